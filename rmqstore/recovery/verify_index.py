"""IndexFile checks for :func:`rmqstore.recovery.verify.verify` (spec §7).

Per file, vectorised over the slot table and the used entries: the header against the
entries (§7.1), slot heads and chain links (a link must go to an *earlier* entry of the
same slot, so a well-formed file has no cycle; every entry is a slot head or the
predecessor of exactly one entry), and entry pointers against the valid records.
Across files: the CommitLog ranges they cover leave no keyed record out. ``deep``
compares the multiset of (key hash, offset) pairs with what dispatch would put (§7.3).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..format import layout as L
from ..errors import RmqStoreError
from ..files.index import IndexFile, IndexGeometry
from ..files.listing import entries, odd_entry, offset_name
from ..scan.properties import sorted_isin


def _files(c, index_dir: Path, geometry: IndexGeometry) -> list[IndexFile]:
    out = []
    if not index_dir.is_dir():
        return out
    for e in entries(index_dir):
        p = e.path
        odd = odd_entry(e)
        if odd is not None:
            c.add(odd[0], p, None, odd[1])
            continue
        if not (e.kind == "file" and offset_name(e.name, 17) is not None):
            c.add("stray-file", p, None, "not an IndexFile (names are 17 digits); the broker "
                  "would map it as one on load")
            continue
        size = e.size
        if size != geometry.file_size:
            c.add("index-file", p, None, f"{size} bytes, but maxHashSlotNum="
                  f"{geometry.hash_slot_num}, maxIndexNum={geometry.index_num} give "
                  f"{geometry.file_size} (truncated, or other geometry: pass --config)")
            continue
        try:
            out.append(IndexFile(p, geometry))
        except RmqStoreError as e:
            c.add("index-file", p, None, e.message)
    return out


def _check_file(c, f: IndexFile, valid_off, end: int, min_offset: int,
                odd: np.ndarray | None = None) -> None:
    g, h = f.geometry, f.header
    ic = h.index_count
    entry_at = lambda e: g.entries_start + e * L.INDEX_ENTRY_SIZE  # noqa: E731
    if ic > g.index_num:
        c.add("index-header", f.path, 36, f"indexCount {ic} exceeds maxIndexNum {g.index_num}")
        ic = g.index_num
    e = f.entries[1:ic]
    kh = e["key_hash"].astype(np.int64)
    phy = e["phy_offset"].astype(np.int64)
    td = e["time_diff"].astype(np.int64)
    prev = e["prev_index"].astype(np.int64)
    num = np.arange(1, ic, dtype=np.int64)
    heads = f.slots.astype(np.int64)
    n = ic - 1
    live_heads = (heads > 0) & (heads < ic)
    problems = []
    if n:
        if h.begin_phy_offset != phy[0] or h.end_phy_offset != phy[-1]:
            problems.append(f"begin/endPhyOffset {h.begin_phy_offset}/{h.end_phy_offset} but the "
                            f"entries run {int(phy[0])}..{int(phy[-1])}")
        if h.end_timestamp < h.begin_timestamp:
            problems.append(f"endTimestamp {h.end_timestamp} < beginTimestamp {h.begin_timestamp}")
    used = int(live_heads.sum())
    if h.hash_slot_count != used:
        problems.append(f"hashSlotCount {h.hash_slot_count} but {used} slots are in use")
    if problems:
        c.add("index-header", f.path, 0, "; ".join(problems))
    chain = []
    bad_heads = np.flatnonzero((heads != 0) & ~live_heads)
    if len(bad_heads):
        chain.append(f"{len(bad_heads)} slot(s) point outside the used entries (first slot "
                     f"{int(bad_heads[0])} -> {int(heads[bad_heads[0]])})")
    hs = np.flatnonzero(live_heads)
    slot = kh % g.hash_slot_num  # each entry's slot, once (a modulo per entry is dear)
    wrong_slot = hs[slot[heads[hs] - 1] != hs]
    if len(wrong_slot):
        chain.append(f"{len(wrong_slot)} slot head(s) hold an entry of another slot")
    if n:
        bad_link = (prev < 0) | (prev >= num)
        linked = ~bad_link & (prev > 0)
        cross = np.zeros(n, bool)
        cross[linked] = slot[prev[linked] - 1] != slot[linked]
        bad = bad_link | cross | (kh < 0) | (td < 0)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            chain.append(f"{int(bad.sum())} entr(y/ies) with a link forward, across slots or a "
                         f"negative hash/timeDiff; first: entry {k + 1}")
        pointed = np.bincount(prev[linked], minlength=ic)
        if (pointed > 1).any():
            chain.append(f"{int((pointed > 1).sum())} entr(y/ies) are the predecessor of more "
                         "than one entry (chains merge)")
        is_head = np.zeros(ic, bool)
        is_head[heads[live_heads]] = True
        orphan = np.flatnonzero(~is_head[1:] & (pointed[1:] == 0))
        if len(orphan) and not chain:
            c.add("index-orphan", f.path, entry_at(int(orphan[0]) + 1),
                  f"{len(orphan)} entr(y/ies) no slot chain reaches; queries never find them; "
                  f"first: entry {int(orphan[0]) + 1}", count=len(orphan))
    if chain:
        c.add("index-chain", f.path, 40, "; ".join(chain) +
              " (repair rebuilds the file from the CommitLog)")
    if n:
        far = phy >= end
        if odd is not None and len(odd):
            far &= ~sorted_isin(phy, odd)  # a record's stored PHYSICALOFFSET: see check_index
        beyond = np.flatnonzero(far)
        if len(beyond):
            c.add("index-beyond-end", f.path, entry_at(int(beyond[0]) + 1),
                  f"{len(beyond)} entr(y/ies) point at or past the CommitLog end {end} (first "
                  f"-> {int(phy[beyond[0]])}); repair rebuilds the file", count=len(beyond))
        inside = (phy < end) & (phy >= min_offset)
        nowhere = np.flatnonzero(inside & ~sorted_isin(phy, valid_off))
        if len(nowhere):
            c.add("index-bad-pointer", f.path, entry_at(int(nowhere[0]) + 1),
                  f"{len(nowhere)} entr(y/ies) point where no valid record starts (first -> "
                  f"{int(phy[nowhere[0]])})", count=len(nowhere))


def _coverage(c, files: list[IndexFile], keyed: np.ndarray, min_offset: int, index_dir: Path) -> None:
    """Keyed records (sorted unique offsets) no file's [begin, end] range covers."""
    ranges = [(f, f.header.begin_phy_offset, f.header.end_phy_offset) for f in files
              if f.header.index_count > 1]
    if not len(keyed):
        return
    if not ranges:
        c.add("index-behind", index_dir, None, f"{len(keyed)} record(s) carry index keys but no "
              f"IndexFile holds any entry; first at {int(keyed[0])}", count=len(keyed))
        return
    lo = min_offset
    for f, b, e in ranges:
        gap = keyed[(keyed >= lo) & (keyed < b)]
        if len(gap):
            c.add("index-gap", f.path, 0, f"{len(gap)} record(s) with keys between {lo} and this "
                  f"file's beginPhyOffset {b} are in no IndexFile (a file was lost?); first at "
                  f"{int(gap[0])}", commitLogOffset=int(gap[0]), count=len(gap))
        lo = max(lo, e + 1)
    f, _, e = ranges[-1]
    after = keyed[keyed > e]
    if len(after):
        c.add("index-behind", f.path, 24, f"{len(after)} record(s) with keys after the last "
              f"IndexFile's endPhyOffset {e} are not indexed; first at {int(after[0])}",
              commitLogOffset=int(after[0]), count=len(after))


