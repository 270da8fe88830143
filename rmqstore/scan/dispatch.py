"""Dispatch computed in bulk: what the broker's reput (spec §9) derives from each record,
for a whole segment at once, with numpy over the segment's bytes.

For the records of one segment, :func:`segment_dispatch` gives per record the fixed
fields dispatch uses, the ConsumeQueue tagsCode (§6.1: Java hash of ``TAGS``, or the
delivery time for the delay topic) and the IndexFile key hashes in put order (§7.3:
``topic#UNIQ_KEY`` then ``topic#token`` per KEYS token; ROLLBACK records get none).

Properties are never decoded per record: :mod:`rmqstore.scan.properties` finds ``TAGS``, ``KEYS``,
``UNIQ_KEY`` and ``DELAY`` and hashes their values for all records at once. Only values
with non-ASCII bytes and delay-topic records take a per-record Python path; both are rare.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields

import numpy as np

from ..format.rules import (SCHEDULE_TOPIC, gets_cq_unit, gets_index_keys, parse_delay_levels,
                            rmqstore_end, tags_code)
from ..format.hashing import java_hash
from .records import RecordColumns, columns, consistent, walk_chain, walk_range
from .properties import PropertyIndex
from . import handover
from ..files.ends import VERIFY_SPELLING, ValidEnd
from ..format.hashing import index_hash_from, key_token_spans, signed_int32, span_hash

# --- one segment -----------------------------------------------------------------------


@dataclass
class SegmentDispatch:
    """A segment's records as dispatch sees them, and how its valid chain ends."""

    start: int  # segment start offset
    limit: int  # readable bytes
    chain_end: int  # absolute offset where the TOTALSIZE chain stopped
    stop: str  # blank | end | zeros | bad magic | bad size | short (walk_chain reasons)
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    consistent: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # §3.9 size rule
    crc_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    queue_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    queue_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    physical_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sys_flag: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    store_timestamp: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    topics: list = field(default_factory=list)
    topic_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tags_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key_record: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # record index
    key_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def cq_mask(self) -> np.ndarray:
        """Records that get a ConsumeQueue unit: NOT_TYPE and COMMIT (spec §6.1)."""
        return gets_cq_unit(self.sys_flag)


# What a fill makes: a compiled pass that makes other fields is not used (numpy is).
_FILLED = frozenset(f.name for f in fields(SegmentDispatch)) - {"start", "limit"}


def dispatch_records(cols: RecordColumns, delay_millis=None, *, keys: bool = True):
    """(topics, topic ids, tagsCode, key record index, key hash) for ``cols``."""
    n = len(cols)
    z = np.zeros(0, np.int64)
    if n == 0:
        return [], z, z, z, z
    u8 = cols.u8
    names, tid = cols.topic_table()
    segs = PropertyIndex(u8, cols.props_pos, cols.props_len)
    tpos, tlen = segs.lookup(b"TAGS")
    has = tpos >= 0
    code = np.zeros(n, np.int64)
    if has.any():
        h, _ = span_hash(u8, tpos[has], tlen[has])
        code[has] = signed_int32(h)
    if SCHEDULE_TOPIC in names:
        _delay_codes(code, u8, segs, np.flatnonzero(tid == names.index(SCHEDULE_TOPIC)),
                     cols.store_timestamp, delay_millis)
    if not keys:
        return names, tid, code, z, z
    key_rec, key_hash = index_keys(cols, u8, segs, names, tid)
    return names, tid, code, key_rec, key_hash


def _delay_codes(code, u8, segs, sched, ts, delay_millis, rows=None) -> None:
    """tagsCode of the delay topic's records ``sched`` that carry DELAY: their delivery
    time instead of the tag hash (spec §6.1); rare, so per record. ``segs`` looks the
    properties up for ``rows`` (default: every record)."""
    delay = delay_millis if delay_millis is not None else parse_delay_levels()
    dpos, dlen = segs.lookup(b"DELAY")
    tpos, tlen = segs.lookup(b"TAGS")
    rows = sched if rows is None else rows
    for i, r in zip(sched.tolist(), rows.tolist()):
        if dpos[r] < 0:
            continue
        props = {"DELAY": u8[dpos[r]:dpos[r] + dlen[r]].tobytes().decode("utf-8", "replace")}
        if tpos[r] >= 0:
            props["TAGS"] = u8[tpos[r]:tpos[r] + tlen[r]].tobytes().decode("utf-8", "replace")
        code[i] = tags_code(SCHEDULE_TOPIC, props, int(ts[i]), delay)


