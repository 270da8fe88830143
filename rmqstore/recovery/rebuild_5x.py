"""The RocketMQ 5.x part of :func:`rmqstore.recovery.rebuild.rebuild` (design-14 D2, §4, §5):
decide once whether the store has BatchCQ topics or LMQ dispatch (refusing where the files
and broker.conf leave it open, decision D6), and write the BatchConsumeQueues beside the
ConsumeQueues (the LMQ units join those through
:func:`rmqstore.scan.dispatch_5x.apply_5x`). A store without either never gets here past
:func:`kinds_for_rebuild`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, UnsupportedStoreError
from ..files.batchconsumequeue import FOLDER, bcq_file_size, build_batch_consume_queue
from ..files.names import queue_dir
from ..files.commitlog import CommitLog
from ..scan.dispatch_5x import (QueueKinds, Variants, apply_5x, lmq_undetermined,
                                 store_queue_kinds)


def kinds_for_rebuild(root: Path, cfg, start: int, *, dledger: bool = False) -> QueueKinds:
    """What the rebuild of the queues must write besides ConsumeQueue units. Refuses
    (nothing changed) when a record carries ``INNER_MULTI_QUEUE_OFFSET`` but neither
    ``consumequeue/%LMQ%*`` nor broker.conf says whether LMQ dispatch was on, and a
    ``from_offset`` rebuild of a store with BatchCQ topics."""
    from ..files.storekind_profile import profile

    kinds = store_queue_kinds(root, cfg)
    if not kinds.lmq_evidence and profile(root, cfg.commit_log_dirs).family != "4.9":
        where = lmq_undetermined(cfg, kinds)
        if where is not None:
            raise ConfigError(
                "rebuild --consumequeue refused: a record carries INNER_MULTI_QUEUE_OFFSET "
                f"(LMQ, {where}) and neither consumequeue/%LMQ%* nor broker.conf says whether "
                "the broker dispatched it: pass --config with enableMultiDispatch (and "
                "enableLmq) as the broker had them (nothing was changed)", root)
    if kinds.any and dledger:
        raise UnsupportedStoreError(
            "rebuild --consumequeue refused: BatchConsumeQueue or LMQ queues on a DLedger "
            "CommitLog are not supported yet (nothing was changed)", root)
    if kinds.batch_topics and start:
        raise UnsupportedStoreError(
            "rebuild --from-offset refused: the store has BatchConsumeQueue topics "
            f"({next(iter(kinds.batch_topics))}); rebuild them whole, without --from-offset "
            "(nothing was changed)", root)
    if kinds.batch_topics and bcq_file_size(cfg) is None:
        raise ConfigError(
            "rebuild --consumequeue refused: the store has BatchCQ topics "
            f"({next(iter(kinds.batch_topics))}) but no {FOLDER}/ file to take "
            "mapperFileSizeBatchConsumeQueue from: pass --config with the broker.conf the "
            "store was written with (nothing was changed)", root)
    return kinds


def write_batch_queues(scratch: Path, cfg, v: Variants, fsync: bool) -> int:
    """``scratch/batchconsumequeue/{topic}/{queueId}`` for every BCQ of ``v``; units written."""
    new = scratch / FOLDER
    new.mkdir()
    size = bcq_file_size(cfg)
    n = 0
    for (topic, qid), units in sorted(v.bcq.items()):
        n += build_batch_consume_queue(queue_dir(new, topic, qid,
                                                 offset=int(units[0]["commit_log_offset"])),
                                       units, size, fsync=fsync)
    return n


def apply_for_rebuild(root: Path, cfg, kinds: QueueKinds, scan, d) -> Variants | None:
    """BCQ units out of ``d``, LMQ units into it (:func:`~rmqstore.scan.dispatch_5x.apply_5x`),
    or None when the store has neither. Topics whose records are inner batches but that
    nothing else names BatchCQ refuse: the queue kind would be a guess (design-14 D5)."""
    seen = store_queue_kinds(root, cfg, scan)
    late = sorted(set(seen.batch_topics) - set(kinds.batch_topics))
    if late:
        raise ConfigError(
            f"rebuild --consumequeue refused: records of topic {late[0]} are inner batches "
            f"(BatchCQ) but neither {FOLDER}/ nor config/topics.json says the topic is "
            "BatchCQ; restore config/topics.json (nothing was changed)", root)
    if not kinds.any:
        return None
    with CommitLog(cfg) as log:
        return apply_5x(d, kinds, log.read_at)
