"""Bulk scan: walk records over a memory map and hand back numpy columns.

A :class:`RecordColumns` holds, for a run of records in one segment, every fixed field
as a numpy array (gathered with the dtypes :mod:`rmqstore.layout` derives) and the
position and length of the body, topic and properties. Python objects are made only for
what a caller asks for (:meth:`RecordColumns.topic_table`, :meth:`RecordColumns.message`).
Record boundaries follow the size chain; every record then passes the structural part of
RocketMQ's check (spec §3.9) vectorised, and the body CRC when asked.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from . import layout as L
from .codec import Message, decode_record

_MIN_RECORD = L.RECORD_FIXED_SIZE[False, False] + 3
_HEAD = L.BLANK_STRUCT  # (total_size, magic): the first 8 bytes of any record


def _gather(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes starting at each of ``pos`` as an (n, width) uint8 array."""
    return u8[pos[:, None] + np.arange(width, dtype=np.int64)]


def _int_at(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed ints of ``width`` bytes at each of ``pos``."""
    if len(pos) == 0:
        return np.zeros(0, dtype=np.int64)
    return _gather(u8, pos, width).view(f">i{width}").reshape(-1).astype(np.int64)


def walk_chain(buf, pos: int, limit: int) -> tuple[np.ndarray, int, str]:
    """Record start positions from ``pos`` following TOTALSIZE, while the magic is a
    message magic and the size fits. Returns (starts, stop position, why it stopped):
    "blank", "end" (reached ``limit``) or a short reason for a failed header."""
    unpack = _HEAD.unpack_from
    v1, v2 = L.MAGIC_V1, L.MAGIC_V2
    starts = []
    append = starts.append
    stop = ""
    while True:
        left = limit - pos
        if left < 8:
            stop = "end" if left == 0 else "short"
            break
        size, magic = unpack(buf, pos)
        if magic != v1 and magic != v2:
            stop = "blank" if magic == L.MAGIC_BLANK else ("zeros" if size == 0 and magic == 0 else "bad magic")
            break
        if size < _MIN_RECORD or size > left:
            stop = "bad size"
            break
        append(pos)
        pos += size
    return np.array(starts, dtype=np.int64), pos, stop


@dataclass
class RecordColumns:
    """Fixed fields and variable-field spans of consecutive records of one segment."""

    base: int  # segment start offset: absolute offset = base + pos
    u8: np.ndarray = field(repr=False)  # the segment's bytes
    pos: np.ndarray
    size: np.ndarray
    magic: np.ndarray
    body_crc: np.ndarray
    queue_id: np.ndarray
    flag: np.ndarray
    queue_offset: np.ndarray
    physical_offset: np.ndarray
    sys_flag: np.ndarray
    born_timestamp: np.ndarray
    store_timestamp: np.ndarray
    reconsume_times: np.ndarray
    prepared_transaction_offset: np.ndarray
    body_pos: np.ndarray
    body_len: np.ndarray
    topic_pos: np.ndarray
    topic_len: np.ndarray
    props_pos: np.ndarray
    props_len: np.ndarray

    def __len__(self) -> int:
        return len(self.pos)

    @property
    def offset(self) -> np.ndarray:
        return self.pos + self.base

    def take(self, sel) -> "RecordColumns":
        kw = {k: (v[sel] if isinstance(v, np.ndarray) and k != "u8" else v)
              for k, v in self.__dict__.items()}
        return RecordColumns(**kw)

    def topic_table(self) -> tuple[list[str], np.ndarray]:
        """(distinct topics, topic id of each record)."""
        if len(self) == 0:
            return [], np.zeros(0, dtype=np.int64)
        h = _span_hash(self.u8, self.topic_pos, self.topic_len)
        uniq, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        names = [bytes(self.u8[p:p + n]).decode("utf-8", "replace")
                 for p, n in zip(self.topic_pos[first].tolist(), self.topic_len[first].tolist())]
        return names, inverse.reshape(-1)

    def properties_text(self, i: int) -> str:
        p, n = int(self.props_pos[i]), int(self.props_len[i])
        return bytes(self.u8[p:p + n]).decode("utf-8", "replace")

    def body(self, i: int) -> bytes:
        p, n = int(self.body_pos[i]), int(self.body_len[i])
        return bytes(self.u8[p:p + n])

    def message(self, i: int) -> Message:
        return decode_record(self.u8, int(self.pos[i]), base=self.base)

    def crc_ok(self) -> np.ndarray:
        """Whether each record's body matches its BODYCRC."""
        mv = memoryview(self.u8)
        out = np.empty(len(self), dtype=bool)
        crc32 = zlib.crc32
        for i, (p, n, c) in enumerate(zip(self.body_pos.tolist(), self.body_len.tolist(),
                                          self.body_crc.tolist())):
            out[i] = (crc32(mv[p:p + n]) & 0x7FFFFFFF if n > 0 else 0) == c or n <= 0
        return out


def _span_hash(u8: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each byte span, vectorised over records (one pass per byte
    column, so it suits short spans such as topics)."""
    h = length.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    maxlen = int(length.max()) if len(length) else 0
    last = len(u8) - 1
    for j in range(maxlen):
        live = length > j
        byte = u8[np.minimum(pos + j, last)].astype(np.uint64)
        h = np.where(live, (h ^ byte) * np.uint64(0x100000001B3), h)
    return h


def columns(u8: np.ndarray, starts: np.ndarray, base: int = 0) -> RecordColumns:
    """Gather every fixed field of the records at ``starts`` (positions in ``u8``)."""
    n = len(starts)
    sys_flag = _int_at(u8, starts + L.OFFSET_OF["sys_flag"], 4)
    combo = (sys_flag & L.SYSFLAG_BORNHOST_V6 != 0) * 2 + (sys_flag & L.SYSFLAG_STOREHOST_V6 != 0)
    cols: dict[str, np.ndarray] = {}
    names = ("total_size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
             "physical_offset", "born_timestamp", "store_timestamp", "reconsume_times",
             "prepared_transaction_offset", "body_length")
    for name in names:
        cols[name] = np.zeros(n, dtype=np.int64)
    fixed = np.zeros(n, dtype=np.int64)
    for (born6, store6), dtype in L.RECORD_FIXED_DTYPE.items():
        sel = np.flatnonzero(combo == born6 * 2 + store6)
        if len(sel) == 0:
            continue
        rows = _gather(u8, starts[sel], dtype.itemsize).view(dtype).reshape(-1)
        for name in names:
            cols[name][sel] = rows[name]
        fixed[sel] = dtype.itemsize
    body_pos = starts + fixed
    body_len = np.maximum(cols["body_length"], 0)
    tlen_pos = body_pos + body_len
    v2 = cols["magic"] == L.MAGIC_V2
    topic_len = np.where(v2, _int_at(u8, np.minimum(tlen_pos, len(u8) - 2), 2),
                         _int_at(u8, tlen_pos, 1))
    topic_pos = tlen_pos + np.where(v2, 2, 1)
    plen_pos = topic_pos + topic_len
    props_len = np.maximum(_int_at(u8, np.clip(plen_pos, 0, len(u8) - 2), 2), 0)
    return RecordColumns(
        base=base, u8=u8, pos=starts, size=cols["total_size"], magic=cols["magic"],
        body_crc=cols["body_crc"], queue_id=cols["queue_id"], flag=cols["flag"],
        queue_offset=cols["queue_offset"], physical_offset=cols["physical_offset"],
        sys_flag=sys_flag, born_timestamp=cols["born_timestamp"],
        store_timestamp=cols["store_timestamp"], reconsume_times=cols["reconsume_times"],
        prepared_transaction_offset=cols["prepared_transaction_offset"], body_pos=body_pos,
        body_len=body_len, topic_pos=topic_pos, topic_len=topic_len, props_pos=plen_pos + 2,
        props_len=props_len)


def consistent(c: RecordColumns) -> np.ndarray:
    """Per record: do the length fields add up to TOTALSIZE (the §3.9 size rule)?"""
    return (c.topic_len >= 0) & (c.props_pos + c.props_len == c.pos + c.size)


@dataclass
class SegmentScan:
    """The valid records of one segment and how the segment ends."""

    records: RecordColumns
    end: int  # absolute offset just after the last valid record (where a BLANK starts)
    stop: str  # blank | end | zeros | bad magic | bad size | short | half record | crc


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
    return SegmentScan(cols, base + stop_pos, stop)
