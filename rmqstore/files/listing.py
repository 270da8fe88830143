"""Directory listings that stay inside the store: symbolic links are reported, never followed.

The rule (docs/playbook.md, "Symbolic links"): the store root and its top-level
``commitlog/``, ``consumequeue/`` and ``index/`` may be symbolic links (operators put them
on other disks); rmqstore reads through them and writes only inside the directories they
resolve to (and the backup folder). Anything *below* them that is a symbolic link (a
topic or queue directory, a segment or index file) is not part of the store: listings
report it, readers never read through it, and repair neither follows it, nor moves or
deletes it or its target. Special files (FIFOs, sockets, devices) are treated alike: a
read of a FIFO would block forever.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: Long.MAX_VALUE: no CommitLog or ConsumeQueue offset (a file name) can be larger.
LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class Entry:
    """One directory entry, as ``lstat`` sees it."""

    name: str
    path: Path
    kind: str  # file | dir | symlink | special
    size: int  # the entry's own size (a link's is its target string's length)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "special"


def entries(directory: str | os.PathLike) -> list[Entry]:
    """The entries of ``directory``, sorted by name, without following any symbolic link
    inside it ([] when it is not a directory). ``directory`` itself may be a link."""
    d = Path(directory)
    try:
        it = os.scandir(d)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    with it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone while listing
            out.append(Entry(e.name, d / e.name, _kind(st.st_mode), st.st_size))
    out.sort(key=lambda e: e.name)
    return out


def link_target(path: str | os.PathLike) -> str:
    """Where a symbolic link points (its text; never resolved)."""
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def odd_entry(e: Entry) -> tuple[str, str] | None:
    """(problem code, detail) for a symbolic link or special file, else None."""
    if e.kind == "symlink":
        return "symlink", (f"a symbolic link (-> {link_target(e.path)}) inside the store: "
                           "never read through, moved or deleted; remove or replace it by hand")
    if e.kind == "special":
        return "special-file", ("not a regular file or directory (a FIFO, socket or device): "
                                "never read, moved or deleted; remove it by hand")
    return None


def offset_name(name: str, digits: int = 20) -> int | None:
    """The offset a ``%0{digits}d`` file name stands for, or None when the name is not
    one or the offset is larger than any Java long (the broker cannot load it)."""
    if len(name) != digits or not name.isdigit() or not name.isascii():
        return None
    n = int(name)
    return n if n <= LONG_MAX else None


def inside(path: str | os.PathLike, roots) -> bool:
    """Whether ``path`` (resolved) lies in one of ``roots`` (resolved)."""
    p = os.path.realpath(path)
    for r in roots:
        r = os.path.realpath(r)
        if p == r or p.startswith(r.rstrip(os.sep) + os.sep):
            return True
    return False


class NotARegularFile(OSError):
    """A store file that is a FIFO, socket, device or directory: never read (it could block)."""


def open_regular(path: str | os.PathLike, mode: str = "rb"):
    """``open(path, mode)`` for a store file that must be a regular file.

    Opened with ``O_NONBLOCK`` first, so a named pipe where a checkpoint or lock should be
    answers at once instead of blocking the reader forever; anything but a regular file
    raises :class:`NotARegularFile` (an ``OSError``, so callers' one-line errors apply)."""
    flags = {"rb": os.O_RDONLY, "r+b": os.O_RDWR}[mode]
    fd = os.open(path, flags | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(0, f"not a regular file ({_kind(st.st_mode)})", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise
