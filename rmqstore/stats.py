"""Store statistics: per topic/queue counts, bytes, queue offsets and store times.

One definition serves ``rmqstore stats`` and ``rmqstore spark stats``: each split of the
CommitLog (see :mod:`rmqstore.scan.splits`) is aggregated with :func:`queue_stats`, partials are
combined with :func:`merge_stats`. Locally the splits run in a process pool, so even a
single 1 GiB segment is scanned by every core.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .format.crc import prop_crc_tails
from .format.rules import gets_cq_unit
from .errors import RmqStoreError
from .scan.records import RecordColumns
from .files.listing import open_regular

#: Below this much CommitLog data a process pool costs more than it saves.
PARALLEL_MIN_BYTES = 96 * 1024 * 1024


def _opt(f, a, b):
    return b if a is None else a if b is None else f(a, b)


@dataclass
class QueueStats:
    """Records of one topic/queue in the CommitLog.

    ``count`` and ``bytes`` cover every record. The queue offset range covers only records
    that get a ConsumeQueue unit: transaction PREPARED and ROLLBACK records store queue
    offset 0 (spec §3.2), which says nothing about the queue. Store times are min/max."""

    topic: str
    queue_id: int
    count: int
    bytes: int
    min_queue_offset: int | None
    max_queue_offset: int | None
    first_store_timestamp: int
    last_store_timestamp: int

    def merge(self, o: "QueueStats") -> "QueueStats":
        return QueueStats(self.topic, self.queue_id, self.count + o.count, self.bytes + o.bytes,
                          _opt(min, self.min_queue_offset, o.min_queue_offset),
                          _opt(max, self.max_queue_offset, o.max_queue_offset),
                          min(self.first_store_timestamp, o.first_store_timestamp),
                          max(self.last_store_timestamp, o.last_store_timestamp))

    def as_dict(self) -> dict:
        return {"topic": self.topic, "queueId": self.queue_id, "messages": self.count,
                "bytes": self.bytes, "minQueueOffset": self.min_queue_offset,
                "maxQueueOffset": self.max_queue_offset,
                "firstStoreTime": self.first_store_timestamp,
                "lastStoreTime": self.last_store_timestamp}


STATS_FIELDS = tuple(f.name for f in dataclasses.fields(QueueStats))


def queue_stats(records: RecordColumns) -> list[QueueStats]:
    """Per-(topic, queueId) aggregates of a run of records, vectorised."""
    n = len(records)
    if n == 0:
        return []
    names, tid = records.topic_table()
    qid = records.queue_id.astype(np.int64)  # int32 ids minus the smallest can overflow
    qmin = int(qid.min())
    key = tid.astype(np.int64) * (int(qid.max()) - qmin + 1) + (qid - qmin)
    order = np.argsort(key, kind="stable")
    k = key[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])

    def red(ufunc, a):
        return ufunc.reduceat(a[order], starts)

    dispatched = gets_cq_unit(records.sys_flag)[order]
    qo = records.queue_offset[order]
    big = np.iinfo(np.int64).max
    qo_min = np.minimum.reduceat(np.where(dispatched, qo, big), starts)
    qo_max = np.maximum.reduceat(np.where(dispatched, qo, -1), starts)
    cnt = np.diff(np.r_[starts, n])
    size = red(np.add, records.size)
    ts_min = red(np.minimum, records.store_timestamp)
    ts_max = red(np.maximum, records.store_timestamp)
    first = order[starts]
    return [QueueStats(names[int(tid[f])], int(qid[f]), int(c), int(b),
                       None if z < 0 else int(a), None if z < 0 else int(z), int(t0), int(t1))
            for f, c, b, a, z, t0, t1 in zip(first, cnt, size, qo_min, qo_max, ts_min, ts_max)]


def merge_stats(parts: Iterable[Iterable[QueueStats]]) -> list[QueueStats]:
    """Combine partial :func:`queue_stats` results; sorted by topic, then queue id."""
    acc: dict[tuple[str, int], QueueStats] = {}
    for part in parts:
        for q in part:
            k = (q.topic, q.queue_id)
            acc[k] = acc[k].merge(q) if k in acc else q
    return [acc[k] for k in sorted(acc)]


def split_stats(split):
    """(boundary, per-queue stats) of one CommitLog byte range: a worker's task, locally
    or in a Spark job (``pipeline.stats_job`` reads a split again with it)."""
    from .scan.splits import open_split

    with open_split(split) as sc:
        return sc.boundary, queue_stats(sc.records)


def kind_counts(records: RecordColumns) -> dict[str, int]:
    """Counts of the record-level store-kind evidence (design-14 §8) in a run of records:
    magic v2, a trailing ``__CRC32#`` entry, inner batches (sysFlag 0x40|0x80)."""
    from .format import layout as L

    n = len(records)
    out = {"records": n, "v2": 0, "propCrc": 0, "innerBatch": 0}
    if n == 0:
        return out
    out["v2"] = int((records.magic == L.MAGIC_V2).sum())
    inner = L.SYSFLAG_NEED_UNWRAP | L.SYSFLAG_INNER_BATCH
    out["innerBatch"] = int(((records.sys_flag & inner) == inner).sum())
    out["propCrc"] = int(prop_crc_tails(records.u8, records.pos + records.size).sum())
    return out


