"""Dispatch ("reput"): each CommitLog record into its ConsumeQueue and the IndexFile (spec §9).

For every record, in CommitLog order:

1. **ConsumeQueue** (§6.1): only transaction types NOT_TYPE and COMMIT get a unit, at
   (topic, queueId, QUEUEOFFSET); tagsCode is the TAGS hash, or the delivery time for
   ``SCHEDULE_TOPIC_XXXX`` (:func:`rmqstore.format.rules.tags_code` with ``config.delay_millis``).
   After a CQ write the checkpoint's logicsMsgTimestamp follows the record (§8.1).
2. **Index** (§7.3): unless ROLLBACK, ``topic#UNIQ_KEY`` then ``topic#token`` for each
   KEYS token, with the record's offset and store timestamp.

:class:`Dispatcher` does this synchronously, for records the appender has just written
(it already knows their fields, so nothing is re-read); its index side, and the keys
that wait to be put together, are :class:`~rmqstore.engine.index_keys.IndexKeys`'. Many
records at once go through the one bulk dispatch,
:func:`rmqstore.engine.batch_dispatch.dispatch_columns`.
:class:`~rmqstore.engine.dispatch_modes.BackgroundDispatcher` runs it on a thread that
follows the appender, like the broker's ReputMessageService.
:meth:`Dispatcher.dispatch_log` re-reads records from the files, for catching up after a
crash or when reopening a store whose queues lag its CommitLog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..format import layout as L
from .append import Appended
from .batch_dispatch import appended_columns, dispatch_columns
from ..format.rules import (SCHEDULE_TOPIC, bcq_base_and_num, gets_cq_unit, gets_index_keys,
                            lmq_targets, tags_hash)
from ..format.message import parse_properties
from ..files.batchconsumequeue import FOLDER as BCQ_FOLDER, BatchConsumeQueueWriter
from ..files.consumequeue_writer import ConsumeQueueWriter
from ..format.hashing import token_hash
from ..files.names import queue_dir
from .index_keys import DEFER_BYTES, DEFER_MAX, PENDING_MAX, IndexKeys

__all__ = ["DEFER_BYTES", "DEFER_MAX", "Dispatcher"]

_TAGS_CACHE_MAX = 1 << 16
_TX_MASK = L.SYSFLAG_TRANSACTION_MASK  # any transaction type takes the general path
_UNIT = L.CQ_UNIT_SIZE
_unit_pack_into = L.CQ_UNIT_STRUCT.pack_into


class Dispatcher(IndexKeys):
    """Writes CQ units and index keys for appended records (the caller serialises calls)."""

    def __init__(self, config, *, index=None, on_logics=None):
        IndexKeys.__init__(self, index if config.message_index_enable else None)
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self.cq_file_size = config.cq_file_size
        self.delay_millis = config.delay_millis
        self.on_logics = on_logics or (lambda ts: None)
        self._writers: dict[tuple[str, int], ConsumeQueueWriter] = {}
        self._tags: dict[str, int] = {}
        self.dispatched = 0  # records handled
        self.logics_timestamp = 0
        # RocketMQ 5.x queue kinds (configure_5x): BatchCQ topics, LMQ multi-dispatch.
        self._special = False
        self._bcq_writers: dict[tuple[str, int], BatchConsumeQueueWriter] = {}
        self.batch_topics: frozenset = frozenset()
        self.multi_dispatch = self.enable_lmq = False
        self.bcq_file_size = config.mapper_file_size_batch_consume_queue

    def configure_5x(self, kinds) -> None:
        """Dispatch as a 5.x broker whose store has ``kinds``
        (:class:`~rmqstore.engine.load.QueueKinds`): records of BatchCQ topics get a
        BatchConsumeQueue unit instead of a ConsumeQueue unit (design-14 §4.2), records
        LMQ dispatches get their ``%LMQ%`` units after their own (§5.2). Such a store takes
        the per-record path everywhere (the bulk forms below hand over to it)."""
        self.batch_topics = kinds.batch_topics
        self.multi_dispatch, self.enable_lmq = kinds.multi_dispatch, kinds.enable_lmq
        if kinds.bcq_file_size:
            self.bcq_file_size = kinds.bcq_file_size
        self._special = kinds.any
        if self._special:
            self.dispatch_record = self._dispatch_record  # no inline 4.x fast path

    def _units_5x(self, topic: str, queue_id: int, queue_offset: int, offset: int, size: int,
                  code: int, store_timestamp: int, props) -> None:
        """The queue units of one record of a 5.x store (gets_cq_unit already true)."""
        if topic in self.batch_topics:
            base, num = bcq_base_and_num(props, queue_offset)
            w = self._bcq_writers.get((topic, queue_id))
            if w is None:
                w = self._bcq_writers[(topic, queue_id)] = BatchConsumeQueueWriter(
                    queue_dir(self.root / BCQ_FOLDER, topic, queue_id,
                              where=self.root / "commitlog", offset=offset),
                    self.bcq_file_size)
            if w.put(offset, size, code, store_timestamp, base, num):
                self.logics_timestamp = store_timestamp
            return  # no LMQ dispatch from a BatchConsumeQueue (design-14 §4.2)
        if self._writer(topic, queue_id, offset).put(queue_offset, offset, size, code):
            self.logics_timestamp = store_timestamp
        if self.multi_dispatch:
            for name, qid, at in lmq_targets(topic, props, queue_id, enable_lmq=self.enable_lmq):
                if self._writer(name, qid, offset).put(at, offset, size, code):
                    self.logics_timestamp = store_timestamp

    def _writer(self, topic: str, queue_id: int, offset: int | None = None) -> ConsumeQueueWriter:
        w = self._writers.get((topic, queue_id))
        if w is None:
            # UnsafePathError for a topic that is not one safe directory name (a record
            # written by something else: append refuses such topics).
            w = ConsumeQueueWriter(queue_dir(self.root / "consumequeue", topic, queue_id,
                                             where=self.root / "commitlog", offset=offset),
                                   self.cq_file_size)
            self._writers[(topic, queue_id)] = w
        return w

    def _tags_code(self, topic: str, props: dict, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC and "DELAY" in props:
            from ..format.rules import tags_code
            return tags_code(topic, props, store_ts, self.delay_millis)
        return self.tags_code_of(props.get("TAGS"))

    def tags_code_of(self, tags: str | None) -> int:
        """tagsCode of a TAGS value outside SCHEDULE_TOPIC (0 for none or empty)."""
        if not tags:
            return 0
        code = self._tags.get(tags)
        if code is None:
            # Tags repeat a lot; the Java hash of each distinct one is computed once.
            if len(self._tags) >= _TAGS_CACHE_MAX:
                self._tags.clear()
            code = self._tags[tags] = tags_hash(tags)
        return code

    def queue_writer(self, key: tuple[str, int]) -> ConsumeQueueWriter:
        """The writer of queue ``key`` (topic, queueId), opened on first use."""
        w = self._writers.get(key)
        return w if w is not None else self._writer(*key)

    def put_units(self, key: tuple[str, int], queue_offset: int, data: bytes,
                  first_end: int, last_end: int, units: np.ndarray) -> None:
        """CQ units ``data`` (``units`` as ``CQ_UNIT_DTYPE``) for consecutive queue offsets
        from ``queue_offset`` and ascending CommitLog ends ``first_end`` .. ``last_end``, into
        queue ``key`` (:meth:`ConsumeQueueWriter.put_block`)."""
        w = self._writers.get(key)
        if w is None:
            w = self._writer(*key)
        w.put_block(queue_offset, data, first_end, last_end, units)

    def dispatch(self, a: Appended) -> None:
        """Both dispatchers for one record, in the broker's order (spec §9 step 2)."""
        self.settle_index()
        props = a.properties
        if gets_cq_unit(a.sys_flag):
            code = self._tags_code(a.topic, props, a.store_timestamp)
            if self._special:
                self._units_5x(a.topic, a.queue_id, a.queue_offset, a.offset, a.size, code,
                               a.store_timestamp, props)
            elif self._writer(a.topic, a.queue_id, a.offset).put(a.queue_offset, a.offset, a.size, code):
                self.logics_timestamp = a.store_timestamp
        if self.index is not None:
            # IndexService applies the §7.3 rules (endPhyOffset skip, ROLLBACK) itself.
            k = props.get("KEYS")
            self.index.build_index(a.topic, props.get("UNIQ_KEY"), k.split(" ") if k else (),
                                   a.offset, a.store_timestamp, a.sys_flag)
        self.dispatched += 1

    def dispatch_record(self, topic: str, queue_id: int, queue_offset: int, offset: int,
                        size: int, sys_flag: int, store_timestamp: int, props: dict | None,
                        text: str = "") -> None:
        """:meth:`dispatch` for one record given as fields (the appender's fast put);
        ``props`` None means parse ``text``. Same bytes, same order.

        The usual record (NOT_TYPE, not SCHEDULE_TOPIC, parsed properties, ASCII keys)
        is handled inline: the CQ writer's next-unit store and the index key hashes
        without a call each; anything else takes :meth:`_dispatch_record`."""
        if props is None or sys_flag & _TX_MASK or topic == SCHEDULE_TOPIC:
            return self._dispatch_record(topic, queue_id, queue_offset, offset, size, sys_flag,
                                         store_timestamp, props, text)
        tags = props.get("TAGS")
        if tags:
            code = self._tags.get(tags)
            if code is None:
                code = self.tags_code_of(tags)
        else:
            code = 0
        w = self._writers.get((topic, queue_id))
        if w is None:
            w = self._writer(topic, queue_id)
        # ConsumeQueueWriter.put's usual case (the next unit, in the mapped segment).
        pos = w.write_pos
        end = offset + size
        if end > self._lag_end and self._pending:
            # The waiting keys go before this record's unit: while keys wait, the queues
            # end within _lag_end, the bound a reopen after a crash re-indexes from.
            self._drain()
        # (write_pos is None before the queue's first unit: never equal to an int)
        if queue_offset * _UNIT == pos and end > w.max_physic_offset:
            rel = pos - w._map_start
            if 0 <= rel < w._map_alloc and w._map_start == w._starts[-1]:  # allocated
                _unit_pack_into(w._map_cur, rel, offset, size, code)
                w.write_pos = pos + _UNIT
                w.max_physic_offset = end
                self.logics_timestamp = store_timestamp
            elif w.put(queue_offset, offset, size, code):
                self.logics_timestamp = store_timestamp
        elif w.put(queue_offset, offset, size, code):
            self.logics_timestamp = store_timestamp
        index = self.index
        if index is not None:
            k = props.get("KEYS")
            if self._room > 1 and end <= self._lag_end:
                # The usual record: its keys wait in the write-behind list and are hashed
                # and put with the others (same bytes, a fraction of the calls). Waiting
                # keys are never more than DEFER_MAX, never from a record starting over
                # DEFER_BYTES before the last dispatched record's end, and always fit in
                # the current index file.
                uniq = props.get("UNIQ_KEY")
                if k or uniq is not None:
                    # Flat (topic, key, offset, timestamp) runs: a tuple kept per record
                    # would wake the cycle collector every 700 puts.
                    pend = self._pending
                    if uniq is not None:
                        pend += (topic, uniq, offset, store_timestamp)
                        self._room -= 1
                    if k:
                        if " " not in k:
                            pend += (topic, k, offset, store_timestamp)
                            self._room -= 1
                        else:
                            self._wait_tokens(topic, k, offset, store_timestamp)
                    if len(pend) >= PENDING_MAX:
                        self._drain()
                        self._lag_end = end + DEFER_BYTES
            else:
                self._index_record(topic, props, k, offset, end, store_timestamp)
        self.dispatched += 1

    def _dispatch_record(self, topic: str, queue_id: int, queue_offset: int, offset: int,
                         size: int, sys_flag: int, store_timestamp: int, props: dict | None,
                         text: str = "") -> None:
        """:meth:`dispatch_record` for any record (the general rules)."""
        self.settle_index()
        if props is None:
            props = parse_properties(text)
        if gets_cq_unit(sys_flag):
            tags = props.get("TAGS")
            if topic == SCHEDULE_TOPIC:
                code = self._tags_code(topic, props, store_timestamp)
            elif tags:
                code = self._tags.get(tags)
                if code is None:
                    code = self._tags_code(topic, props, store_timestamp)
            else:
                code = 0
            if self._special:
                self._units_5x(topic, queue_id, queue_offset, offset, size, code,
                               store_timestamp, props)
            else:
                w = self._writers.get((topic, queue_id))
                if w is None:
                    w = self._writer(topic, queue_id)
                if w.put(queue_offset, offset, size, code):
                    self.logics_timestamp = store_timestamp
        index = self.index
        if index is not None:
            files = self._index_files(index)
            f = files[-1]
            # The §7.3 rules: offset below the file's endPhyOffset, or ROLLBACK: no keys.
            if offset >= f.header.end_phy_offset and gets_index_keys(sys_flag):
                uniq = props.get("UNIQ_KEY")
                k = props.get("KEYS")
                if uniq is not None or k:
                    ph = self._key_prefix.get(topic)
                    if ph is None:
                        ph = self._topic_prefix_hash(topic)
                    if uniq is not None:
                        h = token_hash(ph, topic, uniq)
                        if not files[-1].put(h, offset, store_timestamp):
                            index.put_hash(h, offset, store_timestamp)  # full: next file
                    if k:
                        for t in k.split(" "):
                            if t:
                                h = token_hash(ph, topic, t)
                                if not files[-1].put(h, offset, store_timestamp):
                                    index.put_hash(h, offset, store_timestamp)
        self.dispatched += 1

    def dispatch_many(self, records: Sequence[Appended]) -> None:
        """:meth:`dispatch` for records in CommitLog order, in bulk: the one columnar
        dispatch, :func:`rmqstore.engine.batch_dispatch.dispatch_columns` (same bytes)."""
        if len(records) < 32 or self._special:  # (a 5.x store's queue kinds: per record)
            self.settle_index()
            for a in records:
                self.dispatch(a)
            return
        dispatch_columns(self, appended_columns(records))

    def dispatch_log(self, commitlog, start: int, end: int | None = None) -> int:
        """Re-read records in ``[start, end)`` from a :class:`~rmqstore.files.commitlog.CommitLog`
        and dispatch them (a reput from the files, spec §9). Returns the offset reached."""
        from ..files.commitlog import Check
        reached = start
        chunk: list[Appended] = []
        for off, c in commitlog.walk(start, check_crc=False):
            if end is not None and off >= end:
                break
            if c.status is Check.OK:
                m = commitlog.read_at(off)
                chunk.append(Appended(off, c.size, m.topic, m.queue_id, m.queue_offset,
                                      m.sys_flag, m.store_timestamp,
                                      parse_properties(m.properties_text or "")))
                if len(chunk) >= 4096:
                    self.dispatch_many(chunk)
                    chunk = []
                reached = off + c.size
            elif c.status is Check.END_OF_SEGMENT:
                reached = commitlog.queue.find(off)[0].end
            else:
                break
        self.dispatch_many(chunk)
        return reached

    def flush_queues(self, least_pages: int = 0) -> None:
        """Sync the ConsumeQueue files (see ConsumeQueueWriter.flush); the logics flush
        thread calls this while writers go on."""
        for w in list(self._writers.values()) + list(self._bcq_writers.values()):
            w.flush(least_pages)

    def flush(self) -> None:
        self.settle_index()
        for w in list(self._writers.values()) + list(self._bcq_writers.values()):
            w.flush()
        if self.index is not None and hasattr(self.index, "flush"):
            self.index.flush()

    def close(self) -> None:
        self.settle_index()
        self.release()

    def release(self) -> None:
        """Close the files without writing the index keys still waiting (after an I/O
        error; the next open re-dispatches them)."""
        for w in list(self._writers.values()) + list(self._bcq_writers.values()):
            w.close()
        self._writers, self._bcq_writers = {}, {}
        if self.index is not None:
            self.index.close()

