"""Typed errors. Each names the file (and offset, when there is one) it is about.

The CLI turns any :class:`RmqStoreError` into one line on stderr and the exit code
given by ``exit_code``; nothing here prints.
"""

from __future__ import annotations

import os

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_UNUSABLE = 2


class RmqStoreError(Exception):
    """Base class: an input rmqstore cannot use, with where it happened."""

    exit_code = EXIT_UNUSABLE

    def __init__(self, message: str, path: str | os.PathLike | None = None,
                 offset: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path
            if self.offset is not None:
                where += f" @ offset {self.offset}"
            where += ": "
        return where + self.message


class NotAStoreError(RmqStoreError):
    """The path is not a RocketMQ store root (or store file) at all."""


class ConfigError(RmqStoreError):
    """broker.conf or geometry options are wrong or cannot be inferred."""


class SegmentError(RmqStoreError):
    """A segment file has a bad name or size, or the queue has gaps."""


class RecordError(RmqStoreError):
    """Bytes at an offset are not a valid record (bad magic, lengths, CRC)."""


class OffsetError(RmqStoreError):
    """An offset or id points outside the data that exists."""


class StoreLockedError(RmqStoreError):
    """Another process (a broker, or another rmqstore writer) holds the store lock."""


class InputError(RmqStoreError):
    """Bad user input: a malformed JSON line, an unknown option value."""


class UnsupportedStoreError(RmqStoreError):
    """A store layout or feature rmqstore does not understand yet (a DLedger CommitLog, a
    RocksDB consume queue, ...). Never reported as an empty or healthy store."""


class UnsafePathError(RmqStoreError):
    """A name that comes from disk (a topic, a file name) cannot be used as a path inside
    the store, or a path leads out of it (a symlink, ``..``)."""


class RefusedError(RmqStoreError):
    """A writing command refuses a plan its evidence does not justify (it would remove
    valid data, or work from a guess); the message says why and which override exists."""


class StoreIOError(RmqStoreError):
    """The operating system failed a read or write (ENOSPC, EIO, ...): names the file and
    the operation; the store is left unchanged or resumable."""

    def __init__(self, message: str, path: str | os.PathLike | None = None,
                 offset: int | None = None, *, errno: int | None = None):
        super().__init__(message, path, offset)
        self.errno = errno


class WorkerDiedError(RmqStoreError):
    """A worker process died before it handed back its result (killed by a signal: a bus
    error on a mapped file, the out-of-memory killer, ...); names the signal and, when
    known, the file it was mapping."""


class SparkError(RmqStoreError):
    """Spark cannot run a job: no usable Java, executors that cannot start their Python or
    import rmqstore, or a task or the cluster failing outside rmqstore's own checks. The
    message says what to change (docs/pipeline.md, "On a cluster")."""
