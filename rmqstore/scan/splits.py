"""CommitLog byte-range splits: plan them, read one anywhere, stitch them back together.

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

import dataclasses
import mmap
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..format import layout as L
from . import records as scan
from ..format.record import chain_step, record_fits
from ..format.rules import parse_delay_levels
from ..errors import NotAStoreError, RecordError, SegmentError
from ..files.ends import ValidEnd
from ..files.mapped import map_read

DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
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
#: Stop reasons after which the next segment file continues the chain (spec §4, §10.1).
FILE_DONE = ("blank", "end")


# --- planning ------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """One byte range of one CommitLog segment file. Small and picklable: it is what the
    driver ships to a task."""

    split_id: int
    store: str  # the store root exactly as the user gave it
    path: str  # segment file: a local path or a URI pyarrow.fs understands
    file_index: int  # position of the file in the store's segment order
    file_start: int  # the segment's start offset (its name)
    file_size: int  # readable bytes: min(file length, segment size)
    segment_size: int
    begin: int  # first byte of the range, relative to the file
    end: int  # one past the last byte of the range
    max_record: int  # largest plausible TOTALSIZE (maxMessageSize + 64 KiB, spec §3.6)
    contiguous: bool = True  # the file starts where the previous one ended (spec §2)
    #: Forced first record position: no resync. One below ``begin`` (a range's first split
    #: read alone) walks the chain from there, and only the records from ``begin`` are read.
    start: int | None = None

    def with_start(self, start: int) -> Split:
        return dataclasses.replace(self, start=start)


def is_remote(path: str) -> bool:
    """A URI with a scheme other than ``file``: read through pyarrow.fs."""
    return "://" in path and not path.startswith("file://")


#: Hadoop's names for S3 buckets, which pyarrow knows as ``s3://`` (same bucket and key).
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}


def arrow_filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a URI; ``s3a://`` and ``s3n://`` (Hadoop's
    spelling, what Spark users write) are read as ``s3://``."""
    from pyarrow import fs as pafs

    scheme, sep, rest = uri.partition("://")
    return pafs.FileSystem.from_uri(_ARROW_SCHEMES.get(scheme.lower(), scheme) + sep + rest)


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


@dataclass
class StoreFiles:
    """The CommitLog segment files of one store, in offset order."""

    store: str
    segment_size: int
    max_record: int
    files: list[tuple[str, int, int]]  # (path, start offset, file length)
    delay_millis: tuple[int, ...]


def list_store(store: str, *, segment_size: int | None = None, conf=None,
               config=None) -> StoreFiles:
    """The CommitLog files of a store root (local path or URI), with the geometry the
    readers need. Local stores take geometry from :func:`rmqstore.files.config.load_config`
    (broker.conf > files > defaults), or from ``config``, the
    :class:`~rmqstore.files.config.StoreConfig` a reader already uses: its CommitLog
    directories (``storePathCommitLog``) are the ones listed, and their files gave its
    geometry; remote ones from the file lengths."""
    from ..files.config import load_config
    from ..files.listing import LONG_MAX, entries, offset_name

    if not is_remote(store):
        root = _local(store)
        if not os.path.isdir(root):
            raise NotAStoreError("no such store directory", store)
        overrides = {"mapped_file_size_commit_log": segment_size} if segment_size else None
        if config is not None:
            cfg = config.with_values(**overrides) if overrides else config
        else:
            cfg = load_config(root, conf, overrides)
        found: dict[int, tuple[str, int]] = {}
        for d in cfg.commit_log_dirs:
            for e in entries(d):  # links inside the store are not followed
                start = offset_name(e.name) if e.kind == "file" else None
                if start is not None and start <= LONG_MAX - cfg.mapped_file_size_commit_log:
                    found[start] = (str(e.path), e.size)
        if not found and not any(d.is_dir() for d in cfg.commit_log_dirs):
            raise NotAStoreError("no commitlog directory", store)
        files = [(found[s][0], s, found[s][1]) for s in sorted(found)]
        return StoreFiles(store, cfg.mapped_file_size_commit_log, cfg.max_message_size + 65536,
                          files, cfg.delay_millis)
    from pyarrow import fs as pafs

    fs, base = arrow_filesystem(store.rstrip("/") + "/commitlog")
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    prefix = store.rstrip("/") + "/commitlog/"
    files = sorted((prefix + i.base_name, int(i.base_name), i.size) for i in infos
                   if i.type == pafs.FileType.File and offset_name(i.base_name) is not None)
    files = [(p, s, n) for p, s, n in sorted(files, key=lambda f: f[1])]
    if not files:
        raise NotAStoreError("no commitlog segment files", store)
    if segment_size is None:
        sizes = {n for _, _, n in files if n > 0}
        segment_size = max(sizes) if sizes else 1024 ** 3
    return StoreFiles(store, segment_size, 4 * 1024 * 1024 + 65536, files, parse_delay_levels())


