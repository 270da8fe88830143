"""The CommitLog read side: check a record the way RocketMQ does, find where valid data
ends, read a message at a physical offset, and walk messages in order.

Bulk work over many records lives in :mod:`rmqstore.scan.records`; this module is for walking
with full checks and for single-record reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterator

from ..format import layout as L
from ..format.message import Message
from ..format.record import body_crc_ok, decode_record, fields_size, record_fits
from .config import StoreConfig
from .ends import ValidEnd
from ..errors import OffsetError, RecordError
from .segments import Segment, SegmentQueue

_TOTAL_SIZE = L.RECORD_TOTAL_SIZE_STRUCT


class Check(enum.Enum):
    OK = "ok"
    END_OF_SEGMENT = "blank"  # BLANK record: continue at the next segment
    FAIL = "fail"  # end of valid data
    FAIL_WITH_SIZE = "fail-with-size"  # well-framed but inconsistent ("half message")


@dataclass
class RecordCheck:
    status: Check
    size: int
    reason: str = ""  # what failed, for a person ("size field says 300, fields add up to 254")
    end: str = ""  # the same as a reason valid data ends for (a key of ends.REASONS)


def check_record(buf, pos: int, limit: int, *, check_crc: bool = True,
                 magics: tuple[int, ...] = L.MESSAGE_MAGICS) -> RecordCheck:
    """Classify the bytes at ``pos`` as RocketMQ's scan would (spec §3.9): the size rule
    is :func:`~rmqstore.format.record.record_fits`, and a whole record's body must match its
    BODYCRC (``check_crc``).

    ``magics`` lets a 4.9-faithful caller reject v2. No Python objects are built for the
    variable fields; only the body is touched, and only for the CRC.
    """
    got = record_fits(buf, pos, limit - pos, magics)
    if got.__class__ is int:
        if check_crc and not body_crc_ok(buf, pos, limit - pos):
            return RecordCheck(Check.FAIL, 0, "body CRC mismatch", "crc")
        return RecordCheck(Check.OK, got)
    return _not_whole(buf, pos, limit, magics, check_crc, got)


def _not_whole(buf, pos: int, limit: int, magics, check_crc: bool, why: str) -> RecordCheck:
    """The verdict on bytes :func:`record_fits` found no whole record at (``why``), in the
    order the broker's parse meets them (spec §3.9: a size past the data fails before the
    magic is read, a body is CRC-checked before the topic is read), with the reason text."""
    left = limit - pos
    if left <= 4:
        return RecordCheck(Check.FAIL, 0, "no room for a record", why)
    total, magic = L.BLANK_STRUCT.unpack_from(buf, pos) if left >= 8 else (
        _TOTAL_SIZE.unpack_from(buf, pos)[0], 0)
    if total > left:  # a BLANK too (5.x checks the size first)
        return RecordCheck(Check.FAIL, 0, f"size {total} runs past the {left} bytes left",
                           "bad size" if why == "blank" else why)
    if magic == L.MAGIC_BLANK:
        return RecordCheck(Check.END_OF_SEGMENT, 0, "", why)
    if magic not in magics:
        if total == 0 and magic == 0:
            return RecordCheck(Check.FAIL, 0, "zeros", why)
        return RecordCheck(Check.FAIL, 0, f"bad magic 0x{magic & 0xFFFFFFFF:08X}", why)
    if total < L.RECORD_HEAD_SIZE:
        return RecordCheck(Check.FAIL, 0, f"size {total} is too small", why)
    if check_crc and body_crc_ok(buf, pos, limit - pos) is False:
        return RecordCheck(Check.FAIL, 0, "body CRC mismatch", "crc")
    expected = fields_size(buf, pos, left)
    if expected is None or expected > left:
        return RecordCheck(Check.FAIL, 0, "record fields run past the end of the data", why)
    return RecordCheck(Check.FAIL_WITH_SIZE, total,
                       f"size field says {total}, fields add up to {expected}", why)


@dataclass(frozen=True)
class ScanEnd(ValidEnd):
    """Where valid data ends as the broker's recovery walk finds it (spec §10.1; bodies
    by :func:`~rmqstore.format.rules.broker_end`): ``reason`` is "" when the walk reached
    the last segment's end, else why the record there fails (``detail`` says it for a
    person)."""

    last_record: int = -1  # start of the last valid record, -1 when there is none
    detail: str = ""


class CommitLog:
    """A read-only view of a store's CommitLog segments."""

    def __init__(self, config: StoreConfig, *, queue: SegmentQueue | None = None):
        self.config = config
        self.queue = queue or SegmentQueue(config.commit_log_dirs,
                                           config.mapped_file_size_commit_log, kind="commitlog")

    @property
    def segments(self) -> list[Segment]:
        return self.queue.segments

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset

    def close(self) -> None:
        self.queue.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- single records ------------------------------------------------------------------

    def read_at(self, offset: int, *, check_crc: bool = False) -> Message:
        """The message whose record starts at physical ``offset``."""
        seg, pos = self.queue.find(offset)
        buf = seg.buffer()
        return decode_record(buf, pos, limit=seg.readable_size, path=seg.path,
                             base=seg.start, check_crc=check_crc)

    def check_at(self, offset: int, *, check_crc: bool = True) -> RecordCheck:
        seg, pos = self.queue.find(offset)
        return check_record(seg.buffer(), pos, seg.readable_size, check_crc=check_crc)

    # --- walking -------------------------------------------------------------------------

    def walk(self, start: int | None = None, *, check_crc: bool = True,
             stop_at_end: bool = True) -> Iterator[tuple[int, RecordCheck]]:
        """(offset, check) for each record from ``start`` in CommitLog order, BLANKs
        included; stops after the first FAIL (which is yielded too)."""
        segs = self.segments
        if not segs:
            return
        offset = segs[0].start if start is None else start
        i = next((k for k, s in enumerate(segs) if s.start <= offset < s.end), None)
        if i is None:
            raise OffsetError(f"offset {offset} is in no commitlog segment", self.queue.dirs[0], offset)
        while i < len(segs):
            seg = segs[i]
            buf = seg.buffer()
            pos = offset - seg.start
            limit = seg.readable_size
            while True:
                c = check_record(buf, pos, limit, check_crc=check_crc)
                yield seg.start + pos, c
                if c.status is Check.OK:
                    pos += c.size
                    if pos >= limit:
                        break
                    continue
                if c.status is Check.END_OF_SEGMENT:
                    break
                return
            i += 1
            if i < len(segs) and segs[i].start != seg.end:
                yield segs[i - 1].end, RecordCheck(Check.FAIL, 0, "next segment is missing",
                                                   "missing segment")
                return
            if i < len(segs):
                offset = segs[i].start

    def find_end(self, start: int | None = None, *, check_crc: bool | None = None) -> ScanEnd:
        """Walk from ``start`` (default: the first segment) to the end of valid data,
        as recovery does (spec §10.1): it stops at the first body failing its CRC
        (:func:`~rmqstore.format.rules.broker_end`; verify keeps such a record when valid
        ones follow, :func:`~rmqstore.format.rules.rmqstore_end`)."""
        if check_crc is None:
            check_crc = self.config.check_crc_on_recover
        end = self.segments[0].start if self.segments else 0
        if start is not None:
            end = start
        last = -1
        count = 0
        reason = detail = ""
        for off, c in self.walk(start, check_crc=check_crc):
            if c.status is Check.OK:
                last, count, end = off, count + 1, off + c.size
            elif c.status is Check.END_OF_SEGMENT:
                # The next segment's start, if there is one; recovery stops at the BLANK
                # of the last segment (spec §10.1).
                seg, _ = self.queue.find(off)
                nxt = seg.end
                end = nxt if any(s.start == nxt for s in self.segments) else off
            else:
                end, reason, detail = off, c.end, c.reason or c.status.value
        return ScanEnd(end, reason, count, last, detail)

    def messages(self, start: int | None = None, end: int | None = None, *,
                 check_crc: bool = False) -> Iterator[Message]:
        """Decoded messages from ``start`` up to (not including) ``end`` or invalid data."""
        for off, c in self.walk(start, check_crc=check_crc):
            if end is not None and off >= end:
                return
            if c.status is Check.OK:
                yield self.read_at(off)
            elif c.status is not Check.END_OF_SEGMENT:
                return


def record_error(check: RecordCheck, path, offset: int) -> RecordError:
    return RecordError(check.reason or check.status.value, path, offset)
