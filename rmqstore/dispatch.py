"""Dispatch ("reput"): each CommitLog record into its ConsumeQueue and the IndexFile (spec §9).

For every record, in CommitLog order:

1. **ConsumeQueue** (§6.1): only transaction types NOT_TYPE and COMMIT get a unit, at
   (topic, queueId, QUEUEOFFSET); tagsCode is the TAGS hash, or the delivery time for
   ``SCHEDULE_TOPIC_XXXX`` (:func:`rmqstore.codec.tags_code` with ``config.delay_millis``).
   After a CQ write the checkpoint's logicsMsgTimestamp follows the record (§8.1).
2. **Index** (§7.3): unless ROLLBACK, ``topic#UNIQ_KEY`` then ``topic#token`` for each
   KEYS token, with the record's offset and store timestamp.

:class:`Dispatcher` does this synchronously, for records the appender has just written
(it already knows their fields, so nothing is re-read). :class:`BackgroundDispatcher` does
it on a thread that follows the appender, like the broker's ReputMessageService.
:meth:`Dispatcher.dispatch_log` re-reads records from the files, for catching up after a
crash or when reopening a store whose queues lag its CommitLog.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Iterable, Sequence

from . import layout as L
from .append import Appended
from .codec import SCHEDULE_TOPIC, java_hash, parse_properties
from .consumequeue import ConsumeQueue, ConsumeQueueWriter, list_queues

_CQ_TYPES = (L.TRANSACTION_NOT_TYPE, L.TRANSACTION_COMMIT)
_TAGS_CACHE_MAX = 1 << 16


def queue_state(root: Path, cq_file_size: int) -> tuple[dict[tuple[str, int], int], int]:
    """(next queue offset per (topic, queueId), max physical end over all queues) as the
    broker rebuilds them after recovery (spec §9, §10.6); -1 when there are no units."""
    offsets: dict[tuple[str, int], int] = {}
    max_phy = -1
    for ref in list_queues(root).queues:
        with ConsumeQueue(ref.path, cq_file_size) as cq:
            offsets[(ref.topic, ref.queue_id)] = cq.max_offset
            max_phy = max(max_phy, cq.max_physic_offset)
    return offsets, max_phy


class Dispatcher:
    """Writes CQ units and index keys for appended records (the caller serialises calls)."""

    def __init__(self, config, *, index=None, on_logics=None):
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self.cq_file_size = config.cq_file_size
        self.delay_millis = config.delay_millis
        self.index = index if config.message_index_enable else None
        self.on_logics = on_logics or (lambda ts: None)
        self._writers: dict[tuple[str, int], ConsumeQueueWriter] = {}
        self._tags: dict[str, int] = {}
        self.dispatched = 0  # records handled
        self.logics_timestamp = 0

    def _writer(self, topic: str, queue_id: int) -> ConsumeQueueWriter:
        w = self._writers.get((topic, queue_id))
        if w is None:
            w = ConsumeQueueWriter(self.root / "consumequeue" / topic / str(queue_id),
                                   self.cq_file_size)
            self._writers[(topic, queue_id)] = w
        return w

    def _tags_code(self, topic: str, props: dict, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC and "DELAY" in props:
            from .codec import tags_code
            return tags_code(topic, props, store_ts, self.delay_millis)
        tags = props.get("TAGS")
        if not tags:
            return 0
        code = self._tags.get(tags)
        if code is None:
            # Tags repeat a lot; the Java hash of each distinct one is computed once.
            if len(self._tags) >= _TAGS_CACHE_MAX:
                self._tags.clear()
            code = self._tags[tags] = java_hash(tags)
        return code

    def dispatch(self, a: Appended) -> None:
        """Both dispatchers for one record, in the broker's order (spec §9 step 2)."""
        tx = a.sys_flag & L.SYSFLAG_TRANSACTION_MASK
        props = a.properties
        if tx in _CQ_TYPES:
            code = self._tags_code(a.topic, props, a.store_timestamp)
            if self._writer(a.topic, a.queue_id).put(a.queue_offset, a.offset, a.size, code):
                self.logics_timestamp = a.store_timestamp
        if self.index is not None:
            # IndexService applies the §7.3 rules (endPhyOffset skip, ROLLBACK) itself.
            k = props.get("KEYS")
            self.index.build_index(a.topic, props.get("UNIQ_KEY"), k.split(" ") if k else (),
                                   a.offset, a.store_timestamp, a.sys_flag)
        self.dispatched += 1

    def dispatch_many(self, records: Iterable[Appended]) -> None:
        for a in records:
            self.dispatch(a)

    def dispatch_log(self, commitlog, start: int, end: int | None = None) -> int:
        """Re-read records in ``[start, end)`` from a :class:`~rmqstore.commitlog.CommitLog`
        and dispatch them (a reput from the files, spec §9). Returns the offset reached."""
        from .commitlog import Check
        reached = start
        for off, c in commitlog.walk(start, check_crc=False):
            if end is not None and off >= end:
                break
            if c.status is Check.OK:
                m = commitlog.read_at(off)
                self.dispatch(Appended(off, c.size, m.topic, m.queue_id, m.queue_offset,
                                       m.sys_flag, m.store_timestamp,
                                       parse_properties(m.properties_text or "")))
                reached = off + c.size
            elif c.status is Check.END_OF_SEGMENT:
                reached = commitlog.queue.find(off)[0].end
            else:
                break
        return reached

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()
        if self.index is not None and hasattr(self.index, "flush"):
            self.index.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers = {}
        if self.index is not None:
            self.index.close()


class BackgroundDispatcher:
    """Runs a :class:`Dispatcher` on its own thread, fed in CommitLog order."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self._pending: collections.deque[Sequence[Appended]] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._busy = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rmqstore-reput", daemon=True)
        self._thread.start()

    def submit(self, records: Sequence[Appended]) -> None:
        """Queue records; the appender calls this under its lock, so order is kept."""
        with self._cond:
            self._pending.append(records)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending and self._stop:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
            try:
                for records in batch:
                    self.dispatcher.dispatch_many(records)
            except BaseException as e:  # kept for close() to raise: dispatch must not die silently
                self.error = e
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def wait_idle(self) -> None:
        """Block until every submitted record is dispatched."""
        with self._cond:
            while self._pending or self._busy:
                self._cond.wait()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
