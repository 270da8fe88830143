"""Bytes a repair rewrites in place: zeroing a range (a torn CommitLog tail, cut queue
units), a record's BODYCRC and its ``__CRC32#`` digits (spec §3.8).

Writes are ``pwrite``/``ftruncate`` on descriptors opened without following links, never
through a mapping: on a full disk a write into a hole is then an ENOSPC error, not a
SIGBUS. Zeroing rewrites only the chunks that are not zero already, so it never allocates
a hole.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..files.sparse import CHUNK, is_zero
from ..format import layout as L
from ..format.crc import body_crc, ends_in_prop_crc, prop_crc_entry, record_prop_crc
from .journal import pwrite_all

_SYS_FLAG, _BODY_CRC = L.HEAD_FIELD_STRUCT["sys_flag"], L.HEAD_FIELD_STRUCT["body_crc"]


def zero_range(path: Path, offset: int, length: int, size: int | None = None) -> None:
    """Zero ``[offset, offset + length)`` (within the file), rewriting only the chunks
    that are not zero; then extend the file to ``size`` if shorter. fsync'd."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        end = min(offset + length, os.fstat(fd).st_size)
        pos = offset
        while pos < end:
            data = os.pread(fd, min(CHUNK, end - pos), pos)
            if not data:
                break
            if not is_zero(data):
                pwrite_all(fd, bytes(len(data)), pos)
            pos += len(data)
        if size is not None and os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def fix_body_crc(path: Path, at: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        head = os.pread(fd, L.RECORD_FIXED_SIZE[True, True] + 4, at - 8)
        sys_flag = _SYS_FLAG.unpack_from(head, L.OFFSET_OF["sys_flag"])[0]
        fixed = L.RECORD_FIXED_SIZE[bool(sys_flag & L.SYSFLAG_BORNHOST_V6),
                                    bool(sys_flag & L.SYSFLAG_STOREHOST_V6)]
        n = int.from_bytes(os.pread(fd, 4, at - 8 + fixed - 4), "big", signed=True)
        body = os.pread(fd, max(n, 0), at - 8 + fixed)
        pwrite_all(fd, _BODY_CRC.pack(body_crc(body)), at)
        # A record that ends in a property CRC covers BODYCRC too (spec §3.8): renew it,
        # or a broker with forceVerifyPropCRC would cut the log at this record instead.
        _renew_prop_crc(fd, at - L.OFFSET_OF["body_crc"])
        os.fsync(fd)
    finally:
        os.close(fd)


def _record_at(fd: int, record_at: int) -> bytes:
    size = int.from_bytes(os.pread(fd, 4, record_at), "big", signed=True)
    return os.pread(fd, max(size, 0), record_at) if 0 < size <= (1 << 30) else b""


def prop_crc_digits_range(path: Path, record_at: int) -> tuple[int, int] | None:
    """(position, length) of the digits of the record's ``__CRC32#`` entry, or None when
    the record at ``record_at`` does not end in one."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        rec = _record_at(fd, record_at)
    finally:
        os.close(fd)
    if not ends_in_prop_crc(rec):
        return None
    return record_at + len(rec) - L.PROP_CRC_ENTRY_SIZE + len(L.PROP_CRC_PREFIX), 10


def _renew_prop_crc(fd: int, record_at: int) -> None:
    rec = _record_at(fd, record_at)
    if ends_in_prop_crc(rec):
        entry = prop_crc_entry(record_prop_crc(rec))
        pwrite_all(fd, entry, record_at + len(rec) - L.PROP_CRC_ENTRY_SIZE)


def fix_prop_crc(path: Path, record_at: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        _renew_prop_crc(fd, record_at)
        os.fsync(fd)
    finally:
        os.close(fd)
