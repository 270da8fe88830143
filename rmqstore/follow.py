"""Follow a live store: messages as the broker appends them, read-only.

Nothing here takes the store's ``lock`` or opens a file for writing: each CommitLog
segment is opened ``rb`` and mapped ``ACCESS_READ``, so a broker (or ``rmqstore append``)
keeps writing undisturbed. The follower re-reads the bytes at its position every poll:

* a whole record whose lengths add up and whose body matches BODYCRC is given and the
  position moves past it (spec §3.9);
* a BLANK moves to the next segment, which is waited for until the writer creates it
  (segment roll, spec §4); a file that grows is mapped again;
* zeros, or a record still being copied in, mean "not yet": wait. A record that stays
  inconsistent for ``settle`` seconds is reported in :attr:`Follower.stalled` (the CLI warns
  once); one whose lengths add up but whose body CRC stays wrong is given (``crcOk`` false).
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from .format.message import Message
from .format.record import decode_record
from .files.commitlog import Check, check_record
from .files.segments import segment_name
from .selection import MessageFilter, MessageScan, ScanStop
from .scan.records import scan_buffer


class _Segment:
    """One segment file, mapped read-only at its current size (re-mapped as it grows)."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "rb")
        self.map: mmap.mmap | bytes = b""
        self.size = 0
        self.refresh()

    def refresh(self) -> bool:
        """Map the file again if it grew; True when it did."""
        size = os.fstat(self.file.fileno()).st_size
        if size <= self.size:
            return False
        if isinstance(self.map, mmap.mmap):
            self.map.close()
        self.map = mmap.mmap(self.file.fileno(), size, access=mmap.ACCESS_READ)
        self.size = size
        return True

    def close(self) -> None:
        if isinstance(self.map, mmap.mmap):
            try:
                self.map.close()
            except BufferError:
                pass
        self.file.close()


class Follower:
    """Iterate to get the messages that pass ``filter``, old ones first when the filter
    has ``from_offset`` or ``since``, else only those appended from now on.

    Ends when ``limit`` or ``to_offset`` is reached, when ``stop()`` returns True (checked
    every poll), or after ``idle_timeout`` seconds without a new record; otherwise it
    follows until the caller stops iterating (Ctrl-C in the CLI)."""

    def __init__(self, reader, filter: MessageFilter | None = None, *, poll: float = 0.2,
                 idle_timeout: float | None = None, stop: Callable[[], bool] | None = None,
                 settle: float = 2.0):
        self.reader = reader
        self.filter = f = filter or MessageFilter()
        self.poll, self.idle_timeout, self.stop_when, self.settle = poll, idle_timeout, stop, settle
        self.segment_size = reader.config.mapped_file_size_commit_log
        self.dirs = reader.commitlog.queue.dirs
        self.stalled: ScanStop | None = None
        self.given = 0
        self._history = f.from_offset is not None or f.since is not None
        # Where following starts is decided now, before any new record can be missed.
        self.position = None if self._history else self._current_end()

    def _current_end(self) -> int:
        segs = self.reader.commitlog.segments
        if not segs:
            return 0
        last = segs[-1]
        scan = scan_buffer(last.buffer(), last.start, last.readable_size)
        return last.end if scan.stop == "blank" else scan.end

    def _open(self, start: int) -> _Segment | None:
        for d in self.dirs:
            p = Path(d) / segment_name(start)
            if p.is_file():
                try:
                    return _Segment(p)
                except (OSError, ValueError):
                    return None  # just created, or not mappable yet: try again next poll
        return None

    def __iter__(self) -> Iterator[Message]:
        f = self.filter
        if self._history:
            scan = MessageScan(self.reader.commitlog, f)
            for msg in scan.messages():
                self.given += 1
                yield msg
            if scan.stop is not None and scan.stop.reason in ("limit", "to-offset", "max-bytes"):
                return
            end = scan.stop.offset if scan.stop is not None else 0
            if scan.stop is not None and scan.stop.reason == "blank":
                end = end - end % self.segment_size + self.segment_size
            self.position = end
        yield from self._live()

    def _done(self) -> bool:
        f = self.filter
        return ((f.limit is not None and self.given >= f.limit)
                or (f.to_offset is not None and self.position >= f.to_offset)
                or (self.stop_when is not None and self.stop_when()))

    def _live(self) -> Iterator[Message]:
        f = self.filter
        seg: _Segment | None = None
        seg_start = -1
        idle_since = time.monotonic()
        bad_since, bad_at = None, None
        try:
            while not self._done():
                pos = self.position
                start = pos - pos % self.segment_size
                if seg is None or seg_start != start:
                    if seg is not None:
                        seg.close()
                    seg, seg_start = self._open(start), start
                progressed = False
                if seg is not None:
                    seg.refresh()
                    p = pos - start
                    limit = min(seg.size, self.segment_size)
                    c = check_record(seg.map, p, limit, check_crc=True) if p + 8 <= limit else None
                    if c is not None and c.status is Check.OK:
                        progressed = True
                    elif c is not None and c.status is Check.END_OF_SEGMENT:
                        self.position = start + self.segment_size
                        bad_since = None
                        continue
                    elif c is not None and c.reason == "body CRC mismatch":
                        # lengths add up; a body still being copied would fix itself soon
                        if bad_at == pos and time.monotonic() - bad_since >= self.settle:
                            progressed = True
                    if progressed:
                        msg = decode_record(seg.map, p, limit=limit, path=seg.path, base=start)
                        self.position = pos + msg.store_size
                        bad_since, bad_at, self.stalled = None, None, None
                        idle_since = time.monotonic()
                        if f.matches(msg):
                            self.given += 1
                            yield msg
                        continue
                    if c is not None and c.reason != "zeros":
                        if bad_at != pos:
                            bad_since, bad_at = time.monotonic(), pos
                        elif time.monotonic() - bad_since >= self.settle and c.reason != "body CRC mismatch":
                            why = "bad magic" if "magic" in c.reason else "half record"
                            self.stalled = ScanStop(pos, why, str(seg.path))
                if self.idle_timeout is not None and time.monotonic() - idle_since >= self.idle_timeout:
                    return
                time.sleep(self.poll)
        finally:
            if seg is not None:
                seg.close()


def follow(reader, filter: MessageFilter | None = None, **options) -> Follower:
    """A :class:`Follower` over ``reader``'s CommitLog (options: poll, idle_timeout, stop,
    settle); filter keywords of :meth:`MessageFilter.make` may be given instead of ``filter``."""
    keys = {"poll", "idle_timeout", "stop", "settle"}
    if filter is None:
        filter = MessageFilter.make(**{k: v for k, v in options.items() if k not in keys})
    return Follower(reader, filter, **{k: v for k, v in options.items() if k in keys})


__all__ = ["Follower", "follow"]