def _kernel_delay_codes(code, u8, starts, sched, ts, delay_millis) -> None:
    """:func:`_delay_codes` for a compiled pass's result: the properties of the delay
    topic's records (at ``starts``, positions in ``u8``) looked up by numpy."""
    cols = columns(u8, starts[sched])
    _delay_codes(code, u8, PropertyIndex(u8, cols.props_pos, cols.props_len), sched, ts,
                 delay_millis, np.arange(len(sched)))


def index_keys(cols: RecordColumns, u8, segs, names, tid):
    """(record index, index hash) of every IndexFile put, in put order (spec §7.3)."""
    upos, ulen = segs.lookup(b"UNIQ_KEY")
    kpos, klen = segs.lookup(b"KEYS")
    keyed = gets_index_keys(cols.sys_flag)
    ur = np.flatnonzero((upos >= 0) & keyed)
    kr = np.flatnonzero((kpos >= 0) & keyed)
    # A KEYS value without a space is one token: hash it whole (and learn which have one).
    kh, kunits, spaced = span_hash(u8, kpos[kr], klen[kr], 0x20)
    single = ~spaced
    tok_rec, tok_h, tok_u = kr[single], kh[single], kunits[single]
    if spaced.any():
        # KEYS tokens: split the value on single spaces, dropping empty tokens.
        sr = kr[spaced]
        vlen = klen[sr].astype(np.int64)
        vend = np.cumsum(vlen)
        flat_pos = np.repeat(kpos[sr] - (vend - vlen), vlen) + np.arange(int(vend[-1]))
        # the values back to back, split as the index splits them (format/hashing)
        value, tok_end, tok_len = key_token_spans(u8[flat_pos], vend, vlen)
        h2, u2 = span_hash(u8, flat_pos[tok_end - tok_len], tok_len)
        tok_rec = np.concatenate([tok_rec, sr[value]])
        tok_h = np.concatenate([tok_h, h2])
        tok_u = np.concatenate([tok_u, u2])
        order = np.argsort(tok_rec, kind="stable")  # tokens of one record stay in order
        tok_rec, tok_h, tok_u = tok_rec[order], tok_h[order], tok_u[order]
    if len(ur):
        uh, uu = span_hash(u8, upos[ur], ulen[ur])
        rec = np.concatenate([ur, tok_rec])
        hs = np.concatenate([uh, tok_h])
        us = np.concatenate([uu, tok_u])
        if len(tok_rec):
            # UNIQ_KEY comes before the KEYS tokens of its record (a stable merge).
            order = np.argsort(rec, kind="stable")
            rec, hs, us = rec[order], hs[order], us[order]
    else:
        rec, hs, us = tok_rec, tok_h, tok_u
    if not len(rec):
        return rec.astype(np.int64), np.zeros(0, np.int64)
    th = np.array([java_hash(t) & 0xFFFFFFFF for t in names], np.uint32)
    return rec, index_hash_from(th[tid[rec]], hs, us)


def scan_segment(buf, start: int, limit: int, *, check_crc: bool = True) -> tuple[RecordColumns, int, str]:
    """Records on the TOTALSIZE chain of one segment (magic and size sane), unfiltered."""
    u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
    starts, stop_pos, stop = walk_chain(buf, 0, limit)
    return columns(u8, starts, start), start + stop_pos, stop


def segment_dispatch(buf, start: int, limit: int, *, check_crc: bool = True,
                     delay_millis=None, keys: bool = True) -> SegmentDispatch:
    """Everything dispatch and verify need from one segment's bytes."""
    return _walk_fill(buf, 0, limit, limit, start, check_crc, delay_millis, keys)


