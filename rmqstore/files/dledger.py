"""DLedger CommitLogs: the entry chain as DLedger's own recovery walks it, the records in
it, and CommitLog offsets <-> data-file positions (issue #14).

With ``enableDLegerCommitLog=true`` the CommitLog lives in ``dledger-<selfId>/data/`` as
DLedger entries: a 48-byte header, then one complete CommitLog record (spec §3.1) whose
PHYSICALOFFSET is the entry's ``pos + 48``. That record offset is what the ConsumeQueue,
the IndexFiles, offsetMsgIds and put results hold, so everything that works on record
start positions works here unchanged; only the framing differs (design-14 §1, D1). The
layout is in :mod:`rmqstore.format.dledger_layout`, the files in :mod:`rmqstore.files.dledger_files`.

Where valid data ends is decided as ``DLedgerMmapFileStore#recover`` (DLedger 0.3.1.2)
decides it (design-14 §1.5, D2): :meth:`DLedgerLog.walk`. Nothing here writes: files are
opened read-only and mapped ``ACCESS_READ`` (:class:`~rmqstore.files.segments.SegmentQueue`).

:class:`DLedgerCommitLog` is the CommitLog-shaped face :class:`rmqstore.reader.StoreReader`
reads a DLedger store through (``dump``, ``get``, ``query-key``, ``stats``); see docs/dledger.md.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..errors import ConfigError, NotAStoreError, OffsetError, RecordError, SegmentError
from ..format import layout as L
from ..format.dledger_layout import (DLEDGER_BLANK_MAGIC, DLEDGER_BODY_OFFSET, DLEDGER_HEADER_SIZE,
                                     DLEDGER_INDEX_UNIT_SIZE, DLEDGER_MAGIC, ENTRY_HEADER_DTYPE,
                                     ENTRY_HEADER_SIZE, ENTRY_HEADER_STRUCT, INDEX_UNIT_DTYPE,
                                     INDEX_UNIT_STRUCT, EntryHeader, I32_STRUCT as _I32,
                                     entry_pos, record_offset)
from ..format.message import Message
from ..format.record import decode_record
from .dledger_files import (LEDGER_DIR, CurrTerm, LedgerCheckpoint, LedgerFiles, find_ledger_dirs,
                            list_files, read_checkpoint, read_currterm)
from .segments import Segment, SegmentQueue

__all__ = ["DLedgerLog", "DLedgerCommitLog", "ChainEnd", "EntryRun", "open_ledger", "find_ledger_dirs", "list_files",
           "read_checkpoint", "read_currterm", "LedgerCheckpoint", "CurrTerm", "LedgerFiles",
           "entry_pos", "record_offset", "CLEAN_ENDS"]

#: Why the entry chain ends (ChainEnd.reason), in DLedgerMmapFileStore#recover's order.
END_NO_FILES = "no-data-files"
END_SIZE_ZERO = "size-zero"  # an entry size of 0: the normal end of written data
END_LAST_BLANK = "blank-in-last-file"  # the last file ends in a blank: end = that file's end
END_SHORT = "short"  # too few bytes left in the file for the next header
END_BAD_POS = "bad-pos"
END_BAD_BODY_SIZE = "bad-body-size"
END_PAST_FILE = "past-file-end"
END_BAD_MAGIC = "bad-magic"
END_BAD_INDEX = "bad-index"
END_BAD_TERM = "bad-term"
END_TOO_SMALL = "too-small"
#: Ends that are not damage (the chain stopped where the writer stopped).
CLEAN_ENDS = frozenset({END_NO_FILES, END_SIZE_ZERO, END_LAST_BLANK})

#: Index units gathered per vectorised step: the first try, and the most (32 MiB of units).
_FIRST_WINDOW = 1 << 12
_WINDOW = 1 << 20


@dataclass
class EntryRun:
    """The valid entries of one data file, in order, as numpy columns.

    ``record_pos`` are record start positions in ``u8`` (the file's bytes), so the
    columnar record decoders run on them unchanged: ``scan.columns(run.u8,
    run.record_pos, run.start)`` gives offsets equal to PHYSICALOFFSET."""

    path: Path
    start: int  # the file's start offset (its name)
    u8: np.ndarray  # the file's bytes (read-only map)
    entry_pos: np.ndarray  # int64 positions of the entry headers in the file
    size: np.ndarray  # int64 entry sizes (header included)
    index: np.ndarray  # int64 entry indexes
    term: np.ndarray  # int64 entry terms
    blank: tuple[int, int] | None = None  # (offset, size field) of the file's DLedger blank

    def __len__(self) -> int:
        return len(self.entry_pos)

    @property
    def record_pos(self) -> np.ndarray:
        return self.entry_pos + DLEDGER_BODY_OFFSET

    @property
    def record_offset(self) -> np.ndarray:
        """CommitLog offsets of the records (what the ConsumeQueue and IndexFiles hold)."""
        return self.entry_pos + (self.start + DLEDGER_BODY_OFFSET)

    @property
    def record_size(self) -> np.ndarray:
        """Record sizes (ConsumeQueue unit size, TOTALSIZE)."""
        return self.size - DLEDGER_BODY_OFFSET

    def record_ok(self, magics: tuple[int, ...] = L.MESSAGE_MAGICS) -> np.ndarray:
        """Per entry: does the record inside frame like a RocketMQ record placed here
        (TOTALSIZE == body size, a message magic, PHYSICALOFFSET == pos + 48)? DLedger
        never looks inside (no CRC); RocketMQ's reput does (design-14 §1.6)."""
        p = self.record_pos
        total = _gather_int(self.u8, p, 4)
        magic = _gather_int(self.u8, p + 4, 4)
        phys = _gather_int(self.u8, p + L.OFFSET_OF["physical_offset"], 8)
        fits = p + L.OFFSET_OF["physical_offset"] + 8 <= len(self.u8)
        return fits & (total == self.record_size) & np.isin(magic, magics) & (phys == self.record_offset)


@dataclass
class ChainEnd:
    """What DLedger's recovery concludes about a data folder (design-14 §1.5).

    ``offset`` is its ``processOffset``: data is cut there (later files deleted, bytes after
    it in its file left in place). ``reason`` is one of the ``END_*`` codes; ``detail`` says
    it with the values read. ``damage`` lists breaks in files *before* ``recovery_start``,
    which DLedger does not walk: readers skip the rest of such a file, as RocketMQ's reput
    does. ``committed_pos`` is where RocketMQ serves and dispatches up to after a restart
    (``getMaxOffset``) until the node is leader again."""

    offset: int
    reason: str
    detail: str
    path: Path | None  # the data file holding the end (None: no data files)
    position: int  # the end's position in that file
    recovery_start: int  # start offset of the file DLedger's walk began in
    entries: int  # entries read from the first file to the end (damage skipped)
    begin_index: int  # ledgerBeginIndex: first file's first entry (-1: none)
    end_index: int  # ledgerEndIndex: the last entry kept (-1: none)
    end_term: int
    last_entry_end: int  # end of that entry (== offset unless a blank follows it)
    tail_clean: bool  # only zeros after ``offset`` in its file (after a final blank: a
    # blank whose size is the rest of the file, then zeros)
    files_after_end: list[Path]  # data files starting after ``offset``: DLedger deletes them
    index_rewrite_from: int | None  # first entry (from recovery_start) whose index unit is
    # missing or differs: DLedger truncates the index there and rewrites it from the data
    checkpoint_index: int | None  # committedIndex as dledger-*/checkpoint holds it
    committed_index: int  # after DLedger's clamping (-1: none)
    committed_pos: int  # end of that entry (-1: none)
    max_offset: int  # RocketMQ's DLedgerCommitLog#getMaxOffset after the restart
    refuses_start: list[str] = field(default_factory=list)  # why DLedger would not start
    damage: list[RecordError] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """The chain ends where the writer stopped: no damage, nothing after it."""
        return self.reason in CLEAN_ENDS and self.tail_clean and not self.damage

    def error(self) -> RecordError | None:
        """The end as a typed error naming file and offset, or None for a clean end."""
        if self.reason in CLEAN_ENDS:
            return None
        return RecordError(f"DLedger entry chain ends ({self.reason}): {self.detail}",
                           self.path, self.offset)


class _Ended(Exception):
    """Internal: one frame ends the walk of a file (reason, detail)."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail


def _gather_int(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed ints of ``width`` bytes at each of ``pos`` (int64); positions
    past the end read as 0 (callers check that what they accept fits)."""
    if len(pos) == 0:
        return np.zeros(0, dtype=np.int64)
    n = len(u8) - width + 1
    if n <= 0:
        return np.zeros(len(pos), dtype=np.int64)
    view = np.ndarray(shape=(n,), dtype=f">i{width}", buffer=u8, offset=0, strides=(1,))
    ok = (pos >= 0) & (pos < n)
    return np.where(ok, view[np.clip(pos, 0, n - 1)].astype(np.int64), 0)


def _headers_at(u8: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The entry headers at ``pos`` (all with ``pos + 48 <= len(u8)``) as one copy."""
    top = len(u8) - ENTRY_HEADER_SIZE
    raw = np.ndarray(shape=(top + 1,), dtype=f"V{ENTRY_HEADER_SIZE}", buffer=u8, offset=0,
                     strides=(1,))
    return raw[pos].view(ENTRY_HEADER_DTYPE)


def _columns(rows: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    """(pos, size, index, term) columns of entries walked one by one."""
    a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].copy()


def _first_false(mask: np.ndarray) -> int:
    return len(mask) if mask.all() else int(np.argmin(mask))


def _java_int(v: int) -> int:
    """``v`` as a Java int after overflow (``bodySize + BODY_OFFSET`` is int arithmetic)."""
    return (v + 2**31) % 2**32 - 2**31


class _IndexStream:
    """Units of the DLedger index, read the way ``MmapFileList#getData`` finds them."""

    def __init__(self, queue: SegmentQueue):
        self.queue = queue
        self.segs = queue.segments

    def _locate(self, offset: int) -> tuple[Segment, int] | None:
        if offset < 0 or not self.segs:
            return None
        try:
            return self.queue.find(offset)
        except (OffsetError, SegmentError):
            return None

    def unit(self, i: int) -> tuple[int, int, int, int, int] | None:
        """(magic, pos, size, index, term) of unit ``i``, or None (no file, short file)."""
        got = self._locate(i * DLEDGER_INDEX_UNIT_SIZE)
        if got is None:
            return None
        seg, p = got
        if p + DLEDGER_INDEX_UNIT_SIZE > seg.readable_size:
            return None
        return INDEX_UNIT_STRUCT.unpack_from(seg.buffer(), p)

    def units(self, i: int, n: int) -> np.ndarray:
        """Up to ``n`` units from unit ``i`` on, across files, stopping at a missing one."""
        parts, off, want = [], i * DLEDGER_INDEX_UNIT_SIZE, n
        while want > 0:
            got = self._locate(off)
            if got is None:
                break
            seg, p = got
            have = min(want, (seg.readable_size - p) // DLEDGER_INDEX_UNIT_SIZE)
            if have <= 0:
                break
            parts.append(np.frombuffer(seg.buffer(), dtype=INDEX_UNIT_DTYPE, count=have, offset=p))
            want -= have
            off += have * DLEDGER_INDEX_UNIT_SIZE
        if not parts:
            return np.zeros(0, dtype=INDEX_UNIT_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class _Chain:
    """State of one walk: the last entry kept and what has been seen."""

    def __init__(self):
        self.last_index = -1
        self.last_term = -1
        self.last_entry_end = -1
        self.entries = 0
        self.index_rewrite_from: int | None = None
        self.target_end: int | None = None  # end of the entry the checkpoint names
        self.damage: list[RecordError] = []


class DLedgerLog:
    """One DLedger data folder opened read-only: its files, its entry chain, its records.

    ``ledger_dir`` is a ``dledger-<selfId>`` folder (:func:`open_ledger` finds it from a
    store root). Use as a context manager; maps close on exit."""

    def __init__(self, ledger_dir: str | Path, *, data_dirs: Iterable[str | Path] | None = None,
                 data_file_size: int | None = None, index_file_size: int | None = None):
        self.ledger_dir = Path(ledger_dir)
        self.files = list_files(self.ledger_dir, data_dirs=data_dirs,
                                data_file_size=data_file_size, index_file_size=index_file_size)
        self.checkpoint = read_checkpoint(self.ledger_dir)
        self.currterm = read_currterm(self.ledger_dir)
        self._index = _IndexStream(self.files.index)
        self._end: ChainEnd | None = None

    def __enter__(self) -> "DLedgerLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.files.close()

    @property
    def data_files(self) -> list[Segment]:
        return self.files.data.segments

    @property
    def file_size(self) -> int:
        return self.files.data_file_size

    @property
    def min_offset(self) -> int:
        """First data file's start (``MmapFileList#getMinOffset``); 0 with no files."""
        return self.data_files[0].start if self.data_files else 0

    # --- offsets <-> (file, position) (design-14 §1.4) ----------------------------------

    def locate(self, offset: int) -> tuple[Segment, int]:
        """(data file, position) of a CommitLog offset: file ``offset - offset % size``,
        position ``offset % size`` (``DLedgerCommitLog#getData``). :class:`OffsetError`
        when no data file holds it."""
        try:
            offset = operator.index(offset)  # ints and numpy integers, nothing else
        except TypeError:
            offset = -1
        if offset < 0:
            raise OffsetError("not a CommitLog offset", self.ledger_dir, None)
        return self.files.data.find(offset)

    def offset_of(self, segment: Segment | str | Path, position: int) -> int:
        """The CommitLog offset of ``position`` in a data file (a :class:`Segment` or the
        file's path): its start offset plus the position."""
        if isinstance(segment, Segment):
            seg = segment
        else:
            name = Path(segment).name
            seg = next((s for s in self.data_files if s.path.name == name), None)
            if seg is None:
                raise OffsetError(f"{name} is not a data file of this DLedger log",
                                  self.ledger_dir, None)
        if not 0 <= position < seg.segment_size:
            raise OffsetError(f"position {position} is outside the {seg.segment_size}-byte file",
                              seg.path, None)
        return seg.start + position

    # --- single entries and records -----------------------------------------------------

    def _buffer(self, seg: Segment):
        return seg.buffer()

    def _limit(self, seg: Segment) -> int:
        return seg.readable_size

    def header_at(self, pos: int) -> EntryHeader:
        """The entry header at absolute offset ``pos``, checked as an entry DLedger keeps
        (magic 1, pos field == ``pos``, body size + 48 == size > 44, fits its file).
        :class:`RecordError` naming file and offset when it is not one."""
        seg, p = self.locate(pos)
        limit = self._limit(seg)
        if p + ENTRY_HEADER_SIZE > limit:
            raise RecordError(f"only {limit - p} bytes left in the file, too few for a "
                              "DLedger entry header", seg.path, pos)
        h = EntryHeader(*ENTRY_HEADER_STRUCT.unpack_from(self._buffer(seg), p))
        why = None
        if h.magic == DLEDGER_BLANK_MAGIC:
            why = "a DLedger blank (end of file filler), not an entry"
        elif h.magic != DLEDGER_MAGIC:
            why = f"bad DLedger entry magic {h.magic}"
        elif h.pos != pos:
            why = f"entry says its pos is {h.pos}"
        elif _java_int(h.body_size + DLEDGER_BODY_OFFSET) != h.size:
            why = f"entry size {h.size} != body size {h.body_size} + {DLEDGER_BODY_OFFSET}"
        elif h.size <= DLEDGER_HEADER_SIZE:
            why = f"entry size {h.size} is too small"
        elif p + h.size > limit:
            why = f"entry of {h.size} bytes runs past the end of its file"
        if why:
            raise RecordError(why, seg.path, pos)
        return h

    def record_at(self, offset: int) -> memoryview:
        """The record bytes at CommitLog offset ``offset`` (inside a valid entry, before
        the chain's end). :class:`OffsetError`/:class:`RecordError` naming file and offset."""
        end = self.walk()
        if offset < self.min_offset + DLEDGER_BODY_OFFSET or offset >= end.offset:
            raise OffsetError(f"offset {offset} is outside the DLedger log's records "
                              f"[{self.min_offset + DLEDGER_BODY_OFFSET}, {end.offset})",
                              self.ledger_dir, offset)
        seg, p = self.locate(offset)
        if p < DLEDGER_BODY_OFFSET:
            raise RecordError(f"offset {offset} is in the first {DLEDGER_BODY_OFFSET} bytes of "
                              "a data file: no record starts there", seg.path, offset)
        try:
            h = self.header_at(offset - DLEDGER_BODY_OFFSET)
        except RecordError as e:
            raise RecordError(f"no record starts at offset {offset}: the {DLEDGER_BODY_OFFSET} "
                              f"bytes before it are not a DLedger entry header ({e.message})",
                              seg.path, offset) from None
        return memoryview(self._buffer(seg))[p:p + h.body_size]

    def message_at(self, offset: int, *, check_crc: bool = False) -> Message:
        """The record at CommitLog offset ``offset``, decoded (spec §3.9 rules)."""
        rec = self.record_at(offset)
        seg, p = self.locate(offset)
        return decode_record(self._buffer(seg), p, limit=p + len(rec), path=seg.path,
                             base=seg.start, check_crc=check_crc)

    def index_unit(self, i: int) -> tuple[int, int, int, int, int] | None:
        """(magic, pos, size, index, term) of index unit ``i``, or None when absent."""
        return self._index.unit(i)

    # --- the walk -----------------------------------------------------------------------

    def _precheck(self, seg: Segment) -> bool:
        """The first entry of a file as the recovery's start search checks it: magic
        neither -1 nor < 1 (Java's upper bound there is a tautology), size > 44, pos ==
        file start, body size + 48 == size, and its index unit equal."""
        if self._limit(seg) < ENTRY_HEADER_SIZE:
            return False
        h = EntryHeader(*ENTRY_HEADER_STRUCT.unpack_from(self._buffer(seg), 0))
        if h.magic == DLEDGER_BLANK_MAGIC or h.magic < DLEDGER_MAGIC:
            return False
        if h.size <= DLEDGER_HEADER_SIZE or h.pos != seg.start:
            return False
        if _java_int(h.body_size + DLEDGER_BODY_OFFSET) != h.size:
            return False
        u = self._index.unit(h.index)
        return u is not None and u == (h.magic, seg.start, h.size, h.index, h.term)

    def _recovery_start(self) -> int:
        """Index of the data file DLedger's walk starts in: ``max(0, n - 3)``, walking back
        while that file's first entry fails :meth:`_precheck`; file 0 if none passes."""
        segs = self.data_files
        for i in range(max(0, len(segs) - 3), -1, -1):
            if self._precheck(segs[i]):
                return i
        return 0

    def _step(self, seg: Segment, buf, limit: int, p: int, chain: _Chain, compare: bool):
        """One frame of the recovery loop at position ``p``: (magic, size, index, term) of
        the entry there, or None for a blank; raises :class:`_Ended`. Checks in DLedger's
        order, so the reason is the one its log would give."""
        left = limit - p
        where = seg.start + p
        if left < 4:
            raise _Ended(END_SHORT, f"{left} bytes left at the end of {seg.path.name}")
        if left < ENTRY_HEADER_SIZE:
            magic = _I32.unpack_from(buf, p)[0]
            if magic == DLEDGER_BLANK_MAGIC:
                return None
            if left >= 8 and _I32.unpack_from(buf, p + 4)[0] == 0:
                raise _Ended(END_SIZE_ZERO, f"entry size 0 at {where}")
            raise _Ended(END_SHORT, f"{left} bytes left at the end of {seg.path.name}, "
                                    "too few for an entry header")
        magic, size, index, term, pos, _, _, _, body_size = ENTRY_HEADER_STRUCT.unpack_from(buf, p)
        if magic == DLEDGER_BLANK_MAGIC:
            return None
        if size == 0:
            raise _Ended(END_SIZE_ZERO, f"entry size 0 at {where}")
        if pos != where:
            raise _Ended(END_BAD_POS, f"entry at {where} says its pos is {pos}")
        if _java_int(body_size + DLEDGER_BODY_OFFSET) != size:
            raise _Ended(END_BAD_BODY_SIZE, f"entry at {where}: size {size} != body size "
                                            f"{body_size} + {DLEDGER_BODY_OFFSET}")
        if not 0 <= _java_int(p + size) <= limit:
            raise _Ended(END_PAST_FILE, f"entry at {where} of {size} bytes runs past the "
                                        f"end of {seg.path.name}")
        if magic != DLEDGER_MAGIC:
            raise _Ended(END_BAD_MAGIC, f"entry at {where} has magic {magic}, not {DLEDGER_MAGIC}")
        if chain.last_index != -1 and index != chain.last_index + 1:
            raise _Ended(END_BAD_INDEX, f"entry at {where} has index {index}, "
                                        f"expected {chain.last_index + 1}")
        if term < chain.last_term:
            raise _Ended(END_BAD_TERM, f"entry at {where} has term {term} < the previous "
                                       f"entry's {chain.last_term}")
        if size <= DLEDGER_HEADER_SIZE:
            raise _Ended(END_TOO_SMALL, f"entry at {where} has size {size} <= {DLEDGER_HEADER_SIZE}")
        if compare and chain.index_rewrite_from is None:  # DLedger stops comparing there
            u = self._index.unit(index)
            if u is None or u != (magic, where, size, index, term):
                chain.index_rewrite_from = index
        return magic, size, index, term

    def _vector(self, seg: Segment, u8: np.ndarray, limit: int, p: int, chain: _Chain,
                compare: bool, window: int) -> tuple[np.ndarray, ...] | None:
        """Entries from ``p`` found through the index units and proved by the data alone
        (contiguous, every check of :meth:`_step`): the same entries the frame-by-frame
        walk accepts, at numpy speed. None when the index does not lead anywhere here."""
        e = chain.last_index + 1
        units = self._index.units(e, min(window, (limit - p) // (DLEDGER_HEADER_SIZE + 1) + 1))
        if len(units) == 0:
            return None
        upos = units["pos"].astype(np.int64) - seg.start
        n = _first_false((upos >= p) & (upos + ENTRY_HEADER_SIZE <= limit))
        if n == 0 or upos[0] != p:
            return None
        upos, units = upos[:n], units[:n]
        h = _headers_at(u8, upos)
        size = h["size"].astype(np.int64)
        index = h["index"].astype(np.int64)
        term = h["term"].astype(np.int64)
        nxt = upos + size
        ok = ((h["magic"] == DLEDGER_MAGIC) & (size > DLEDGER_HEADER_SIZE)
              & (h["pos"].astype(np.int64) == upos + seg.start)
              & (h["body_size"].astype(np.int64) + DLEDGER_BODY_OFFSET == size)
              & (nxt <= limit) & (index == e + np.arange(n))
              & (term >= np.concatenate(([chain.last_term], term[:-1]))))
        ok[1:] &= upos[1:] == nxt[:-1]
        k = _first_false(ok)
        if k == 0:
            return None
        if compare and chain.index_rewrite_from is None:
            same = ((units["magic"][:k] == h["magic"][:k]) & (units["size"][:k] == h["size"][:k])
                    & (units["index"][:k] == h["index"][:k]) & (units["term"][:k] == h["term"][:k]))
            if not same.all():
                chain.index_rewrite_from = int(index[_first_false(same)])
        return upos[:k], size[:k], index[:k], term[:k]

    def _runs(self, target: int | None) -> Iterator[EntryRun]:
        """Walk every data file: files before the recovery start are read with the same
        entry checks (a break there is damage, the rest of that file skipped); from the
        recovery start on, DLedger's walk decides the end. Sets ``self._end``."""
        segs = self.data_files
        chain = _Chain()
        if not segs:
            self._end = self._conclude(None, 0, END_NO_FILES, "no DLedger data files", 0, chain, None)
            return
        start = self._recovery_start()
        k = 0
        while k < len(segs):
            seg = segs[k]
            if k == start:  # DLedger's walk begins afresh here (lastEntryIndex = -1)
                if chain.last_index != -1:
                    h = self._peek_index(seg)
                    if h is not None and h != chain.last_index + 1:
                        chain.damage.append(RecordError(
                            f"first entry of the recovery start file has index {h}, the "
                            f"previous file ended at {chain.last_index}", seg.path, seg.start))
                chain.last_index, chain.last_term = -1, -1
            trusted = k < start
            buf, limit = self._buffer(seg), self._limit(seg)
            u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
            cols: list[tuple[np.ndarray, ...]] = []
            p, blank, ended = 0, None, None
            mine = None if trusted else target  # DLedger reads pos + size of those from the index
            # Ask the index for entries in windows that grow while it leads true, and back
            # off (frames walked one by one) while it does not: a stale index costs little.
            patience, backoff, window = 1, 64, _FIRST_WINDOW
            pend: list[tuple[int, int, int, int]] = []  # entries walked frame by frame
            while True:
                if chain.last_index != -1 and patience <= 0:
                    if pend:
                        cols.append(_columns(pend))
                        pend = []
                    got = self._vector(seg, u8, limit, p, chain, not trusted, window)
                    if got is not None:
                        cols.append(got)
                        self._accepted(chain, seg.start, got, mine)
                        p = int(got[0][-1] + got[1][-1])
                        if len(got[0]) == window:
                            window = min(window * 2, _WINDOW)
                        patience, backoff = 0, 64
                        continue
                    patience, backoff, window = backoff, min(backoff * 2, 1 << 16), _FIRST_WINDOW
                try:
                    h = self._step(seg, buf, limit, p, chain, not trusted)
                except _Ended as e:
                    ended = e
                    break
                if h is None:
                    size_field = _I32.unpack_from(buf, p + 4)[0] if limit - p >= 8 else None
                    blank = (seg.start + p, size_field)
                    break
                _, size, index, term = h
                pend.append((p, size, index, term))
                if index == mine:
                    chain.target_end = seg.start + p + size
                chain.last_index, chain.last_term = index, term
                chain.last_entry_end = seg.start + p + size
                chain.entries += 1
                p += size
                patience -= 1
            if pend:
                cols.append(_columns(pend))
            yield self._run(seg, u8, cols, blank)
            if ended is not None and trusted:
                chain.damage.append(RecordError(
                    f"DLedger entry chain breaks ({ended.reason}): {ended.detail}; the rest of "
                    "the file is skipped (DLedger does not walk this file on restart; RocketMQ's "
                    "reput skips the rest of it)", seg.path, seg.start + p))
                chain.last_index, chain.last_term = -1, -1
                k += 1
                continue
            if ended is not None:
                self._end = self._conclude(seg, seg.start + p, ended.reason, ended.detail, start,
                                           chain, target)
                return
            if k == len(segs) - 1:  # a blank in the last file: DLedger ends at the file end
                end = seg.start + self.file_size
                self._end = self._conclude(seg, end, END_LAST_BLANK, f"the last data file "
                                           f"{seg.path.name} ends in a blank at {blank[0]}",
                                           start, chain, target, blank=p)
                return
            k += 1

    def _peek_index(self, seg: Segment) -> int | None:
        if self._limit(seg) < ENTRY_HEADER_SIZE:
            return None
        return EntryHeader(*ENTRY_HEADER_STRUCT.unpack_from(self._buffer(seg), 0)).index

    @staticmethod
    def _accepted(chain: _Chain, base: int, cols: tuple[np.ndarray, ...], target: int | None) -> None:
        pos, size, index, term = cols
        if target is not None and index[0] <= target <= index[-1]:
            i = int(target - index[0])
            chain.target_end = base + int(pos[i] + size[i])
        chain.last_index, chain.last_term = int(index[-1]), int(term[-1])
        chain.last_entry_end = base + int(pos[-1] + size[-1])
        chain.entries += len(pos)

    @staticmethod
    def _run(seg: Segment, u8: np.ndarray, cols, blank) -> EntryRun:
        if cols:
            pos, size, index, term = (np.concatenate([c[j] for c in cols]) for j in range(4))
        else:
            pos = size = index = term = np.zeros(0, np.int64)
        return EntryRun(seg.path, seg.start, u8, pos, size, index, term, blank)

    def _conclude(self, seg: Segment | None, end: int, reason: str, detail: str, start: int,
                  chain: _Chain, target: int | None, blank: int | None = None) -> ChainEnd:
        segs = self.data_files
        refuses = [f"{p.path}: {p.detail}" for p in self.files.refusing_problems]
        tail_clean, position = True, 0
        if seg is not None:
            position = end - seg.start
            limit = self._limit(seg)
            u8 = np.frombuffer(self._buffer(seg), dtype=np.uint8, count=limit) if limit else None
            if blank is not None:  # a true filler: its size is the rest of the file, zeros after
                size_ok = limit - blank >= 8 and _I32.unpack_from(u8, blank + 4)[0] == limit - blank
                tail_clean = size_ok and not u8[blank + 8:].any()
            elif position < limit:
                tail_clean = not u8[position:].any()
            last = segs[-1]
            if last.start - end > self.file_size:  # DLedgerMmapFileStore#recover: System.exit
                refuses.append(f"the entry chain ends at {end}, more than a file before the last "
                               f"data file {last.path.name}: DLedger refuses to start")
        begin = self._peek_index(segs[0]) if segs and chain.last_index != -1 else None
        begin_index = -1 if begin is None else begin
        end_index = chain.last_index
        ck = self.checkpoint.committed_index
        committed_index, committed_pos = -1, -1
        # DLedgerMmapFileStore#updateCommittedIndex, called with the checkpoint's value.
        if ck is not None and ck != -1 and end_index != -1 and ck >= -1 and ck >= begin_index:
            committed_index = min(ck, end_index)
            if committed_index == end_index:
                committed_pos = chain.last_entry_end
            elif target == committed_index and chain.target_end is not None:
                committed_pos = chain.target_end
            else:  # before the recovery walk: DLedger takes pos + size from the index unit
                u = self._index.unit(committed_index)
                if u is None:
                    refuses.append(f"no index unit for committedIndex {committed_index}: "
                                   "DLedger's recovery fails")
                    committed_index = -1
                else:
                    committed_pos = u[1] + u[2]
        first = segs[0].start if segs else 0
        max_offset = committed_pos if committed_pos > 0 else (first if first > 0 else 0)
        return ChainEnd(
            offset=end, reason=reason, detail=detail,
            path=seg.path if seg is not None else None, position=position,
            recovery_start=segs[start].start if segs else 0, entries=chain.entries,
            begin_index=begin_index, end_index=end_index,
            end_term=chain.last_term if end_index != -1 else -1,
            last_entry_end=chain.last_entry_end if end_index != -1 else first,
            tail_clean=tail_clean, files_after_end=[s.path for s in segs if s.start > end],
            index_rewrite_from=chain.index_rewrite_from,
            checkpoint_index=ck, committed_index=committed_index, committed_pos=committed_pos,
            max_offset=max_offset, refuses_start=refuses, damage=chain.damage)

    def _target(self) -> int | None:
        ck = self.checkpoint.committed_index
        return ck if ck is not None and ck >= 0 else None

    def walk(self) -> ChainEnd:
        """Where valid data ends and why, as DLedger's recovery decides (cached)."""
        if self._end is None:
            for _ in self._runs(self._target()):
                pass
        return self._end

    def runs(self) -> Iterator[EntryRun]:
        """The valid entries, one :class:`EntryRun` per data file, in order, up to the end
        :meth:`walk` reports (files after it are not read; damaged spans are skipped)."""
        for run in self._runs(self._target()):
            yield run

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """(CommitLog offset, record bytes) of every valid entry, in order."""
        for run in self.runs():
            mv = memoryview(run.u8)
            for off, p, n in zip(run.record_offset.tolist(), run.record_pos.tolist(),
                                 run.record_size.tolist()):
                yield off, mv[p:p + n]


def open_ledger(path: str | Path, **kw) -> DLedgerLog:
    """A :class:`DLedgerLog` for a ``dledger-<selfId>`` folder or a store root holding
    exactly one. :class:`NotAStoreError` when there is none; :class:`ConfigError` when
    there are several (the broker's ``dLegerSelfId`` chooses: pass its folder)."""
    p = Path(path)
    if LEDGER_DIR.match(p.name) and p.is_dir():
        return DLedgerLog(p, **kw)
    found = find_ledger_dirs(p)
    if not found:
        raise NotAStoreError("no dledger-<selfId> folder with data/ or index/ here", p)
    if len(found) > 1:
        raise ConfigError("several DLedger folders (" + ", ".join(d.name for d in found)
                          + "): name the one of the broker's dLegerSelfId", p)
    return DLedgerLog(found[0], **kw)


class DLedgerCommitLog:
    """What readers need of a CommitLog, over a DLedger log (read-only): its data files
    as ``segments``, ``read_at`` by record offset (= entry pos + 48, the offsets the
    ConsumeQueue, the IndexFiles and offsetMsgIds hold), and :meth:`end`. ``framing``
    tells the bulk readers to walk entries (:meth:`DLedgerLog.runs`), not record chains."""

    framing = "dledger"

    def __init__(self, log: DLedgerLog):
        self.log = log

    @property
    def segments(self) -> list[Segment]:
        return self.log.data_files

    @property
    def queue(self) -> SegmentQueue:
        return self.log.files.data

    @property
    def min_offset(self) -> int:
        """``DLedgerCommitLog#getMinOffset``: the first data file's start."""
        return self.log.min_offset

    def end(self) -> ChainEnd:
        return self.log.walk()

    def read_at(self, offset: int, *, check_crc: bool = False) -> Message:
        """The message whose record starts at CommitLog ``offset`` (an entry's pos + 48),
        before the end of the entry chain; typed errors name file and offset."""
        return self.log.message_at(offset, check_crc=check_crc)

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> "DLedgerCommitLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
