"""DLedger CommitLogs: the entry chain as DLedger's own recovery walks it, the records in
it, and CommitLog offsets <-> data-file positions (issue #14).

With ``enableDLegerCommitLog=true`` the CommitLog lives in ``dledger-<selfId>/data/`` as
DLedger entries: a 48-byte header, then one complete CommitLog record (spec §3.1) whose
PHYSICALOFFSET is the entry's ``pos + 48``. That record offset is what the ConsumeQueue,
the IndexFiles, offsetMsgIds and put results hold, so everything that works on record
start positions works here unchanged; only the framing differs (design-14 §1, D1). The
layout is in :mod:`rmqstore.format.dledger_layout`, the files in :mod:`rmqstore.files.dledger_files`,
the chain's vocabulary (ends, runs, index units) in :mod:`rmqstore.files.dledger_chain` and
the recovery walk in :mod:`rmqstore.files.dledger_walk`.

Where valid data ends is decided as ``DLedgerMmapFileStore#recover`` (DLedger 0.3.1.2)
decides it (design-14 §1.5, D2): :meth:`DLedgerLog.walk`. Nothing here writes: files are
opened read-only and mapped ``ACCESS_READ`` (:class:`~rmqstore.files.segments.SegmentQueue`).

:class:`DLedgerCommitLog` is the CommitLog-shaped face :class:`rmqstore.reader.StoreReader`
reads a DLedger store through (``dump``, ``get``, ``query-key``, ``stats``); see docs/dledger.md.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import ConfigError, NotAStoreError, OffsetError, RecordError
from ..format.dledger_layout import (DLEDGER_BLANK_MAGIC, DLEDGER_BODY_OFFSET, DLEDGER_HEADER_SIZE,
                                     DLEDGER_MAGIC, ENTRY_HEADER_SIZE, ENTRY_HEADER_STRUCT,
                                     EntryHeader, entry_pos, java_int, record_offset)
from ..format.message import Message
from ..format.record import decode_record
from .dledger_chain import (CLEAN_ENDS, END_BAD_BODY_SIZE, END_BAD_INDEX, END_BAD_MAGIC,
                            END_BAD_POS, END_BAD_TERM, END_LAST_BLANK, END_NO_FILES,
                            END_PAST_FILE, END_SHORT, END_SIZE_ZERO, END_TOO_SMALL, ChainEnd,
                            EntryRun, IndexStream)
from .dledger_files import (LEDGER_DIR, CurrTerm, LedgerCheckpoint, LedgerFiles, find_ledger_dirs,
                            list_files, read_checkpoint, read_currterm)
from .dledger_walk import ChainWalk
from .segments import Segment, SegmentQueue

__all__ = ["DLedgerLog", "DLedgerCommitLog", "ChainEnd", "EntryRun", "open_ledger", "find_ledger_dirs", "list_files",
           "read_checkpoint", "read_currterm", "LedgerCheckpoint", "CurrTerm", "LedgerFiles",
           "entry_pos", "record_offset", "CLEAN_ENDS", "ledger_for", "END_NO_FILES", "END_SIZE_ZERO",
           "END_LAST_BLANK", "END_SHORT", "END_BAD_POS", "END_BAD_BODY_SIZE", "END_PAST_FILE",
           "END_BAD_MAGIC", "END_BAD_INDEX", "END_BAD_TERM", "END_TOO_SMALL"]


class DLedgerLog(ChainWalk):
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
        self._index = IndexStream(self.files.index)
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
        elif java_int(h.body_size + DLEDGER_BODY_OFFSET) != h.size:
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

    def index_units(self, i: int, n: int):
        """Up to ``n`` index units from unit ``i`` on (numpy, fields of
        :data:`~rmqstore.format.dledger_layout.DLedgerIndexUnit`), stopping at a missing one."""
        return self._index.units(i, n)

    # --- the walk -----------------------------------------------------------------------

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


def ledger_for(config) -> DLedgerLog | None:
    """The DLedger log of the store ``config`` describes, or None for a plain CommitLog
    (design-14 §1; the files decide). A broker.conf that says DLedger where the files do
    not is a :class:`ConfigError`; a store with both commitlog/ segments and a DLedger log
    (design-14 §1.9) is not supported yet."""
    from ..errors import UnsupportedStoreError
    from .config import SEGMENT_NAME
    from .listing import entries

    ledgers = find_ledger_dirs(config.root)
    said = next((d for d in config.features if d.feature.key == "dledger"), None)
    if not ledgers:
        if said is not None:
            raise ConfigError(f"{said.evidence} says the CommitLog is a DLedger CommitLog, but the "
                              "store has no dledger-<selfId>/ folder; the files are the truth: "
                              "drop the setting or give the DLedger store's root", config.root)
        return None
    if any(SEGMENT_NAME.match(e.name) for d in config.commit_log_dirs if d.is_dir()
           for e in entries(d)):
        raise UnsupportedStoreError(
            f"the store has both commitlog/ segments and a DLedger CommitLog ({ledgers[0].name}/): "
            "a broker switched to DLedger on an old store; reading both as one log is not "
            "supported yet; nothing was read", config.root)
    # The files decided mappedFileSizeCommitLog (load_config): the data files' size.
    return open_ledger(config.root, data_file_size=config.mapped_file_size_commit_log)


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
