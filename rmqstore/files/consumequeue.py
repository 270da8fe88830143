"""ConsumeQueue: 20-byte units per topic/queue, read offline (spec §6.1).

:func:`list_queues` finds the queue directories of a store; :class:`ConsumeQueue` maps one
read-only and finds the end of data with the broker's recover rule. Writing is
:mod:`rmqstore.files.consumequeue_writer`.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from ..format import layout as L
from ..errors import OffsetError, SegmentError, UnsafePathError
from .listing import LONG_MAX, entries, odd_entry, offset_name, open_regular
from .mapped import map_read
from .names import queue_dir

DEFAULT_CQ_FILE_SIZE = 6_000_000
UNIT = L.CQ_UNIT_SIZE
_NAME = re.compile(r"^\d{20}$")
# The broker parses queue directory names with Integer.parseInt: a negative id (a record
# whose QUEUEID is negative gets one) loads like any other.
_QUEUE_ID = re.compile(r"^(0|-?[1-9]\d{0,9})$")


def effective_file_size(size: int) -> int:
    """``mappedFileSizeConsumeQueue`` rounded up to whole units (spec §1.2)."""
    if size <= 0:
        raise SegmentError(f"ConsumeQueue file size must be positive, got {size}")
    return -(-size // UNIT) * UNIT


class CQUnit(NamedTuple):
    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int

    @property
    def is_placeholder(self) -> bool:
        return self.size == L.CQ_PLACEHOLDER_SIZE and self.commit_log_offset == 0


@dataclass(frozen=True)
class QueueProblem:
    """Something odd under ``consumequeue/``; readers report it and carry on."""

    code: str  # stray-file | symlink | special-file | bad-queue-dir | misaligned | wrong-size | gap | beyond-end
    path: str
    detail: str


@dataclass(frozen=True)
class QueueRef:
    topic: str
    queue_id: int
    path: Path


@dataclass
class QueueListing:
    queues: list[QueueRef]
    problems: list[QueueProblem]


def list_queues(root: str | os.PathLike, folder: str = "consumequeue") -> QueueListing:
    """Every ``consumequeue/{topic}/{queueId}`` directory of a store root, sorted
    (``folder="batchconsumequeue"``: the BatchConsumeQueues, design-14 §4.1).

    ``consumequeue/`` itself may be a link to another disk; a link or special file below
    it is reported (code ``symlink``/``special-file``), never followed
    (:mod:`rmqstore.files.listing`)."""
    base = Path(root) / folder
    queues: list[QueueRef] = []
    problems: list[QueueProblem] = []
    for t in entries(base):
        odd = odd_entry(t)
        if odd is not None:
            problems.append(QueueProblem(odd[0], str(t.path), odd[1]))
            continue
        if t.kind != "dir":
            problems.append(QueueProblem("stray-file", str(t.path), "not a topic directory"))
            continue
        for q in entries(t.path):
            odd = odd_entry(q)
            if odd is not None:
                problems.append(QueueProblem(odd[0], str(q.path), odd[1]))
            elif q.kind == "dir" and _QUEUE_ID.match(q.name) and -2**31 <= int(q.name) < 2**31:
                queues.append(QueueRef(t.name, int(q.name), q.path))
            elif q.kind == "dir":
                problems.append(QueueProblem("bad-queue-dir", str(q.path),
                                             "queue directory names are decimal queue ids"))
            else:
                problems.append(QueueProblem("stray-file", str(q.path), "not a queue directory"))
    queues.sort(key=lambda q: (q.topic, q.queue_id))
    return QueueListing(queues, problems)


def _scan_segments(path: Path, file_size: int, problems: list[QueueProblem]) -> list[tuple[int, Path, int]]:
    """(start, path, file length) of each well-named segment, in offset order (spec §2)."""
    found = []
    for e in entries(path):
        odd = odd_entry(e)
        if odd is not None:
            problems.append(QueueProblem(odd[0], str(e.path), odd[1]))
            continue
        start = offset_name(e.name) if e.kind == "file" else None
        if start is None or start > LONG_MAX - file_size:
            problems.append(QueueProblem("stray-file", str(e.path), "segment names are 20 digits"
                                         + (" (within a Java long)" if _NAME.match(e.name) else "")))
            continue
        found.append((start, e.path, e.size))
    for i, (start, p, length) in enumerate(found):
        if start % file_size:
            problems.append(QueueProblem("misaligned", str(p),
                                         f"start {start} is not a multiple of {file_size}"))
        if length != file_size:
            problems.append(QueueProblem("wrong-size", str(p),
                                         f"{length} bytes, segments are {file_size}"))
        if i and start != found[i - 1][0] + file_size:
            problems.append(QueueProblem("gap", str(p),
                                         f"previous segment ends at {found[i - 1][0] + file_size}"))
    return found


def _valid(units: np.ndarray) -> np.ndarray:
    return (units["commit_log_offset"] >= 0) & (units["size"] > 0)


def first_false(mask: np.ndarray) -> int:
    """Index of the first False, or len(mask) when all are True."""
    bad = np.flatnonzero(~mask)
    return int(bad[0]) if bad.size else len(mask)


class QueueFiles:
    """A queue directory's segment files mapped read-only as arrays of units (``_DTYPE``):
    what a ConsumeQueue and a BatchConsumeQueue share. Subclasses set ``path``,
    ``file_size`` and ``problems``, then call :meth:`_load`, and give the recovery rules
    (``_recover``, ``_truncate``) of their kind."""

    _DTYPE = L.CQ_UNIT_DTYPE
    _WHAT = "queue file"  # for the one-line error naming the file

    def _load(self, truncate_at: int | None) -> None:
        self._files = []
        self._maps: list[mmap.mmap] = []
        self.segments: list[tuple[int, np.ndarray]] = []  # (start, all units of the file)
        for start, p, length in _scan_segments(self.path, self.file_size, self.problems):
            self.segments.append((start, self._map(p, min(length, self.file_size))))
        self._recover()
        if truncate_at is not None:
            self._truncate(truncate_at)
        self._units: np.ndarray | None = None

    def _recover_files(self, valid, noun: str) -> None:
        """The recover walk both kinds share (spec §6.1 steps 1-5, ``BatchConsumeQueue#
        recover`` @5.x): files before the third from the end are trusted whole; from there,
        the ``valid(units)`` ones up to the first invalid, a full file going on to the next;
        files after the end are reported (the broker deletes them on load) and dropped.
        Sets ``_used``, the valid units per remaining file."""
        segs = self.segments
        self._used = [len(u) for _, u in segs]
        per_file = self.file_size // self._DTYPE.itemsize
        last = len(segs) - 1
        for i in range(max(0, len(segs) - 3), len(segs)):
            n = first_false(valid(segs[i][1]))
            self._used[i] = n
            last = i
            if n < per_file:
                break
        for start, _ in segs[last + 1:]:
            self.problems.append(QueueProblem(
                "beyond-end", str(self.path / f"{start:020d}"),
                f"{noun} after the end of data (the broker deletes it on load)"))
        del segs[last + 1:]
        del self._used[last + 1:]

    def _map(self, p: Path, length: int) -> np.ndarray:
        unit = self._DTYPE.itemsize
        if length < unit:
            return np.zeros(0, dtype=self._DTYPE)
        f = None
        try:
            f = open_regular(p)
            mm = map_read(f.fileno(), length, p)  # holes read as zeros, never a bus error
        except OSError as e:
            if f is not None:
                f.close()
            raise SegmentError(f"cannot map {self._WHAT}: {e.strerror}", p) from None
        self._files.append(f)
        self._maps.append(mm)
        return np.frombuffer(mm, dtype=self._DTYPE, count=length // unit)

    def close(self) -> None:
        self.segments = []
        self._units = None
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a view; the map closes when it is dropped
        for f in self._files:
            f.close()
        self._maps, self._files = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ConsumeQueue(QueueFiles):
    """One queue directory, mapped read-only; units up to the recovered end (spec §6.1).

    ``truncate_at`` applies truncateDirtyLogicFiles(phy) (spec §10.4) to the view, which
    is how recovery drops units pointing at or past the CommitLog's recovered end; the
    bytes stay on disk, so a plain read of a recovered store can still see them.
    """

    _WHAT = "ConsumeQueue segment"

    def __init__(self, path: str | os.PathLike, file_size: int = DEFAULT_CQ_FILE_SIZE, *,
                 truncate_at: int | None = None):
        self.path = Path(path)
        self.file_size = effective_file_size(file_size)
        self.problems: list[QueueProblem] = []
        if not self.path.is_dir():
            raise SegmentError("ConsumeQueue directory does not exist", self.path)
        self._load(truncate_at)

    def _recover(self) -> None:
        """End of data as the broker's recover finds it (spec §6.1 steps 1-5)."""
        self._recover_files(_valid, "segment")
        segs = self.segments
        self.max_physic_offset = -1
        self.last_unit_offset: int | None = None  # CommitLog offset of the last unit's record
        for (_, units), n in zip(reversed(segs), reversed(self._used)):
            if n:
                u = units[n - 1]
                self.last_unit_offset = int(u["commit_log_offset"])
                self.max_physic_offset = self.last_unit_offset + int(u["size"])
                break

    def _truncate(self, phy: int) -> None:
        """truncateDirtyLogicFiles(phy) on the view (spec §10.4)."""
        self.max_physic_offset, self.last_unit_offset = phy, None
        while self.segments:
            units = self.segments[-1][1]
            if len(units) and units[0]["commit_log_offset"] >= phy:
                self.segments.pop()
                self._used.pop()
                continue
            keep = first_false(_valid(units) & (units["commit_log_offset"] < phy))
            self._used[-1] = keep
            if keep:
                u = units[keep - 1]
                self.last_unit_offset = int(u["commit_log_offset"])
                self.max_physic_offset = self.last_unit_offset + int(u["size"])
            break

    # --- offsets ----------------------------------------------------------------------

    @property
    def base_offset(self) -> int:
        """Queue offset of the first unit the first segment can hold."""
        return self.segments[0][0] // UNIT if self.segments else 0

    @property
    def max_offset(self) -> int:
        """One past the last unit: ``(lastSegmentStart + writePos) / 20`` (spec §6.1)."""
        if not self.segments:
            return 0
        return (self.segments[-1][0] + self._used[-1] * UNIT) // UNIT

    def min_offset(self, commit_log_min_offset: int = 0, rule: str = "4.9") -> int:
        """correctMinOffset (spec §6.1), ``rule`` "4.9" (linear scan) or "5.x".

        When no unit of the first segment reaches the CommitLog minimum, the broker keeps
        its previous value; offline there is none, so the first segment's base is used.
        """
        if not self.segments:
            return 0
        first = self.segments[0][1][:self._used[0]]["commit_log_offset"]
        if rule == "5.x":
            units = self.units
            if len(units) == 0 or units[-1]["commit_log_offset"] < commit_log_min_offset:
                return self.max_offset
            i = int(np.searchsorted(first, commit_log_min_offset, side="left"))
        elif rule == "4.9":
            i = first_false(first < commit_log_min_offset)
        else:
            raise ValueError(f"unknown min-offset rule {rule!r}")
        return self.base_offset + i if i < len(first) else self.base_offset

    # --- units ------------------------------------------------------------------------

    @property
    def units(self) -> np.ndarray:
        """Units ``[base_offset, max_offset)`` as one CQ_UNIT_DTYPE array (a copy).

        Row i is queue offset ``base_offset + i`` unless the queue has a gap (a problem).
        """
        if self._units is None:
            parts = [u[:n] for (_, u), n in zip(self.segments, self._used)]
            self._units = (np.concatenate(parts) if parts
                           else np.zeros(0, dtype=L.CQ_UNIT_DTYPE))
        return self._units

    def first_physic_offset_from(self, low: int) -> int | None:
        """The smallest CommitLog offset at or after ``low`` that a unit points at (units
        point ever further, so only the last segments are read), or None."""
        best = None
        for (_, units), n in zip(reversed(self.segments), reversed(self._used)):
            phy = units[:n]["commit_log_offset"]
            if n == 0 or int(phy[-1]) < low:
                break
            i = int(np.searchsorted(phy, low, side="left"))
            best = int(phy[i])
            if i > 0:
                break
        return best

    def placeholder_mask(self) -> np.ndarray:
        u = self.units
        return (u["size"] == L.CQ_PLACEHOLDER_SIZE) & (u["commit_log_offset"] == 0)

    def unit_at(self, queue_offset: int) -> CQUnit:
        """The unit at ``queue_offset``; placeholders are returned (see ``is_placeholder``)."""
        if self.segments and self.base_offset <= queue_offset < self.max_offset:
            byte = queue_offset * UNIT
            i = byte // self.file_size - self.segments[0][0] // self.file_size
            if not (0 <= i < len(self.segments) and self.segments[i][0] <= byte):
                i = max(k for k, (s, _) in enumerate(self.segments) if s <= byte)
            start, units = self.segments[i]
            pos = (byte - start) // UNIT
            if pos < self._used[i]:
                u = units[pos]
                return CQUnit(queue_offset, int(u["commit_log_offset"]), int(u["size"]),
                              int(u["tags_code"]))
        raise OffsetError(f"queue offset {queue_offset} is outside "
                          f"[{self.base_offset}, {self.max_offset})", self.path, queue_offset * UNIT)

    def iter_units(self, start: int | None = None, *, placeholders: bool = False
                   ) -> Iterator[CQUnit]:
        """(queueOffset, commitLogOffset, size, tagsCode) from ``start`` to the end.

        Queue offsets come from each segment's name, so they stay right across a gap.
        """
        for (seg_start, seg_units), n in zip(self.segments, self._used):
            first = seg_start // UNIT
            lo = 0 if start is None else min(n, max(0, start - first))
            for k in range(lo, n, 65536):
                chunk = seg_units[k:min(n, k + 65536)]
                rows = zip(chunk["commit_log_offset"].tolist(), chunk["size"].tolist(),
                           chunk["tags_code"].tolist())
                for j, (off, size, tags) in enumerate(rows):
                    if placeholders or not (size == L.CQ_PLACEHOLDER_SIZE and off == 0):
                        yield CQUnit(first + k + j, off, size, tags)

    __iter__ = iter_units

    def __len__(self) -> int:
        return self.max_offset - self.base_offset

def open_consume_queue(root: str | os.PathLike, topic: str, queue_id: int,
                       file_size: int = DEFAULT_CQ_FILE_SIZE, **kw) -> ConsumeQueue:
    """A queue by topic and id (:class:`UnsafePathError` for a topic that is not one safe
    directory name, or a queue reached through a symbolic link)."""
    path = queue_dir(Path(root) / "consumequeue", topic, queue_id)
    for p in (path.parent, path):
        if p.is_symlink():
            raise UnsafePathError("a symbolic link inside the store: not read through", p)
    return ConsumeQueue(path, file_size, **kw)
