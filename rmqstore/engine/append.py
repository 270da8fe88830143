"""The CommitLog appender: records into segments, BLANK at a segment's end, queue offsets.

This is the broker's ``CommitLog.putMessage`` / ``putMessages`` path without the network:
a message is checked against the limits of spec §3.6 (a failed check is a returned
:class:`PutStatus`, never an exception), encoded outside the lock (§3.1), and written
under the store-wide append lock, which assigns its QUEUEOFFSET (§3.2), PHYSICALOFFSET
and, when asked, STORETIMESTAMP. A record that does not fit the rest of the segment
leaves an 8-byte BLANK there and moves to the next one (§4); a batch moves as a whole
(§3.7). Durability is :mod:`rmqstore.engine.flush`'s business, CQ and index :mod:`rmqstore.engine.dispatch`'s.

Concurrent readers of the files see only whole records: a record's bytes are written
tail first and its TOTALSIZE field last, so until then a scan finds zeros (end of data).
"""

from __future__ import annotations

import enum
import errno
import itertools
import operator
import os
import threading
import time
import zlib
from collections.abc import Sequence as _SequenceABC
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..format import layout as L
from ..format.message import (Message, offset_msg_id, offset_msg_id_at, offset_msg_id_prefix,
                              parse_properties, serialize_properties)
from ..format.record import pack_head, record_tail, topic_field
from ..format.rules import NO_QUEUE_OFFSET_BIT, advances_queue_offset, java_length, magic_for
from ..format.crc import BODY_CRC_MASK, body_crc
from ..files.config import StoreConfig
from ..errors import OffsetError, StoreIOError
from ..files.names import shown, topic_problem
from ..files.segments import Segment, SegmentQueue, segment_ahead, segment_pwrite, segment_sync

_PWRITE_MIN = 64 * 1024  # bytes from which _place writes with pwrite, not the mapping
#: Segment bytes allocated at a time ahead of the write position: a store through the
#: map into an unallocated page on a full disk is a SIGBUS, an allocation that fails is
#: an error before any byte changes. One posix_fallocate per 16 MiB costs nothing a put.
ALLOCATE_AHEAD = 16 << 20

_MAGIC, _MAGIC_AT = L.HEAD_FIELD_STRUCT["magic"], L.OFFSET_OF["magic"]
_HOST_BITS = L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6
_SHORT_MAX = 32767
_TOTAL_SIZE = L.RECORD_TOTAL_SIZE_STRUCT
_PROPS_LEN = L.RECORD_PROPERTIES_LENGTH_STRUCT
# PROPERTIESLENGTH fields of the lengths the single put takes (< 16 KiB), each packed on
# first use: a list index is cheaper than a pack call per put.
_PROPS_LEN_BYTES: list = [None] * 16384
_NOT_HOST_BITS = ~(L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6)
_crc32 = zlib.crc32
_MAGIC_V1 = L.MAGIC_V1
_NAME_VALUE = L.PROPERTY_NAME_VALUE_SEPARATOR.join


class PutStatus(str, enum.Enum):
    """PutMessageStatus (spec §3.6); the 5.x spellings."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutResult:
    """What a put reports back: status, where the record went, its ids.

    ``msg_id`` is the offsetMsgId (spec §5.1). A put that knows its store host's prefix
    passes ``prefix`` instead, and the id is made on first read (as the broker's
    msgIdSupplier does): a caller that never reads it does not pay for the hex text.
    """

    __slots__ = ("status", "offset", "size", "queue_offset", "store_timestamp", "_msg_id",
                 "reason", "_prefix")

    def __init__(self, status: PutStatus, offset: int = -1, size: int = 0,
                 queue_offset: int = -1, store_timestamp: int = 0, msg_id: str = "",
                 reason: str = "", *, prefix: str | None = None):
        self.status = status
        self.offset = offset  # wroteOffset: PHYSICALOFFSET of the record
        self.size = size  # wroteBytes: TOTALSIZE
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self._msg_id = msg_id if prefix is None else None
        self.reason = reason  # why a put failed, for people
        self._prefix = prefix

    @property
    def msg_id(self) -> str:
        m = self._msg_id
        if m is None:
            m = self._msg_id = offset_msg_id_at(self._prefix, self.offset)
        return m

    @msg_id.setter
    def msg_id(self, value: str) -> None:
        self._msg_id = value

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    def _fields(self) -> tuple:
        return (self.status, self.offset, self.size, self.queue_offset, self.store_timestamp,
                self.msg_id, self.reason)

    def __eq__(self, other) -> bool:
        if not isinstance(other, PutResult):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable (status changes on a flush timeout), like the dataclass was

    def __repr__(self) -> str:
        return ("PutResult(status={!r}, offset={!r}, size={!r}, queue_offset={!r}, "
                "store_timestamp={!r}, msg_id={!r}, reason={!r})").format(*self._fields())


_PUT_OK = PutStatus.PUT_OK


_new_object = object.__new__


def _put_ok(offset: int, size: int, queue_offset: int, store_timestamp: int,
            prefix: str) -> PutResult:
    """The PUT_OK :class:`PutResult` of the fast single put, its slots filled here:
    calling the class (type call, ``__init__`` run from C, keyword defaults) costs
    more per put. The same object in every way."""
    r = _new_object(PutResult)
    r.status = _PUT_OK
    r.offset = offset
    r.size = size
    r.queue_offset = queue_offset
    r.store_timestamp = store_timestamp
    r._msg_id = None
    r.reason = ""
    r._prefix = prefix
    return r


class PutResults(_SequenceABC):
    """The results of one batch put, made on first use (like the broker's msgIdSupplier):
    a caller that only needs the batch written does not pay for a PutResult per message.
    Behaves as a read-only list of :class:`PutResult` (the objects are kept once made)."""

    __slots__ = ("_offsets", "_sizes", "_queue_offsets", "_timestamps", "_prefixes", "_list")

    def __init__(self, offsets, sizes, queue_offsets, timestamps, prefixes):
        self._offsets, self._sizes = offsets, sizes
        self._queue_offsets, self._timestamps, self._prefixes = queue_offsets, timestamps, prefixes
        self._list = None

    def _made(self) -> list[PutResult]:
        if self._list is None:
            ok = PutStatus.PUT_OK
            self._list = [PutResult(ok, o, s, q, t, offset_msg_id_at(p, o)) for o, s, q, t, p in zip(
                self._offsets.tolist(), self._sizes.tolist(), self._queue_offsets.tolist(),
                self._timestamps, self._prefixes)]
        return self._list

    @property
    def end(self) -> int:
        """End offset of the batch's last record."""
        return int(self._offsets[-1] + self._sizes[-1])

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, i):
        return self._made()[i]

    def __iter__(self):
        return iter(self._made())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, PutResults)) \
            else NotImplemented

    def __repr__(self) -> str:
        return repr(self._made())


