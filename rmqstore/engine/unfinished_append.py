"""After a crash: clearing what an interrupted append of this engine left after the end
of valid data (spec §10.1, §10.5)."""

from __future__ import annotations

import errno
import os

import numpy as np

from ..errors import OffsetError
from ..files.segments import SegmentQueue, segment_pwrite, segment_sync


def clear_unfinished_append(queue: SegmentQueue, end: int) -> int:
    """After a crash: zero the bytes an interrupted append left after ``end``, the end of
    valid data (spec §10.1); returns how many bytes were cleared.

    The appender writes a record's (or BLANK's) TOTALSIZE last, so an append the writer died
    in leaves a zero TOTALSIZE at ``end`` followed by some of the record's other bytes:
    garbage to every reader (§10.5), and bytes the next append would overwrite anyway. A
    broker writes TOTALSIZE first, so its torn records never start with zeros; those are left
    as the broker's recovery leaves them (§10.4).
    """
    try:
        seg, pos = queue.find(end)
    except OffsetError:
        return 0  # end is a segment's end (or the log is empty): nothing after it here
    buf = seg.buffer()
    if bytes(buf[pos:pos + 4]).strip(b"\0"):
        return 0  # a TOTALSIZE: not an append of ours
    step = 1 << 20
    hi = pos  # one past the last non-zero byte: searched from the end back, in data only
    for lo_ext, hi_ext in reversed(_data_extents(seg.path, pos, seg.readable_size)):
        while hi_ext > lo_ext and hi == pos:
            lo = max(lo_ext, hi_ext - step)
            nz = np.flatnonzero(np.frombuffer(buf, np.uint8, count=hi_ext - lo, offset=lo))
            if len(nz):
                hi = lo + int(nz[-1]) + 1
            hi_ext = lo
        if hi > pos:
            break
    zeros = bytes(min(step, hi - pos))
    for at in range(pos, hi, step):
        segment_pwrite(seg, zeros[:min(step, hi - at)], at)
    if hi > pos:
        segment_sync(seg)
    return hi - pos


def _data_extents(path, lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of ``[lo, hi)`` of a file that hold data, not holes (SEEK_DATA/SEEK_HOLE):
    a preallocated 1 GiB segment is mostly hole. The whole range where not supported."""
    if not hasattr(os, "SEEK_DATA"):
        return [(lo, hi)]
    out = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        at = lo
        while at < hi:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after ``at``
                    break
                return [(lo, hi)]
            if start >= hi:
                break
            at = min(os.lseek(fd, start, os.SEEK_HOLE), hi)
            out.append((start, at))
    finally:
        os.close(fd)
    return out
