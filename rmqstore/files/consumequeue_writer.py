"""ConsumeQueue units written offline with the broker's write rules (spec §6.1).

:class:`ConsumeQueueWriter` appends units one at a time (:meth:`~ConsumeQueueWriter.put`)
or in bulk (:meth:`~ConsumeQueueWriter.put_many`); both produce the same bytes.
:func:`build_consume_queue` writes a whole queue from arrays. Reading is
:mod:`rmqstore.files.consumequeue`.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from ..errors import SegmentError
from ..format import layout as L
from .consumequeue import DEFAULT_CQ_FILE_SIZE, UNIT, ConsumeQueue, first_false, effective_file_size
from .mapped import Ahead, io_error, note

_UNIT_STRUCT = L.CQ_UNIT_STRUCT
_PLACEHOLDER = np.array([(0, L.CQ_PLACEHOLDER_SIZE, 0)], dtype=L.CQ_UNIT_DTYPE)


class ConsumeQueueWriter:
    """Appends units with the broker's write rules (spec §6.1).

    Opening recovers the end of data like a broker load and deletes the segments after
    it, as the broker does; the caller must hold the store lock.
    """

    def __init__(self, path: str | os.PathLike, file_size: int = DEFAULT_CQ_FILE_SIZE):
        self.path = Path(path)
        self.file_size = effective_file_size(file_size)
        self.path.mkdir(parents=True, exist_ok=True)
        with ConsumeQueue(self.path, self.file_size) as cq:
            self._starts = [s for s, _ in cq.segments]
            self.write_pos = cq.max_offset * UNIT if cq.segments else None
            self.max_physic_offset = cq.max_physic_offset
            beyond = [p.path for p in cq.problems if p.code == "beyond-end"]
        for p in beyond:
            os.unlink(p)
        self._fds: dict[int, int] = {}
        # Units are stored through a shared mapping of the segment being written: a
        # 20-byte store costs far less than a pwrite() system call, same bytes on disk.
        # Only into allocated bytes (a store into an unallocated page on a full disk is a
        # SIGBUS): each file is allocated ALLOCATE_AHEAD bytes at a time, in _ensure.
        self._maps: dict[int, mmap.mmap] = {}
        self._map_start = -1  # segment start of _map_cur
        self._map_cur: mmap.mmap | None = None
        self._ahead: dict[int, Ahead] = {}  # segment start -> its allocation ahead
        self._map_alloc = 0  # _map_cur's allocated bytes, whole units: units below go in
        self._flushed_pos = self.write_pos or 0  # what flush() last covered

    # --- segment files --------------------------------------------------------------

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            p = self.path / f"{start:020d}"
            try:
                fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise io_error(e, p, "open ConsumeQueue segment") from None
            try:
                if os.fstat(fd).st_size < self.file_size:
                    os.ftruncate(fd, self.file_size)  # sparse zeros, like a fresh mmap (§2)
            except OSError as e:
                os.close(fd)
                raise io_error(e, p, "size ConsumeQueue segment") from None
            self._fds[start] = fd
        return fd

    def _ensure(self, start: int, at: int, upto: int) -> None:
        """Allocate segment ``start`` for a write of bytes ``[at, upto)`` (and ahead)
        before units are stored there; :class:`StoreIOError` (nothing written) on a full
        disk."""
        ahead = self._ahead.get(start)
        if ahead is None:
            ahead = self._ahead[start] = Ahead(
                self._fd(start), at, self.file_size, ALLOCATE_AHEAD,
                self.path / f"{start:020d}", "the ConsumeQueue segment")
        if upto > ahead.end:
            have = ahead.need(upto)
            if start == self._map_start:
                self._map_alloc = have - have % UNIT

    def _segment_for(self, queue_offset: int) -> None:
        """getLastMappedFile: the first segment, with placeholders, or the next one."""
        if self.write_pos is None:
            expect = queue_offset * UNIT
            start = expect - expect % self.file_size
            self._starts.append(start)
            self._fd(start)
            self.write_pos = start
            if queue_offset != 0 and expect > start:
                self._pwrite(start, np.repeat(_PLACEHOLDER, (expect - start) // UNIT).tobytes())
                self.write_pos = expect
        elif self.write_pos == self._starts[-1] + self.file_size:
            self._starts.append(self.write_pos)
            self._fd(self.write_pos)

    def _map_for(self, start: int) -> mmap.mmap:
        mm = self._maps.get(start)
        if mm is None:
            note(self.path / f"{start:020d}", "write")
            try:
                mm = self._maps[start] = mmap.mmap(self._fd(start), self.file_size)
            except OSError as e:
                raise io_error(e, self.path / f"{start:020d}", "map ConsumeQueue segment") from None
        ahead = self._ahead.get(start)
        have = ahead.end if ahead is not None else 0
        self._map_start, self._map_cur, self._map_alloc = start, mm, have - have % UNIT
        return mm

    def _pwrite(self, pos: int, data: bytes) -> None:
        start = self._starts[-1]
        mm = self._map_cur if start == self._map_start else self._map_for(start)
        self._ensure(start, pos - start, pos - start + len(data))
        mm[pos - start:pos - start + len(data)] = data

    # --- appending ------------------------------------------------------------------

    def put(self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        """putMessagePositionInfo; True when the unit was written (spec §6.1)."""
        if commit_log_offset + size <= self.max_physic_offset:
            return False  # a repeat
        pos = self.write_pos
        if pos is not None and queue_offset * UNIT == pos \
                and 0 <= pos - self._map_start < self._map_alloc and self._map_start == self._starts[-1]:
            # The usual case: the next unit, in the segment being written.
            _UNIT_STRUCT.pack_into(self._map_cur, pos - self._map_start,
                                   commit_log_offset, size, tags_code)
            self.write_pos = pos + UNIT
            self.max_physic_offset = commit_log_offset + size
            return True
        self._segment_for(queue_offset)
        if queue_offset * UNIT < self.write_pos:
            return False  # already built
        # A unit for a later offset still goes at the write position: units stay dense.
        self._pwrite(self.write_pos, L.CQ_UNIT_STRUCT.pack(commit_log_offset, size, tags_code))
        self.write_pos += UNIT
        self.max_physic_offset = commit_log_offset + size
        return True

    def put_many(self, queue_offsets, commit_log_offsets, sizes, tags_codes) -> int:
        """:meth:`put` for each unit in order, vectorised; returns how many were written."""
        q = np.asarray(queue_offsets, dtype=np.int64)
        phy = np.asarray(commit_log_offsets, dtype=np.int64)
        size = np.asarray(sizes, dtype=np.int64)
        tags = np.asarray(tags_codes, dtype=np.int64)
        ends = phy + size
        n, i, written, window = len(q), 0, 0, 4096
        while i < n:
            if self.write_pos is None:
                written += self.put(int(q[i]), int(phy[i]), int(size[i]), int(tags[i]))
                i += 1
                continue
            j = min(n, i + window)
            k = self._accepted_prefix(q[i:j], ends[i:j])
            if k:
                self._write_dense(phy[i:i + k], size[i:i + k], tags[i:i + k])
                written += k
                i += k
                window = min(window * 2, 1 << 22)
            if i < j:
                # The unit a rule applies to goes the slow way; then vectorise again.
                written += self.put(int(q[i]), int(phy[i]), int(size[i]), int(tags[i]))
                i += 1
                window = 4096
        return written

    def put_run(self, first_queue_offset: int, commit_log_offsets, sizes, tags_codes) -> int:
        """:meth:`put_many` for units whose queue offsets count up by one from
        ``first_queue_offset``; when they continue the queue exactly and point ever
        further into the CommitLog (a rebuild's usual run), they are written without the
        per-unit rule checks."""
        phy = np.asarray(commit_log_offsets, dtype=np.int64)
        size = np.asarray(sizes, dtype=np.int64)
        n = len(phy)
        if n and self.write_pos is not None and first_queue_offset * UNIT == self.write_pos:
            ends = phy + size
            if int(ends[0]) > self.max_physic_offset and bool((ends[1:] > ends[:-1]).all()):
                self._write_dense(phy, size, tags_codes)
                return n
        q = np.arange(first_queue_offset, first_queue_offset + n, dtype=np.int64)
        return self.put_many(q, phy, size, tags_codes)

    def put_block(self, first_queue_offset: int, data, first_end: int, last_end: int,
                  units: np.ndarray) -> None:
        """Units ready as bytes ``data`` (``units``, the same as ``CQ_UNIT_DTYPE``) for
        queue offsets counting up by one from ``first_queue_offset``, pointing at ascending
        CommitLog ends ``first_end`` .. ``last_end`` (a batch's units of one queue): one
        block write when they simply continue the queue, else :meth:`put_many` (same
        bytes either way)."""
        pos = self.write_pos
        if pos is None or pos != first_queue_offset * UNIT or first_end <= self.max_physic_offset:
            self.put_many(np.arange(first_queue_offset, first_queue_offset + len(units)),
                          units["commit_log_offset"], units["size"], units["tags_code"])
            return
        start, size = self._starts[-1], self.file_size
        if pos - start + len(data) <= self._map_alloc and self._map_start == start:
            mm = self._map_cur  # the usual case: within the allocated part being written
            mm[pos - start:pos - start + len(data)] = data
            self.write_pos = pos + len(data)
        else:
            done = 0
            while done < len(data):  # _write_dense, from ready bytes
                if self.write_pos == self._starts[-1] + size:
                    self._starts.append(self.write_pos)
                room = self._starts[-1] + size - self.write_pos
                chunk = data[done:done + room]
                self._pwrite(self.write_pos, chunk)
                self.write_pos += len(chunk)
                done += len(chunk)
        self.max_physic_offset = last_end

    def _accepted_prefix(self, q: np.ndarray, ends: np.ndarray) -> int:
        """How many leading units neither write rule skips (each then lands at its slot)."""
        prev = np.maximum.accumulate(np.concatenate(([self.max_physic_offset], ends[:-1])))
        ok = ends > prev
        ok &= q >= self.write_pos // UNIT + np.arange(len(q))
        return first_false(ok)

    def _write_dense(self, phy: np.ndarray, size: np.ndarray, tags: np.ndarray) -> None:
        units = np.empty(len(phy), dtype=L.CQ_UNIT_DTYPE)
        units["commit_log_offset"], units["size"], units["tags_code"] = phy, size, tags
        data = memoryview(units).cast("B")
        done = 0
        while done < len(data):
            if self.write_pos == self._starts[-1] + self.file_size:
                self._starts.append(self.write_pos)
            start = self._starts[-1]
            room = start + self.file_size - self.write_pos
            chunk = data[done:done + room]
            self._ensure(start, self.write_pos - start, self.write_pos - start + len(chunk))
            if len(chunk) >= _PWRITE_MIN:
                # Many units: one pwrite costs less than page-faulting the fresh mapping.
                try:
                    os.pwrite(self._fd(start), chunk, self.write_pos - start)
                except OSError as e:
                    raise io_error(e, self.path / f"{start:020d}", "write ConsumeQueue units",
                                   self.write_pos - start) from None
            else:
                self._pwrite(self.write_pos, chunk)
            self.write_pos += len(chunk)
            done += len(chunk)
        self.max_physic_offset = int(phy[-1] + size[-1])

    def flush(self, least_pages: int = 0) -> None:
        """Sync the segments (an ``fsync`` also writes back pages dirtied through the
        mapping on Linux); with ``least_pages``, only once that many 4 KiB pages were
        written since the last flush. Safe from another thread than the writer's."""
        pos = self.write_pos or 0
        if least_pages and pos // 4096 - self._flushed_pos // 4096 < least_pages:
            return
        for start, fd in list(self._fds.items()):
            try:
                os.fsync(fd)
            except OSError as e:
                raise io_error(e, self.path / f"{start:020d}", "sync ConsumeQueue segment") from None
        self._flushed_pos = pos

    def close(self) -> None:
        # Only the last file has bytes allocated ahead and never written: give them back.
        if self._starts and self.write_pos is not None and self._starts[-1] in self._ahead:
            start = self._starts[-1]
            self._ahead[start].give_back(self.write_pos - start)
        for mm in self._maps.values():
            mm.close()
        self._maps, self._map_start, self._map_cur = {}, -1, None
        self._ahead, self._map_alloc = {}, 0
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __enter__(self) -> "ConsumeQueueWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_PWRITE_MIN = 64 * 1024  # bytes from which dense units are written with pwrite
#: Bytes of a ConsumeQueue file allocated at a time ahead of the units written (3,276
#: units): small, as a store may have thousands of queues, each with its file.
ALLOCATE_AHEAD = 64 * 1024


def build_consume_queue(path: str | os.PathLike, queue_offsets, commit_log_offsets, sizes,
                        tags_codes, file_size: int = DEFAULT_CQ_FILE_SIZE, *,
                        fsync: bool = False) -> int:
    """Write one queue from arrays in CommitLog order into an empty directory.

    The files equal what incremental dispatch writes (spec §6.1, §9).
    """
    p = Path(path)
    if p.is_dir() and any(p.iterdir()):
        raise SegmentError("bulk ConsumeQueue build needs an empty directory", p)
    with ConsumeQueueWriter(p, file_size) as w:
        n = w.put_many(queue_offsets, commit_log_offsets, sizes, tags_codes)
        if fsync:
            w.flush()
    return n