def _walk_fill(buf, first: int, end: int, limit: int, base: int, check_crc: bool,
               delay_millis, keys: bool) -> SegmentDispatch:
    """The records on the chain from ``first`` (starting below ``end``) in ``buf[:limit]``,
    filled: in one compiled pass when :mod:`rmqstore.scan.segment_pass` can (same result),
    else with numpy, which defines it."""
    from . import segment_pass  # numba is imported by the first bulk scan only

    fast = segment_pass.dispatch_range(
        buf, first, end, limit, base, check_crc=check_crc, keys=keys, fields=_FILLED,
        delay_codes=functools.partial(_kernel_delay_codes, delay_millis=delay_millis))
    if fast is not None:
        return SegmentDispatch(base, limit, fast.pop("chain_end"), fast.pop("stop"), **fast)
    u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
    starts, stop_pos, stop = walk_range(buf, first, end, limit)
    return fill_dispatch(SegmentDispatch(base, limit, base + stop_pos, stop), columns(u8, starts, base),
                 check_crc, delay_millis, keys)


def fill_at(out: SegmentDispatch, u8: np.ndarray, starts: np.ndarray, check_crc: bool,
            delay_millis, keys: bool) -> SegmentDispatch:
    """``out`` filled for the records at ``starts`` (positions in ``u8``, of whole records
    that pass the §3.9 size rule, found by another framing: DLedger's entries): in one
    compiled pass when :mod:`rmqstore.scan.segment_pass` can, else by :func:`fill_dispatch`
    (numpy, which defines it)."""
    from . import segment_pass

    fast = segment_pass.dispatch_at(
        u8, starts, out.start, check_crc=check_crc, keys=keys,
        delay_codes=functools.partial(_kernel_delay_codes, delay_millis=delay_millis))
    if fast is None:
        return fill_dispatch(out, columns(u8, starts, out.start), check_crc, delay_millis, keys)
    for name, value in fast.items():
        setattr(out, name, value)
    return out


def fill_dispatch(out: SegmentDispatch, cols: RecordColumns, check_crc: bool, delay_millis,
                  keys: bool) -> SegmentDispatch:
    """``out`` filled with what dispatch and verify need of the records ``cols`` (any
    framing: the plain chain walk or DLedger entries, :mod:`rmqstore.scan.dledger_scan`)."""
    n = len(cols)
    if n == 0:
        return out
    ok = consistent(cols)
    out.consistent = ok
    # Records after the first inconsistent one are not trusted for anything else.
    good = int(np.argmin(ok)) if not ok.all() else n
    out.crc_ok = np.ones(n, bool)
    if check_crc and good:
        out.crc_ok[:good] = cols.take(slice(0, good)).crc_ok()
    out.offset = cols.offset
    out.size = cols.size.astype(np.int64)
    for name in ("queue_id", "queue_offset", "physical_offset", "sys_flag", "store_timestamp"):
        setattr(out, name, getattr(cols, name))
    sub = cols.take(slice(0, good)) if good < n else cols
    names, tid, code, krec, khash = dispatch_records(sub, delay_millis, keys=keys)
    out.topics = names
    out.topic_id = np.concatenate([tid, np.full(n - good, -1, np.int64)]) if good < n else tid
    out.tags_code = np.concatenate([code, np.zeros(n - good, np.int64)]) if good < n else code
    out.key_record, out.key_hash = krec, khash
    return out


def dispatch_split(split, check_crc: bool = True, delay_millis=None, keys: bool = True):
    """(boundary, dispatch data) of the records starting in one byte range of a segment
    (:mod:`rmqstore.scan.splits`): a worker's task. The chain walk stops at the range end;
    :func:`merge_splits` checks that consecutive ranges continue each other's chain."""
    return split_dispatch(split, check_crc, delay_millis, keys, pack_columns)


