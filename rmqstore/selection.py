"""Which messages a dump shows, and why it stopped where it did.

:class:`MessageFilter` holds every filter of ``rmqstore dump`` (topic, queue, tag, key,
UNIQ_KEY, store time, CommitLog offsets, bytes, count) in two forms that agree: a
vectorised one over scan columns (:meth:`MessageFilter.select`) and a scalar one for a
single message (:meth:`MessageFilter.matches`, used when following a live store).

:class:`MessageScan` walks a CommitLog with a filter and, once exhausted, says in
:attr:`MessageScan.stop` where valid data ended and whether that end is damage (a torn or
garbled record, a missing segment) or a normal end (zeros, a BLANK with no next segment,
a limit reached). Records whose body does not match BODYCRC are given with ``crcOk``
false and counted in :attr:`MessageScan.bad_crc`.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .format.message import Message, parse_properties, split_keys
from .format.record import RecordError, inner_messages, is_inner_batch
from .errors import InputError
from .scan.records import FIRST_WINDOW, scan_windows
from .times import parse_time

#: Why a walk stopped, when that means the data ends in damage (spec §10.1, §10.5).
DAMAGE = {"bad magic": "garbage where a record should start",
          "bad size": "a record header whose size does not fit",
          "short": "a few stray bytes where a record should start",
          "half record": "a torn record (its lengths do not add up)",
          "missing segment": "the next CommitLog segment file is missing",
          # DLedger CommitLogs (design-14 §1.5): where its recovery would cut, and why
          "dledger entry": "a DLedger entry that DLedger's recovery cuts here (the entry chain breaks)",
          "dledger tail": "non-zero bytes after the end of the DLedger entry chain",
          "dledger record": "a DLedger entry whose record is not a valid CommitLog record",
          "dledger file": "a break in the entry chain of an older data file; the rest of that file was skipped"}
#: Records of a DLedger entry run gathered into columns at a time (memory stays bounded).
DLEDGER_CHUNK = 1 << 16


def _many(value, kind=str) -> tuple | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, int)):
        value = [value]
    out = tuple(kind(v) for v in value)
    return out or None


def _tag_alternatives(tags: tuple[str, ...] | None) -> frozenset[str] | None:
    """Subscription-expression style: ``TagA || TagB``; ``*`` matches every message."""
    if tags is None:
        return None
    alts = {t.strip() for expr in tags for t in expr.split("||") if t.strip()}
    return None if "*" in alts or not alts else frozenset(alts)


@dataclass(frozen=True)
class MessageFilter:
    """Every filter is optional; several values of one filter mean any of them.

    ``since``/``until`` are store times (inclusive), ``from_offset``/``to_offset`` CommitLog
    offsets (``[from, to)``), ``max_bytes`` the CommitLog bytes a scan may cover from where
    it starts (a record counts whole), ``limit`` the most messages given."""

    topics: tuple[str, ...] | None = None
    queue_ids: tuple[int, ...] | None = None
    tags: frozenset[str] | None = None
    keys: tuple[str, ...] | None = None
    uniq_keys: tuple[str, ...] | None = None
    since: int | None = None
    until: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    max_bytes: int | None = None
    limit: int | None = None

    @classmethod
    def make(cls, *, topic=None, queue_id=None, tag=None, key=None, uniq_key=None, since=None,
             until=None, from_offset=None, to_offset=None, max_bytes=None, limit=None,
             tz=None) -> "MessageFilter":
        """From the loose forms scripts and the CLI use: one value or several; times in
        any form :func:`rmqstore.times.parse_time` reads (naive ones in ``tz``)."""
        for name, v in (("from_offset", from_offset), ("to_offset", to_offset),
                        ("max_bytes", max_bytes), ("limit", limit)):
            if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0):
                raise InputError(f"{name} must be a whole number >= 0, got {v!r}")
        return cls(topics=_many(topic), queue_ids=_many(queue_id, int),
                   tags=_tag_alternatives(_many(tag)), keys=_many(key), uniq_keys=_many(uniq_key),
                   since=parse_time(since, tz), until=parse_time(until, tz),
                   from_offset=from_offset, to_offset=to_offset, max_bytes=max_bytes, limit=limit)

    @property
    def needs_properties(self) -> bool:
        return self.tags is not None or self.keys is not None or self.uniq_keys is not None

    def scan_start(self, first: int) -> int:
        """Where a scan of a CommitLog whose first segment starts at ``first`` begins:
        what ``max_bytes`` counts from."""
        return first if self.from_offset is None else max(self.from_offset, first)

    def scan_end(self, first: int) -> int | None:
        """No record starting at or after this CommitLog offset can pass (``to_offset``,
        ``max_bytes`` from :meth:`scan_start`); None when nothing bounds the scan."""
        ends = [e for e in (self.to_offset, None if self.max_bytes is None
                            else self.scan_start(first) + self.max_bytes) if e is not None]
        return min(ends) if ends else None

    # --- the two forms ----------------------------------------------------------------

    def properties_match(self, props: dict[str, str]) -> bool:
        if self.tags is not None and props.get("TAGS") not in self.tags:
            return False
        if self.keys is not None and not set(self.keys) & set(split_keys(props.get("KEYS"))):
            return False
        if self.uniq_keys is not None and props.get("UNIQ_KEY") not in self.uniq_keys:
            return False
        return True

    def matches(self, msg: Message) -> bool:
        """The scalar form: does this one message pass (``limit``/``max_bytes`` aside)?"""
        off = msg.commit_log_offset
        if self.from_offset is not None and off < self.from_offset:
            return False
        if self.to_offset is not None and off >= self.to_offset:
            return False
        if self.queue_ids is not None and msg.queue_id not in self.queue_ids:
            return False
        if self.since is not None and msg.store_timestamp < self.since:
            return False
        if self.until is not None and msg.store_timestamp > self.until:
            return False
        if self.topics is not None and msg.topic not in self.topics:
            return False
        return self.properties_match(msg.properties)

    def select(self, cols, start: int | None = None) -> np.ndarray:
        """The vectorised form: indices of the records of ``cols`` that pass. ``start`` is
        where the scan began (for ``max_bytes``)."""
        keep = np.ones(len(cols), dtype=bool)
        if not len(cols):
            return np.flatnonzero(keep)
        off = cols.offset
        if self.from_offset is not None:
            keep &= off >= self.from_offset
        if self.to_offset is not None:
            keep &= off < self.to_offset
        if self.max_bytes is not None and start is not None:
            keep &= off + cols.size <= start + self.max_bytes
        if self.queue_ids is not None:
            keep &= np.isin(cols.queue_id, self.queue_ids)
        if self.since is not None:
            keep &= cols.store_timestamp >= self.since
        if self.until is not None:
            keep &= cols.store_timestamp <= self.until
        if self.topics is not None and keep.any():
            names, ids = cols.topic_table()
            wanted = [i for i, n in enumerate(names) if n in self.topics]
            keep &= np.isin(ids, wanted)
        chosen = np.flatnonzero(keep)
        if self.needs_properties and len(chosen):
            # An inner-batch record's messages carry their own TAGS/KEYS/UNIQ_KEY: it is
            # kept here and its messages are matched once unwrapped (MessageScan).
            inner = is_inner_batch(cols.sys_flag[chosen]).tolist()
            ok = [b or self.properties_match(parse_properties(cols.properties_text(i)))
                  for i, b in zip(chosen.tolist(), inner)]
            chosen = chosen[np.array(ok, dtype=bool)]
        return chosen


@dataclass(frozen=True)
class ScanStop:
    """Where and why a scan stopped."""

    offset: int  # the CommitLog offset it stopped at
    reason: str  # zeros | blank | end | limit | max-bytes | to-offset | one of DAMAGE
    path: str | None = None  # the segment file it stopped in
    detail: str = ""  # the values read, when the reason alone does not say enough

    @property
    def damaged(self) -> bool:
        return self.reason in DAMAGE

    def describe(self) -> str:
        where = f"{self.path} @ offset {self.offset}" if self.path else f"offset {self.offset}"
        return f"{where}: {DAMAGE.get(self.reason, self.reason)}" + (
            f" ({self.detail})" if self.detail else "")


class MessageScan:
    """The messages of one CommitLog that pass a filter, in physical order. Iterate
    :meth:`chunks`, :meth:`messages` or :meth:`dicts` once; then :attr:`stop` says why it
    ended (None if the caller stopped early) and :attr:`bad_crc` how many of the given
    records failed their body CRC."""

    def __init__(self, commitlog, flt: MessageFilter | None = None, *, unwrap: bool = True):
        self.commitlog = commitlog
        self.filter = flt or MessageFilter()
        #: Give an inner-batch record's messages (design-14 §4.3, D7), not the record.
        self.unwrap = unwrap
        #: Inner-batch records whose body did not unwrap (given whole): (offset, why).
        self.unwrap_problems: list[tuple[int, str]] = []
        self.stop: ScanStop | None = None
        self.given = 0
        self.bad_crc = 0
        #: Damage passed over without stopping (DLedger: entry framing gives the next
        #: record's place, so a bad record or a broken older file does not end the scan).
        self.damage: list[ScanStop] = []

    def chunks(self) -> Iterator[tuple[object, np.ndarray]]:
        """(columns, indices) per window of a segment for the records that pass, at most
        ``limit`` in all."""
        if getattr(self.commitlog, "framing", "plain") == "dledger":
            yield from self._dledger_chunks()
            return
        f = self.filter
        segs = self.commitlog.segments
        if not segs:
            self.stop = ScanStop(0, "end")
            return
        start = f.scan_start(segs[0].start)
        scan = None
        for k, seg in enumerate(segs):
            if f.to_offset is not None and seg.start >= f.to_offset:
                self.stop = ScanStop(seg.start, "to-offset", str(seg.path))
                return
            if f.max_bytes is not None and seg.start >= start + f.max_bytes:
                self.stop = ScanStop(seg.start, "max-bytes", str(seg.path))
                return
            if k and seg.start != segs[k - 1].end:
                self.stop = ScanStop(segs[k - 1].end, "missing segment", str(segs[k - 1].path))
                return
            if f.from_offset is not None and seg.end <= f.from_offset:
                continue
            # A window at a time, its pages let go once handed over: memory stays at a
            # window's columns whatever the segment's size. Windows start small and grow,
            # so a scan that stops early (a limit, a to-offset) reads about what it gives.
            buf = seg.buffer()
            released = 0
            for scan in scan_windows(buf, seg.start, seg.readable_size, first=FIRST_WINDOW):
                cols = scan.records
                chosen = f.select(cols, start)
                if f.limit is not None:
                    chosen = chosen[:max(f.limit - self.given, 0)]
                if len(chosen):
                    self.bad_crc += int((~cols.crc_ok(chosen)).sum())
                    self.given += len(chosen)
                    yield cols, chosen
                if f.limit is not None and self.given >= f.limit:
                    self.stop = ScanStop(int(cols.offset[chosen[-1]]) if len(chosen) else seg.start,
                                         "limit", str(seg.path))
                    return
                if f.to_offset is not None and scan.end >= f.to_offset:
                    self.stop = ScanStop(f.to_offset, "to-offset", str(seg.path))
                    return
                if f.max_bytes is not None and scan.end > start + f.max_bytes:
                    self.stop = ScanStop(start + f.max_bytes, "max-bytes", str(seg.path))
                    return
                if not seg.writable:
                    released = release_pages(buf, released, scan.end - seg.start)
            if scan.stop not in ("blank", "end"):
                self.stop = ScanStop(scan.end, scan.stop, str(seg.path))
                return
        last = segs[-1]
        if scan is None:  # every segment lies before from_offset
            self.stop = ScanStop(last.end, "end", str(last.path))
        else:
            self.stop = ScanStop(scan.end, scan.stop, str(last.path))

    def _dledger_chunks(self) -> Iterator[tuple[object, np.ndarray]]:
        """:meth:`chunks` over a DLedger CommitLog: the records inside the entries DLedger's
        recovery keeps, in entry order, with the same filters and stops (design-14 §1).
        Offsets are record offsets (entry pos + 48), as in the ConsumeQueue."""
        from .files.dledger import CLEAN_ENDS
        from .scan.records import columns, consistent

        f = self.filter
        log = self.commitlog.log
        segs = log.data_files
        start = f.scan_start(segs[0].start if segs else 0)
        for run in log.runs():
            if not len(run):
                continue
            path = str(run.path)
            if f.to_offset is not None and run.start >= f.to_offset:
                self.stop = ScanStop(run.start, "to-offset", path)
                return
            if f.max_bytes is not None and run.start >= start + f.max_bytes:
                self.stop = ScanStop(run.start, "max-bytes", path)
                return
            if f.from_offset is not None and run.start + log.file_size <= f.from_offset:
                continue
            good = run.record_ok()
            for lo in range(0, len(run), DLEDGER_CHUNK):
                keep = np.arange(lo, min(lo + DLEDGER_CHUNK, len(run)))
                cols = columns(run.u8, run.record_pos[keep], run.start)
                ok = good[keep] & consistent(cols)
                if not ok.all():
                    for i in np.flatnonzero(~ok).tolist():
                        self.damage.append(ScanStop(int(cols.offset[i]), "dledger record", path))
                    cols = cols.take(np.flatnonzero(ok))
                chosen = f.select(cols, start)
                if f.limit is not None:
                    chosen = chosen[:max(f.limit - self.given, 0)]
                if len(chosen):
                    self.bad_crc += int((~cols.crc_ok(chosen)).sum())
                    self.given += len(chosen)
                    yield cols, chosen
                last = int(run.entry_pos[keep[-1]] + run.size[keep[-1]]) + run.start
                if f.limit is not None and self.given >= f.limit:
                    self.stop = ScanStop(int(cols.offset[chosen[-1]]) if len(chosen) else run.start,
                                         "limit", path)
                    return
                if f.to_offset is not None and last >= f.to_offset:
                    self.stop = ScanStop(f.to_offset, "to-offset", path)
                    return
                if f.max_bytes is not None and last > start + f.max_bytes:
                    self.stop = ScanStop(start + f.max_bytes, "max-bytes", path)
                    return
        end = log.walk()
        for e in end.damage:
            self.damage.append(ScanStop(e.offset if e.offset is not None else 0, "dledger file",
                                        e.path, e.message))
        where = str(end.path) if end.path else None
        if end.reason not in CLEAN_ENDS:
            self.stop = ScanStop(end.offset, "dledger entry", where, end.detail)
        elif not end.tail_clean:
            self.stop = ScanStop(end.offset, "dledger tail", where)
        else:
            self.stop = ScanStop(end.offset, "zeros" if end.reason == "size-zero" else
                                 "blank" if end.reason == "blank-in-last-file" else "end", where)

    def _unwrapped(self, msg: Message) -> list[Message]:
        return unwrap_message(msg, self.filter, self.unwrap_problems)

    def _runs(self, cols, chosen):
        """(is an inner-batch run, indices) in order: records that unwrap apart from the
        rest, which keep the vectorised path. One vector test when there are none."""
        if not self.unwrap:
            yield False, chosen
            return
        inner = is_inner_batch(cols.sys_flag[chosen])
        if not inner.any():
            yield False, chosen
            return
        cuts = np.flatnonzero(inner[1:] != inner[:-1]) + 1
        for part in np.split(np.arange(len(chosen)), cuts):
            yield bool(inner[part[0]]), chosen[part]

    def _capped(self, rows):
        """``rows`` up to the filter's ``limit``; ``given`` then counts rows, not records
        (an inner-batch record gives several)."""
        limit, n = self.filter.limit, 0
        for row in rows:
            if limit is not None and n >= limit:
                break
            n += 1
            yield row
        self.given = n

    def messages(self) -> Iterator[Message]:
        return self._capped(self._messages())

    def _messages(self) -> Iterator[Message]:
        for cols, chosen in self.chunks():
            for inner, idx in self._runs(cols, chosen):
                for i in idx.tolist():
                    if inner:
                        yield from self._unwrapped(cols.message(i))
                    else:
                        yield cols.message(i)

    def dicts(self, body: str = "base64", *, charset: str = "utf-8", tz=None,
              sink=None) -> Iterator[dict]:
        """The message JSON (:mod:`rmqstore.view`) of each message, from the columns."""
        return self._capped(self._dicts(body, charset, tz, sink))

    def _dicts(self, body, charset, tz, sink) -> Iterator[dict]:
        from .view import message_dict, message_dicts

        for cols, chosen in self.chunks():
            for inner, idx in self._runs(cols, chosen):
                if not inner:
                    yield from message_dicts(cols, body, idx, charset=charset, tz=tz, sink=sink)
                    continue
                for i in idx.tolist():
                    for m in self._unwrapped(cols.message(i)):
                        yield message_dict(m, body, charset=charset, tz=tz, sink=sink)


    def json_lines(self, body: str = "base64", *, charset: str = "utf-8", tz=None,
                   extra=None) -> Iterator["JsonLines"]:
        """:meth:`dicts` as JSON Lines text (:mod:`rmqstore.view_lines`), a block of lines
        at a time, ``extra``'s members last in every object; ``given`` and ``stop`` as
        :meth:`dicts` leaves them."""
        return self._capped_blocks(self._blocks(body, charset, tz, extra))

    def _blocks(self, body, charset, tz, extra):
        from .json_lines import JsonLines, json_line
        from .view import message_dict
        from .view_lines import message_lines

        for cols, chosen in self.chunks():
            for inner, idx in self._runs(cols, chosen):
                if not inner:
                    yield from message_lines(cols, idx, body, charset=charset, tz=tz,
                                             extra=extra)
                    continue
                for i in idx.tolist():  # one line a block: _capped_blocks stops as _capped
                    for m in self._unwrapped(cols.message(i)):
                        d = message_dict(m, body, charset=charset, tz=tz)
                        yield JsonLines(json_line({**d, **extra} if extra else d).encode(), 1)

    def _capped_blocks(self, blocks):
        """:meth:`_capped` for blocks of lines: a block that passes ``limit`` is cut, and
        the walk stops there (rows followed it, as :meth:`_capped` stops on the next row)."""
        limit, n = self.filter.limit, 0
        for b in blocks:
            if limit is not None:
                if n >= limit:
                    break
                if n + b.count > limit:
                    b = b.head(limit - n)
                    n += b.count
                    yield b
                    break
            n += b.count
            yield b
        self.given = n


def unwrap_message(msg: Message, flt: MessageFilter | None = None,
                   problems: list | None = None) -> list[Message]:
    """The messages a consumer gets from a record: an inner batch's (design-14 §4.3) that
    pass ``flt``'s property tests, else the record itself. A body that does not unwrap
    gives the record whole, and (offset, why) in ``problems``."""
    if not is_inner_batch(msg.sys_flag):
        return [msg]
    try:
        out = inner_messages(msg)
    except RecordError as e:
        if problems is not None:
            problems.append((msg.commit_log_offset, str(e)))
        return [msg]
    if flt is not None and flt.needs_properties:
        out = [m for m in out if flt.properties_match(m.properties)]
    return out


def release_pages(buf, done: int, upto: int) -> int:
    """Drop this process's mapping of a read-only map's pages in ``[done, upto)`` (page
    aligned down): the data stays in the page cache and is read again if touched, but it
    no longer counts in the reader's resident memory. Returns the new ``done``."""
    upto -= upto % mmap.PAGESIZE
    if upto > done and isinstance(buf, mmap.mmap):
        buf.madvise(mmap.MADV_DONTNEED, done, upto - done)
        return upto
    return done


__all__ = ["MessageFilter", "MessageScan", "ScanStop", "DAMAGE", "release_pages", "unwrap_message"]
