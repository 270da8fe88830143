"""CommitLog byte-range splits: read one anywhere. Planning them is
:mod:`rmqstore.scan.split_plan`, stitching them back together
:mod:`rmqstore.scan.split_stitch`; this module gives their names too (``splits.Split``,
``splits.plan_splits``, ``splits.stitch``...), for the callers that use one namespace.

This is the reading core shared by the CLI (one process or a process pool) and the
Spark jobs (:mod:`rmqstore.pipeline`); it imports numpy only (pyarrow lazily, for remote
files) and never pyspark. Records become Arrow data in :mod:`rmqstore.scan.arrow`.

How a split is read (spark-notes "Reading CommitLog files", spec §2, §3, §4):

* The driver cuts every segment file into byte ranges (:func:`plan_splits`). A task
  owns exactly the records that *start* in its range ``[begin, end)``.
* A task opens its own file: a read-only mmap for a local path, or ``pyarrow.fs``
  ``read_at`` of the range plus an overhang that grows when a record runs past it, for
  a Hadoop-compatible URI (``hdfs://``, ``s3://``, ...).
* Position 0 of a segment is always a record start (records never span segments,
  spec §4). Any other range resyncs to the first position at or after ``begin`` where
  (1) the magic matches, (2) the size is plausible, (3) body, topic and properties
  lengths add up to the size exactly, (4) the stored PHYSICALOFFSET equals file base +
  position, and (5) the size chain holds for 3 hops or ends exactly at the end of the
  file, at a BLANK filling the rest, or at an all-zero tail.
* Resync is a heuristic, so the driver checks it (:func:`stitch`): within a file the
  chain must be unbroken, each split's first record being the previous split's "next".
  A split that resynced wrong is read again with a forced start; records after the end
  of valid data (a BLANK, zeros, a torn record) are dropped, so the union of all splits
  is exactly what a sequential walk from the first segment sees (spec §10.1).
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass

import numpy as np

from ..errors import SegmentError
from ..files.mapped import map_read
from ..format import layout as L
from ..format.record import chain_step, record_fits
from . import records as scan
from .split_plan import (DEFAULT_SPLIT_SIZE, Split, StoreFiles, local_path, arrow_filesystem,  # noqa: F401
                         in_range, is_remote, list_store, plan_splits)
from .split_stitch import (FILE_DONE, Boundary, Stitched, StoreEnd, resolve, run_local,  # noqa: F401
                           stitch)

#: Resync hops (rule 5) and how far a remote window reaches past a range at first.
RESYNC_HOPS = 3
REMOTE_OVERHANG = 1024 * 1024
#: How much of an "all-zero tail" a resync candidate must see: a whole 1 GiB tail would
#: cost a full read; the driver's chain check catches whatever this lets through.
ZERO_TAIL_PROBE = 64 * 1024

_MIN_RECORD = L.MIN_RECORD_SIZE
_HEAD = L.BLANK_STRUCT  # (total_size, magic): the first 8 bytes of any record
_MAGIC_AT = L.OFFSET_OF["magic"]
_PHYS_AT = L.OFFSET_OF["physical_offset"]
_PHYSICAL_OFFSET = L.HEAD_FIELD_STRUCT["physical_offset"]
_TOTAL_SIZE = L.RECORD_TOTAL_SIZE_STRUCT
_MAGIC_V1_BYTES = L.HEAD_FIELD_STRUCT["magic"].pack(L.MAGIC_V1)
_MAGIC_V2_BYTES = L.HEAD_FIELD_STRUCT["magic"].pack(L.MAGIC_V2)
_MAGIC_PREFIX = os.path.commonprefix([_MAGIC_V1_BYTES, _MAGIC_V2_BYTES])
_MAGIC_LAST = {_MAGIC_V1_BYTES[-1], _MAGIC_V2_BYTES[-1]}


class _NeedMore(Exception):
    """A check needs bytes past the remote window; grow it and try again."""

    def __init__(self, upto: int):
        self.upto = upto


_POPULATE_PAST = 1 << 20  # how far past its range a split's records are mapped in advance
_MADV_POPULATE_READ = 22  # Linux 5.14+: fault a range in at once (Python 3.11 lacks the name)


def _populate(mm: mmap.mmap, lo: int, hi: int) -> None:
    """Map a range's pages in one call instead of one page fault per 4 KiB (a few percent
    of a scan); a kernel without MADV_POPULATE_READ simply faults them in as read."""
    lo -= lo % mmap.PAGESIZE
    if hi <= lo:
        return
    try:
        mm.madvise(_MADV_POPULATE_READ, lo, hi - lo)
    except (OSError, ValueError, AttributeError):
        pass


class Window:
    """Bytes ``[lo, hi)`` of a segment file as a buffer; positions given to the methods
    are file positions. Local files are mapped whole (read-only, zero copy)."""

    def __init__(self, split: Split):
        self.split = split
        self.size = split.file_size
        self._file = None
        self._map = None
        if not is_remote(split.path):
            self.lo, self.hi = 0, self.size
            if self.size == 0:
                self.buf = b""
                return
            try:
                self._file = open(local_path(split.path), "rb")
                # Holes read as zeros without a bus error, even on a full tmpfs.
                self._map = map_read(self._file.fileno(), 0, split.path)
            except OSError as e:
                self.close()
                raise SegmentError(f"cannot map segment: {e.strerror}", split.path) from None
            if len(self._map) < self.size:
                self.size = self.hi = len(self._map)
            self.buf = self._map
            hi = min(split.end + _POPULATE_PAST, self.size)
            if self.next_data(split.begin) < hi:  # a range that is one hole maps nothing
                _populate(self._map, split.begin, hi)
        else:
            fs, p = arrow_filesystem(split.path)
            self._file = fs.open_input_file(p)
            self.lo = split.begin if split.start is None else min(split.begin, split.start)
            self.hi = self.lo
            self.buf = b""
            self.grow(split.end + REMOTE_OVERHANG)

    def grow(self, upto: int) -> None:
        """Make the window reach at least ``upto`` (doubling the overhang), remote only."""
        upto = min(max(upto, self.hi + (self.hi - self.lo)), self.size)
        if upto <= self.hi:
            return
        extra = self._file.read_at(upto - self.hi, self.hi)
        self.buf = bytes(self.buf) + extra
        self.hi = self.lo + len(self.buf)

    @property
    def complete(self) -> bool:
        """Does the window reach the end of the file?"""
        return self.hi >= self.size

    def next_data(self, pos: int) -> int:
        """The first file position at or after ``pos`` that is not in a hole (the file's
        size when only holes follow): holes read as zeros, and zeros hold no record, so a
        search may start there. ``pos`` itself where the file system cannot tell, or for a
        remote file."""
        if self._map is None or self._file is None:
            return pos
        try:
            return os.lseek(self._file.fileno(), pos, os.SEEK_DATA)
        except OSError as e:
            return self.size if e.errno == errno.ENXIO else pos

    def need(self, upto: int) -> None:
        if upto > self.hi and not self.complete:
            raise _NeedMore(upto)

    def u8(self) -> np.ndarray:
        n = self.hi - self.lo
        return np.frombuffer(self.buf, dtype=np.uint8, count=n) if n else np.zeros(0, np.uint8)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # numpy/Arrow views still point into it; it closes when they go
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _record_ok(w: Window, p: int, base: int, max_record: int) -> int:
    """TOTALSIZE of a whole record at file position ``p`` (resync rules 1 and 3: the
    spec's §3.9 size rule, :func:`~rmqstore.format.record.record_fits`) no larger than
    ``max_record`` (rule 2) whose stored PHYSICALOFFSET is ``base + p`` (rule 4), else 0."""
    if w.size - p < _MIN_RECORD:
        return 0
    w.need(p + 8)
    r = p - w.lo
    if chain_step(w.buf, r, min(max_record, w.size - p)) != "record":
        return 0
    total = _TOTAL_SIZE.unpack_from(w.buf, r)[0]
    w.need(p + total)
    # The record's own bytes only: a tail that runs into the next record is not whole.
    if record_fits(w.buf, r, total) != total:
        return 0
    return total if _PHYSICAL_OFFSET.unpack_from(w.buf, r + _PHYS_AT)[0] == base + p else 0


def _is_end(w: Window, q: int) -> bool:
    """Rule 5's clean endings at file position ``q``: end of file, a BLANK filling the
    rest of the segment (spec §4), or an all-zero tail."""
    if q == w.size:
        return True
    if w.size - q >= 8:
        w.need(q + 8)
        total, magic = _HEAD.unpack_from(w.buf, q - w.lo)
        if magic == L.MAGIC_BLANK:
            return total == w.split.segment_size - q
    upto = min(w.size, q + ZERO_TAIL_PROBE)
    w.need(upto)
    tail = np.frombuffer(w.buf, dtype=np.uint8, count=min(upto, w.hi) - w.lo)[q - w.lo:]
    return not tail.any()


def _chain_holds(w: Window, p: int, total: int, base: int, max_record: int) -> bool:
    q = p + total
    for _ in range(RESYNC_HOPS):
        if _is_end(w, q):
            return True
        n = _record_ok(w, q, base, max_record)
        if not n:
            return False
        q += n
    return True


def resync(w: Window, begin: int, end: int) -> int | None:
    """File position of the first record starting in ``[begin, end)`` by rules 1-5, or
    None when the range holds no record start."""
    s = w.split
    base = s.file_start
    find = w.buf.find
    pos = max(begin, 0) + _MAGIC_AT
    # A sparse stretch (a preallocated segment's unused part) is skipped, not searched.
    pos = max(pos, w.next_data(pos - _MAGIC_AT) + _MAGIC_AT)
    if pos - _MAGIC_AT >= end:
        return None
    while True:
        limit = min(end + _MAGIC_AT + len(_MAGIC_PREFIX), w.hi)
        k = find(_MAGIC_PREFIX, pos - w.lo, limit - w.lo)
        if k < 0:
            if limit < end + _MAGIC_AT and not w.complete:
                w.need(end + _MAGIC_AT + 4)
            return None
        k += w.lo
        pos = k + 1
        p = k - _MAGIC_AT
        if p >= end:
            return None
        w.need(k + 4)
        if w.buf[k - w.lo + 3] not in _MAGIC_LAST or p < begin:
            continue
        total = _record_ok(w, p, base, s.max_record)
        if total and _chain_holds(w, p, total, base, s.max_record):
            return p


def _walk(w: Window, first: int, end: int) -> tuple[list[int], int, str]:
    """Record starts from ``first`` while they are below ``end``, following TOTALSIZE;
    (starts, where the walk stopped, why): "range" when the next start is at or past
    ``end`` and holds a record header, else blank / end / zeros / bad magic / bad size /
    short, for the position where valid data stops (spec §3.9) -- possibly past ``end``."""
    buf, lo, size = w.buf, w.lo, w.size
    v1, v2 = L.MAGIC_V1, L.MAGIC_V2
    unpack = _HEAD.unpack_from
    starts: list[int] = []
    append = starts.append
    pos = first
    while pos < end:
        left = size - pos
        if left >= 8:
            if pos + 8 > w.hi:
                w.need(pos + 8)
            # the usual case, inline: a message header whose size fits (chain_step's rule)
            total, magic = unpack(buf, pos - lo)
            if (magic == v1 or magic == v2) and _MIN_RECORD <= total <= left:
                if pos + total > w.hi:
                    w.need(pos + total)
                append(pos)
                pos += total
                continue
        return starts, pos, chain_step(buf, pos - lo, left)
    # Classify where the chain leaves the range too: a BLANK or zeros there ends the
    # file's data, which the split that holds that position cannot see by resync.
    left = size - pos
    if left >= 8:
        w.need(pos + 8)
    step = chain_step(w.buf, pos - w.lo, left)
    return starts, pos, ("range" if step == "record" else step)


@dataclass
class SplitScan:
    """The records a split owns, as bulk columns over the open window, and its boundary."""

    split: Split
    records: scan.RecordColumns
    boundary: Boundary
    window: Window

    def close(self) -> None:
        self.records = None  # type: ignore[assignment]
        self.window.close()

    def __enter__(self) -> SplitScan:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_split(split: Split) -> SplitScan:
    """Read a split: resync (unless it starts at 0 or has a forced start), walk the size
    chain up to the range end, gather the records' columns and check each one's lengths
    (spec §3.9). Use as a context manager; the columns view the open file."""
    w = Window(split)
    try:
        while True:
            try:
                return _read(w, split)
            except _NeedMore as more:
                w.grow(more.upto)
    except BaseException:
        w.close()
        raise


def _chain(w: Window, first: int, end: int) -> tuple[scan.RecordColumns, int, str]:
    """The records from ``first`` that start below ``end`` and whose lengths add up
    (spec §3.9), as columns; and where and why the chain stopped."""
    if w.complete and w.lo == 0:  # the whole file is mapped: the vectorised walk
        starts, stop_pos, stop = scan.walk_range(w.buf, first, end, w.size)
    else:
        starts, stop_pos, stop = _walk(w, first, end)
    rel = np.array(starts, dtype=np.int64) - w.lo
    cols = scan.columns(w.u8(), rel, w.split.file_start + w.lo)
    ok = scan.consistent(cols)
    if len(ok) and not ok.all():
        k = int(np.argmin(ok))
        stop, stop_pos = "half record", int(starts[k])
        cols = cols.take(slice(0, k))
    return cols, stop_pos, stop


def _read(w: Window, s: Split) -> SplitScan:
    if s.framing == "dledger":  # entries at known starts (design-14 D1)
        from .dledger_splits import read_ledger_split

        cols, b = read_ledger_split(w, s)
        return SplitScan(s, cols, b, w)
    forced = s.start is not None or s.begin == 0
    first = (s.start if s.start is not None else s.begin) if forced else resync(w, s.begin, s.end)
    pos, stop = (s.begin, "none") if first is None else (first, "range")
    # A forced start below the range proves where the range's first record is: the chain
    # is walked and checked up to it a window at a time (memory stays at a window), and
    # nothing before ``begin`` is returned.
    while stop == "range" and pos < s.begin:
        _, pos, stop = _chain(w, pos, min(pos + scan.WINDOW, s.begin))
    if stop == "range":
        cols, stop_pos, stop = _chain(w, pos, s.end)
    else:
        cols, stop_pos = scan.columns(w.u8(), np.zeros(0, np.int64), s.file_start + w.lo), pos
    b = Boundary(s.split_id, first, stop_pos, stop, len(cols), forced)
    return SplitScan(s, cols, b, w)


def split_boundary(split: Split) -> Boundary:
    with open_split(split) as sc:
        return sc.boundary