def _phy(v) -> int:
    return int(np.frombuffer(v.tobytes(), ">i8")[0])


def _pairs(phy: np.ndarray, kh: np.ndarray) -> np.ndarray:
    a = np.empty(len(phy), dtype=[("p", ">i8"), ("h", ">i8")])
    a["p"], a["h"] = phy, kh
    return a.view("V16")


def _deep(c, files: list[IndexFile], d, end: int, index_dir: Path) -> None:
    """Multiset of (offset, key hash): index entries against dispatch's puts (§7.3)."""
    parts = [(f.entries[1:f.header.index_count]["phy_offset"].astype(np.int64),
              f.entries[1:f.header.index_count]["key_hash"].astype(np.int64)) for f in files]
    if parts:
        aphy, akh = (np.concatenate(x) for x in zip(*parts))
    else:
        aphy = akh = np.zeros(0, np.int64)
    lo = min((f.header.begin_phy_offset for f in files if f.header.index_count > 1), default=end)
    keep = aphy < end
    aphy, akh = aphy[keep], akh[keep]
    sel = d.key_offset >= lo
    ev, ec = np.unique(_pairs(d.key_offset[sel], d.key_hash[sel]), return_counts=True)
    av, ac = np.unique(_pairs(aphy, akh), return_counts=True)
    pos = np.searchsorted(av, ev)
    pos_ok = pos < len(av)
    found = np.zeros(len(ev), np.int64)
    m = pos_ok.copy()
    m[pos_ok] = av[pos[pos_ok]] == ev[pos_ok]
    found[m] = ac[pos[m]]
    missing = np.flatnonzero(found < ec)
    if len(missing):
        p = _phy(ev[missing[0]])
        c.add("index-missing-keys", index_dir, None, f"{int((ec - found)[missing].sum())} key(s) "
              f"of messages are not in any IndexFile; first: the record at {p}",
              commitLogOffset=p, count=len(missing))
    epos = np.searchsorted(ev, av)
    e_ok = epos < len(ev)
    known = e_ok.copy()
    known[e_ok] = ev[epos[e_ok]] == av[e_ok]
    stray = np.flatnonzero(~known)
    if len(stray):
        p = _phy(av[stray[0]])
        c.add("index-stray-entries", index_dir, None, f"{int(ac[stray].sum())} entr(y/ies) point "
              f"at records that carry no key with that hash; first -> {p}",
              commitLogOffset=p, count=len(stray))
    exp_count = np.zeros(len(av), np.int64)
    exp_count[known] = ec[epos[known]]
    dup = np.flatnonzero(known & (ac > exp_count))
    if len(dup):
        p = _phy(av[dup[0]])
        c.add("index-duplicate", index_dir, None, f"{len(dup)} key(s) indexed more than once for "
              f"the same record (a re-dispatch indexes the last record again, §14.7); first at {p}",
              commitLogOffset=p, count=len(dup))


