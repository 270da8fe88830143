"""File maps that never end in SIGBUS: allocate before writing through a map, map holes
safely for reading, and note which file is mapped.

A memory map turns I/O failures into SIGBUS, which kills the process with no message:

* a store through a shared map into a page the file system has not allocated, when it
  cannot allocate it (ENOSPC, a quota, EIO);
* on tmpfs (and ramfs, hugetlbfs) even a *load* from a hole of a sparse file: shmem
  allocates a page on the read fault, and on a full tmpfs that fails. ``pread()`` of the
  same hole returns zeros and allocates nothing (measured on Linux 6.18).

So writers :func:`allocate` every range before they store into it through a map (a full
disk is then a :class:`StoreIOError` raised before the bytes change), and readers map
files with :func:`map_read`: on a file system that allocates on read faults, a file with
holes becomes private zero pages with the file's data extents mapped over them (small
extents copied), so reading a hole neither allocates nor faults. Elsewhere (ext4, xfs,
...) it is the plain ``ACCESS_READ`` map it always was.

What remains (a file truncated by another process while mapped, EIO under a map) cannot
be caught in Python. The CLI runs each command in a child process and reports such a
death in one line (``cli/guard.py``), naming the file :func:`~rmqstore.files.notes.note`
recorded last in a page shared with it.
"""

from __future__ import annotations

import errno as _errno
import mmap
import os

from ..errors import StoreIOError
from .notes import note

PAGE = mmap.PAGESIZE
#: Data extents at least this long are mapped from the file; shorter ones are copied
#: (a fragmented file would otherwise cost one mapping per extent).
OVERLAY_MIN = 1 << 20
#: File systems whose read faults on holes allocate a page (shmem and kin), as
#: /proc/self/mountinfo names them.
ALLOCATE_ON_READ_FS = frozenset({"tmpfs", "devtmpfs", "ramfs", "hugetlbfs"})

# --- allocation -----------------------------------------------------------------------


def allocate(fd: int, offset: int, length: int, path, what: str) -> None:
    """Allocate ``[offset, offset + length)`` of an open file (``posix_fallocate``: the
    bytes stay as they are, holes become allocated zeros). :class:`StoreIOError`
    naming ``path`` and ``what`` when the file system cannot (ENOSPC, EIO, EFBIG...)."""
    if length <= 0 or not hasattr(os, "posix_fallocate"):  # (macOS: no way to ask)
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        raise StoreIOError(f"cannot allocate {length} bytes at offset {offset} for {what}: "
                           f"{e.strerror or e}", path, offset, errno=e.errno) from None