def _merge_counts(parts) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


def inner_batch_extras(records: RecordColumns) -> dict[tuple[str, int], tuple[int, int]]:
    """Per (topic, queueId) with inner-batch records (design-14 §4.3): (messages beyond one
    per record, largest queue offset of a message, QUEUEOFFSET + i). One vector test when
    there are none; the inner records' bodies are walked one by one."""
    from .format.record import RecordError, inner_entries, is_inner_batch

    inner = np.flatnonzero(is_inner_batch(records.sys_flag))
    if not len(inner):
        return {}
    names, tid = records.topic_table()
    mv = memoryview(records.u8)
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for i in inner.tolist():
        bpos, blen = int(records.body_pos[i]), int(records.body_len[i])
        try:
            n = len(inner_entries(mv[bpos:bpos + max(blen, 0)]))
        except RecordError:
            n = 1  # given whole by dump, as one message
        k = (names[int(tid[i])], int(records.queue_id[i]))
        extra, top = out.get(k, (0, -1))
        out[k] = (extra + n - 1, max(top, int(records.queue_offset[i]) + n - 1))
    return out


def _merge_extras(parts) -> dict[tuple[str, int], tuple[int, int]]:
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for part in parts:
        for k, (extra, top) in part.items():
            e0, t0 = out.get(k, (0, -1))
            out[k] = (e0 + extra, max(t0, top))
    return out


def _stats_kind_task(split):
    from .scan.splits import open_split

    with open_split(split) as sc:
        return sc.boundary, (queue_stats(sc.records), kind_counts(sc.records),
                             inner_batch_extras(sc.records))


def commitlog_stats(store: str, *, split_size: int | None = None, processes: int | None = None,
                    conf=None, config=None, kind: bool = False, inner_extras: bool = False):
    """(per-queue stats, where valid data ends) for one store, without Spark: the same
    splits and merge the Spark job uses. ``processes`` defaults to every core for stores
    large enough to gain from it. ``config`` (a StoreConfig) is used as it is, else one
    is loaded from ``conf`` and the files. ``kind=True`` adds a third item, the
    :func:`kind_counts` of every record (with ``inner_extras``, also ``innerExtras``: the
    :func:`inner_batch_extras` of the store, when it has inner batches)."""
    from .scan.splits import DEFAULT_SPLIT_SIZE, list_store, plan_splits, run_local

    files = list_store(store, conf=conf, config=config)
    splits = plan_splits([files], split_size or DEFAULT_SPLIT_SIZE)
    if processes is None:
        total = sum(s.end - s.begin for s in splits)
        processes = (os.cpu_count() or 1) if total >= PARALLEL_MIN_BYTES else 1
    if not kind:
        st, payloads = run_local(splits, split_stats, processes)
        return merge_stats(payloads.values()), st.ends[store]
    st, payloads = run_local(splits, _stats_kind_task, processes)
    counts = _merge_counts(c for _, c, _ in payloads.values())
    extras = _merge_extras(e for _, _, e in payloads.values())
    if extras and inner_extras:
        counts["innerExtras"] = extras
    return (merge_stats(q for q, _, _ in payloads.values()), st.ends[store], counts)


