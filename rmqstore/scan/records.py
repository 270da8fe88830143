"""Bulk scan: walk records over a memory map and hand back numpy columns.

A :class:`RecordColumns` holds, for a run of records in one segment, every fixed field
as a numpy array (gathered with the dtypes :mod:`rmqstore.format.layout` derives) and the
position and length of the body, topic and properties. Python objects are made only for
what a caller asks for (:meth:`RecordColumns.topic_table`, :meth:`RecordColumns.message`).
Record boundaries follow the size chain; every record then passes the structural part of
RocketMQ's check (spec §3.9) vectorised, and the body CRC when asked.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from construct import Struct

from ..format import layout as L
from ..format.layout import ints_at
from ..format.message import Host, Message
from ..format.record import chain_step, decode_record
from ..format.crc import BODY_CRC_MASK, crc32_spans
from ..files.ends import ValidEnd

_MIN_RECORD = L.MIN_RECORD_SIZE
_SIZE = L.derive_struct(Struct(L.RecordHead.subcons[0]))  # TOTALSIZE alone, for the walk


def walk_chain(buf, pos: int, limit: int) -> tuple[np.ndarray, int, str]:
    """Record start positions from ``pos`` following TOTALSIZE while the magic is a
    message magic and the size fits. Returns (starts, stop position, why it stopped):
    "blank", "end" (reached ``limit``), "zeros", "bad magic", "bad size" or "short".

    Dense records are found vectorised (see :func:`walk_range`); large ones by a
    Python loop over the size field."""
    return walk_range(buf, pos, limit, limit)


# Record-start candidates are found by the magic's bytes; below this average record size a
# vectorised search over every byte beats following TOTALSIZE in Python (~0.2 µs/record).
_VEC_MAX_AVG = 640
_PROBE = 32  # records walked in Python before choosing
_MAGIC_BYTES = (L.MAGIC_V1 & 0xFFFFFFFF).to_bytes(4, "big"), (L.MAGIC_V2 & 0xFFFFFFFF).to_bytes(4, "big")
_MAGIC_AT = L.OFFSET_OF["magic"]
_VEC_CHUNK = 1024 * 1024  # bytes compared at a time: the masks stay in cache (16 MiB: 1.5x slower)


def chain_stop(buf, pos: int, end: int, limit: int) -> str:
    """Why a chain that reached ``pos`` stops (or "range": a plausible record header at or
    past ``end``, where the caller's range ends)."""
    step = chain_step(buf, pos, limit - pos)
    if step == "record":  # a whole record below ``end`` would have been walked
        return "range" if pos >= end else "bad size"
    return step


def _candidates(u8: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Positions p in [lo, hi) whose bytes p+4..p+8 are a message magic."""
    m1, m2 = _MAGIC_BYTES
    at = _MAGIC_AT
    out = []
    for a in range(lo, hi, _VEC_CHUNK):
        b = min(hi, a + _VEC_CHUNK)
        c = np.flatnonzero(u8[a + at:b + at] == m1[0])
        if len(c):
            c += a + at
            c = c[(u8[c + 1] == m1[1]) & (u8[c + 2] == m1[2])]
            last = u8[c + 3]
            c = c[(last == m1[3]) | (last == m2[3])]
            out.append(c - at)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _walk_vec(buf, u8: np.ndarray, pos: int, end: int, limit: int):
    """The chain from ``pos`` over magic candidates, vectorised: the Python loop runs
    once per candidate that is not a record start (a magic inside a body), not per record.
    None when such false candidates are too many (the caller then walks in Python)."""
    hi = min(end, limit - 7)
    if hi <= pos:
        return None
    c = _candidates(u8, pos, hi)
    if not len(c) or c[0] != pos:
        return None
    size = ints_at(u8, c, 4)
    ok = (size >= _MIN_RECORD) & (size <= limit - c)
    succ = c + size
    cont = np.zeros(len(c), bool)
    cont[:-1] = ok[:-1] & (succ[:-1] == c[1:])
    brk = np.flatnonzero(~cont)  # chain from candidate i runs to the first break >= i
    if len(brk) > 64 + len(c) // 64:
        return None
    pieces = []
    i = 0
    while True:
        j = int(brk[np.searchsorted(brk, i)])
        if not ok[j]:
            pieces.append(c[i:j])
            return pieces, int(c[j])
        pieces.append(c[i:j + 1])
        q = int(succ[j])
        k = int(np.searchsorted(c, q))
        if q >= hi or k >= len(c) or int(c[k]) != q:
            return pieces, q
        i = k


def walk_range(buf, pos: int, end: int, limit: int) -> tuple[np.ndarray, int, str]:
    """Record starts from ``pos`` following TOTALSIZE while below ``end`` (magic a message
    magic, size in [minimum, bytes left to ``limit``]). Returns (starts, where the chain
    stopped, why): "range" (it left ``[pos, end)`` at a plausible record header), "end",
    "short", "blank", "zeros", "bad magic" or "bad size" -- as a Python walk would."""
    unpack = _SIZE.unpack_from
    starts = array("q")
    append = starts.append
    first = pos
    stop = min(end, limit - 7)  # a header is readable below this
    probe = first + _PROBE * _VEC_MAX_AVG
    vec = None
    # The loop reads only TOTALSIZE; magics are checked afterwards, vectorised.
    while pos < stop:
        (size,) = unpack(buf, pos)
        if not _MIN_RECORD <= size <= limit - pos:
            break
        append(pos)
        pos += size
        if len(starts) == _PROBE:
            if pos < probe and pos < stop:
                vec = _walk_vec(buf, np.frombuffer(buf, dtype=np.uint8, count=limit),
                                pos, end, limit)
                if vec is not None:
                    break
            probe = -1
    found = np.frombuffer(starts, dtype=np.int64).copy() if len(starts) else np.zeros(0, np.int64)
    if len(found):
        magic = ints_at(np.frombuffer(buf, dtype=np.uint8, count=limit), found + 4, 4)
        good = (magic == L.MAGIC_V1) | (magic == L.MAGIC_V2)
        if not good.all():
            k = int(np.argmin(good))
            found, pos, vec = found[:k], int(found[k]), None
    if vec is not None:
        pieces, pos = vec
        found = np.concatenate([found] + pieces)
    return found, pos, chain_stop(buf, pos, end, limit)


_FIXED_NAMES = tuple(L.RECORD_FIXED_OFFSETS[False, False])
_COMBOS = [(False, False), (False, True), (True, False), (True, True)]
# Per field, its offset in each host-width combination (index: born_v6 * 2 + store_v6).
_FIELD_TABLE = {name: (np.array([L.RECORD_FIXED_OFFSETS[c][name][0] for c in _COMBOS]),
                       L.RECORD_FIXED_OFFSETS[False, False][name][1])
                for name in _FIXED_NAMES if not name.endswith("_address")}
_FIXED_SIZES = np.array([L.RECORD_FIXED_SIZE[c] for c in _COMBOS])
_FIXED_DTYPES = [L.RECORD_FIXED_DTYPE[c] for c in _COMBOS]
# Fields before the hosts sit at one offset whatever the host widths.
_HEAD_FIELDS = frozenset(n for n, (offs, _) in _FIELD_TABLE.items() if (offs == offs[0]).all())
_FIXED = " fixed"  # cache key of the gathered fixed prefixes (never an attribute name)
_CRC = " crc"  # cache key of the body CRC answers (crc_ok)


def _fixed_rows(u8: np.ndarray, pos: np.ndarray, combo: int) -> np.ndarray:
    """The fixed prefix of the record at each of ``pos``, as the structured dtype
    :mod:`rmqstore.format.layout` derives for host-width combination ``combo``: one copy of
    ~88 bytes a record (about 20 ns), after which every field is a cheap conversion."""
    dt = _FIXED_DTYPES[combo]
    top = len(u8) - dt.itemsize
    if top < 0:
        return np.zeros(len(pos), dtype=dt)
    raw = np.ndarray(shape=(top + 1,), dtype=f"V{dt.itemsize}", buffer=u8, offset=0,
                     strides=(1,))
    # As in layout.ints_at: out-of-range positions only come from damaged lengths, which the
    # size check rejects, so any in-range bytes will do.
    return raw[np.minimum(pos, top)].view(dt)


class RecordColumns:
    """The records starting at ``pos`` in one segment's bytes, as lazily gathered columns.

    Each fixed field (``queue_id``, ``store_timestamp``, … every name of the record schema)
    is gathered on first use and cached, so a caller pays only for what it reads. Derived
    spans: ``body_pos/body_len``, ``topic_pos/topic_len``, ``props_pos/props_len``.
    """

    def __init__(self, u8: np.ndarray, pos: np.ndarray, base: int = 0, cache: dict | None = None):
        self.u8 = u8
        self.pos = pos
        self.base = base
        self._cache: dict[str, np.ndarray] = {} if cache is None else cache

    def __len__(self) -> int:
        return len(self.pos)

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_"):
            raise AttributeError(name)
        cache = self.__dict__["_cache"]
        if name not in cache:
            maker = _DERIVED.get(name)
            if maker is not None:
                maker(self)
            elif name in _FIELD_TABLE:
                cache[name] = self._fixed_field(name)
            else:
                raise AttributeError(name)
        return cache[name]

    def _fixed_field(self, name: str) -> np.ndarray:
        cache = self._cache
        block = cache.get(_FIXED)
        if block is None:
            block = cache[_FIXED] = _fixed_rows(self.u8, self.pos, 0)
        out = block[name].astype(np.int64)
        if name not in _HEAD_FIELDS:
            combo = self.combo
            if combo.any():  # IPv6 hosts move the later fields: re-read those records
                for k in (1, 2, 3):
                    idx = np.flatnonzero(combo == k)
                    if len(idx):
                        out[idx] = _fixed_rows(self.u8, self.pos[idx], k)[name]
        return out

    @property
    def offset(self) -> np.ndarray:
        """Absolute CommitLog offset of each record."""
        return self.pos + self.base

    @property
    def size(self) -> np.ndarray:
        return self.total_size

    def take(self, sel) -> "RecordColumns":
        return RecordColumns(self.u8, self.pos[sel], self.base,
                             {k: v[sel] for k, v in self._cache.items()})

    def host(self, which: str, i: int) -> Host:
        """``born_host`` or ``store_host`` of record ``i``."""
        p = int(self.pos[i])
        combo = _COMBOS[int(self.combo[i])]
        off, width = L.RECORD_FIXED_OFFSETS[combo][f"{which}_address"]
        port_off, _ = L.RECORD_FIXED_OFFSETS[combo][f"{which}_port"]
        port = int.from_bytes(self.u8[p + port_off:p + port_off + 4].tobytes(), "big", signed=True)
        return Host(self.u8[p + off:p + off + width].tobytes(), port)

    def host_keys(self, which: str) -> np.ndarray:
        """An int per record such that equal keys mean equal ``born_host``/``store_host``:
        IPv4 address and port packed exactly; an IPv6 host gets a key of its own (a
        negative record number), so callers decode those one by one."""
        combo = self.combo
        v6_bit = 2 if which == "born_host" else 1
        port = getattr(self, f"{which}_port")
        offsets = np.array([L.RECORD_FIXED_OFFSETS[c][f"{which}_address"][0] for c in _COMBOS])
        addr_pos = self.pos + (offsets[combo] if combo.any() else int(offsets[0]))
        key = ints_at(self.u8, addr_pos, 4) & 0xFFFFFFFF
        v6 = (combo & v6_bit) != 0
        key = (key << 32) | (port & 0xFFFFFFFF)
        if v6.any():
            key = np.where(v6, -1 - np.arange(len(key)), key)
        return key

    def topic_table(self) -> tuple[list[str], np.ndarray]:
        """(distinct topics, topic id of each record)."""
        if len(self) == 0:
            return [], np.zeros(0, dtype=np.int64)
        h = _span_hash(self.u8, self.topic_pos, self.topic_len)
        uniq, first, inverse = _distinct(h)
        names = [self.u8[p:p + n].tobytes().decode("utf-8", "replace")
                 for p, n in zip(self.topic_pos[first].tolist(), self.topic_len[first].tolist())]
        return names, inverse

    def properties_text(self, i: int) -> str:
        p, n = int(self.props_pos[i]), int(self.props_len[i])
        return self.u8[p:p + n].tobytes().decode("utf-8", "replace")

    def body(self, i: int) -> bytes:
        p, n = int(self.body_pos[i]), int(self.body_len[i])
        return self.u8[p:p + n].tobytes()

    def message(self, i: int) -> Message:
        return decode_record(self.u8, int(self.pos[i]), base=self.base)

    def crc_ok(self, sel=None) -> np.ndarray:
        """Whether each record's body matches its BODYCRC (an empty body always does); of
        records ``sel`` only, when given. Answers are kept: a record's body is read once
        however often it is asked about (a dump asks when counting and when printing)."""
        memo = self._cache.get(_CRC)
        if memo is None:
            memo = self._cache[_CRC] = np.full(len(self), -1, np.int8)  # -1: not read yet
        idx = np.arange(len(self)) if sel is None else np.asarray(sel)
        todo = idx[memo[idx] < 0]
        if len(todo):
            n = self.body_len[todo]
            got = crc32_spans(self.u8, self.body_pos[todo], n).astype(np.int64) & BODY_CRC_MASK
            memo[todo] = (got == self.body_crc[todo]) | (n <= 0)
        return memo[idx] == 1


def _combo(c: RecordColumns) -> None:
    sf = c.sys_flag
    c._cache["combo"] = ((sf & L.SYSFLAG_BORNHOST_V6) != 0) * 2 + ((sf & L.SYSFLAG_STOREHOST_V6) != 0)


def _spans(c: RecordColumns) -> None:
    u8, combo = c.u8, c.combo
    body_pos = c.pos + (_FIXED_SIZES[combo] if combo.any() else int(_FIXED_SIZES[0]))
    body_len = np.maximum(c.body_length, 0)
    tlen_pos = body_pos + body_len
    v2 = c.magic == L.MAGIC_V2
    topic_len = ints_at(u8, tlen_pos, 1)
    if v2.any():
        topic_len = np.where(v2, ints_at(u8, tlen_pos, 2), topic_len)
    topic_pos = tlen_pos + np.where(v2, 2, 1) if v2.any() else tlen_pos + 1
    plen_pos = topic_pos + topic_len
    c._cache.update(body_pos=body_pos, body_len=body_len, topic_pos=topic_pos,
                    topic_len=topic_len, props_pos=plen_pos + 2,
                    props_len=np.maximum(ints_at(u8, plen_pos, 2), 0))


_DERIVED = {"combo": _combo, **{k: _spans for k in
            ("body_pos", "body_len", "topic_pos", "topic_len", "props_pos", "props_len")}}


def _distinct(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct values, index of the first of each, id of each) for a uint64 array.

    Stores have few topics, so a sample's distinct values usually cover everything and a
    binary search assigns ids without sorting the whole column."""
    sample = np.unique(h[:: max(1, len(h) // 4096)])
    ids = np.searchsorted(sample, h)
    np.minimum(ids, len(sample) - 1, out=ids)
    if len(sample) <= 256 and bool((sample[ids] == h).all()):
        first = np.full(len(sample), len(h), dtype=np.int64)
        np.minimum.at(first, ids, np.arange(len(h)))
        present = first < len(h)
        remap = np.cumsum(present) - 1
        return sample[present], first[present], remap[ids]
    uniq, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    return uniq, first, inverse.reshape(-1)


def _span_hash(u8: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each byte span, eight bytes at a time (suits short spans): the
    spans are copied as rows of whole words, bytes past each span's end masked off."""
    h = length.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    maxlen = int(length.max()) if len(length) else 0
    width = -(-maxlen // 8) * 8
    if width == 0:
        return h
    room = len(u8) - width
    items = np.ndarray(shape=(max(room + 1, 0),), dtype=f"V{width}", buffer=u8, offset=0,
                       strides=(1,))
    tail = np.flatnonzero(pos > room)  # rows that would run off the buffer: padded copies
    if room < 0:
        m = np.zeros((len(pos), width), np.uint8)
    else:
        m = items[np.minimum(pos, room)].view(np.uint8).reshape(len(pos), width)
    for i in tail.tolist():
        chunk = u8[int(pos[i]):int(pos[i]) + width]
        m[i, :len(chunk)], m[i, len(chunk):] = chunk, 0
    words = m.view("<u8")  # little-endian: a span's first byte is a word's lowest
    one = length[0] if len(length) else 0
    same = bool((length == one).all())
    full = np.uint64(0xFFFFFFFFFFFFFFFF)
    for j in range(width // 8):
        keep = np.clip(length - 8 * j, 0, 8) if not same else np.clip(int(one) - 8 * j, 0, 8)
        if same:
            mask = full if keep >= 8 else np.uint64((1 << (8 * int(keep))) - 1)
        else:
            bits = keep.astype(np.uint64) * np.uint64(8)
            mask = np.where(keep >= 8, full, (np.uint64(1) << np.minimum(bits, np.uint64(63))) - np.uint64(1))
        w = words[:, j] & mask
        h = (h ^ w) * np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
    return h


def columns(u8: np.ndarray, starts: np.ndarray, base: int = 0) -> RecordColumns:
    """Columns for the records at ``starts`` (positions in ``u8``); gathered on use."""
    return RecordColumns(u8, starts, base)


def consistent(c: RecordColumns) -> np.ndarray:
    """Per record: do the length fields add up to TOTALSIZE (the §3.9 size rule)?"""
    return (c.topic_len >= 0) & (c.props_pos + c.props_len == c.pos + c.size)


@dataclass
class SegmentScan:
    """The valid records of one segment (or of a window of it) and where and why they end
    (``valid_end.reason``: blank, end, range, zeros, bad magic, bad size, short, half record
    or crc, :data:`rmqstore.files.ends.REASONS`)."""

    records: RecordColumns
    valid_end: ValidEnd

    @property
    def end(self) -> int:
        """Absolute offset just after the last valid record (where a BLANK starts)."""
        return self.valid_end.offset

    @property
    def stop(self) -> str:
        return self.valid_end.reason


#: Bytes of a segment walked and gathered at a time by :func:`scan_windows`: columns stay
#: a few MB however large the segment (a 1 GiB segment of 230-byte records is 4.7 M records).
WINDOW = 8 * 1024 * 1024
#: The first window of a walk that may stop early (``dump -n 5``): windows then double up
#: to WINDOW, so a head read touches about what it gives, a whole walk ~7 windows more.
FIRST_WINDOW = 64 * 1024


def scan_windows(buf, base: int, limit: int, start: int = 0, *,
                 window: int | None = None, first: int | None = None) -> Iterator[SegmentScan]:
    """:func:`scan_buffer` in pieces: the valid records starting in each window of bytes,
    in order; windows are ``first`` bytes (default: ``window``), doubling up to ``window``.
    Every piece but the last stops with ``"range"``; the last one stops where and why
    :func:`scan_buffer` would (same chain, same size rule, spec §3.9, §10.1)."""
    window = window or WINDOW
    size = min(first or window, window)
    u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
    pos = start
    while True:
        starts, stop_pos, stop = walk_range(buf, pos, min(pos + size, limit), limit)
        size = min(2 * size, window)
        cols = columns(u8, starts, base)
        ok = consistent(cols)
        if not ok.all():
            k = int(np.argmin(ok))
            cols, stop, stop_pos = cols.take(slice(0, k)), "half record", int(starts[k])
        yield SegmentScan(cols, ValidEnd(base + stop_pos, stop, len(cols)))
        if stop != "range":
            return
        pos = stop_pos


def scan_buffer(buf, base: int, limit: int, start: int = 0, *,
                check_crc: bool = False) -> SegmentScan:
    """Scan one segment's bytes from ``start`` up to ``limit``: the valid records, in
    order, and where and why valid data stops (spec §3.9, §10.1)."""
    u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
    starts, stop_pos, stop = walk_chain(buf, start, limit)
    cols = columns(u8, starts, base)
    ok = consistent(cols)
    if check_crc and len(cols):
        ok &= cols.crc_ok()
    if not ok.all():
        k = int(np.argmin(ok))
        stop = "half record" if not consistent(cols.take(slice(k, k + 1)))[0] else "crc"
        cols = cols.take(slice(0, k))
        stop_pos = int(starts[k])
    return SegmentScan(cols, ValidEnd(base + stop_pos, stop, len(cols)))
