"""Recovery on load (spec §10): what opening a store for writing reads, and refuses,
before anything changes, and the reput that brings the queues up to the CommitLog.

:func:`survey` reads everything that can refuse the store, so a refused open leaves
every byte as it was; :func:`find_end` is the end of valid data the broker's recovery
finds (§10.1-§10.3); :func:`catch_up` re-dispatches the records the queues lack (the 4.9
reput start, §9) and, after a crash, the index keys that may have been waiting
(:data:`~rmqstore.engine.index_keys.DEFER_BYTES`). :class:`~rmqstore.engine.store.
MessageStore` runs them in that order, changing the files only between the first and
the last, as a broker's start does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, OffsetError, RecordError, RefusedError
from ..files.commitlog import Check, CommitLog, ScanEnd
from ..files.config import StoreConfig
from ..files.index import IndexFile, IndexGeometry, list_index_files
from ..files.segments import SegmentQueue
from ..scan.survivors import Survivors, find_survivors
from .index_keys import DEFER_BYTES
from .reput import keys_behind, queue_state


def _zeros_at(queue: SegmentQueue, offset: int) -> bool:
    """Are the 4 bytes at ``offset`` zeros (read with ``pread``, not through a map)?"""
    try:
        seg, pos = queue.find(offset)
    except OffsetError:
        return False
    fd = os.open(seg.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return not os.pread(fd, 4, pos).strip(b"\0")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class QueueKinds:
    """What the 5.x writer does beyond ConsumeQueues (design-14 §4, §5): the BatchCQ topics,
    whether LMQ multi-dispatch writes ``%LMQ%`` units, whether the store wraps LMQ
    messages (enableLmq), and the BatchConsumeQueue file size."""

    batch_topics: frozenset = field(default_factory=frozenset)
    multi_dispatch: bool = False
    enable_lmq: bool = False
    bcq_file_size: int | None = None

    @property
    def any(self) -> bool:
        return bool(self.batch_topics) or self.multi_dispatch or self.enable_lmq


def queue_kinds(cfg: StoreConfig) -> QueueKinds:
    """The queue kinds the writer follows, from the files first (spec: files are the truth):
    a topic is BatchCQ when ``batchconsumequeue/<topic>/`` exists or ``config/topics.json``
    says ``queue.type=BatchCQ``; the two disagreeing, or a topic with both a ConsumeQueue and
    a BatchConsumeQueue directory, is refused (one kind of queue per topic, never a second).
    LMQ: on when ``consumequeue/%LMQ%*`` exists (a broker.conf saying
    enableMultiDispatch=false then is refused), else as the configuration says. 4.9
    stores have none of it."""
    from ..files.batchconsumequeue import FOLDER, bcq_file_size
    from ..files.listing import entries
    from ..format.rules import LMQ_PREFIX
    from ..scan.dispatch_5x import topic_queue_types

    root = Path(cfg.store_path_root_dir)

    def dirs(folder: str) -> set[str]:
        d = root / folder
        return {e.name for e in entries(d) if e.kind == "dir"} if d.is_dir() else set()

    bcq_dirs, cq_dirs = dirs(FOLDER), dirs("consumequeue")
    conf = topic_queue_types(root)
    types = conf[1] if conf is not None else {}
    where = f"config/{conf[0]}" if conf is not None else ""
    lmq_dirs = sorted(n for n in cq_dirs if n.startswith(LMQ_PREFIX))
    if cfg.broker_version == "4.9":
        # 4.9 has no BatchConsumeQueue, and its MultiDispatch follows other rules
        # (design-14 §5.1 R4): a 4.9 writer would write the wrong queues.
        why = (f"{FOLDER}/{sorted(bcq_dirs)[0]}/ exists" if bcq_dirs
               else f"{where} has queue.type=BatchCQ" if "BatchCQ" in types.values()
               else f"consumequeue/{lmq_dirs[0]}/ exists" if lmq_dirs
               else "enableLmq/enableMultiDispatch is set"
               if cfg.enable_lmq or cfg.enable_multi_dispatch else None)
        if why is not None:
            raise ConfigError(f"append refused: {why}, a RocketMQ 5.x queue kind, and the store "
                              "is written with 4.9's conventions: pass --broker-version 5 "
                              "(nothing was changed)", root)
        return QueueKinds()
    for t in sorted(bcq_dirs & cq_dirs):
        raise ConfigError(f"append refused: topic {t!r} has both consumequeue/{t}/ and "
                          f"{FOLDER}/{t}/; one topic has one kind of queue (nothing was changed)",
                          root)
    batch = set(bcq_dirs)
    for t, kind in sorted(types.items()):
        if t in bcq_dirs and kind != "BatchCQ":
            raise ConfigError(f"append refused: {FOLDER}/{t}/ exists but {where} gives topic "
                              f"{t!r} queue.type={kind}; the files are the truth: fix {where} "
                              "(nothing was changed)", root)
        if kind == "BatchCQ":
            if t in cq_dirs:
                raise ConfigError(f"append refused: {where} gives topic {t!r} queue.type=BatchCQ "
                                  f"but consumequeue/{t}/ holds its ConsumeQueues; the files are "
                                  f"the truth: fix {where} (nothing was changed)", root)
            batch.add(t)
    multi, enable = cfg.enable_multi_dispatch, cfg.enable_lmq
    if lmq_dirs:
        if cfg.sources.get("enable_multi_dispatch") not in (None, "default") and not multi:
            raise ConfigError(f"append refused: consumequeue/{lmq_dirs[0]}/ shows LMQ dispatch "
                              "but the configuration says enableMultiDispatch=false; the files "
                              "are the truth: fix the setting (nothing was changed)", root)
        multi = True
        if cfg.sources.get("enable_lmq") in (None, "default"):
            enable = True
    size = bcq_file_size(cfg) if batch else None
    return QueueKinds(frozenset(batch), bool(multi), bool(enable),
                      size or cfg.mapper_file_size_batch_consume_queue)


def survey(cfg: StoreConfig, queue: SegmentQueue, geometry: IndexGeometry, was_clean: bool,
           kinds: QueueKinds = QueueKinds()) -> tuple[ScanEnd | None, dict, int]:
    """Everything that can refuse the store, read before anything changes, so a refused
    open leaves every byte as it was: (the end of valid data, the next queue offsets,
    the ConsumeQueues' max physical end). Refused is what a broker's recovery would not do, or would do only
    by destroying valid data; ``rmqstore repair`` plans it with a backup (spec §10.4):

    * segments of the wrong size, misaligned or with a gap (the broker refuses to load);
    * ConsumeQueue units pointing past the end (the broker would cut them);
    * CRC-valid records after the end that the reopen would delete (segments wholly
      after it) or the next append overwrite (the rest of the end segment), unless
      they are the unfinished append of a writer of ours that died (zeros at the end,
      after a crash: :func:`~rmqstore.engine.unfinished_append.clear_unfinished_append`);
    * IndexFiles this geometry cannot open.
    """
    root = Path(cfg.store_path_root_dir)
    bad = [p for p in queue.problems if p.code in ("wrong-size", "misaligned", "gap")]
    if bad:
        raise RecordError(f"commitlog segment problem: {bad[0].detail}", bad[0].path, bad[0].offset)
    found = find_end(cfg, queue, was_clean)
    end = found.offset if found is not None else 0
    offsets, max_phy, _ = queue_state(root, cfg.cq_file_size, kinds.bcq_file_size)
    if max_phy > end:
        raise RefusedError(f"ConsumeQueue units point past the CommitLog's end ({max_phy} > "
                           f"{end}); nothing was changed: run `rmqstore repair`, which "
                           "cuts them as a broker's recovery does (spec §10.4)", root, end)
    size = cfg.mapped_file_size_commit_log
    surv = find_survivors(queue, end, cfg.max_message_size + 65536, data_only=True)
    if len(surv) and not was_clean:
        ours = _zeros_at(queue, end)
        if ours:  # an interrupted append: cleared, as after our own crash
            surv = Survivors(surv.offset[surv.offset >= end - end % size + size])
    if len(surv):
        first = int(surv.offset[0])
        raise RefusedError(
            f"{len(surv)} CRC-valid record(s) lie after the end of valid data {end} (first "
            f"at CommitLog offset {first}): the record chain breaks before them, and "
            "opening for writing would delete or overwrite them; nothing was changed: run "
            "`rmqstore repair` (it keeps them unless told --allow-data-loss)", root, first)
    if cfg.message_index_enable and cfg.index_dir.is_dir():
        files = list_index_files(cfg.index_dir)
        for i, p in enumerate(files):
            if i == len(files) - 1 and not was_clean and p.stat().st_size == 0:
                continue  # killed between create and sizing: recover_unfinished drops it
            IndexFile(p, geometry).close()
    return found, offsets, max_phy


def find_end(cfg: StoreConfig, queue: SegmentQueue, was_clean: bool) -> ScanEnd | None:
    """End of valid data (spec §10.1): from the third-to-last segment after a clean
    shutdown, from the first after a crash (``abort`` was present); None without
    segments."""
    if not queue.segments:
        return None
    start = queue.segments[max(0, len(queue.segments) - 3)].start if was_clean \
        else queue.segments[0].start
    # Recovery reads through read-only maps, which read a preallocated segment's
    # holes safely; on tmpfs a read through the writable map would allocate the
    # pages (and die of SIGBUS on a full one).
    with CommitLog(cfg) as view:
        return view.find_end(start)


def catch_up(cfg: StoreConfig, queue: SegmentQueue, dispatcher, end: int, max_phy: int,
             was_clean: bool, offsets: dict, kinds: QueueKinds = QueueKinds()) -> dict:
    """Re-dispatch the records in ``[max(max_phy, queue start), end)`` the queues lack,
    after a crash from where index keys may have been waiting; returns the next queue
    offsets (``offsets`` when nothing was re-dispatched)."""
    root = Path(cfg.store_path_root_dir)
    index = dispatcher.index
    reput_from = max(queue.min_offset, max_phy)
    if queue.segments and (reput_from < end or not was_clean):
        with CommitLog(cfg) as log_view:  # read-only maps: see find_end
            if index is not None and not was_clean and max_phy > 0:
                # Index keys that were waiting when the writer died (index_keys.DEFER_BYTES).
                def size_at(offset: int) -> int | None:
                    c = log_view.check_at(offset, check_crc=False)
                    return c.size if c.status is Check.OK else None

                behind = keys_behind(root, cfg.cq_file_size, index, max_phy, size_at,
                                     DEFER_BYTES)
                if behind is not None:
                    reput_from = max(queue.min_offset, min(reput_from, behind))
            if reput_from < end:
                dispatcher.dispatch_log(log_view, reput_from, end)
            offsets, _, last = queue_state(root, cfg.cq_file_size, kinds.bcq_file_size)
            if not was_clean and last is not None:
                # The broker's abnormal recovery re-dispatches every record from its
                # start segment (spec §10.3), and each CQ write sets logicsMsgTimestamp,
                # a unit the queue already holds included (putMessagePositionInfo
                # returns true for it). Our reput skips those records, so take the
                # time of the last record the queues hold, or a clean close would
                # write the stale value of the crashed run's checkpoint (§8.1).
                dispatcher.logics_timestamp = log_view.read_at(last).store_timestamp
    return offsets
