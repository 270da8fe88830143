"""Queues of fixed-size segment files named by their 20-digit start offset (spec §2).

A :class:`SegmentQueue` lists a directory (or several, for a multi-path CommitLog),
keeps the well-named segments in offset order and reports, rather than raises on,
anything odd: stray files, wrong sizes, gaps, misaligned names. Read-only queues map
files with ``ACCESS_READ``; nothing here writes unless the queue was opened writable.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .config import SEGMENT_NAME
from ..errors import OffsetError, SegmentError
from .listing import LONG_MAX, entries, odd_entry, offset_name
from .mapped import Ahead, io_error, map_read, note


def segment_name(offset: int) -> str:
    """``%020d``: the file name of the segment starting at ``offset``."""
    return f"{offset:020d}"


@dataclass
class SegmentProblem:
    """Something odd about a segment queue's files; readers carry on around it."""

    code: str  # stray-file | symlink | special-file | wrong-size | gap | misaligned | empty-file
    path: str
    offset: int | None
    detail: str


@dataclass(eq=False)
class Segment:
    """One segment file: its start offset and a lazily opened memory map."""

    path: Path
    start: int
    file_size: int
    segment_size: int
    writable: bool = False
    _file: object = field(default=None, repr=False)
    _map: mmap.mmap | None = field(default=None, repr=False)

    @property
    def end(self) -> int:
        """Logical end offset: start + configured size."""
        return self.start + self.segment_size

    @property
    def readable_size(self) -> int:
        return min(self.file_size, self.segment_size)

    def buffer(self):
        """The file's bytes as a memory map (``b""`` for an empty file); read-only maps
        read holes as zeros without a bus error (:func:`~rmqstore.files.mapped.map_read`)."""
        if self._map is None:
            if self.file_size == 0:
                return b""
            try:
                self._file = open(self.path, "r+b" if self.writable else "rb")
                if self.writable:
                    # Writers allocate ahead of what they store through this map
                    # (CommitLogAppender), so no store lands on an unallocated page.
                    note(self.path, "write")
                    self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_WRITE)
                else:
                    self._map = map_read(self._file.fileno(), 0, self.path)
            except OSError as e:
                self.close()
                raise SegmentError(f"cannot map segment: {e.strerror}", self.path) from None
        return self._map

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # numpy views still use the map; it closes when they are gone
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None


