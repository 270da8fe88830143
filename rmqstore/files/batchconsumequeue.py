"""BatchConsumeQueue: 46-byte units per topic/queue of a RocketMQ 5.x BatchCQ topic, read
offline (design-14 §4, ``BatchConsumeQueue`` @5.x).

The sibling of :mod:`rmqstore.files.consumequeue`, with the same public shape:
:func:`list_batch_queues` finds ``batchconsumequeue/{topic}/{queueId}``;
:class:`BatchConsumeQueue` maps one read-only and finds the end of data with the broker's
recover rule. A unit covers the queue offsets ``[msgBaseOffset, msgBaseOffset + batchNum)``
(an inner-batch record holds batchNum messages). Files are named by their byte offset in
the queue's stream of units and hold ``mapperFileSizeBatchConsumeQueue`` bytes, not rounded
to whole units. :func:`build_batch_consume_queue` writes one queue in bulk (rebuild).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from ..errors import OffsetError, SegmentError, UnsafePathError
from ..format import layout as L
from ..format.rules import bcq_unit_ok
from .consumequeue import QueueFiles, QueueListing, QueueProblem, first_false, list_queues
from .listing import entries, offset_name
from .mapped import io_error
from .names import queue_dir

FOLDER = "batchconsumequeue"
#: ``mapperFileSizeBatchConsumeQueue``'s default: 300,000 units (design-14 §4.1).
DEFAULT_BCQ_FILE_SIZE = 300_000 * L.BCQ_UNIT_SIZE
UNIT = L.BCQ_UNIT_SIZE


class BCQUnit(NamedTuple):
    """One unit; it stands for the queue offsets ``[base_offset, base_offset + batch_num)``."""

    base_offset: int
    commit_log_offset: int
    size: int
    tags_code: int
    batch_num: int
    store_timestamp: int
    compacted_offset: int


def list_batch_queues(root: str | os.PathLike) -> QueueListing:
    """Every ``batchconsumequeue/{topic}/{queueId}`` directory of a store root, sorted; odd
    entries reported, links never followed (as :func:`~rmqstore.files.consumequeue.list_queues`)."""
    return list_queues(root, FOLDER)


def file_size_from_files(path: str | os.PathLike) -> int | None:
    """The file size the segments of one queue directory show (they are created whole), or
    None when it has none."""
    for e in entries(Path(path)):
        if e.kind == "file" and offset_name(e.name) is not None and e.size > 0:
            return e.size
    return None


def store_file_size(root: str | os.PathLike) -> int | None:
    """``mapperFileSizeBatchConsumeQueue`` as the store's BCQ files show it, or None."""
    for ref in list_batch_queues(root).queues:
        size = file_size_from_files(ref.path)
        if size:
            return size
    return None


def bcq_file_size(cfg) -> int | None:
    """``mapperFileSizeBatchConsumeQueue`` for the store ``cfg`` describes: what its BCQ
    files show (a broker.conf value that disagrees is a :class:`ConfigError`: the files
    are the truth), else the configured value when one was given, else None (undetermined)."""
    from ..errors import ConfigError

    files = store_file_size(cfg.root)
    given = cfg.sources.get("mapper_file_size_batch_consume_queue") is not None
    if files is not None:
        if given and cfg.mapper_file_size_batch_consume_queue != files:
            raise ConfigError(f"mapperFileSizeBatchConsumeQueue={cfg.mapper_file_size_batch_consume_queue} "
                              f"disagrees with the files, which are {files} bytes; the files are "
                              "the truth: fix or drop the setting", cfg.root / FOLDER)
        return files
    return cfg.mapper_file_size_batch_consume_queue if given else None


def _valid(units: np.ndarray) -> np.ndarray:
    """A unit recovery keeps: phy >= 0, size > 0, base >= 0, batchNum > 0 (design-14 §4.2)."""
    return ((units["commit_log_offset"] >= 0) & (units["size"] > 0)
            & bcq_unit_ok(units["msg_base_offset"], units["batch_size"]))