def split_dispatch(split, check_crc: bool, delay_millis, keys: bool, pack):
    """(boundary, ``pack(SegmentDispatch)``) of one byte range of a segment."""
    from .split_stitch import Boundary
    from .splits import Window, resync

    w = Window(split)
    try:
        base = split.file_start
        if w.size == 0:
            return (Boundary(split.split_id, 0, 0, "zeros", 0, True),
                    pack(SegmentDispatch(base, 0, base, "zeros")))
        forced = split.start is not None or split.begin == 0
        first = (split.start if split.start is not None else split.begin) if forced \
            else resync(w, split.begin, split.end)
        if first is None:
            out = SegmentDispatch(base, w.size, base + split.begin, "none")
        else:
            out = _walk_fill(w.buf, first, split.end, w.size, base, check_crc, delay_millis,
                             keys)
        return (Boundary(split.split_id, first, out.chain_end - base, out.stop, len(out), forced),
                pack(out))
    finally:
        w.close()


# A split's part in the hand-over format (rmqstore.scan.handover) with the COLUMNS
# payload, narrowed: PHYSICALOFFSET is sent only when it differs from the record offsets
# (the head gives those), and 32-bit fields travel as 32-bit ints.
_NARROW = {"queue_id": np.int32, "sys_flag": np.int32, "topic_id": np.int32,
           "key_record": np.int32, "key_hash": np.int32}
_WIDE = ("queue_offset", "store_timestamp", "tags_code")


def pack_columns(p: SegmentDispatch) -> dict:
    """A range's part with the COLUMNS payload (:func:`merge_splits` takes it back)."""
    d = handover.head(p)
    d["topics"] = p.topics
    for name, dt in _NARROW.items():
        d[name] = getattr(p, name).astype(dt)
    for name in _WIDE:
        d[name] = getattr(p, name)
    same = len(p) == 0 or bool((p.physical_offset == p.offset).all())
    d["physical_offset"] = None if same else p.physical_offset
    return d


def _unpack(d: dict) -> SegmentDispatch:
    out = SegmentDispatch(d["start"], d["limit"], d["chain_end"], d["stop"])
    n = d["n"]
    if not n:
        return out
    off = handover.record_offsets(d)
    out.offset, out.size = off, d["size"].astype(np.int64)
    out.consistent, out.crc_ok = handover.flags(d, "consistent"), handover.flags(d, "crc_ok")
    for name in _NARROW:  # 32-bit fields stay 32-bit: every consumer widens as needed
        setattr(out, name, d[name])
    for name in _WIDE:
        setattr(out, name, d[name])
    phy = d["physical_offset"]
    out.physical_offset = off if phy is None else phy
    out.topics = d["topics"]
    return out


_PART_FIELDS = ("offset", "size", "consistent", "crc_ok", "queue_id", "queue_offset",
                "physical_offset", "sys_flag", "store_timestamp", "tags_code")


def merge_splits(parts: list[SegmentDispatch]) -> SegmentDispatch:
    """One segment's :class:`SegmentDispatch` from its ranges' parts, in order (the last
    one says where and why the chain stopped)."""
    parts = [_unpack(p) if isinstance(p, dict) else p for p in parts]
    last = parts[-1]
    out = SegmentDispatch(parts[0].start, last.limit, last.chain_end, last.stop)
    parts = [p for p in parts if len(p)]
    if not parts:
        return out
    for name in _PART_FIELDS:
        setattr(out, name, np.concatenate([getattr(p, name) for p in parts]))
    topics: dict[str, int] = {}
    tids, krecs, khashes = [], [], []
    base = 0
    for p in parts:
        remap = np.array([topics.setdefault(t, len(topics)) for t in p.topics] + [-1], np.int64)
        tids.append(remap[p.topic_id])  # -1 (untrusted) maps to the trailing -1
        krecs.append(p.key_record + base)
        khashes.append(p.key_hash)
        base += len(p)
    out.topics = list(topics)
    out.topic_id = np.concatenate(tids)
    out.key_record = np.concatenate(krecs)
    out.key_hash = np.concatenate(khashes)
    n = len(out)
    if not out.consistent.all():
        # As for one whole segment: nothing after the first inconsistent record is trusted.
        good = int(np.argmin(out.consistent))
        out.crc_ok[good:] = True
        out.topic_id[good:] = -1
        out.tags_code[good:] = 0
        keep = out.key_record < good
        out.key_record, out.key_hash = out.key_record[keep], out.key_hash[keep]
    assert len(out.topic_id) == n
    return out