def plan_splits(stores: Sequence[str] | Sequence[StoreFiles], split_size: int = DEFAULT_SPLIT_SIZE,
                ) -> list[Split]:
    """Cut every CommitLog segment of every store into ranges of at most ``split_size``
    bytes. Split ids are dense and ordered by (store, file, range)."""
    if split_size <= 0:
        raise ValueError("split size must be positive")
    out: list[Split] = []
    for st in stores:
        sf = st if isinstance(st, StoreFiles) else list_store(st)
        prev_end = None
        for fi, (path, start, length) in enumerate(sf.files):
            readable = min(length, sf.segment_size)
            contiguous = prev_end is None or start == prev_end
            prev_end = start + sf.segment_size
            begins = range(0, readable, split_size) if readable else [0]
            for b in begins:
                out.append(Split(len(out), sf.store, path, fi, start, readable, sf.segment_size,
                                 b, min(b + split_size, readable), sf.max_record, contiguous))
    return out


def in_range(splits: Sequence[Split], lo: int | None = None, hi: int | None = None) -> list[Split]:
    """The splits of one store that can hold records starting in ``[lo, hi)`` (CommitLog
    offsets; None: open); the others are not read at all. Reading starts at the segment
    holding ``lo``, as a sequential reader from ``lo`` starts (spec §4): the first split
    kept in it is forced to start at the segment's start (see :attr:`Split.start`), so its
    first record is proven by the size chain, never guessed by resync. A missing segment
    before ``lo`` still ends the store's data there (spec §2), so the range gets nothing.
    A file shorter than the segment size still holds ``lo`` up to its logical end: its
    last split is kept, so damage before ``lo`` in it ends the data as it does for dump."""
    out: list[Split] = []
    gap = False
    for s in splits:
        if hi is not None and s.file_start + s.begin >= hi:
            continue
        reach = s.segment_size if s.end >= s.file_size else s.end
        if lo is not None and s.file_start + reach <= lo:
            gap |= not s.contiguous
            continue
        if not out or out[-1].file_index != s.file_index:
            if s.begin > 0:
                s = s.with_start(0)
            if gap:
                s, gap = dataclasses.replace(s, contiguous=False), False
        out.append(s)
    return out


# --- reading one split -----------------------------------------------------------------


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
                self._file = open(_local(split.path), "rb")
                # Holes read as zeros without a bus error, even on a full tmpfs.
                self._map = map_read(self._file.fileno(), 0, split.path)
            except OSError as e:
                self.close()
                raise SegmentError(f"cannot map segment: {e.strerror}", split.path) from None
            if len(self._map) < self.size:
                self.size = self.hi = len(self._map)
            self.buf = self._map
            _populate(self._map, split.begin, min(split.end + _POPULATE_PAST, self.size))
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
class Boundary:
    """What a task reports about its split, for the driver's chain check."""

    split_id: int
    first: int | None  # file position of the first record it owns (forced start if forced)
    chain_end: int  # file position just after its last owned record (or its first)
    stop: str  # "range" (the chain continues past the range), or why valid data stopped
    records: int
    forced: bool = False

    def as_row(self) -> dict:
        return dataclasses.asdict(self)


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


# --- stitching ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreEnd(ValidEnd):
    """Where a store's valid CommitLog data ends (spec §10.1) as the split walk finds it:
    ``reason`` is "" when every file ended cleanly (BLANK or file end), else why; the
    ``records`` before it; and where the data begins."""

    min_offset: int = 0  # first segment's start

    @property
    def end_offset(self) -> int:
        """First byte after the last valid record (recovery's processOffset)."""
        return self.offset


@dataclass
class Stitched:
    """The driver's verdict on every split."""

    keep: list[int]  # split ids whose records are part of the store's valid data
    drop: list[int]  # split ids whose records lie after the end of valid data
    rerun: dict[int, int]  # split id -> the position the chain says it must start at
    ends: dict[str, StoreEnd]
    records: int  # records in kept splits


