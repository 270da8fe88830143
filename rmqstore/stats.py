"""Store statistics: per topic/queue counts, bytes, offsets and times, from the CommitLog
(bulk scan, segments in parallel processes), plus the ConsumeQueue, IndexFile and
checkpoint views. ``rmqstore stats`` prints :func:`store_stats`; ``spark stats`` computes
the same per-queue numbers from the same :func:`segment_partials`.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import layout as L
from .errors import RmqStoreError
from .scan import RecordColumns, scan_buffer

#: Segments at least this large are scanned in worker processes (when there are several).
PARALLEL_MIN_BYTES = 64 * 1024 * 1024


@dataclass
class QueueStats:
    """What the CommitLog holds for one topic/queue."""

    topic: str
    queue_id: int
    messages: int = 0
    bytes: int = 0
    min_queue_offset: int | None = None  # over records that get a ConsumeQueue unit
    max_queue_offset: int | None = None
    first_store_time: int | None = None
    last_store_time: int | None = None

    def merge(self, o: "QueueStats") -> None:
        self.messages += o.messages
        self.bytes += o.bytes
        self.min_queue_offset = _opt(min, self.min_queue_offset, o.min_queue_offset)
        self.max_queue_offset = _opt(max, self.max_queue_offset, o.max_queue_offset)
        self.first_store_time = _opt(min, self.first_store_time, o.first_store_time)
        self.last_store_time = _opt(max, self.last_store_time, o.last_store_time)

    def as_dict(self) -> dict:
        return {"topic": self.topic, "queueId": self.queue_id, "messages": self.messages,
                "bytes": self.bytes, "minQueueOffset": self.min_queue_offset,
                "maxQueueOffset": self.max_queue_offset, "firstStoreTime": self.first_store_time,
                "lastStoreTime": self.last_store_time}


def _opt(f, a, b):
    return b if a is None else a if b is None else f(a, b)


@dataclass
class SegmentPartial:
    """One segment's share: per-queue stats and how its valid data ends."""

    start: int
    records: int
    bytes: int
    end: int
    stop: str
    queues: dict[tuple[str, int], QueueStats] = field(default_factory=dict)


def aggregate(cols: RecordColumns) -> dict[tuple[str, int], QueueStats]:
    """Per (topic, queueId) stats of a run of records, vectorised."""
    out: dict[tuple[str, int], QueueStats] = {}
    if len(cols) == 0:
        return out
    names, tid = cols.topic_table()
    qid = cols.queue_id
    qmin = int(qid.min())
    span = int(qid.max()) - qmin + 1
    key = tid * span + (qid - qmin)
    uniq, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    g = len(uniq)
    counts = np.bincount(inverse, minlength=g)
    sizes = np.bincount(inverse, weights=cols.size, minlength=g)
    ts = cols.store_timestamp
    first = np.full(g, np.iinfo(np.int64).max)
    last = np.full(g, np.iinfo(np.int64).min)
    np.minimum.at(first, inverse, ts)
    np.maximum.at(last, inverse, ts)
    tran = cols.sys_flag & L.SYSFLAG_TRANSACTION_MASK
    dispatched = (tran == L.TRANSACTION_NOT_TYPE) | (tran == L.TRANSACTION_COMMIT)
    qo = cols.queue_offset
    lo = np.full(g, np.iinfo(np.int64).max)
    hi = np.full(g, np.iinfo(np.int64).min)
    np.minimum.at(lo, inverse[dispatched], qo[dispatched])
    np.maximum.at(hi, inverse[dispatched], qo[dispatched])
    for k, kv in enumerate(uniq.tolist()):
        t, q = divmod(kv, span)
        has = hi[k] >= lo[k]
        out[names[t], q + qmin] = QueueStats(
            names[t], q + qmin, int(counts[k]), int(sizes[k]),
            int(lo[k]) if has else None, int(hi[k]) if has else None, int(first[k]), int(last[k]))
    return out