def dledger_stats(log) -> tuple[list[QueueStats], dict[str, int], list[dict]]:
    """(per-queue stats, :func:`kind_counts`, records skipped) of a DLedger CommitLog: the
    records inside the entries DLedger's recovery keeps (design-14 §1.5), walked entry
    run by entry run. A record that is not a valid CommitLog record is skipped and listed
    (RocketMQ's reput would skip the rest of its data file, design-14 §1.6)."""
    from .scan.records import columns, consistent

    parts, counts, skipped = [], [], []
    for run in log.runs():
        if not len(run):
            continue
        good = run.record_ok()
        for lo in range(0, len(run), 1 << 16):
            keep = np.arange(lo, min(lo + (1 << 16), len(run)))
            cols = columns(run.u8, run.record_pos[keep], run.start)
            ok = good[keep] & consistent(cols)
            if not ok.all():
                skipped += [{"file": str(run.path), "offset": int(o)}
                            for o in cols.offset[~ok].tolist()]
                cols = cols.take(np.flatnonzero(ok))
            parts.append(queue_stats(cols))
            counts.append(kind_counts(cols))
    return merge_stats(parts), _merge_counts(counts), skipped


def _dledger_block(end, log) -> dict:
    """What ``stats`` says about a DLedger log (design-14 §1.4, §1.5, T9)."""
    from .format.dledger_layout import DLEDGER_INDEX_UNIT_SIZE

    return {"folder": log.ledger_dir.name, "entries": end.entries,
            "ledgerBeginIndex": end.begin_index, "ledgerEndIndex": end.end_index,
            "ledgerEndTerm": end.end_term,
            "committedIndex": end.committed_index, "committedPos": end.committed_pos,
            "checkpointCommittedIndex": end.checkpoint_index,
            # DLedgerCommitLog#getMaxOffset after a restart: served and dispatched up to here
            "servedUpTo": end.max_offset,
            "endOffset": end.offset, "endReason": end.reason, "tailClean": end.tail_clean,
            "recoveryStart": end.recovery_start,
            "indexRewriteFrom": end.index_rewrite_from,
            "dataFileSize": log.file_size, "indexFileSize": log.files.index_file_size,
            # the index as DLedger's recovery leaves it: one unit per entry kept
            "indexBytes": (end.end_index + 1) * DLEDGER_INDEX_UNIT_SIZE if end.end_index >= 0 else 0,
            "term": log.currterm.term,
            "problems": [str(p.detail) for p in log.files.problems] + list(end.refuses_start)}