def stitch(splits: Sequence[Split], boundaries: dict[int, Boundary]) -> Stitched:
    """Check the size chain across splits and files, as a sequential walk from the first
    segment would see it (spec §4, §10.1; spark-notes resync rule).

    Within a file the chain starts at 0 and each split must begin where the previous one's
    chain left its range; a split that disagrees is returned in ``rerun`` with the start
    it must use (only the first per file: the rest depend on it). After a BLANK or the
    file's end the next file continues; after anything else valid data has ended, and
    every later record of the store is dropped.
    """
    keep: list[int] = []
    drop: list[int] = []
    rerun: dict[int, int] = {}
    ends: dict[str, StoreEnd] = {}
    records = 0
    by_store: dict[str, list[Split]] = {}
    for s in splits:
        by_store.setdefault(s.store, []).append(s)
    for store, ss in by_store.items():
        ss = sorted(ss, key=lambda s: (s.file_index, s.begin))
        ended: tuple[int, str] | None = None
        counted = 0  # records in the store's kept splits
        last_end = ss[0].file_start if ss else 0
        # Where recovery's processOffset lands if nothing fails: at the last file's BLANK
        # (or its end), not at the end of its padding (spec §10.1).
        final = last_end
        i = 0
        while i < len(ss):
            fi = ss[i].file_index
            group = []
            while i < len(ss) and ss[i].file_index == fi:
                group.append(ss[i])
                i += 1
            head = group[0]
            if ended is None and not head.contiguous:
                ended = (last_end, "missing segment")
            expected: int | None = 0
            state = "open" if ended is None else "after"
            pending = False
            for s in group:
                b = boundaries[s.split_id]
                if pending:
                    continue  # decided once the rerun ahead of it is in
                if state != "open" or expected is None or expected >= s.end:
                    (drop if b.records else keep).append(s.split_id)
                    continue
                if b.first != expected:
                    rerun[s.split_id] = expected
                    pending = True
                    continue
                keep.append(s.split_id)
                counted += b.records
                if b.stop == "range":
                    expected = b.chain_end
                elif b.stop in FILE_DONE:
                    state = "done"
                    last_end = head.file_start + head.segment_size
                    final = head.file_start + b.chain_end
                else:
                    state = "ended"
                    ended = (head.file_start + b.chain_end, b.stop)
            if state == "open" and not pending:
                # The chain ran past the last range: it ended exactly at the file end.
                last_end = final = head.file_start + head.segment_size
        offset, reason = (final, "") if ended is None else ended
        ends[store] = StoreEnd(offset, reason, counted, ss[0].file_start if ss else 0)
        records += counted
    return Stitched(sorted(keep), sorted(drop), rerun, ends, records)


def resolve(splits: Sequence[Split], boundaries: dict[int, Boundary],
            rerun: Callable[[Split], Boundary]) -> tuple[Stitched, dict[int, Split]]:
    """Stitch, re-reading each wrongly resynced split with a forced start via ``rerun``
    until the chain is whole. Returns the verdict and the forced splits that replaced
    the originals (their outputs are the ones to keep)."""
    by_id = {s.split_id: s for s in splits}
    replaced: dict[int, Split] = {}
    boundaries = dict(boundaries)
    for _ in range(len(splits) + 1):
        st = stitch(splits, boundaries)
        if not st.rerun:
            return st, replaced
        for sid, start in st.rerun.items():
            if boundaries[sid].forced:
                # A forced start is the chain's own position; it cannot disagree.
                raise RecordError("split chain does not converge", by_id[sid].path, start)
            fs = by_id[sid].with_start(start)
            replaced[sid] = fs
            boundaries[sid] = rerun(fs)
    raise RecordError("split chain does not converge", splits[0].path if splits else None)


def run_local(splits: Sequence[Split], task: Callable[[Split], tuple[Boundary, object]],
              processes: int = 1) -> tuple[Stitched, dict[int, object]]:
    """Run ``task`` over every split in this process (or a process pool), stitch, re-run
    wrong resyncs, and return the verdict and each kept split's payload."""
    payloads: dict[int, object] = {}
    boundaries: dict[int, Boundary] = {}
    if processes > 1 and len(splits) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(processes) as pool:
            for s, (b, p) in zip(splits, pool.map(task, splits)):
                boundaries[s.split_id], payloads[s.split_id] = b, p
    else:
        for s in splits:
            boundaries[s.split_id], payloads[s.split_id] = task(s)

    def again(s: Split) -> Boundary:
        b, p = task(s)
        payloads[s.split_id] = p
        return b

    st, _ = resolve(splits, boundaries, again)
    return st, {sid: payloads[sid] for sid in st.keep}
