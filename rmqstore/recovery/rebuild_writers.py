"""ConsumeQueues and IndexFiles built while a rebuild's scan still runs.

:func:`rmqstore.scan.runner.scan_chains` hands each byte range's grouped part
(:mod:`rmqstore.scan.per_queue`) to ``on_part`` as soon as the range is known to be on the
record chain, in chain order, while the workers scan later ranges. :class:`Live` writes
the part's units and index puts there and then, so the writing overlaps the scanning
instead of following it.

Which records are valid is only known at the end (a torn tail is cut, a gap ends the
log). But the valid records are a prefix of the chain, and what went in is every unit
and put of a prefix of the chain too, in order; so when as many units (and puts) went in
as the valid records have, they are exactly those. :meth:`Live.finish` checks that and
otherwise throws the files away for the bulk build.

The IndexFile puts run on a thread of their own (the compiled put releases the GIL), so
they overlap the ConsumeQueue writing in this process as well as the scan in the workers;
each put gets its own copies of the part's arrays (a part may live in the scan's shared
memory, which is gone once the scan returns), and the thread is drained before the index
is closed, finished or thrown away.
"""

from __future__ import annotations

import shutil
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..files.config import StoreConfig
from ..files.consumequeue_writer import ConsumeQueueWriter
from ..scan.per_queue import keys, units
from ..files.index import IndexGeometry
from ..files.index_service import IndexService
from ..files.names import is_safe_topic, queue_dir

#: A range with more queues than this makes writing per range cost more than in bulk.
MAX_GROUPS = 256
#: Queues written live at most: each keeps files open until the end (descriptor limits).
MAX_QUEUES = 512
#: Index puts handed to the index thread and not yet done, at most (bounds the copies held).
MAX_PENDING_PUTS = 8


def _own(a: np.ndarray) -> np.ndarray:
    """``a`` as int64 in memory of its own: a view (of a part's arrays) is copied."""
    return a.astype(np.int64) if a.base is not None or a.dtype != np.int64 else a


def finish_index(svc: IndexService, fsync: bool) -> tuple[int, list[str]]:
    """Close ``svc`` (synced with ``fsync``): (entries, file names)."""
    with svc:
        if fsync:
            svc.flush()
        return (sum(max(f.header.index_count - 1, 0) for f in svc.files),
                [f.path.name for f in svc.files])


class Live:
    """``on_part`` for a full rebuild into ``scratch/consumequeue`` and ``scratch/index``."""

    def __init__(self, scratch: Path, cfg: StoreConfig, clock, *, queues: bool, index: bool):
        self.cq_dir, self.index_dir = scratch / "consumequeue", scratch / "index"
        self.file_size = cfg.cq_file_size
        self.writers: dict[tuple[str, int], ConsumeQueueWriter] | None = None
        if queues:
            self.cq_dir.mkdir()
            self.writers = {}
        self.svc = None
        self._puts: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()
        if index:
            self.index_dir.mkdir()
            self.svc = IndexService(self.index_dir,
                                    IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num),
                                    clock=clock, flush_full_files=False)
            self._puts = ThreadPoolExecutor(1, thread_name_prefix="rmqstore-index")
        self.units = self.written = self.puts = 0
        self.stopped = False

    def __call__(self, segment: int, part: dict) -> None:
        if self.stopped:
            return
        if self.writers is not None:
            if len(part["groups"]) > MAX_GROUPS:
                self._drop_queues()
            else:
                self._units(part)
                if self.writers is not None and len(self.writers) > MAX_QUEUES:
                    self._drop_queues()
        m = len(part["key_hash"])
        if self.svc is not None and m:
            # arrays of the thread's own, made now: the part's may be shared memory
            args = tuple(_own(a) for a in keys(part, 0, m))
            while len(self._pending) >= MAX_PENDING_PUTS:
                self._pending.popleft().result()  # re-raises the thread's error here
            self._pending.append(self._puts.submit(self.svc.put_hashes, *args))
            self.puts += m
        if part["consistent"] is not None and not part["consistent"].all():
            self.stopped = True  # nothing after this range is on a trusted chain

    def _units(self, part: dict) -> None:
        qo, dense = part["qo"], part["qo_dense"]
        if not all(is_safe_topic(g[0]) for g in part["groups"]):
            # A topic that cannot be a directory name: the bulk build, once the valid
            # records are known, decides (and refuses, naming the record).
            self._drop_queues()
            return
        for g, (topic, qid, a, b) in enumerate(part["groups"]):
            w = self.writers.get((topic, qid))
            if w is None:
                w = self.writers[topic, qid] = ConsumeQueueWriter(
                    queue_dir(self.cq_dir, topic, qid), self.file_size)
            if dense:
                self.written += w.put_run(int(qo[g]), *units(part, a, b))
            else:
                self.written += w.put_many(qo[a:b], *units(part, a, b))
            self.units += b - a

    def _drop_queues(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers = None
        shutil.rmtree(self.cq_dir, ignore_errors=True)

    def finish(self, d, d_index, fsync: bool) -> tuple[int | None, tuple[int, list[str]] | None]:
        """(units written or None, (index entries, names) or None): None where what went
        in is not exactly what ``d`` (the queues) or ``d_index`` (the index) hold; those
        files are removed, for the bulk build to write."""
        cq = None
        if self.writers is not None:
            if self.units == d.unit_count:
                for w in self.writers.values():
                    if fsync:
                        w.flush()
                    w.close()
                self.writers = None
                cq = self.written
            else:
                self._drop_queues()
        ix = None
        if self.svc is not None:
            self._drain()
            svc, self.svc = self.svc, None
            if self.puts == d_index.key_count:
                ix = finish_index(svc, fsync)
            else:
                svc.close()
                shutil.rmtree(self.index_dir)
        return cq, ix

    def close(self) -> None:
        """Release files after an error (the caller removes the scratch directory)."""
        for w in (self.writers or {}).values():
            w.close()
        self.writers = None
        if self.svc is not None:
            self._drain(raising=False)
            self.svc.close()
            self.svc = None

    def _drain(self, raising: bool = True) -> None:
        """Wait for every index put handed to the thread (and stop it); with ``raising``,
        the first put's error is raised here."""
        first = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except BaseException as e:  # noqa: BLE001 - kept, raised after the wait
                first = first or e
        if self._puts is not None:
            self._puts.shutdown(wait=True)
            self._puts = None
        if first is not None and raising:
            raise first