def dispatch_file(path: str, start: int, limit: int, check_crc: bool = True,
                  delay_millis=None, keys: bool = True) -> SegmentDispatch:
    """:func:`segment_dispatch` of a segment file, opened read-only (a worker's task)."""
    import os

    from ..files.mapped import map_read

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        limit = min(limit, size)
        if limit <= 0:
            return SegmentDispatch(start, 0, start, "zeros")
        mm = map_read(f.fileno(), 0, path)  # holes read as zeros, never a bus error
        try:
            return segment_dispatch(mm, start, limit, check_crc=check_crc,
                                    delay_millis=delay_millis, keys=keys)
        finally:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views are gone with the result; the map closes with them


# --- the whole CommitLog ------------------------------------------------------------------


@dataclass
class StoreScan:
    """Every segment's dispatch data, and where valid data ends for the whole log.

    ``kept[i]`` is how many leading records of ``parts[i]`` are valid. Valid means on the
    TOTALSIZE chain from the first segment, passing the §3.9 size rule, and not part of a
    trailing run of records whose body fails its CRC (a torn tail, spec §10.5). A record
    whose body fails its CRC but is followed by valid records stays (``damaged``): the
    broker's recovery would cut the log there and lose everything after it.
    """

    parts: list[SegmentDispatch]
    kept: list[int]
    valid_end: ValidEnd  # where valid data ends and why (blank/end: the last segment's end)
    end_segment: int  # index of the segment holding ``end`` (-1: no segments)
    damaged: list[int]  # offsets of kept records whose body fails its CRC

    @property
    def end(self) -> int:
        """First byte after valid data."""
        return self.valid_end.offset

    @property
    def reason(self) -> str:
        """Why valid data stops, spelled as verify shows it (``endReason``): "torn" for a
        half record, "gap" for a missing segment (:data:`~rmqstore.files.ends.VERIFY_SPELLING`)."""
        why = self.valid_end.reason
        return VERIFY_SPELLING.get(why, why)

    def records(self, field_name: str) -> np.ndarray:
        arrs = [getattr(p, field_name)[:k] for p, k in zip(self.parts, self.kept)]
        return np.concatenate(arrs) if arrs else np.zeros(0, np.int64)

    @property
    def count(self) -> int:
        return sum(self.kept)


def store_scan(parts: list[SegmentDispatch], segment_size: int) -> StoreScan:
    """Walk the per-segment results in order, as recovery's shared scan does (§10.1), with
    rmqstore's rule for bodies failing their CRC (:func:`~rmqstore.format.rules.rmqstore_end`:
    a trailing run is a torn tail, earlier ones are ``damaged``)."""
    kept = [0] * len(parts)
    damaged: list[int] = []
    if not parts:
        return StoreScan(parts, kept, ValidEnd(0, "no segments", 0), -1, damaged)
    end, end_seg, reason = parts[0].start, 0, ""
    for i, p in enumerate(parts):
        reason = ""
        if i and p.start != parts[i - 1].start + segment_size:
            reason = "missing segment"
            break
        n = len(p)
        good = int(np.argmin(p.consistent)) if n and not p.consistent.all() else n
        full = p.stop in ("blank", "end") and good == n and p.limit == segment_size
        keep = rmqstore_end(p.crc_ok[:good], full)  # a torn tail is cut, damage kept
        if keep < good:
            good, reason = keep, "torn"
        damaged.extend(p.offset[np.flatnonzero(~p.crc_ok[:good])].tolist())
        kept[i] = good
        end_seg = i
        if good < n:
            end = int(p.offset[good])
            reason = reason or "half record"
            break
        if full:
            end = p.start + segment_size if p.stop == "blank" else p.chain_end
            reason = p.stop
            continue
        end = int(p.offset[good - 1] + p.size[good - 1]) if good else p.start
        if reason != "torn":
            reason = p.stop if p.limit == segment_size else "short file"
        break
    return StoreScan(parts, kept, ValidEnd(end, reason, sum(kept)), end_seg, damaged)