_BATCH_FIELDS = operator.attrgetter(
    "topic", "body", "properties", "properties_text", "queue_id", "flag", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "prepared_transaction_offset", "magic")


def _props_text(props: dict, trailing: bool) -> str:
    return serialize_properties(props, trailing) if props else ""


def _column(values, dtype=np.int64) -> np.ndarray | int:
    """A column for the header array: a scalar when every value is the same."""
    first = values[0]
    if values.count(first) == len(values):
        return first
    return np.array(values, dtype=dtype)


@dataclass(slots=True)
class Prepared:
    """A message checked and encoded up to the fields the append lock assigns."""

    msg: Message
    key: tuple[bool, bool]  # (born host v6, store host v6): which fixed layout
    magic: int
    sys_flag: int
    crc: int
    total: int
    tail: bytes  # body, topic and properties with their length fields
    properties: dict = field(default_factory=dict)


@dataclass(slots=True)
class Appended:
    """One record as written, with what dispatch needs (spec §9)."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    store_timestamp: int
    properties: dict


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def prepare(msg: Message, config: StoreConfig) -> Prepared | PutResult:
    """Check ``msg`` against the limits in the broker's order and encode its variable part
    (spec §3.6). Returns a failed :class:`PutResult` instead of raising."""
    v5 = config.broker_version != "4.9"
    topic = msg.topic
    topic_b = topic.encode("utf-8", "replace")
    text = msg.properties_text
    if not v5:
        # 4.9's DefaultMessageStore checks Java lengths first, both as MESSAGE_ILLEGAL.
        if java_length(topic) > 127:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="topic is longer than 127 characters")
        if msg.magic == L.MAGIC_V2:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="magic v2 is unknown to a 4.9 store")
    else:
        # 5.x broker hook: topic byte limits; %RETRY% topics may go up to 255 (§3.2).
        if len(topic_b) > 255 or (len(topic_b) > 127 and not topic.startswith("%RETRY%")):
            return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="topic is too long")
    why = topic_problem(topic)
    if why is not None:
        # The topic becomes consumequeue/{topic}/ (spec §6.1): it must be one safe name.
        return PutResult(PutStatus.MESSAGE_ILLEGAL,
                         reason=f"topic {shown(topic)} cannot be a directory name ({why})")
    if text is None:
        props = msg.properties
        text = serialize_properties(props, config.trailing_separator) if props else ""
    else:
        props = None
    if not v5 and len(text) > _SHORT_MAX // 2 and java_length(text) > _SHORT_MAX:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="properties are longer than 32767 characters")
    props_b = text.encode("utf-8", "replace")
    if len(props_b) > _SHORT_MAX:
        return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                         reason=f"properties are {len(props_b)} bytes, more than 32767")
    body = msg.body or b""
    if len(body) > config.max_message_size:
        return PutResult(PutStatus.MESSAGE_ILLEGAL,
                         reason=f"body is {len(body)} bytes, more than maxMessageSize {config.max_message_size}")
    magic = magic_for(topic, msg.magic, auto=v5)  # 4.9 refused v2 above
    born6, store6 = msg.born_host.is_v6, msg.store_host.is_v6
    sys_flag = (msg.sys_flag & ~_HOST_BITS) | (L.SYSFLAG_BORNHOST_V6 if born6 else 0) | (
        L.SYSFLAG_STOREHOST_V6 if store6 else 0)
    total = L.record_size(sys_flag, magic, len(body), len(topic_b), len(props_b))
    if total > config.max_message_size + 65536:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"record of {total} bytes is over the limit")
    if total + L.END_FILE_MIN_BLANK_LENGTH > config.mapped_file_size_commit_log:
        # The broker would write a BLANK over a whole fresh segment and fail; refuse early.
        return PutResult(PutStatus.MESSAGE_ILLEGAL,
                         reason=f"record of {total} bytes cannot fit a {config.mapped_file_size_commit_log}-byte segment")
    tail = record_tail(body, topic_field(topic_b, magic), props_b)
    if props is None:
        props = parse_properties(text)
    return Prepared(msg, (born6, store6), magic, sys_flag, body_crc(body), total, tail, props)


class CommitLogAppender:
    """Appends prepared records at the end of a writable CommitLog segment queue.

    ``end`` is where the next record goes; ``queue_offsets`` maps (topic, queueId) to the
    next queue offset, restored by the caller from the ConsumeQueues (spec §10.6).
    ``buffer_for`` returns the writable bytes of a segment: its mmap, or a transient-pool
    buffer (spec §11.3). ``on_new_segment`` is told when a segment is started.
    """

    def __init__(self, config: StoreConfig, queue: SegmentQueue, end: int,
                 queue_offsets: dict[tuple[str, int], int] | None = None, *,
                 buffer_for: Callable[[Segment], object] | None = None,
                 preallocate: bool = True,
                 on_dispatch_error: Callable[[StoreIOError], None] | None = None):
        self.config = config
        self.queue = queue
        self.size = config.mapped_file_size_commit_log
        self.queue_offsets: dict[tuple[str, int], int] = dict(queue_offsets or {})
        self.lock = threading.RLock()
        self.preallocate = preallocate
        # A record written whose dispatch then hit a full disk is still put (as in the
        # broker, where dispatch runs after the append): this is told, and the store
        # stops taking messages. Without it the error is raised.
        self.on_dispatch_error = on_dispatch_error
        self._buffer_for = buffer_for or (lambda seg: seg.buffer())
        self._direct = buffer_for is None  # writes land in the segment's own mapping
        self.end = end  # absolute offset of the next record
        self.last_store_timestamp = 0
        self.last_record_offset = -1  # PHYSICALOFFSET of the last record appended
        self._seg: Segment | None = None
        self._seg_start = 0
        self._seg_end = 0  # where the current segment ends (0: none yet)
        # Where the allocated part of the current segment ends (<= _seg_end): a record
        # whose end + 8 (room for a BLANK) is within it goes straight in.
        self._alloc_end = 0
        self._ahead = None  # the current segment's Ahead (its end is _alloc_end)
        self._buf = None
        # Fast single-put path (put_message): what prepare() works out per topic and per
        # host width, computed once.
        self._v5 = config.broker_version != "4.9"
        self._trailing = config.trailing_separator
        self._max_body = config.max_message_size
        # A record up to this size passes both size checks of prepare().
        self._max_total = min(config.max_message_size + 65536,
                              self.size - L.END_FILE_MIN_BLANK_LENGTH)
        self._topics: dict[str, tuple[int, bytes, int]] = {}
        self._msg_id_prefix: dict = {}
        self._hosts = (None, None)  # see _hosts_entry
        self._fixed = []
        self._batch_dtypes = []
        for k in range(4):
            born6, store6 = bool(k & 1), bool(k & 2)
            self._fixed.append((L.RECORD_FIXED_SIZE[born6, store6], L.RECORD_FIXED_STRUCT[born6, store6],
                                (L.SYSFLAG_BORNHOST_V6 if born6 else 0)
                                | (L.SYSFLAG_STOREHOST_V6 if store6 else 0)))
            self._batch_dtypes.append(L.RECORD_FIXED_DTYPE[born6, store6])
        if end % self.size or any(s.start == end for s in queue.segments):
            # Continue inside the segment that holds ``end`` (or starts there).
            self._open_segment(end - end % self.size)

    # --- segments ------------------------------------------------------------------------

    def _take_segment(self, start: int) -> tuple[Segment, object]:
        seg = self.queue.create_segment(start)
        if self.preallocate:
            # The broker asks for the next-next segment when it takes a new one (spec §2).
            self.queue.create_segment(start + self.size)
        return seg, self._buffer_for(seg)

    def _open_segment(self, start: int) -> None:
        seg, buf = self._take_segment(start)
        self._seg = seg
        self._seg_start = seg.start
        self._seg_end = seg.start + self.size
        self._buf = buf
        at = max(self.end, seg.start)
        self._ahead = segment_ahead(seg, at - seg.start, ALLOCATE_AHEAD)
        self._alloc_end = at  # nothing known to be allocated after

    def _make_room(self, n: int) -> None:
        """Room for ``n`` bytes at ``end`` and a later BLANK's 8, allocated on disk: in
        this segment, or in the next after a BLANK. A full disk raises
        :class:`~rmqstore.errors.StoreIOError` before any byte changes."""
        try:
            if self._seg is None or self.end + n + L.END_FILE_MIN_BLANK_LENGTH > self._seg_end:
                self._write_blank(n)
            else:
                self._allocate(self.end + n + L.END_FILE_MIN_BLANK_LENGTH)
        except StoreIOError as e:
            e.store_unchanged = True  # nothing was written (MessageStore._failed)
            raise

    def _allocate(self, upto: int) -> None:
        if upto > self._alloc_end:
            s = self._seg_start
            self._alloc_end = s + self._ahead.need(upto - s)

    def release_ahead(self) -> None:
        """Give back the segment bytes allocated ahead and never written (a clean close:
        the files then take the space the broker's sparse ones take)."""
        if self._ahead is not None and self._alloc_end > self.end:
            self._ahead.give_back(self.end - self._seg_start)
            self._alloc_end = self.end

    def _write_blank(self, n: int = 0) -> None:
        """Close the current segment with an 8-byte BLANK and start the next (spec §4),
        with room for ``n`` bytes: the next segment is made and allocated first, so a
        full disk leaves the current one as it was."""
        if self._seg is None:
            self._open_segment(self.end)
            self._allocate(self.end + n + L.END_FILE_MIN_BLANK_LENGTH)
            return
        self._allocate(self.end + L.END_FILE_MIN_BLANK_LENGTH)
        nxt_start = self._seg_start + self.size
        nxt, nbuf = self._take_segment(nxt_start)
        nahead = segment_ahead(nxt, 0, ALLOCATE_AHEAD)
        nalloc = nxt_start + nahead.need(n + L.END_FILE_MIN_BLANK_LENGTH)
        pos = self.end - self._seg_start
        left = self.size - pos
        buf = self._buf
        # Magic first, size last: a concurrent scan sees zeros, then the whole BLANK.
        _MAGIC.pack_into(buf, pos + _MAGIC_AT, L.MAGIC_BLANK)
        _TOTAL_SIZE.pack_into(buf, pos, left)
        self.end += left
        self._seg, self._seg_start, self._seg_end = nxt, nxt_start, nxt_start + self.size
        self._buf, self._alloc_end, self._ahead = nbuf, nalloc, nahead

    # --- append --------------------------------------------------------------------------

    def _next_queue_offset(self, p: Prepared) -> tuple[tuple[str, int], int, bool]:
        key = (p.msg.topic, p.msg.queue_id)
        if not advances_queue_offset(p.sys_flag):
            return key, 0, False  # PREPARED / ROLLBACK: 0, and no advance (spec §3.2)
        return key, self.queue_offsets.get(key, 0), True

    def _encode(self, p: Prepared, phys: int, queue_offset: int, store_ts: int) -> bytes:
        m = p.msg
        return pack_head(p.key, p.total, p.magic, p.crc, p.sys_flag, m, queue_offset, phys,
                         store_ts, len(m.body or b"")) + p.tail

    def _place(self, data, n: int) -> int:
        """Write ``n`` bytes at ``end``, TOTALSIZE of the first record last."""
        pos = self.end - self._seg.start
        buf = self._buf
        if n >= _PWRITE_MIN and self._direct:
            # Many records (a batch): one write() into the file costs ~1.2 µs a fresh 4 KiB
            # page, a store through the mapping page-faults it in for 1.3-8 µs (more while
            # the kernel writes back dirty pages). Same page cache, so mapped readers see
            # it; TOTALSIZE still goes last.
            segment_pwrite(self._seg, memoryview(data)[4:n], pos + 4)
        else:
            buf[pos + 4:pos + n] = memoryview(data)[4:n]
        buf[pos:pos + 4] = data[:4]
        self.end += n
        return pos

    def append(self, p: Prepared, *, stamp: bool = False) -> tuple[PutResult, Appended]:
        """Append one prepared record; the caller holds :attr:`lock`."""
        self._make_room(p.total)
        m = p.msg
        store_ts = now_ms() if stamp else m.store_timestamp
        key, qoff, advance = self._next_queue_offset(p)
        phys = self.end
        data = self._encode(p, phys, qoff, store_ts)
        self._place(data, p.total)
        if advance:
            self.queue_offsets[key] = qoff + 1
        self.last_store_timestamp = store_ts
        self.last_record_offset = phys
        result = PutResult(PutStatus.PUT_OK, phys, p.total, qoff, store_ts,
                           offset_msg_id(m.store_host, phys))
        return result, Appended(phys, p.total, m.topic, m.queue_id, qoff, p.sys_flag, store_ts,
                                p.properties)

    def append_batch(self, preps: Sequence[Prepared], *,
                     stamp: bool = False) -> tuple[list[PutResult], list[Appended]]:
        """Append records that must share one segment (a regular batch, spec §3.7).
        The caller holds :attr:`lock` and has checked that the batch fits a segment."""
        total = sum(p.total for p in preps)
        self._make_room(total)
        store_ts = now_ms() if stamp else None
        start = self.end
        phys = start
        chunks = []
        results, appended = [], []
        counters = self.queue_offsets
        before: dict = {}  # counters as they were, put back if the write fails
        for p in preps:
            m = p.msg
            ts = m.store_timestamp if store_ts is None else store_ts
            key, qoff, advance = self._next_queue_offset(p)
            chunks.append(self._encode(p, phys, qoff, ts))
            if advance:
                if key not in before:
                    before[key] = counters.get(key)
                counters[key] = qoff + 1
            results.append(PutResult(PutStatus.PUT_OK, phys, p.total, qoff, ts,
                                     offset_msg_id(m.store_host, phys)))
            appended.append(Appended(phys, p.total, m.topic, m.queue_id, qoff, p.sys_flag, ts,
                                     p.properties))
            phys += p.total
            self.last_store_timestamp = ts
        data = b"".join(chunks)
        try:
            self._place(data, len(data))
        except BaseException:
            for key, v in before.items():
                if v is None:
                    counters.pop(key, None)
                else:
                    counters[key] = v
            raise
        self.last_record_offset = results[-1].offset
        return results, appended

    def append_encoded(self, data, total: int, count: int, last_store_timestamp: int) -> int:
        """Place ``total`` bytes of ready records (the vectorised batch path) that were
        encoded for PHYSICALOFFSET :meth:`reserve` returned. Caller holds the lock."""
        self._place(data, total)
        self.last_store_timestamp = last_store_timestamp
        return count

    def reserve(self, total: int) -> int:
        """Where a batch of ``total`` bytes will start, after a BLANK if it must move;
        its bytes are allocated on disk (StoreIOError before any change otherwise)."""
        self._make_room(total)
        return self.end

    # --- the fast single put -------------------------------------------------------------

    def _topic_entry(self, topic: str):
        """(magic, topic length field + topic bytes, their length + that of the
        PROPERTIESLENGTH field) for a message of ``topic`` (magic v1 unless the topic
        needs v2), or None when prepare() would refuse the topic."""
        topic_b = topic.encode("utf-8", "replace")
        jlen = java_length(topic)
        if not self._v5:
            if jlen > 127:
                return None
        elif len(topic_b) > 255 or (len(topic_b) > 127 and not topic.startswith("%RETRY%")):
            return None
        if topic_problem(topic) is not None:
            return None
        magic = magic_for(topic, auto=self._v5)
        tblock = topic_field(topic_b, magic)
        entry = (magic, tblock, len(tblock) + _PROPS_LEN.size)
        if len(self._topics) < 65536:
            self._topics[topic] = entry
        return entry

    def put_message(self, msg: Message, stamp: bool, record=None) -> PutResult | None:
        """Check, encode and append one message in one step: the bytes, checks and
        statuses of :func:`prepare` + :meth:`append`, at a fraction of the cost.

        Returns None when the message needs the general path (a refused message, magic
        v2 asked for, very long properties or body): the caller then uses prepare()/append().
        A specialised form of :func:`rmqstore.format.record.encode_record` (its topic
        field and header struct, packed in place): tests/test_one_encoder.py pins the
        bytes to it.
        ``record(topic, queue_id, queue_offset, offset, size, sys_flag, store_ts, props,
        text)`` is called under the lock (dispatch); ``props`` is None when the message
        came with ``properties_text``.
        """
        topic = msg.topic
        entry = self._topics.get(topic)
        if entry is None:
            entry = self._topic_entry(topic)
            if entry is None:
                return None
        if msg.magic != _MAGIC_V1:
            return None
        magic, tblock, tlen = entry
        text = msg.properties_text
        if text is None:
            props = msg.properties
            if props:
                try:
                    text = "\x02".join(map(_NAME_VALUE, props.items()))  # all str: C speed
                except TypeError:  # a None (skipped) or non-str value
                    text = "\x02".join([f"{k}\x01{v}" for k, v in props.items() if v is not None])
                if text and self._trailing:
                    text += "\x02"
            else:
                text = ""
        else:
            props = None
        try:
            props_b = text.encode()
        except UnicodeEncodeError:  # lone surrogates: replaced, as prepare() does
            props_b = text.encode("utf-8", "replace")
        plen = len(props_b)
        body = msg.body or b""
        blen = len(body)
        # <= 16383 bytes: neither 4.9's 32767-char rule nor the 32767-byte rule applies.
        if plen > 16383 or blen > self._max_body:
            return None
        born, store = msg.born_host, msg.store_host
        hosts = self._hosts
        if born is not hosts[0] or store is not hosts[1]:
            hosts = self._hosts_entry(born, store)
        _, _, fixed, st, host_bits, prefix = hosts
        total = fixed + blen + tlen + plen
        if total > self._max_total:
            return None
        sys_flag = (msg.sys_flag & _NOT_HOST_BITS) | host_bits
        crc = _crc32(body) & BODY_CRC_MASK
        plen_b = _PROPS_LEN_BYTES[plen]
        if plen_b is None:
            plen_b = _PROPS_LEN_BYTES[plen] = _PROPS_LEN.pack(plen)
        tail = b"".join((body, tblock, plen_b, props_b))
        queue_id = msg.queue_id
        # acquire/release, not ``with``: the context protocol costs about twice as much
        # per put as the two calls.
        lock = self.lock
        lock.acquire()
        try:
            end = self.end
            if end + total + 8 > self._alloc_end:  # no allocated room for it and a BLANK
                self._make_room(total)
                end = self.end
            if sys_flag & NO_QUEUE_OFFSET_BIT:  # rules.advances_queue_offset, inline
                qoff = 0  # PREPARED / ROLLBACK: 0, and no advance (spec §3.2)
            else:
                counters = self.queue_offsets
                key = (topic, queue_id)
                qoff = counters.get(key, 0)
                counters[key] = qoff + 1
            ts = now_ms() if stamp else msg.store_timestamp
            buf = self._buf
            pos = end - self._seg_start
            # Tail, then the fixed fields with TOTALSIZE 0, then TOTALSIZE: a concurrent
            # scan sees zeros (end of data) until the whole record is there.
            buf[pos + fixed:pos + total] = tail
            st.pack_into(buf, pos, 0, magic, crc, queue_id, msg.flag, qoff, end, sys_flag,
                         msg.born_timestamp, born[0], born[1], ts, store[0], store[1],
                         msg.reconsume_times, msg.prepared_transaction_offset, blen)
            _TOTAL_SIZE.pack_into(buf, pos, total)
            self.end = end + total
            self.last_store_timestamp = ts
            self.last_record_offset = end
            if record is not None:
                try:
                    record(topic, queue_id, qoff, end, total, sys_flag, ts, props, text)
                except StoreIOError as e:
                    self.dispatch_failed(e)
        finally:
            lock.release()
        return _put_ok(end, total, qoff, ts, prefix)

    def _hosts_entry(self, born, store) -> tuple:
        """(born host, store host, fixed-part size, its struct, host sysFlag bits, msgId
        prefix) for a host pair, kept as :attr:`_hosts` for the next put: most messages
        carry the same two Host objects, which put_message then recognises by identity."""
        fixed, st, host_bits = self._fixed[(len(born[0]) == 16) + 2 * (len(store[0]) == 16)]
        prefix = self._msg_id_prefix.get(store)
        if prefix is None:
            prefix = offset_msg_id_prefix(store)
            if len(self._msg_id_prefix) < 1024:
                self._msg_id_prefix[store] = prefix
        self._hosts = hosts = (born, store, fixed, st, host_bits, prefix)
        return hosts

    # --- the vectorised batch -------------------------------------------------------------

    def put_batch_message(self, msgs: Sequence[Message], stamp: bool, record_many=None):
        """A regular batch (spec §3.7) encoded with numpy: the bytes, checks and statuses
        of prepare() + :meth:`append_batch` for the usual batch. Returns None when the
        batch needs the general path (a refused message, magic v2, mixed host widths,
        long properties or bodies), or (results, first record offset).

        ``record_many(columns)`` dispatches the records under the lock.
        """
        n = len(msgs)
        cols = list(zip(*map(_BATCH_FIELDS, msgs)))
        (topics, bodies, props, texts, queue_ids, flags, sys_flags, born_ts, born_hosts,
         store_ts, store_hosts, reconsume, prepared, magics) = cols
        if magics.count(_MAGIC_V1) != n:
            return None
        distinct = set(topics)
        blocks = {}
        for t in distinct:
            entry = self._topics.get(t) or self._topic_entry(t)
            if entry is None or entry[0] != _MAGIC_V1:
                return None
            blocks[t] = entry[1]
        born_set, store_set = set(born_hosts), set(store_hosts)
        born6 = {len(h[0]) == 16 for h in born_set}
        store6 = {len(h[0]) == 16 for h in store_set}
        if len(born6) != 1 or len(store6) != 1:
            return None
        k = born6.pop() + 2 * store6.pop()
        fixed, _, host_bits = self._fixed[k]
        dtype = self._batch_dtypes[k]
        # Properties text, as prepare() makes it.
        if texts.count(None) == n:
            try:
                texts = ["\x02".join(map(_NAME_VALUE, p.items())) if p else "" for p in props]
            except TypeError:  # a None (skipped) or non-str value somewhere
                texts = [_props_text(p, False) for p in props]
            if self._trailing:
                texts = [t + "\x02" if t else t for t in texts]
            parsed = props
        else:
            # Some messages carry their stored text: dispatch parses the texts (prepare()).
            texts = [_props_text(p, self._trailing) if t is None else t for t, p in zip(texts, props)]
            parsed = None
        try:
            props_b = list(map(str.encode, texts))
        except UnicodeEncodeError:
            props_b = [t.encode("utf-8", "replace") for t in texts]
        if None in bodies:
            bodies = [b or b"" for b in bodies]
        plens = np.fromiter(map(len, props_b), dtype=np.int64, count=n)
        blens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
        if int(plens.max()) > 16383 or int(blens.max()) > self._max_body:
            return None
        if len(distinct) == 1:
            tblock = blocks[topics[0]]
            tblocks = itertools.repeat(tblock, n)
            tlens = len(tblock)
        else:
            tblocks = [blocks[t] for t in topics]
            tlens = np.fromiter(map(len, tblocks), dtype=np.int64, count=n)
        totals = fixed + blens + tlens + 2 + plens
        total = int(totals.sum())
        if int(totals.max()) > self._max_total or total + L.END_FILE_MIN_BLANK_LENGTH > self.size:
            return None  # prepare() refuses a record, or the batch cannot fit a segment
        crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n) & BODY_CRC_MASK
        sys_arr = (np.array(sys_flags, dtype=np.int64) & ~_HOST_BITS) | host_bits
        advance = advances_queue_offset(sys_arr)
        qids = np.array(queue_ids, dtype=np.int64)
        # Key codes for (topic, queueId): consecutive queue offsets per key, in batch order.
        if len(distinct) == 1:
            uq, codes = np.unique(qids, return_inverse=True)
            keys = [(topics[0], q) for q in uq.tolist()]
        else:
            kmap: dict = {}
            codes = np.fromiter((kmap.setdefault(x, len(kmap)) for x in zip(topics, queue_ids)),
                                dtype=np.int64, count=n)
            keys = list(kmap)
        codes = np.where(advance, codes, len(keys))
        order = np.argsort(codes, kind="stable")
        sc = codes[order]
        starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
        counts = np.diff(np.r_[starts, n])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - np.repeat(starts, counts)
        used = np.bincount(codes, minlength=len(keys) + 1)[:len(keys)]
        plen_b = list(map(_PROPS_LEN.pack, plens.tolist()))
        rel = np.cumsum(totals) - totals
        hdr = np.zeros(n, dtype=dtype)
        hdr["total_size"] = totals
        hdr["magic"] = _MAGIC_V1
        hdr["body_crc"] = crcs
        hdr["queue_id"] = qids
        hdr["flag"] = _column(flags)
        hdr["sys_flag"] = sys_arr
        hdr["born_timestamp"] = _column(born_ts)
        for hosts, hset, which in ((born_hosts, born_set, "born_host"), (store_hosts, store_set, "store_host")):
            if len(hset) == 1:
                h = next(iter(hset))
                hdr[which + "_address"] = np.frombuffer(h[0], dtype=np.uint8)
                hdr[which + "_port"] = h[1]
            else:
                hdr[which + "_address"] = np.frombuffer(b"".join([h[0] for h in hosts]),
                                                        dtype=np.uint8).reshape(n, -1)
                hdr[which + "_port"] = np.array([h[1] for h in hosts], dtype=np.int64)
        hdr["reconsume_times"] = _column(reconsume)
        hdr["prepared_transaction_offset"] = _column(prepared)
        hdr["body_length"] = blens
        with self.lock:
            start = self.reserve(total)
            phys = start + rel
            counters = self.queue_offsets
            base = np.array([counters.get(key, 0) for key in keys] + [0], dtype=np.int64)
            qoffs = np.where(advance, base[codes] + rank, 0)
            if stamp:
                now = now_ms()
                ts_list = [now] * n
                hdr["store_timestamp"] = now
            else:
                ts_list = store_ts
                hdr["store_timestamp"] = _column(store_ts)
            hdr["queue_offset"] = qoffs
            hdr["physical_offset"] = phys
            heads = hdr.view(f"V{fixed}").tolist()
            data = b"".join(itertools.chain.from_iterable(zip(heads, bodies, tblocks, plen_b, props_b)))
            self._place(data, total)
            for key, b, u in zip(keys, base.tolist(), used.tolist()):  # once written
                if u:
                    counters[key] = b + u
            self.last_store_timestamp = ts_list[-1]
            self.last_record_offset = int(phys[-1])
            if record_many is not None:
                try:
                    record_many(topics, distinct, qids, qoffs, phys, totals, sys_arr, ts_list,
                                parsed, texts)
                except StoreIOError as e:
                    self.dispatch_failed(e)
        if len(store_set) == 1:
            prefix = self._msg_id_prefix.get(store_hosts[0]) or offset_msg_id_prefix(store_hosts[0])
            prefixes = itertools.repeat(prefix, n)
        else:
            prefixes = [offset_msg_id_prefix(h) for h in store_hosts]
        return PutResults(phys, totals, qoffs, ts_list, prefixes)

    def dispatch_failed(self, e: StoreIOError) -> None:
        """Dispatch of records already written failed (a full disk): tell the store, or
        raise when nobody listens."""
        if self.on_dispatch_error is None:
            raise e
        self.on_dispatch_error(e)

    @property
    def current_segment(self) -> Segment | None:
        return self._seg