def check_index(c, root: Path, cfg, scan, d, *, deep: bool = False) -> None:
    if not cfg.message_index_enable or "max_hash_slot_num" in cfg.undetermined:
        return  # an unknown geometry is the "geometry-unknown" finding, not a file error
    index_dir = root / "index"
    geometry = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
    files = _files(c, index_dir, geometry)
    try:
        pos = scan.records("offset")  # positions: sorted
        stored = scan.records("physical_offset")
        # Index entries carry the stored PHYSICALOFFSET (§7.3): where it differs from the
        # position (reported as record-physical-offset), an entry pointing at it is what
        # dispatch writes, and re-indexing would write it again.
        odd = np.unique(stored[stored != pos])
        valid_off = np.union1d(pos, odd) if len(odd) else pos
        min_offset = int(scan.parts[0].start) if scan.parts else 0
        for f in files:
            _check_file(c, f, valid_off, scan.end, min_offset, odd)
        ko = d.key_offset  # CommitLog order: sorted, so unique is a diff
        if len(odd):
            ko = np.unique(ko[~sorted_isin(ko, odd)])
        keyed = ko[np.r_[True, ko[1:] != ko[:-1]]] if len(ko) else ko
        _coverage(c, files, keyed, min_offset, index_dir)
        if deep:
            _deep(c, files, d, scan.end, index_dir)
    finally:
        for f in files:
            f.close()