def segment_partial(path: str, start: int, limit: int) -> SegmentPartial:
    """Scan one CommitLog segment file (opened here, read-only) and aggregate it."""
    import mmap

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0 or limit == 0:
            return SegmentPartial(start, 0, 0, start, "zeros")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        scan = scan_buffer(mm, start, min(limit, size))
        cols = scan.records
        part = SegmentPartial(start, len(cols), int(cols.size.sum()), scan.end, scan.stop,
                              aggregate(cols))
        del cols, scan
    return part


def segment_partials(segments, *, processes: int | None = None) -> list[SegmentPartial]:
    """Partials for ``segments`` (objects with path, start, readable_size), in order."""
    jobs = [(str(s.path), s.start, s.readable_size) for s in segments]
    big = sum(j[2] for j in jobs) >= PARALLEL_MIN_BYTES and len(jobs) > 1
    workers = processes if processes is not None else (os.cpu_count() or 1)
    if big and workers > 1:
        import multiprocessing

        with ProcessPoolExecutor(min(workers, len(jobs)),
                                 mp_context=multiprocessing.get_context("fork")) as ex:
            return list(ex.map(segment_partial, *zip(*jobs)))
    return [segment_partial(*j) for j in jobs]


def merge_partials(partials: list[SegmentPartial]) -> tuple[dict, dict[tuple[str, int], QueueStats]]:
    """CommitLog totals and per-queue stats, up to where valid data ends (spec §10.1)."""
    queues: dict[tuple[str, int], QueueStats] = {}
    records = nbytes = 0
    end, stop = (partials[0].start if partials else 0), "no segments"
    for p in partials:
        records += p.records
        nbytes += p.bytes
        end, stop = p.end, p.stop
        for k, q in p.queues.items():
            if k in queues:
                queues[k].merge(q)
            else:
                queues[k] = q
        if p.stop not in ("blank", "end"):
            break
    return {"messages": records, "bytes": nbytes, "maxOffset": end, "endReason": stop}, queues


def store_stats(reader) -> dict:
    """Everything ``rmqstore stats`` reports for a :class:`~rmqstore.reader.StoreReader`."""
    from .checkpoint import abort_exists, read_checkpoint

    cl = reader.commitlog
    totals, queues = merge_partials(segment_partials(cl.segments))
    commit_log = {"minOffset": cl.min_offset, **totals, "segments": len(cl.segments),
                  "segmentSize": reader.config.mapped_file_size_commit_log,
                  "problems": [p.__dict__ for p in cl.queue.problems]}
    rows = []
    listing = reader.queues()
    cq_info = {}
    for ref in listing.queues:
        try:
            with reader.consume_queue(ref.topic, ref.queue_id) as cq:
                cq_info[ref.topic, ref.queue_id] = (cq.min_offset(cl.min_offset), cq.max_offset)
        except RmqStoreError:  # a broken queue shows as unknown; verify explains it
            cq_info[ref.topic, ref.queue_id] = (None, None)
    for key in sorted(set(queues) | set(cq_info)):
        q = queues.get(key) or QueueStats(*key)
        d = q.as_dict()
        d["cqMinOffset"], d["cqMaxOffset"] = cq_info.get(key, (None, None))
        rows.append(d)
    index_files = []
    if reader.config.index_dir.is_dir() and any(reader.config.index_dir.iterdir()):
        with reader.index() as idx:
            for f in idx.files:
                h = f.header
                index_files.append({"name": f.path.name, "entries": max(h.index_count - 1, 0),
                                    "hashSlotCount": h.hash_slot_count,
                                    "beginTimestamp": h.begin_timestamp, "endTimestamp": h.end_timestamp,
                                    "beginPhyOffset": h.begin_phy_offset, "endPhyOffset": h.end_phy_offset})
    checkpoint = None
    if reader.config.checkpoint_path.exists():
        checkpoint = read_checkpoint(reader.config.checkpoint_path).__dict__
    return {"store": str(reader.root), "commitLog": commit_log, "queues": rows,
            "indexFiles": index_files, "checkpoint": checkpoint,
            "abortFile": abort_exists(reader.root),
            "geometry": {k: getattr(reader.config, k) for k in
                         ("mapped_file_size_commit_log", "mapped_file_size_consume_queue",
                          "max_hash_slot_num", "max_index_num")},
            "geometrySources": dict(reader.config.sources)}
