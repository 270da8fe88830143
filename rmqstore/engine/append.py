"""The CommitLog appender: records into segments, BLANK at a segment's end, queue offsets.

This is the broker's ``CommitLog.putMessage`` / ``putMessages`` path without the network:
a message checked and part-encoded by :func:`rmqstore.engine.prepare.prepare` (spec §3.6,
§3.1) is written under the store-wide append lock, which assigns its QUEUEOFFSET (§3.2),
PHYSICALOFFSET and, when asked, STORETIMESTAMP. A record that does not fit the rest of
the segment leaves an 8-byte BLANK there and moves to the next one (§4); a batch moves
as a whole (§3.7). :meth:`CommitLogAppender.put_message` is the single put's fast path
(check, encode and append in one step); the vectorised batches are
:mod:`rmqstore.engine.batch`'s, what a put reports :mod:`rmqstore.engine.results`'.
Durability is :mod:`rmqstore.engine.flush`'s business, CQ and index
:mod:`rmqstore.engine.dispatch`'s.

Concurrent readers of the files see only whole records: a record's bytes are written
tail first and its TOTALSIZE field last, so until then a scan finds zeros (end of data).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from ..errors import StoreIOError
from ..files.config import StoreConfig
from ..files.names import topic_problem
from ..files.segments import Segment, SegmentQueue, segment_ahead, segment_pwrite
from ..format import layout as L
from ..format.crc import BODY_CRC_MASK, crc32, prop_crc_entry, record_prop_crc
from ..format.message import Message, offset_msg_id, offset_msg_id_prefix
from ..format.record import pack_head, topic_field
from ..format.rules import NO_QUEUE_OFFSET_BIT, magic_for, queue_offset_advance, topic_field_refusal
from .prepare import FAST_PROPS_MAX, Prepared, topic_length_refusal
from .results import Appended, PutResult, PutStatus, put_ok

_PWRITE_MIN = 64 * 1024  # bytes from which place() writes with pwrite, not the mapping
#: Segment bytes allocated at a time ahead of the write position: a store through the
#: map into an unallocated page on a full disk is a SIGBUS, an allocation that fails is
#: an error before any byte changes. One posix_fallocate per 16 MiB costs nothing a put.
ALLOCATE_AHEAD = 16 << 20

_MAGIC, _MAGIC_AT = L.HEAD_FIELD_STRUCT["magic"], L.OFFSET_OF["magic"]
_TOTAL_SIZE = L.RECORD_TOTAL_SIZE_STRUCT
_PROPS_LEN = L.RECORD_PROPERTIES_LENGTH_STRUCT
# PROPERTIESLENGTH fields of the lengths the single put takes (< 16 KiB), each packed on
# first use: a list index is cheaper than a pack call per put.
_PROPS_LEN_BYTES: list = [None] * (FAST_PROPS_MAX + 1)
_NOT_HOST_BITS = ~(L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6)
_crc32 = crc32  # format/crc: zlib's CRC-32, through ISA-L where installed
_MAGIC_V1 = L.MAGIC_V1
_BLANK = L.END_FILE_MIN_BLANK_LENGTH
_NAME_VALUE = L.PROPERTY_NAME_VALUE_SEPARATOR.join


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        # RocketMQ 5.x BatchCQ topics (the store sets them): an inner batch advances its
        # queue's offset by INNER_NUM (design-14 §4.2).
        self.batch_topics: frozenset = frozenset()
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
        self.trailing = config.trailing_separator
        self.max_body = config.max_message_size
        # A record up to this size passes both size checks of prepare().
        self.max_total = min(config.max_message_size + 65536,
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

    def _next_queue_offset(self, p: Prepared) -> tuple[tuple[str, int], int, int]:
        """(queue key, the record's QUEUEOFFSET, how far the counter then moves)."""
        key = (p.msg.topic, p.msg.queue_id)
        advance = queue_offset_advance(p.sys_flag, p.properties, p.msg.topic in self.batch_topics)
        if not advance:
            return key, 0, 0  # PREPARED / ROLLBACK: 0, and no advance (spec §3.2)
        return key, self.queue_offsets.get(key, 0), advance

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next record of (topic, queueId) gets (caller holds the lock)."""
        return self.queue_offsets.get((topic, queue_id), 0)

    def _encode(self, p: Prepared, phys: int, queue_offset: int, store_ts: int) -> bytes:
        m = p.msg
        data = pack_head(p.key, p.total, p.magic, p.crc, p.sys_flag, m, queue_offset, phys,
                         store_ts, len(m.body or b"")) + p.tail
        if p.prop_crc:  # over the whole record as placed, offsets and time included (§3.8)
            body = data[:-L.PROP_CRC_ENTRY_SIZE]
            data = body + prop_crc_entry(record_prop_crc(data))
        return data

    def place(self, data, n: int) -> int:
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
        self.place(data, p.total)
        if advance:
            self.queue_offsets[key] = qoff + advance
        self.last_store_timestamp = store_ts
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
                counters[key] = qoff + advance
            results.append(PutResult(PutStatus.PUT_OK, phys, p.total, qoff, ts,
                                     offset_msg_id(m.store_host, phys)))
            appended.append(Appended(phys, p.total, m.topic, m.queue_id, qoff, p.sys_flag, ts,
                                     p.properties))
            phys += p.total
            self.last_store_timestamp = ts
        data = b"".join(chunks)
        try:
            self.place(data, len(data))
        except BaseException:
            for key, v in before.items():
                if v is None:
                    counters.pop(key, None)
                else:
                    counters[key] = v
            raise
        return results, appended

    def append_encoded(self, data, total: int, count: int, last_store_timestamp: int) -> int:
        """Place ``total`` bytes of ready records (the vectorised batch path) that were
        encoded for PHYSICALOFFSET :meth:`reserve` returned. Caller holds the lock."""
        self.place(data, total)
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
        if topic_length_refusal(topic, topic_b, self._v5) or topic_problem(topic) is not None:
            return None
        magic = magic_for(topic, auto=self._v5)
        if topic_field_refusal(topic_b, magic) is not None:
            return None
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
                if text and self.trailing:
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
        if plen > FAST_PROPS_MAX or blen > self.max_body:  # prepare() measures those
            return None
        born, store = msg.born_host, msg.store_host
        hosts = self._hosts
        if born is not hosts[0]:
            # Born hosts vary by client; only their width matters here (spec §3.2:
            # the sysFlag bit and the fixed part's size), the rest is the store host's.
            if store is not hosts[1] or len(born[0]) != len(hosts[0][0]):
                hosts = self._hosts_entry(born, store)
        elif store is not hosts[1]:
            hosts = self._hosts_entry(born, store)
        _, _, fixed, st, host_bits, prefix = hosts
        total = fixed + blen + tlen + plen
        if total > self.max_total:
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
            if end + total + _BLANK > self._alloc_end:  # no allocated room for it and a BLANK
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
            if record is not None:
                try:
                    record(topic, queue_id, qoff, end, total, sys_flag, ts, props, text)
                except StoreIOError as e:
                    self.dispatch_failed(e)
        finally:
            lock.release()
        return put_ok(end, total, qoff, ts, prefix)

    # --- what the vectorised batches (rmqstore.engine.batch) build records with ----------

    def topic_entry(self, topic: str):
        """(magic, TOPICLENGTH field + topic bytes, their length + PROPERTIESLENGTH's) for
        a message of ``topic``, or None when prepare() would refuse the topic (cached)."""
        return self._topics.get(topic) or self._topic_entry(topic)

    def host_layout(self, k: int) -> tuple:
        """(fixed-part size, its numpy dtype, host sysFlag bits) for host widths
        ``k`` = born v6 + 2 * store v6 (``layout.RECORD_FIXED_DTYPE``)."""
        fixed, _, host_bits = self._fixed[k]
        return fixed, self._batch_dtypes[k], host_bits

    def msg_id_prefix(self, store) -> str:
        """The offsetMsgId prefix (store host) of ``store`` (cached)."""
        prefix = self._msg_id_prefix.get(store)
        if prefix is None:
            prefix = offset_msg_id_prefix(store)
            if len(self._msg_id_prefix) < 1024:
                self._msg_id_prefix[store] = prefix
        return prefix

    def _hosts_entry(self, born, store) -> tuple:
        """(born host, store host, fixed-part size, its struct, host sysFlag bits, msgId
        prefix) for a host pair, kept as :attr:`_hosts` for the next put: most messages
        carry the same two Host objects, which put_message then recognises by identity."""
        fixed, st, host_bits = self._fixed[(len(born[0]) == 16) + 2 * (len(store[0]) == 16)]
        prefix = self.msg_id_prefix(store)
        self._hosts = hosts = (born, store, fixed, st, host_bits, prefix)
        return hosts

    def dispatch_failed(self, e: StoreIOError) -> None:
        """Dispatch of records already written failed (a full disk): tell the store, or
        raise when nobody listens."""
        if self.on_dispatch_error is None:
            raise e
        self.on_dispatch_error(e)

    @property
    def current_segment(self) -> Segment | None:
        return self._seg