class Ahead:
    """One file allocated ahead of where it is written through a map, ``step`` bytes at a
    time, and given back at the end where nothing was written.

    Writing starts at ``start``. From the page after it to the first data after that
    (SEEK_DATA, looked at before anything is allocated) the file is holes: allocating
    there and punching it again later changes no byte. Data further on (a torn tail a
    broker left past the end of valid data, stale units) is never punched."""

    def __init__(self, fd: int, start: int, limit: int, step: int, path, what: str):
        self.fd, self.limit, self.step, self.path, self.what = fd, limit, step, path, what
        self.end = start  # allocated (or data) up to here
        clean = -(-start // PAGE) * PAGE
        try:
            self.clean_to = min(os.lseek(fd, clean, os.SEEK_DATA), limit)
        except OSError as e:
            self.clean_to = limit if e.errno == _errno.ENXIO else clean  # else: punch none

    def need(self, upto: int) -> int:
        """Allocate to at least ``upto`` (a whole step when the disk has it, else just
        what the write needs, so a nearly full disk is used to its last page); returns the
        allocated end. :class:`StoreIOError` on a full disk, before any byte changes."""
        if upto <= self.end:
            return self.end
        want = min(self.limit, -(-max(upto, self.end + self.step) // PAGE) * PAGE)
        try:
            allocate(self.fd, self.end, want - self.end, self.path, self.what)
        except StoreIOError:
            self._punch(self.end, want)  # what the failed step did take (ext4 keeps it)
            want = min(self.limit, -(-upto // PAGE) * PAGE)
            allocate(self.fd, self.end, want - self.end, self.path, self.what)
        self.end = want
        return want

    def give_back(self, used: int) -> None:
        """Punch what was allocated past ``used`` (the end of what was written), so a
        closed store takes the space the broker's sparse files take."""
        if self.end > used:
            self._punch(used, self.end)
            self.end = used

    def _punch(self, lo: int, hi: int) -> None:
        lo = -(-lo // PAGE) * PAGE
        hi = min(hi, self.clean_to)
        if hi > lo:
            punch_hole(self.fd, lo, hi - lo)


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Make ``[offset, offset + length)`` a hole (FALLOC_FL_PUNCH_HOLE: it reads as zeros,
    its blocks are freed). Only for ranges known to hold zeros. Best effort: nothing
    happens where the file system cannot punch holes."""
    global _libc
    try:
        if _libc is None:
            _libc = _Libc()
        _libc.fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, offset, length)
    except (OSError, AttributeError):
        pass


_KEEP_SIZE, _PUNCH_HOLE = 0x01, 0x02  # FALLOC_FL_* (linux/falloc.h)


def io_error(e: OSError, path, what: str, offset: int | None = None) -> StoreIOError:
    """An :class:`OSError` from a write path as one :class:`StoreIOError` line."""
    return StoreIOError(f"cannot {what}: {e.strerror or e}", path if path is not None
                        else e.filename, offset, errno=e.errno)


# --- which file systems allocate on a read fault ---------------------------------------

_fs_by_dev: dict[int, str] = {}


def _mount_types() -> dict[int, str]:
    """st_dev -> file system type of every mount (/proc/self/mountinfo)."""
    out = {}
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                left, _, right = line.partition(b" - ")
                fields = left.split()
                if len(fields) < 3 or not right:
                    continue
                major, _, minor = fields[2].partition(b":")
                try:
                    dev = os.makedev(int(major), int(minor))
                except ValueError:
                    continue
                out[dev] = right.split()[0].decode("ascii", "replace")
    except OSError:
        pass
    return out


def fs_type(fd: int, dev: int | None = None) -> str:
    """The type of the file system holding an open file ("" when unknown)."""
    if dev is None:
        dev = os.fstat(fd).st_dev
    t = _fs_by_dev.get(dev)
    if t is None:
        _fs_by_dev.update(_mount_types())  # a mount made since the last look
        t = _fs_by_dev.setdefault(dev, "")
    return t


def allocates_on_read(fd: int, dev: int | None = None) -> bool:
    """Does a read fault on a hole of this file allocate a page (tmpfs and kin)?"""
    return fs_type(fd, dev) in ALLOCATE_ON_READ_FS


# --- hole-safe read maps --------------------------------------------------------------


def data_extents(fd: int, length: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the data (non-hole) ranges of the first ``length`` bytes
    (SEEK_DATA / SEEK_HOLE); the whole range when the file system cannot tell."""
    out = []
    pos = 0
    try:
        while pos < length:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == _errno.ENXIO:  # no data after pos
                    break
                raise
            if d >= length:
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            out.append((d, min(h, length)))
            pos = h
    except OSError:
        return [(0, length)]
    return out


class _Libc:
    def __init__(self):
        import ctypes

        lib = ctypes.CDLL(None, use_errno=True)
        self.mmap = getattr(lib, "mmap64", None) or lib.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int64]
        self.mprotect = lib.mprotect
        self.mprotect.restype = ctypes.c_int
        self.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.fallocate = getattr(lib, "fallocate64", None) or lib.fallocate
        self.fallocate.restype = ctypes.c_int
        self.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


_libc: _Libc | None = None
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)


def _address(mm: mmap.mmap) -> int:
    """Start address of a map (numpy reads it without a writable export)."""
    import numpy as np

    a = np.frombuffer(mm, dtype=np.uint8, count=1)
    addr = a.__array_interface__["data"][0]
    del a
    return addr


def _read_into(fd: int, addr: int, lo: int, hi: int, path) -> None:
    import ctypes

    view = memoryview((ctypes.c_char * (hi - lo)).from_address(addr + lo)).cast("B")
    done = 0
    while done < hi - lo:
        try:
            n = os.preadv(fd, [view[done:]], lo + done)
        except OSError as e:
            raise io_error(e, path, "read", lo + done) from None
        if n == 0:
            break  # the file shrank: the rest reads as zeros
        done += n


#: Advice that drops pages: private copied pages would read back as zeros after it.
_DROPS = frozenset(getattr(mmap, n) for n in ("MADV_DONTNEED", "MADV_FREE", "MADV_REMOVE",
                                              "MADV_DONTNEED_LOCKED") if hasattr(mmap, n))


class _HoleSafeMap(mmap.mmap):
    """A :func:`map_read` map over a file with holes. Extents it copied live in its own
    private pages, so advice that drops pages (``MADV_DONTNEED`` ...: a reader letting
    a window go) is given for the rest only; mapped extents and zero pages come back
    as they were."""

    _kept: tuple = ()  # page-aligned (lo, hi) of the copied extents, in order

    def madvise(self, option, start=0, length=None):
        if option not in _DROPS or not self._kept:
            return super().madvise(option, start) if length is None \
                else super().madvise(option, start, length)
        end = len(self) if length is None else min(len(self), start + length)
        at = start
        for lo, hi in self._kept:
            if lo > at and at < end:
                super().madvise(option, at, min(lo, end) - at)
            at = max(at, hi)
        if at < end:
            super().madvise(option, at, end - at)


def _hole_safe_map(fd: int, length: int, path) -> mmap.mmap:
    """Private read-only zero pages of ``length`` bytes with the file's data laid over
    them: big extents mapped from the file (shared, read-only), small ones copied."""
    import ctypes

    global _libc
    if _libc is None:
        _libc = _Libc()
    libc = _libc
    failed = ctypes.c_void_p(-1).value
    anon = _HoleSafeMap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                        prot=mmap.PROT_READ)
    try:
        addr = _address(anon)
        span = -(-length // PAGE) * PAGE
        mapped, copied = [], []
        for d, h in data_extents(fd, length):
            a = -(-d // PAGE) * PAGE
            b = h if h == length else h - h % PAGE
            if b - a >= OVERLAY_MIN:
                mapped.append((a, b))
                copied += [(d, a)] if a > d else []
                copied += [(b, h)] if h > b else []
            else:
                copied.append((d, h))
        if copied:
            if libc.mprotect(addr, span, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect failed")
            try:
                for lo, hi in copied:
                    _read_into(fd, addr, lo, hi, path)
            finally:
                libc.mprotect(addr, span, mmap.PROT_READ)
            anon._kept = tuple((lo - lo % PAGE, -(-hi // PAGE) * PAGE) for lo, hi in copied)
        for a, b in mapped:
            r = libc.mmap(addr + a, -(-(b - a) // PAGE) * PAGE, mmap.PROT_READ,
                          mmap.MAP_SHARED | _MAP_FIXED, fd, a)
            if r in (None, failed) or r != addr + a:
                raise OSError(ctypes.get_errno(), "mmap failed")
        return anon
    except BaseException:
        anon.close()
        raise


def map_read(fd: int, length: int = 0, path=None, *, hole_safe: bool | None = None) -> mmap.mmap:
    """A read-only map of the first ``length`` bytes (0: the whole file) of an open file,
    like ``mmap.mmap(fd, length, access=ACCESS_READ)``, that reading a hole cannot turn
    into SIGBUS or an allocation. ``hole_safe`` forces (True) or skips (False) the
    hole-safe form; by default it is used where read faults allocate (tmpfs and kin) and
    the file has holes. Raises OSError/ValueError as ``mmap.mmap`` does."""
    st = os.fstat(fd)
    size = st.st_size
    if length == 0:
        length = size
    if path is not None:
        note(path, "read")
    if hole_safe is None:
        hole_safe = 0 < length <= size and allocates_on_read(fd, st.st_dev)
    if hole_safe and 0 < length <= size and data_extents(fd, length) != [(0, length)]:
        return _hole_safe_map(fd, length, path)
    return mmap.mmap(fd, length, access=mmap.ACCESS_READ)