class BatchConsumeQueue(QueueFiles):
    """One BCQ directory, mapped read-only; units up to the recovered end (design-14 §4.2).

    ``file_size`` defaults to what the files show; ``truncate_at`` applies
    truncateDirtyLogicFiles(phy) to the view, as recovery does.
    """

    _DTYPE = L.BCQ_UNIT_DTYPE
    _WHAT = "BatchConsumeQueue file"

    def __init__(self, path: str | os.PathLike, file_size: int | None = None, *,
                 truncate_at: int | None = None):
        self.path = Path(path)
        self.problems: list[QueueProblem] = []
        if not self.path.is_dir():
            raise SegmentError("BatchConsumeQueue directory does not exist", self.path)
        self.file_size = file_size or file_size_from_files(self.path) or DEFAULT_BCQ_FILE_SIZE
        if self.file_size < UNIT:
            raise SegmentError(f"BatchConsumeQueue file size {self.file_size} holds no unit",
                               self.path)
        self._load(truncate_at)

    def _recover(self) -> None:
        """``BatchConsumeQueue#recover`` @5.x: from the third file from the end, valid units
        up to the first invalid one; a full file goes on to the next (the walk a
        ConsumeQueue's recover makes, with this kind's unit validity)."""
        self._recover_files(_valid, "file")

    def _truncate(self, phy: int) -> None:
        """``truncateDirtyLogicFiles(phy)``: from the last file, drop a file whose first unit
        points at or past ``phy``, else keep its units before ``phy``."""
        while self.segments:
            units = self.segments[-1][1][:self._used[-1]]
            if not len(units) or units[0]["commit_log_offset"] >= phy:
                self.segments.pop()
                self._used.pop()
                continue
            self._used[-1] = first_false(units["commit_log_offset"] < phy)
            break

    # --- offsets --------------------------------------------------------------------------

    def _last(self):
        for (_, units), n in zip(reversed(self.segments), reversed(self._used)):
            if n:
                return units[n - 1]
        return None

    @property
    def max_offset(self) -> int:
        """One past the last message: the last unit's base + batchNum (0 when empty)."""
        u = self._last()
        return 0 if u is None else int(u["msg_base_offset"]) + int(u["batch_size"])

    @property
    def max_physic_offset(self) -> int:
        """The CommitLog offset of the last unit's record (its **start**, unlike a
        ConsumeQueue's end: ``maxMsgPhyOffsetInCommitLog`` @5.x); -1 when empty."""
        u = self._last()
        return -1 if u is None else int(u["commit_log_offset"])

    last_unit_offset = max_physic_offset

    @property
    def max_physic_end(self) -> int:
        """Where the last unit's record ends in the CommitLog (-1 when empty): what a
        reopen's reput resumes from (a ConsumeQueue's max_physic_offset)."""
        u = self._last()
        return -1 if u is None else int(u["commit_log_offset"]) + int(u["size"])

    def min_offset(self, commit_log_min_offset: int = 0) -> int:
        """The first file's first base, pushed past units whose record lies before the
        CommitLog minimum (``correctMinOffset`` @5.x)."""
        if not self.segments or not self._used[0]:
            return self.max_offset if self.segments else 0
        first = self.segments[0][1][:self._used[0]]
        gone = np.flatnonzero(first["commit_log_offset"] < commit_log_min_offset)
        if len(gone):
            u = first[gone[-1]]
            return int(u["msg_base_offset"]) + int(u["batch_size"])
        return int(first[0]["msg_base_offset"])

    # --- units ----------------------------------------------------------------------------

    @property
    def units(self) -> np.ndarray:
        """Every unit up to the recovered end, as one BCQ_UNIT_DTYPE array (a copy)."""
        if self._units is None:
            parts = [u[:n] for (_, u), n in zip(self.segments, self._used)]
            # (np.concatenate would give the fields in native byte order)
            self._units = (np.concatenate(parts).astype(L.BCQ_UNIT_DTYPE) if parts
                           else np.zeros(0, dtype=L.BCQ_UNIT_DTYPE))
        return self._units

    @staticmethod
    def _unit(u) -> BCQUnit:
        return BCQUnit(int(u["msg_base_offset"]), int(u["commit_log_offset"]), int(u["size"]),
                       int(u["tags_code"]), int(u["batch_size"]), int(u["store_timestamp"]),
                       int(u["compacted_offset"]))

    def unit_at(self, queue_offset: int) -> BCQUnit:
        """The unit whose messages include ``queue_offset`` (base <= N < base + batchNum),
        found as ``getBatchMsgIndexBuffer`` does: the last file whose first base is <= N,
        then a binary search on base."""
        files = [(units[:n], int(units[0]["msg_base_offset"]))
                 for (_, units), n in zip(self.segments, self._used) if n]
        starts = [b for _, b in files]
        k = int(np.searchsorted(starts, queue_offset, side="right")) - 1
        if k >= 0:
            units = files[k][0]
            i = int(np.searchsorted(units["msg_base_offset"], queue_offset, side="right")) - 1
            if i >= 0:
                u = units[i]
                if int(u["msg_base_offset"]) <= queue_offset < int(u["msg_base_offset"]) + int(u["batch_size"]):
                    return self._unit(u)
        raise OffsetError(f"queue offset {queue_offset} is in no unit of "
                          f"[{self.min_offset()}, {self.max_offset})", self.path)

    def iter_units(self) -> Iterator[BCQUnit]:
        for (_, units), n in zip(self.segments, self._used):
            for k in range(0, n, 65536):
                for u in units[k:min(n, k + 65536)]:
                    yield self._unit(u)

    __iter__ = iter_units

    def __len__(self) -> int:
        """Units (records), not messages: ``max_offset - min_offset()`` counts those."""
        return sum(self._used)


