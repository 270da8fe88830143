"""Copies that keep holes, and what files really take on disk.

A broker's IndexFile is 420 MB of which a small store uses a few pages; ConsumeQueue and
CommitLog segments are created sparse too (spec §2). A backup copies only the data
extents (``SEEK_DATA``/``SEEK_HOLE``) and skips 1 MiB chunks that are all zeros, so it
takes what the file uses, not its size. Space figures come from allocated blocks
(``st_blocks``), never from ``st_size``. Plain ``pread``/``pwrite``, never a mapping: a
write into a hole on a full disk is an ENOSPC error here, not a SIGBUS.

Nothing here follows a symlink: a link is copied as a link.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)
BLOCK = 4096


def is_zero(data: bytes | memoryview) -> bool:
    n = len(data)
    return data == (_ZEROS if n == CHUNK else bytes(n))


def allocated(path: str | os.PathLike) -> int:
    """Bytes the file (or the tree under a directory) really takes: ``st_blocks`` * 512."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512
    total = st.st_blocks * 512
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
    return total


def data_extents(fd: int, start: int, end: int):
    """``(offset, end)`` of the parts of ``[start, end)`` that are not holes. Filesystems
    without SEEK_DATA report the whole range as data."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return  # only a hole up to the end of the file
            if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                yield pos, end
                return
            raise
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        pos = hole


def nonzero_end(path: str | os.PathLike, start: int, end: int) -> int:
    """One past the last non-zero byte of ``[start, end)`` of a file (``start`` when it is
    all zeros), read from the end back through the data extents only: a preallocated
    1 GiB segment's hole costs nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        end = min(end, os.fstat(fd).st_size)
        for a, b in reversed(list(data_extents(fd, start, end))):
            while b > a:
                lo = max(a, b - CHUNK)
                data = os.pread(fd, b - lo, lo)
                stripped = data.rstrip(b"\0")
                if stripped:
                    return lo + len(stripped)
                b = lo
        return start
    finally:
        os.close(fd)


def allocated_in(path: str | os.PathLike, offset: int, length: int) -> int:
    """Bytes of ``[offset, offset + length)`` that are not holes (an upper bound on what
    a sparse copy of the range takes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        end = min(offset + length, os.fstat(fd).st_size)
        return sum(b - a for a, b in data_extents(fd, offset, end))
    finally:
        os.close(fd)


def _copy_extent(src: int, dst: int, start: int, end: int, dst_delta: int) -> None:
    """Copy ``[start, end)`` of ``src`` to ``start - dst_delta`` in ``dst``; chunks of zeros
    stay holes."""
    pos = start
    while pos < end:
        data = os.pread(src, min(CHUNK, end - pos), pos)
        if not data:
            return  # the file shrank under us; the caller sets the size
        if not is_zero(data):
            view, at = memoryview(data), pos - dst_delta
            while view:
                n = os.pwrite(dst, view, at)
                view, at = view[n:], at + n
        pos += len(data)


def copy_range(src: int, dst: int, offset: int, length: int, dst_offset: int = 0) -> int:
    """Copy ``length`` bytes at ``offset`` of ``src`` (fds) sparsely to ``dst_offset``;
    returns how many bytes the source had there (less at its end)."""
    end = min(offset + length, os.fstat(src).st_size)
    for a, b in data_extents(src, offset, end):
        _copy_extent(src, dst, a, b, offset - dst_offset)
    return max(0, end - offset)


def copy_file(src: str | os.PathLike, dst: str | os.PathLike, *, fsync: bool = True) -> None:
    """Sparse copy of a regular file (or a symlink, as a link) to a new ``dst``, with its
    size, mode and modification time; fsync'd unless told not to."""
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
        return
    if not stat.S_ISREG(st.st_mode):
        # A FIFO, socket or device: kept as what it is (opening a FIFO to read its
        # bytes would block forever, and it has none).
        os.mknod(dst, st.st_mode, st.st_rdev)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        return
    s = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            copy_range(s, d, 0, st.st_size)
            os.ftruncate(d, st.st_size)
            if fsync:
                os.fsync(d)
            os.fchmod(d, stat.S_IMODE(st.st_mode))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(d)
    finally:
        os.close(s)


def copy_tree(src: str | os.PathLike, dst: str | os.PathLike, *, fsync: bool = True) -> None:
    """:func:`copy_file` of a file, or of every file under a directory (links as links)."""
    src, dst = Path(src), Path(dst)
    st = os.lstat(src)
    if not stat.S_ISDIR(st.st_mode):
        copy_file(src, dst, fsync=fsync)
        return
    os.mkdir(dst, 0o755)
    for entry in sorted(os.listdir(src)):
        copy_tree(src / entry, dst / entry, fsync=fsync)
    if fsync:
        fsync_dir(dst)
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def remove_tree(path: str | os.PathLike) -> None:
    """Remove a file, link or directory tree; nothing when absent. Never follows links."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for entry in os.listdir(p):
            remove_tree(p / entry)
        os.rmdir(p)
    else:
        os.unlink(p)


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync a file, or every file and directory under a directory (links, FIFOs,
    sockets and devices are skipped: opening a FIFO would block, and they hold no data)."""
    st = os.lstat(path)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        return
    if stat.S_ISDIR(st.st_mode):
        for entry in os.listdir(path):
            fsync_tree(os.path.join(path, entry))
        fsync_dir(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
