"""IndexFile checks for :func:`rmqstore.recovery.verify.verify` (spec §7).

Per file, vectorised over the slot table and the used entries: the header against the
entries (§7.1), slot heads and chain links (a link must go to an *earlier* entry of the
same slot, so a well-formed file has no cycle; every entry is a slot head or the
predecessor of exactly one entry), and entry pointers against the valid records.
Across files: the CommitLog ranges they cover leave no keyed record out. ``deep``
compares the multiset of (key hash, offset) pairs with what dispatch would put (§7.3).

Each file's facts (:class:`FileFacts`) come from numpy (:func:`file_facts`, the
definition) or from the compiled check (:mod:`rmqstore.files.index_jit`: one pass over the
entries, the slots and chains part beside the CommitLog scan for big files:
:class:`ChainCheck`); one function turns them into findings.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..format import layout as L
from ..errors import RmqStoreError
from ..files import jit
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


@dataclass
class FileFacts:
    """What verify reports about one IndexFile's entries (entry numbers, not positions;
    -1: none). :func:`file_facts` (numpy) defines every field; the compiled form
    (:mod:`rmqstore.files.index_jit`: ``check_chains``, ``check_pointers``) must give the
    same."""

    ic: int  # indexCount as checked (at most maxIndexNum)
    phy_span: tuple[int, int] | None  # first and last entry's phyOffset
    used: int  # slots whose head is a used entry
    bad_heads: int  # slots pointing outside the used entries
    bad_head_slot: int
    bad_head_value: int
    wrong_slot: int  # slot heads holding an entry of another slot
    bad: int  # links forward, across slots, negative hash or timeDiff
    bad_first: int
    merged: int  # entries that are the predecessor of more than one
    orphans: int  # entries no chain reaches
    orphan_first: int
    beyond: int  # pointing at or past the CommitLog end (not a stored PHYSICALOFFSET)
    beyond_first: int
    beyond_phy: int
    nowhere: int  # pointing inside the log where no valid record starts
    nowhere_first: int
    nowhere_phy: int


def file_facts(f: IndexFile, valid_off, end: int, min_offset: int,
               odd: np.ndarray | None = None) -> FileFacts:
    """:class:`FileFacts` of ``f`` against the sorted ``valid_off`` (record starts) and
    ``odd`` (stored PHYSICALOFFSETs that differ from their record's position), with numpy:
    the definition."""
    g, h = f.geometry, f.header
    ic = min(h.index_count, g.index_num)
    e = f.entries[1:ic]
    kh = e["key_hash"].astype(np.int64)
    phy = e["phy_offset"].astype(np.int64)
    td = e["time_diff"].astype(np.int64)
    prev = e["prev_index"].astype(np.int64)
    num = np.arange(1, ic, dtype=np.int64)
    heads = f.slots.astype(np.int64)
    n = ic - 1
    live_heads = (heads > 0) & (heads < ic)
    bad_heads = np.flatnonzero((heads != 0) & ~live_heads)
    hs = np.flatnonzero(live_heads)
    slot = kh % g.hash_slot_num  # each entry's slot, once (a modulo per entry is dear)
    wrong_slot = hs[slot[heads[hs] - 1] != hs]
    bad = merged = orphan = np.zeros(0, np.int64)
    beyond = nowhere = np.zeros(0, np.int64)
    if n:
        bad_link = (prev < 0) | (prev >= num)
        linked = ~bad_link & (prev > 0)
        cross = np.zeros(n, bool)
        cross[linked] = slot[prev[linked] - 1] != slot[linked]
        bad = np.flatnonzero(bad_link | cross | (kh < 0) | (td < 0))
        pointed = np.bincount(prev[linked], minlength=ic)
        merged = np.flatnonzero(pointed > 1)
        is_head = np.zeros(ic, bool)
        is_head[heads[live_heads]] = True
        orphan = np.flatnonzero(~is_head[1:] & (pointed[1:] == 0))
        far = phy >= end
        if odd is not None and len(odd):
            far &= ~sorted_isin(phy, odd)  # a record's stored PHYSICALOFFSET: see check_index
        beyond = np.flatnonzero(far)
        inside = (phy < end) & (phy >= min_offset)
        nowhere = np.flatnonzero(inside & ~sorted_isin(phy, valid_off))
    first = lambda a: int(a[0]) + 1 if len(a) else -1  # noqa: E731 - as an entry number
    return FileFacts(ic, (int(phy[0]), int(phy[-1])) if n else None, int(live_heads.sum()),
                     len(bad_heads), int(bad_heads[0]) if len(bad_heads) else -1,
                     int(heads[bad_heads[0]]) if len(bad_heads) else 0, len(wrong_slot),
                     len(bad), first(bad), len(merged), len(orphan), first(orphan),
                     len(beyond), first(beyond), int(phy[beyond[0]]) if len(beyond) else 0,
                     len(nowhere), first(nowhere), int(phy[nowhere[0]]) if len(nowhere) else 0)


def _kernel():
    """(the compiled check, its geometry) or None: switched off (``RMQSTORE_NO_JIT=1``),
    no numba, or a host the kernel cannot serve."""
    if jit.switched_off():
        return None
    K = jit.load("rmqstore.files.index_jit")
    geo = K.geometry() if K is not None else None
    return (K, geo) if geo is not None else None


#: How often each form of the file check ran in this process ("kernel", "numpy"; "beside":
#: with the chain part from :class:`ChainCheck`); tests read it to prove the kernel is used.
used: Counter = Counter()


def compiled_facts(f: IndexFile, valid_off, end: int, min_offset: int,
                   odd: np.ndarray | None = None,
                   chains: list[int] | None = None) -> FileFacts | None:
    """:func:`file_facts` by the compiled check, or None (take numpy); ``chains``: the
    slot and chain part, when :class:`ChainCheck` made it for this file as it is."""
    loaded = _kernel()
    if loaded is None:
        return None
    K, geo = loaded
    g = f.geometry
    ic = min(f.header.index_count, g.index_num)
    ents = f.entries
    if chains is not None:
        out = np.array(chains, np.int64)
    else:
        out = np.zeros(K.CHECKS, np.int64)
        K.check_chains(f.slots.view(np.uint32), ents.view(np.uint32), geo, ic, g.hash_slot_num,
                       out)
    K.check_pointers(ents.view(np.uint32), geo, ic, np.ascontiguousarray(valid_off, np.int64),
                     np.ascontiguousarray(odd if odd is not None else (), np.int64), end,
                     min_offset, out)
    phy = lambda k: int(ents[k]["phy_offset"]) if k > 0 else 0  # noqa: E731
    o = out.tolist()
    return FileFacts(ic, (phy(1), phy(ic - 1)) if ic > 1 else None, o[K.C_USED],
                     o[K.C_BAD_HEADS], o[K.C_BAD_HEAD_SLOT], o[K.C_BAD_HEAD_VALUE],
                     o[K.C_WRONG_SLOT], o[K.C_BAD], o[K.C_BAD_FIRST], o[K.C_MERGED],
                     o[K.C_ORPHANS], o[K.C_ORPHAN_FIRST], o[K.C_BEYOND], o[K.C_BEYOND_FIRST],
                     phy(o[K.C_BEYOND_FIRST]), o[K.C_NOWHERE], o[K.C_NOWHERE_FIRST],
                     phy(o[K.C_NOWHERE_FIRST]))


#: From this many bytes of IndexFiles on, their slots and chains are checked in a child
#: process while the CommitLog is scanned (:class:`ChainCheck`); below it, after the scan.
CHAINS_BESIDE_MIN = 64 << 20


def _geometry(cfg) -> IndexGeometry | None:
    if not cfg.message_index_enable or "max_hash_slot_num" in cfg.undetermined:
        return None  # an unknown geometry is the "geometry-unknown" finding, not a file error
    return IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)


def _chain_outputs(root: Path, geometry: IndexGeometry) -> dict[str, tuple[int, list[int]]]:
    """Per whole IndexFile: (indexCount as checked, the compiled slot and chain part)."""
    from .findings import Collector

    loaded = _kernel()
    files = _files(Collector(root), root / "index", geometry)  # verify reports these later
    out = {}
    try:
        for f in files:
            ic = min(f.header.index_count, geometry.index_num)
            o = np.zeros(loaded[0].CHECKS, np.int64)
            loaded[0].check_chains(f.slots.view(np.uint32), f.entries.view(np.uint32),
                                   loaded[1], ic, geometry.hash_slot_num, o)
            out[str(f.path)] = (ic, o.tolist())
    finally:
        for f in files:
            f.close()
    return out


def _warm_chains() -> None:
    """``check_chains`` run once on a one-entry file, with the argument types a mapped
    file gives (read-only words), so its compiled code is in memory."""
    K, geo = _kernel()
    slots, ents = np.zeros(1, np.uint32), np.zeros(2 * int(geo[K.G_ENTRY_W]), np.uint32)
    slots.flags.writeable = ents.flags.writeable = False
    K.check_chains(slots, ents, geo, 1, 1, np.zeros(K.CHECKS, np.int64))


class ChainCheck:
    """The slot and chain part of the compiled IndexFile check, run in a child process
    beside the CommitLog scan (it needs nothing the scan finds); :func:`check_index` takes
    its answer for each file whose indexCount is still what it saw. Only with the kernel
    on and at least :data:`CHAINS_BESIDE_MIN` bytes of IndexFiles (a fork costs more for
    small ones); a child that fails only means the check runs after the scan."""

    def __init__(self, root: Path, cfg, processes: int | None = None):
        self._job = None
        self._answer: dict | None = None
        geometry = _geometry(cfg)
        if geometry is None or processes == 1 or _kernel() is None:
            return
        index_dir = root / "index"
        sizes = [e.size for e in entries(index_dir) if e.kind == "file"] \
            if index_dir.is_dir() else []
        if sum(sizes) >= CHAINS_BESIDE_MIN:
            from ..scan import segment_pass
            from ..scan.parallel import Child

            # Compiled code loaded here once, before any fork: the child and the scan's
            # workers inherit it instead of each loading it again.
            segment_pass.warm()
            _warm_chains()
            self._job = Child(lambda: _chain_outputs(root, geometry))

    def answer(self) -> dict:
        """{path: (indexCount, chain part)}, empty when there is none."""
        if self._answer is None:
            job, self._job = self._job, None
            try:
                self._answer = job.result() if job is not None else {}
            except Exception:  # noqa: BLE001 - the check then runs in this process
                self._answer = {}
        return self._answer

    def __enter__(self) -> "ChainCheck":
        return self

    def __exit__(self, *exc) -> None:
        self.answer()  # the child reaped, whatever happened


def _check_file(c, f: IndexFile, valid_off, end: int, min_offset: int,
                odd: np.ndarray | None = None, chains: list[int] | None = None) -> None:
    g, h = f.geometry, f.header
    entry_at = lambda e: g.entries_start + e * L.INDEX_ENTRY_SIZE  # noqa: E731
    x = compiled_facts(f, valid_off, end, min_offset, odd, chains)
    used[x is None and "numpy" or "kernel"] += 1
    if x is None:
        x = file_facts(f, valid_off, end, min_offset, odd)
    if h.index_count > g.index_num:
        c.add("index-header", f.path, 36, f"indexCount {h.index_count} exceeds maxIndexNum "
              f"{g.index_num}")
    problems = []
    if x.phy_span is not None:
        if (h.begin_phy_offset, h.end_phy_offset) != x.phy_span:
            problems.append(f"begin/endPhyOffset {h.begin_phy_offset}/{h.end_phy_offset} but the "
                            f"entries run {x.phy_span[0]}..{x.phy_span[1]}")
        if h.end_timestamp < h.begin_timestamp:
            problems.append(f"endTimestamp {h.end_timestamp} < beginTimestamp {h.begin_timestamp}")
    if h.hash_slot_count != x.used:
        problems.append(f"hashSlotCount {h.hash_slot_count} but {x.used} slots are in use")
    if problems:
        c.add("index-header", f.path, 0, "; ".join(problems))
    chain = []
    if x.bad_heads:
        chain.append(f"{x.bad_heads} slot(s) point outside the used entries (first slot "
                     f"{x.bad_head_slot} -> {x.bad_head_value})")
    if x.wrong_slot:
        chain.append(f"{x.wrong_slot} slot head(s) hold an entry of another slot")
    if x.bad:
        chain.append(f"{x.bad} entr(y/ies) with a link forward, across slots or a "
                     f"negative hash/timeDiff; first: entry {x.bad_first}")
    if x.merged:
        chain.append(f"{x.merged} entr(y/ies) are the predecessor of more "
                     "than one entry (chains merge)")
    if x.orphans and not chain:
        c.add("index-orphan", f.path, entry_at(x.orphan_first),
              f"{x.orphans} entr(y/ies) no slot chain reaches; queries never find them; "
              f"first: entry {x.orphan_first}", count=x.orphans)
    if chain:
        c.add("index-chain", f.path, 40, "; ".join(chain) +
              " (repair rebuilds the file from the CommitLog)")
    if x.beyond:
        c.add("index-beyond-end", f.path, entry_at(x.beyond_first),
              f"{x.beyond} entr(y/ies) point at or past the CommitLog end {end} (first "
              f"-> {x.beyond_phy}); repair rebuilds the file", count=x.beyond)
    if x.nowhere:
        c.add("index-bad-pointer", f.path, entry_at(x.nowhere_first),
              f"{x.nowhere} entr(y/ies) point where no valid record starts (first -> "
              f"{x.nowhere_phy})", count=x.nowhere)


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


def check_index(c, root: Path, cfg, scan, d, *, deep: bool = False,
                chains: ChainCheck | None = None) -> None:
    """IndexFile findings (``chains``: the slot and chain part, if started beside the scan)."""
    geometry = _geometry(cfg)
    if geometry is None:
        return
    index_dir = root / "index"
    files = _files(c, index_dir, geometry)
    done = chains.answer() if chains is not None else {}
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
            ic, part = done.get(str(f.path), (None, None))
            same = ic == min(f.header.index_count, geometry.index_num)  # not appended since
            used["beside"] += same
            _check_file(c, f, valid_off, scan.end, min_offset, odd, part if same else None)
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