def bench_messages(count: int, body_size: int = 100, queues: int = 8, topic: str = "BenchTopic"):
    """The benchmark's messages: fixed body, TAGS and one KEYS token each, round-robin
    over ``queues`` queues (so dispatch writes CQ units and an index entry per message)."""
    body = b"x" * body_size
    tags = [f"Tag{i % 4}" for i in range(4)]
    for i in range(count):
        yield Message(topic=topic, body=body, queue_id=i % queues,
                      properties={"TAGS": tags[i % 4], "KEYS": f"k{i}"},
                      born_timestamp=1, store_timestamp=1)


def bench_columns(count: int, body_size: int = 100, queues: int = 8, topic: str = "BenchTopic"):
    """:func:`bench_messages` as columns: (topic, bodies, queue ids, TAGS, KEYS)."""
    body = b"x" * body_size
    tags = [f"Tag{i % 4}" for i in range(4)]
    return (topic, [body] * count, np.arange(count, dtype=np.int64) % queues,
            [tags[i % 4] for i in range(count)], [f"k{i}" for i in range(count)])


def bench_append(root, count: int = 200_000, *, body_size: int = 100, batch: int = 0,
                 flush_disk_type: str = "ASYNC_FLUSH", dispatch: str = "sync",
                 segment_size: int = 1 << 30, threads: int = 1, columns: bool = False) -> dict:
    """Append ``count`` messages into a new store at ``root`` and time it (from the first
    put to a clean close, so flushing and dispatch are included).

    ``batch`` > 0 uses :meth:`MessageStore.put_batch` with that many messages per call;
    ``columns`` (with ``batch``) gives the same messages to
    :meth:`MessageStore.put_columns` as column slices instead;
    ``threads`` writers share the work. Returns messages, bytes, seconds, msgs_per_s.
    """
    from .store import MessageStore

    cfg = StoreConfig(mapped_file_size_commit_log=segment_size, flush_disk_type=flush_disk_type)
    st = MessageStore.open(root, cfg, create=True, dispatch=dispatch)
    per = -(-count // threads)
    if columns:
        if not batch:
            raise ValueError("columns=True needs batch > 0")
        topic, bodies, qids, tags, keys = bench_columns(count, body_size)
        chunks = [range(i, min(i + per, count)) for i in range(0, count, per)]
    else:
        msgs = list(bench_messages(count, body_size))
        chunks = [msgs[i:i + per] for i in range(0, count, per)]

    def work(chunk):
        if columns:
            put = st.put_columns
            for i in range(chunk.start, chunk.stop, batch):
                j = min(i + batch, chunk.stop)
                put(topic=topic, bodies=bodies[i:j], queue_ids=qids[i:j],
                    properties={"TAGS": tags[i:j], "KEYS": keys[i:j]},
                    born_timestamp=1, store_timestamp=1)
        elif batch:
            for i in range(0, len(chunk), batch):
                st.put_batch(chunk[i:i + batch])
        else:
            put = st.put
            for m in chunk:
                put(m)

    t0 = time.perf_counter()
    if threads == 1:
        work(chunks[0])
    else:
        workers = [threading.Thread(target=work, args=(c,)) for c in chunks]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    end = st.appender.end
    st.close()
    seconds = time.perf_counter() - t0
    return {"messages": count, "bytes": end, "seconds": seconds,
            "msgs_per_s": count / seconds if seconds else float("inf")}


def clear_unfinished_append(queue: SegmentQueue, end: int) -> int:
    """After a crash: zero the bytes an interrupted append left after ``end``, the end of
    valid data (spec §10.1); returns how many bytes were cleared.

    The appender writes a record's (or BLANK's) TOTALSIZE last, so an append the writer died
    in leaves a zero TOTALSIZE at ``end`` followed by some of the record's other bytes:
    garbage to every reader (§10.5), and bytes the next append would overwrite anyway. A
    broker writes TOTALSIZE first, so its torn records never start with zeros; those are left
    as the broker's recovery leaves them (§10.4).
    """
    try:
        seg, pos = queue.find(end)
    except OffsetError:
        return 0  # end is a segment's end (or the log is empty): nothing after it here
    buf = seg.buffer()
    if bytes(buf[pos:pos + 4]).strip(b"\0"):
        return 0  # a TOTALSIZE: not an append of ours
    step = 1 << 20
    hi = pos  # one past the last non-zero byte: searched from the end back, in data only
    for lo_ext, hi_ext in reversed(_data_extents(seg.path, pos, seg.readable_size)):
        while hi_ext > lo_ext and hi == pos:
            lo = max(lo_ext, hi_ext - step)
            nz = np.flatnonzero(np.frombuffer(buf, np.uint8, count=hi_ext - lo, offset=lo))
            if len(nz):
                hi = lo + int(nz[-1]) + 1
            hi_ext = lo
        if hi > pos:
            break
    zeros = bytes(min(step, hi - pos))
    for at in range(pos, hi, step):
        segment_pwrite(seg, zeros[:min(step, hi - at)], at)
    if hi > pos:
        segment_sync(seg)
    return hi - pos


def _data_extents(path, lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of ``[lo, hi)`` of a file that hold data, not holes (SEEK_DATA/SEEK_HOLE):
    a preallocated 1 GiB segment is mostly hole. The whole range where not supported."""
    if not hasattr(os, "SEEK_DATA"):
        return [(lo, hi)]
    out = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        at = lo
        while at < hi:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after ``at``
                    break
                return [(lo, hi)]
            if start >= hi:
                break
            at = min(os.lseek(fd, start, os.SEEK_HOLE), hi)
            out.append((start, at))
    finally:
        os.close(fd)
    return out
