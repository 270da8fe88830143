"""Which file this process (or one of its forked children) maps last, and whether it
writes to a store: one page of shared memory the CLI reads after a child died of a bus
error (``cli/guard.py``). Tiny on purpose: the CLI imports it before every command."""

from __future__ import annotations

import mmap
import os
import struct

_NOTE_SLOT = 2048  # bytes of the file slot; the store slot follows
_LEN = struct.Struct("<I")
_note_page: mmap.mmap | None = None


def install_note_page() -> mmap.mmap:
    """Make the page :func:`note` writes to: shared and anonymous, so forked children
    (the CLI's command process, its pool workers) write where the first process reads."""
    global _note_page
    if _note_page is None:
        _note_page = mmap.mmap(-1, mmap.PAGESIZE)
    return _note_page


def _put(slot: int, text: str) -> None:
    page = _note_page
    data = os.fsencode(text)[:_NOTE_SLOT - _LEN.size]
    _LEN.pack_into(page, slot, 0)  # a reader sees no text rather than half of one
    page[slot + _LEN.size:slot + _LEN.size + len(data)] = data
    _LEN.pack_into(page, slot, len(data))


def note(path, op: str) -> None:
    """Record that ``path`` is being mapped for ``op`` ("read", "write")."""
    if _note_page is not None:
        _put(0, f"{op}\0{os.fspath(path)}")


def note_writing(root) -> None:
    """Record that this process took the store at ``root`` for writing (its lock)."""
    if _note_page is not None:
        _put(_NOTE_SLOT, os.fspath(root))


def _get(page: mmap.mmap, slot: int) -> str:
    (n,) = _LEN.unpack_from(page, slot)
    n = min(n, _NOTE_SLOT - _LEN.size)
    return os.fsdecode(bytes(page[slot + _LEN.size:slot + _LEN.size + n]))


def noted(page: mmap.mmap | None = None) -> tuple[str, str, str]:
    """(op, path, store root being written) from the note page; "" where unknown."""
    page = page or _note_page
    if page is None:
        return "", "", ""
    op, _, path = _get(page, 0).partition("\0")
    return op, path, _get(page, _NOTE_SLOT)
