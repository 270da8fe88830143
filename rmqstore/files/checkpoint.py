"""The store's ``checkpoint``, ``abort`` and ``lock`` files (spec §8).

Readers here never create or modify a file; :func:`is_locked` in particular probes the
broker's lock without taking it. Writers hold the lock (:class:`StoreLock`) first.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from ..format import layout as L
from ..errors import RecordError, StoreLockedError, UnsafePathError
from .mapped import io_error
from .listing import open_regular
from .notes import note_writing

CHECKPOINT = "checkpoint"
ABORT = "abort"
ABORT_BAK = "abort.bak"  # 5.x: what abort held before this start (design-14 §7)
COMPACTION_POSITION = "compaction/position-checkpoint"
#: What a 5.x broker persists at shutdown when no topic is compacted (CompactionPositionMgr).
COMPACTION_POSITION_EMPTY = b'{\n\t"empty":true,\n\t"queueOffsetMap":{}\n}'
LOCK = "lock"
LOCK_CONTENT = b"lock"


@dataclass
class Checkpoint:
    """The checkpoint's fields (spec §8.1); the two 5.x fields read 0 in a 4.9 file."""

    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @property
    def min_timestamp(self) -> int:
        """What abnormal recovery compares segment start times with (spec §8.1)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)


def _file(root_or_file: str | os.PathLike, name: str) -> Path:
    p = Path(root_or_file)
    return p / name if p.is_dir() else p


def _open_in_store(path: Path, flags: int) -> int:
    """``os.open`` that never writes through a symbolic link (it could lead out of the
    store): :class:`UnsafePathError` instead."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError("a symbolic link: rmqstore does not write through it",
                                  path) from None
        raise


def read_checkpoint(root_or_file: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint file (or ``{root}/checkpoint``) without changing it (spec §8.1)."""
    path = _file(root_or_file, CHECKPOINT)
    try:
        with open_regular(path) as f:
            data = f.read(L.CHECKPOINT_V5_STRUCT.size)
    except OSError as e:
        raise RecordError(f"cannot read checkpoint: {e.strerror}", path) from None
    if len(data) < L.CHECKPOINT_V4_STRUCT.size:
        raise RecordError(f"checkpoint is {len(data)} bytes, needs at least "
                          f"{L.CHECKPOINT_V4_STRUCT.size} (the broker writes "
                          f"{L.CHECKPOINT_FILE_SIZE})", path, len(data))
    data = data.ljust(L.CHECKPOINT_V5_STRUCT.size, b"\0")
    return Checkpoint(*L.CHECKPOINT_V5_STRUCT.unpack(data))


def write_checkpoint(root_or_file: str | os.PathLike, cp: Checkpoint, *,
                     version: str = "4.9", fsync: bool = True) -> None:
    """Write all 4096 bytes in place: 3 longs for "4.9", 5 for "5.x" (spec §8.1, §13)."""
    path = _file(root_or_file, CHECKPOINT)
    if version == "4.9":
        data = L.CHECKPOINT_V4_STRUCT.pack(cp.physic_msg_timestamp, cp.logics_msg_timestamp,
                                           cp.index_msg_timestamp)
    elif version == "5.x":
        data = L.CHECKPOINT_V5_STRUCT.pack(cp.physic_msg_timestamp, cp.logics_msg_timestamp,
                                           cp.index_msg_timestamp, cp.master_flushed_offset,
                                           cp.confirm_phy_offset)
    else:
        raise ValueError(f"unknown checkpoint version {version!r}")
    try:
        fd = _open_in_store(path, os.O_RDWR | os.O_CREAT)
        try:
            os.pwrite(fd, data.ljust(L.CHECKPOINT_FILE_SIZE, b"\0"), 0)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise io_error(e, path, "write checkpoint") from None


# --- abort (spec §8.2) -------------------------------------------------------------------


def abort_exists(root: str | os.PathLike) -> bool:
    """True when the last broker run did not shut down cleanly."""
    return (Path(root) / ABORT).exists()


def create_abort(root: str | os.PathLike, content: bytes = b"", *, keep_previous: bool = False) -> None:
    """Mark the store as being modified: 4.9 writes it empty, 5.x the PID text and, first,
    what ``abort`` held into ``abort.bak`` (an empty file after a clean shutdown, the
    crashed run's PID after a crash: ``MixAll#string2File``, design-14 §7)."""
    path = Path(root) / ABORT
    existed = path.exists()
    if keep_previous:
        _write_file(Path(root) / ABORT_BAK, _read_small(path) if existed else b"", "create abort.bak")
    _write_file(path, content, "create abort", remove_on_error=not existed)


def _read_small(path: Path) -> bytes:
    try:
        fd = _open_in_store(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _write_file(path: Path, content: bytes, what: str, *, remove_on_error: bool = False) -> None:
    """Write a small state file in the store (never through a link) and fsync it;
    ``remove_on_error``: a file this call created goes again when the write fails (a full
    disk leaves no half-made marker behind)."""
    try:
        fd = _open_in_store(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if remove_on_error:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise io_error(e, path, what) from None


def write_compaction_position(root: str | os.PathLike) -> None:
    """What a 5.x broker's shutdown leaves in ``compaction/position-checkpoint`` when no
    topic is compacted; a file already there (compaction in use) is left as it is."""
    d = Path(root) / "compaction"
    if d.is_symlink() or (d.exists() and not d.is_dir()):
        return  # never write through a link or over something else
    path = Path(root) / COMPACTION_POSITION
    if path.exists() or path.is_symlink():
        return
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise io_error(e, d, "create compaction/") from None
    _write_file(path, COMPACTION_POSITION_EMPTY, "write compaction/position-checkpoint")


def shutdown_files(root: str | os.PathLike) -> None:
    """The files a 5.x broker's start and clean shutdown leave beside the data: what
    ``abort`` held, kept in ``abort.bak``, and the compaction positions."""
    path = Path(root) / ABORT
    _write_file(Path(root) / ABORT_BAK, _read_small(path) if path.exists() else b"",
                "write abort.bak")
    write_compaction_position(root)


def remove_abort(root: str | os.PathLike) -> None:
    """Only after everything is flushed consistently (spec §8.2)."""
    try:
        os.unlink(Path(root) / ABORT)
    except FileNotFoundError:
        pass


# --- lock (spec §8.3) --------------------------------------------------------------------

# POSIX record locks belong to the process, not the descriptor: a second lock from this
# process would succeed, and closing any descriptor of the file drops the lock. So the
# process remembers which lock files it holds.
_HELD: dict[tuple[int, int], "StoreLock"] = {}


def _key(fd_or_path: int | Path) -> tuple[int, int]:
    st = os.fstat(fd_or_path) if isinstance(fd_or_path, int) else os.stat(fd_or_path)
    return st.st_dev, st.st_ino


def held_here(path: Path) -> bool:
    """Does this process hold the lock file ``path`` (a StoreLock of ours)?"""
    # Checked by path before any open: closing even a probe descriptor drops our lock.
    try:
        return _key(path) in _HELD
    except FileNotFoundError:
        return False


class StoreLock:
    """The broker's store lock: an exclusive POSIX lock on byte 0 of ``{root}/lock``.

    Use as a context manager; :class:`StoreLockedError` when someone else holds it.
    """

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "StoreLock":
        if held_here(self.path):
            raise StoreLockedError("this process already holds the store lock", self.path)
        try:
            fd = _open_in_store(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            raise StoreLockedError(f"cannot open the lock file for writing: {e.strerror}",
                                   self.path) from None
        key = _key(fd)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise StoreLockedError(
                    "the store is locked by another process (a running broker?); "
                    "stop it before writing", self.path) from None
            raise StoreLockedError(f"cannot lock: {e.strerror}", self.path) from None
        try:
            os.pwrite(fd, LOCK_CONTENT, 0)
            os.fsync(fd)
        except OSError as e:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
            os.close(fd)
            raise io_error(e, self.path, "write lock") from None
        self._fd = fd
        _HELD[key] = self
        note_writing(self.path.parent)  # for the CLI's last-resort message
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        _HELD.pop(_key(self._fd), None)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "StoreLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def hold_lock(root: str | os.PathLike) -> StoreLock:
    """``with hold_lock(root): ...`` writes under the store lock."""
    return StoreLock(root)


# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid (native alignment, padded to 32 bytes on LP64).
_FLOCK = struct.Struct("hhqqi")
_FLOCK_SIZE = 32


def is_locked(root: str | os.PathLike) -> bool:
    """Does anyone hold the store lock? Creates and modifies nothing.

    Linux: F_GETLK on a read-only descriptor asks whether a write lock on byte 0 would be
    refused, so it works on read-only stores. Elsewhere: the file is opened read/write
    (without writing) and the lock is tried and released at once.
    """
    path = Path(root) / LOCK
    if held_here(path):
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block
    except FileNotFoundError:
        return False
    try:
        if sys.platform.startswith("linux"):
            req = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0).ljust(_FLOCK_SIZE, b"\0")
            res = fcntl.fcntl(fd, fcntl.F_GETLK, req)
            return _FLOCK.unpack_from(res)[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)
    try:
        fd = os.open(path, os.O_RDWR)
    except PermissionError:
        return False  # nobody can have write-locked what cannot be opened for writing
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
        return False
    finally:
        os.close(fd)