def store_stats(reader, *, processes: int | None = None, conf=None) -> dict:
    """Everything ``rmqstore stats`` reports for a :class:`~rmqstore.reader.StoreReader`,
    from the reader's configuration (``conf`` is not read again: the reader's has it)."""
    from .files.checkpoint import abort_exists, read_checkpoint

    from .files.storekind_profile import profile

    cl = reader.commitlog
    root = str(reader.root)
    kind = profile(reader.root, reader.config.commit_log_dirs)
    dledger = None
    if getattr(cl, "framing", "plain") == "dledger":
        queues, counts, skipped = dledger_stats(cl.log)
        end = cl.end()
        dledger = dict(_dledger_block(end, cl.log), recordsSkipped=skipped)
        commit_log = {"minOffset": cl.min_offset, "maxOffset": end.offset,
                      # the plain scan's words for a clean end (zeros, a final blank)
                      "endReason": {"size-zero": "zeros", "blank-in-last-file": "blank",
                                    "no-data-files": "no segments"}.get(end.reason, end.reason)
                      if end.clean else end.reason}
    else:
        # The reader's configuration: the CommitLog directories it reads and their geometry
        # (a storePathCommitLog elsewhere than STORE/commitlog, spec §1.1).
        queues, end, counts = commitlog_stats(root, processes=processes, config=reader.config,
                                              kind=True, inner_extras=True) \
            if cl.segments else ([], None, {})
        commit_log = {"minOffset": cl.min_offset,
                      "maxOffset": end.end_offset if end else cl.min_offset,
                      "endReason": (end.reason or "clean") if end else "no segments"}
    extras = counts.pop("innerExtras", {})
    kind.add_records(counts)
    records = sum(q.count for q in queues)
    commit_log = {"minOffset": commit_log["minOffset"], "maxOffset": commit_log["maxOffset"],
                  # messages as consumers get them: an inner batch counts its messages
                  "messages": records + sum(e for e, _ in extras.values()), "records": records,
                  "bytes": sum(q.bytes for q in queues),
                  "endReason": commit_log["endReason"],
                  "segments": len(cl.segments),
                  "segmentSize": reader.config.mapped_file_size_commit_log,
                  "problems": [p.__dict__ for p in cl.queue.problems]}
    by_key = {(q.topic, q.queue_id): q.as_dict() for q in queues}
    for key, (extra, top) in extras.items():
        if key in by_key:
            d = by_key[key]
            d["records"] = d["messages"]
            d["messages"] += extra
            d["maxQueueOffset"] = max(d["maxQueueOffset"] or -1, top)
    cq_info = {}
    for ref in reader.queues().queues:
        try:
            with reader.consume_queue(ref.topic, ref.queue_id) as cq:
                cq_info[ref.topic, ref.queue_id] = (cq.min_offset(cl.min_offset), cq.max_offset)
        except RmqStoreError:  # a broken queue shows as unknown; verify explains it
            cq_info[ref.topic, ref.queue_id] = (None, None)
    cq_info.update(_batch_queue_info(reader, cl.min_offset))
    rows = []
    for key in sorted(set(by_key) | set(cq_info)):
        d = by_key.get(key) or QueueStats(key[0], key[1], 0, 0, None, None, None, None).as_dict()
        d["cqMinOffset"], d["cqMaxOffset"] = cq_info.get(key, (None, None))
        rows.append(d)
    index_files = []
    if reader.config.index_dir.is_dir() and any(reader.config.index_dir.iterdir()):
        if "max_hash_slot_num" in reader.config.undetermined:
            headers = _index_headers(reader.config.index_dir)  # the header needs no geometry
        else:
            with reader.index() as idx:
                headers = [(f.path.name, f.header) for f in idx.files]
        for name, h in headers:
            index_files.append({"name": name, "entries": max(h.index_count - 1, 0),
                                "hashSlotCount": h.hash_slot_count,
                                "beginTimestamp": h.begin_timestamp, "endTimestamp": h.end_timestamp,
                                "beginPhyOffset": h.begin_phy_offset, "endPhyOffset": h.end_phy_offset})
    checkpoint = None
    if reader.config.checkpoint_path.exists():
        checkpoint = read_checkpoint(reader.config.checkpoint_path).__dict__
    out = {"store": root, "storeKind": kind.as_dict(), "commitLog": commit_log}
    if dledger is not None:
        out["dledger"] = dledger
    return out | {"queues": rows,
            "indexFiles": index_files, "checkpoint": checkpoint,
            "abortFile": abort_exists(reader.root),
            "geometry": {k: getattr(reader.config, k) for k in
                         ("mapped_file_size_commit_log", "mapped_file_size_consume_queue",
                          "max_hash_slot_num", "max_index_num")},
            "geometrySources": dict(reader.config.sources),
            "warnings": list(reader.config.warnings)}


def _batch_queue_info(reader, commit_log_min: int) -> dict:
    """(min, max) queue offset of each BatchConsumeQueue (design-14 §4.2), as the
    ConsumeQueues' ``cqMinOffset``/``cqMaxOffset``."""
    from .files.batchconsumequeue import BatchConsumeQueue, bcq_file_size

    refs = reader.batch_queues().queues
    if not refs:
        return {}
    size = bcq_file_size(reader.config)
    out = {}
    for ref in refs:
        try:
            with BatchConsumeQueue(ref.path, size) as q:
                out[ref.topic, ref.queue_id] = (q.min_offset(commit_log_min), q.max_offset)
        except RmqStoreError:
            out[ref.topic, ref.queue_id] = (None, None)
    return out


def _index_headers(index_dir):
    """(name, header) of each IndexFile, from its first 40 bytes (spec §7.1)."""
    from .format import layout as L
    from .files.index import IndexHeader, list_index_files

    out = []
    for p in list_index_files(index_dir):
        with open_regular(p) as f:
            head = f.read(L.INDEX_HEADER_SIZE)
        if len(head) == L.INDEX_HEADER_SIZE:
            out.append((p.name, IndexHeader(*L.INDEX_HEADER_STRUCT.unpack(head))))
    return out