class BatchConsumeQueueWriter:
    """Appends units to one BCQ directory with the broker's write rule (design-14 §4.2,
    ``BatchConsumeQueue#putBatchMessagePositionInfo`` @5.x): a unit whose record starts at
    or before the last unit's record is skipped, one with a negative base or batchNum too;
    any other goes right after the last unit (no placement by queue offset: the base says
    which offsets it covers). Files are ``file_size`` bytes, named by their byte offset in
    the queue's unit stream. Opening recovers the end as the broker's load does; a file
    after that end is refused (``rmqstore repair`` deals with it), never deleted here.
    The caller holds the store lock."""

    def __init__(self, path: str | os.PathLike, file_size: int = DEFAULT_BCQ_FILE_SIZE):
        self.path = Path(path)
        self.file_size = file_size
        self.per = file_size // UNIT
        if self.per < 1:
            raise SegmentError(f"BatchConsumeQueue file size {file_size} holds no unit", self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        with BatchConsumeQueue(self.path, file_size) as q:
            beyond = [p for p in q.problems if p.code == "beyond-end"]
            if beyond:
                raise SegmentError(f"{beyond[0].path}: {beyond[0].detail}; run `rmqstore repair` "
                                   "first (nothing was changed)", self.path)
            self._start = q.segments[-1][0] if q.segments else 0
            self._used = q._used[-1] if q.segments else 0
            self.max_physic_offset = q.max_physic_offset
        self._fds: dict[int, int] = {}

    def _fd(self, start: int) -> int:

        fd = self._fds.get(start)
        if fd is None:
            p = self.path / f"{start:020d}"
            try:
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise io_error(e, p, "open BatchConsumeQueue file") from None
            try:
                if os.fstat(fd).st_size < self.file_size:
                    os.ftruncate(fd, self.file_size)  # sparse zeros, like a fresh mmap
            except OSError as e:
                os.close(fd)
                raise io_error(e, p, "size BatchConsumeQueue file") from None
            self._fds[start] = fd
        return fd

    def put(self, commit_log_offset: int, size: int, tags_code: int, store_timestamp: int,
            base: int, num: int) -> bool:
        """One unit; True when written."""

        if commit_log_offset <= self.max_physic_offset or base < 0 or num < 0:
            return False
        if self._used >= self.per:
            self._start, self._used = self._start + self.file_size, 0
        data = L.BCQ_UNIT_STRUCT.pack(commit_log_offset, size, tags_code, store_timestamp, base,
                                      num, L.BCQ_COMPACTED_NONE, 0)
        at = self._used * UNIT
        try:
            os.pwrite(self._fd(self._start), data, at)
        except OSError as e:
            raise io_error(e, self.path / f"{self._start:020d}", "write BatchConsumeQueue unit",
                           at) from None
        self._used += 1
        self.max_physic_offset = commit_log_offset
        return True

    def flush(self, least_pages: int = 0) -> None:

        for start, fd in list(self._fds.items()):
            try:
                os.fsync(fd)
            except OSError as e:
                raise io_error(e, self.path / f"{start:020d}", "sync BatchConsumeQueue file") from None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def open_batch_consume_queue(root: str | os.PathLike, topic: str, queue_id: int,
                             file_size: int | None = None, **kw) -> BatchConsumeQueue:
    """A BCQ by topic and id (:class:`UnsafePathError` for a topic that is not one safe
    directory name, or a queue reached through a symbolic link)."""
    path = queue_dir(Path(root) / FOLDER, topic, queue_id)
    for p in (path.parent, path):
        if p.is_symlink():
            raise UnsafePathError("a symbolic link inside the store: not read through", p)
    return BatchConsumeQueue(path, file_size, **kw)


def get_in_batch_queue(reader, topic: str, queue_id: int, queue_offset: int):
    """The message at ``queue_offset`` of a BatchCQ topic's queue, or None when the topic
    has no ``batchconsumequeue/`` directory (a ConsumeQueue topic): the unit with
    base <= N < base + batchNum, its record, and for an inner batch message N - base of it
    (design-14 §4.3). ``reader`` is a :class:`~rmqstore.reader.StoreReader`."""
    from ..format.record import inner_messages, is_inner_batch

    topic_dir = Path(reader.root) / FOLDER
    if not (topic_dir / topic).is_dir() or (topic_dir / topic).is_symlink():
        return None
    with open_batch_consume_queue(reader.root, topic, queue_id, bcq_file_size(reader.config)) as q:
        unit = q.unit_at(queue_offset)
    msg = reader.read_at(unit.commit_log_offset)
    if not is_inner_batch(msg.sys_flag):
        return msg
    inner = inner_messages(msg)
    i = queue_offset - unit.base_offset
    if i >= len(inner):
        raise OffsetError(f"queue offset {queue_offset}: the unit says batch of {unit.batch_num} "
                          f"from {unit.base_offset}, the record at {unit.commit_log_offset} holds "
                          f"{len(inner)} messages", q.path)
    return inner[i]


def bcq_units(commit_log_offsets, sizes, tags_codes, store_timestamps, bases, nums) -> np.ndarray:
    """The units dispatch writes for these records, in CommitLog order, as the broker's
    ``putBatchMessagePositionInfo`` does: a unit whose base or batchNum is negative is
    skipped, as is a record at or before the previous unit's record (CommitLog offsets
    only grow, so that is a record given twice); compactedOffset -1, reserved 0."""
    phy = np.asarray(commit_log_offsets, np.int64)
    base, num = np.asarray(bases, np.int64), np.asarray(nums, np.int64)
    keep = (base >= 0) & (num >= 0)
    if len(phy) > 1:
        keep[1:] &= phy[1:] > np.maximum.accumulate(phy)[:-1]
    idx = np.flatnonzero(keep)
    out = np.zeros(len(idx), dtype=L.BCQ_UNIT_DTYPE)
    out["commit_log_offset"] = phy[idx]
    out["size"] = np.asarray(sizes)[idx]
    out["tags_code"] = np.asarray(tags_codes)[idx]
    out["store_timestamp"] = np.asarray(store_timestamps)[idx]
    out["msg_base_offset"] = base[idx]
    out["batch_size"] = num[idx]
    out["compacted_offset"] = L.BCQ_COMPACTED_NONE
    return out


def build_batch_consume_queue(path: str | os.PathLike, units: np.ndarray,
                              file_size: int = DEFAULT_BCQ_FILE_SIZE, *, fsync: bool = False) -> int:
    """Write one queue's units (:func:`bcq_units`) into an empty directory: files named by
    their byte offset, each ``file_size`` bytes (zeros after the last unit), as the broker
    leaves them. Returns the units written."""
    p = Path(path)
    if p.is_dir() and any(p.iterdir()):
        raise SegmentError("bulk BatchConsumeQueue build needs an empty directory", p)
    p.mkdir(parents=True, exist_ok=True)
    per = file_size // UNIT
    raw = units.tobytes()
    for k in range(0, max(len(units), 1), per):
        if not len(units):
            break
        data = raw[k * UNIT:min(len(units), k + per) * UNIT]
        name = p / f"{(k // per) * file_size:020d}"
        with open(name, "xb") as f:  # a new file only: nothing of the store is replaced
            f.write(data + bytes(file_size - len(data)))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return len(units)


__all__ = ["BatchConsumeQueueWriter", "bcq_file_size", "get_in_batch_queue", "BatchConsumeQueue", "BCQUnit", "list_batch_queues", "open_batch_consume_queue",
           "build_batch_consume_queue", "bcq_units", "store_file_size", "file_size_from_files",
           "DEFAULT_BCQ_FILE_SIZE", "FOLDER"]