class SegmentQueue:
    """The segments of one queue (CommitLog, or one ConsumeQueue), in offset order."""

    def __init__(self, dirs: Path | str | Iterable[Path | str], segment_size: int, *,
                 writable: bool = False, kind: str = "segment"):
        if isinstance(dirs, (str, os.PathLike)):
            dirs = [dirs]
        self.dirs = [Path(d) for d in dirs]
        self.segment_size = segment_size
        self.writable = writable
        self.kind = kind
        self.segments: list[Segment] = []
        self.problems: list[SegmentProblem] = []
        self._load()

    def _load(self) -> None:
        found: dict[int, tuple[Path, int]] = {}
        for d in self.dirs:
            # The directory itself may be a link to another disk; nothing inside is followed.
            for e in entries(d):
                if self.writable and self._remove_unfinished(e):
                    continue
                odd = odd_entry(e)
                if odd is not None:
                    self.problems.append(SegmentProblem(odd[0], str(e.path), None, odd[1]))
                    continue
                start = offset_name(e.name) if e.kind == "file" else None
                if start is None or start > LONG_MAX - self.segment_size:
                    why = (f"not a {self.kind} segment (names are 20 digits)"
                           if not SEGMENT_NAME.match(e.name) or e.kind != "file" else
                           f"name {e.name} is past the largest {self.kind} offset (2^63-1): "
                           "the broker cannot load it")
                    self.problems.append(SegmentProblem("stray-file", str(e.path), None, why))
                    continue
                found[start] = (e.path, e.size)
        for start in sorted(found):
            p, size = found[start]
            if start % self.segment_size:
                self.problems.append(SegmentProblem(
                    "misaligned", str(p), start,
                    f"start {start} is not a multiple of the segment size {self.segment_size}"))
            if size == 0:
                self.problems.append(SegmentProblem("empty-file", str(p), start, "zero-length segment file"))
            elif size != self.segment_size:
                self.problems.append(SegmentProblem(
                    "wrong-size", str(p), start,
                    f"{size} bytes, but segments are {self.segment_size} bytes"))
            if self.segments and start != self.segments[-1].start + self.segment_size:
                prev = self.segments[-1]
                self.problems.append(SegmentProblem(
                    "gap", str(p), start,
                    f"previous segment {prev.path.name} ends at {prev.end}, this one starts at {start}"))
            self.segments.append(Segment(p, start, size, self.segment_size, self.writable))

    def _remove_unfinished(self, e) -> bool:
        # A segment a crashed writer sized under its hidden name and never renamed
        # (create_segment_file's fallback). The broker's loader would take it for a
        # segment; a writer removes it when it is a regular file holding only zeros.
        if e.kind != "file" or not _UNFINISHED.match(e.name) or not holds_no_data(e.path):
            return False
        try:
            e.path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True

    # --- lookup --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.segments)

    def __iter__(self):
        return iter(self.segments)

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    @property
    def limit_offset(self) -> int:
        """One past the last byte any segment could hold."""
        return self.segments[-1].end if self.segments else 0

    def find(self, offset: int) -> tuple[Segment, int]:
        """(segment, position) holding ``offset``; :class:`OffsetError` when none does."""
        if self.segments:
            first = self.segments[0].start
            i = offset // self.segment_size - first // self.segment_size
            if 0 <= i < len(self.segments) and self.segments[i].start <= offset < self.segments[i].end:
                seg = self.segments[i]
            else:  # gaps or odd names: fall back to a search, as the broker does
                seg = next((s for s in self.segments if s.start <= offset < s.end), None)
            if seg is not None:
                pos = offset - seg.start
                if pos < seg.readable_size:
                    return seg, pos
        raise OffsetError(
            f"offset {offset} is outside the {self.kind} "
            f"[{self.min_offset}, {self.limit_offset})", self.dirs[0] if self.dirs else None, offset)

    # --- write side (spec §2) ---------------------------------------------------------

    def _writable_dir(self, start: int) -> Path:
        # Multi-path CommitLog: round-robin over the sorted directories (spec §1.1).
        dirs = sorted(self.dirs)
        return dirs[(start // self.segment_size) % len(dirs)]

    def create_segment(self, start: int) -> Segment:
        """Create (or adopt, if already on disk) the writable segment starting at ``start``."""
        for seg in self.segments:
            if seg.start == start:
                return seg
        if start % self.segment_size:
            raise SegmentError(f"segment start {start} is not a multiple of {self.segment_size}",
                               self.dirs[0], start)
        d = self._writable_dir(start)
        d.mkdir(parents=True, exist_ok=True)
        path = d / segment_name(start)
        try:
            create_segment_file(path, self.segment_size)
        except OSError as e:
            raise io_error(e, path, "create segment", start) from None
        seg = Segment(path, start, self.segment_size, self.segment_size, True)
        self.segments.append(seg)
        self.segments.sort(key=lambda s: s.start)
        return seg

    def delete_from(self, offset: int) -> list[Path]:
        """Delete every segment that lies wholly at or after ``offset`` (truncateDirtyFiles /
        the clean-shutdown removal of a preallocated, unused segment, spec §2, §10.4)."""
        gone = []
        keep = []
        for seg in self.segments:
            if seg.start >= offset:
                seg.close()
                try:
                    seg.path.unlink()
                except FileNotFoundError:
                    pass
                gone.append(seg.path)
            else:
                keep.append(seg)
        self.segments[:] = keep
        return gone

    def close(self) -> None:
        for s in self.segments:
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- write side (spec §2: creation, preallocation, truncation) ---------------------------

OS_PAGE_SIZE = 4096


def create_segment_file(path: Path | str, size: int) -> None:
    """A new segment of ``size`` zero bytes. The broker extends a new file by mapping it,
    which leaves it sparse; ``ftruncate`` gives the same bytes (spec §2). A new file is
    sized before it gets its name, so neither a concurrent listing nor a crash ever
    leaves a short segment or a stray file behind: it is made nameless (``O_TMPFILE``)
    and linked in whole. Where the file system has no nameless files it is sized under
    the hidden name :func:`unfinished_name` and renamed, and a writer that finds such a
    leftover (a crash between the two steps) removes it (:meth:`SegmentQueue._load`)."""
    path = Path(path)
    if not path.exists():
        if _create_nameless(path, size):
            return
        tmp = path.with_name(unfinished_name(path.name))
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def unfinished_name(name: str) -> str:
    """The hidden name a segment is sized under where nameless files are not available."""
    return f".{name}.new"


_UNFINISHED = re.compile(r"^\.(\d{20})\.new$")
# Errors that mean "this file system (or kernel) has no O_TMPFILE": use the rename.
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EPERM}


def _create_nameless(path: Path, size: int) -> bool:
    """Size a nameless file in ``path``'s directory and link it in as ``path``; False
    when this kernel or file system cannot, so the caller uses the rename."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return False
    try:
        fd = os.open(path.parent, flag | os.O_RDWR, 0o644)
    except OSError as e:
        if e.errno in _NO_TMPFILE:
            return False
        raise
    try:
        os.ftruncate(fd, size)
        linked = _link_fd(fd, path)
    finally:
        os.close(fd)
    return linked and path.exists()


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000


def _link_fd(fd: int, path: Path) -> bool:
    # Two spellings of linkat for an O_TMPFILE file (open(2)): through /proc/self/fd
    # with AT_SYMLINK_FOLLOW, and AT_EMPTY_PATH on the descriptor itself. Some
    # sandboxes refuse the first (EXDEV), older kernels the second without privileges.
    try:
        os.link(f"/proc/self/fd/{fd}", path)
        return True
    except FileExistsError:
        return True  # someone named it first: the caller's next open sizes that file
    except OSError as e:
        if e.errno not in _NO_TMPFILE and e.errno != errno.EXDEV:
            raise
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.linkat(fd, b"", _AT_FDCWD, os.fsencode(path), _AT_EMPTY_PATH) == 0:
            return True
        err = ctypes.get_errno()
    except (OSError, AttributeError):
        return False
    if err == errno.EEXIST:
        return True
    if err in _NO_TMPFILE or err in (errno.EXDEV, errno.ENOSYS):
        return False
    raise OSError(err, os.strerror(err), str(path))


def holds_no_data(path: Path) -> bool:
    """True when every byte of the file is zero (a hole or written zeros), so removing it
    loses nothing. Holes are skipped with SEEK_DATA; data regions are read in chunks."""
    chunk = 1 << 20
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return True  # only holes from here to the end
                raise
            try:
                end = os.lseek(fd, pos, os.SEEK_HOLE)
            except OSError:
                end = size
            while pos < end:
                data = os.pread(fd, min(chunk, end - pos), pos)
                if not data:
                    return True
                if data.count(0) != len(data):
                    return False
                pos += len(data)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _segment_fileno(seg: Segment) -> int:
    seg.buffer()
    return seg._file.fileno()


def segment_sync(seg: Segment) -> None:
    """Make the segment's written bytes durable. ``fdatasync`` on the file also writes
    back pages dirtied through a shared mapping (Linux), and unlike ``mmap.flush`` it
    releases the GIL while it waits on the disk."""
    if seg.file_size:
        try:
            os.fdatasync(_segment_fileno(seg))
        except OSError as e:
            raise io_error(e, seg.path, "sync segment") from None


def segment_pwrite(seg: Segment, data, position: int) -> None:
    """``write()`` bytes into the segment file (the transient pool's commit, spec §11.3)."""
    fd = _segment_fileno(seg)
    view = memoryview(data)
    while view:
        try:
            n = os.pwrite(fd, view, position)
        except OSError as e:
            raise io_error(e, seg.path, "write segment", position) from None
        view = view[n:]
        position += n


def segment_ahead(seg: Segment, start: int, step: int) -> Ahead:
    """Allocation of the segment file ahead of position ``start``, where writing starts
    (:class:`~rmqstore.files.mapped.Ahead`): bytes are stored through its map only where
    allocated, so a full disk is a StoreIOError, never a bus error."""
    return Ahead(_segment_fileno(seg), start, seg.file_size, step, seg.path,
                 "the commitlog segment")
