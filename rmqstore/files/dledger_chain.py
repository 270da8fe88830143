"""The vocabulary of a DLedger entry chain (design-14 §1.5): why a walk ends
(``END_*``), what it concludes (:class:`ChainEnd`), the entries it keeps per data file
(:class:`EntryRun`), and the index units read the way ``MmapFileList#getData`` finds them.

The walk that produces them is :mod:`rmqstore.files.dledger_walk`; the log that owns the
files is :mod:`rmqstore.files.dledger`. Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import OffsetError, RecordError, SegmentError
from ..format import layout as L
from ..format.layout import ints_at
from ..format.dledger_layout import (DLEDGER_BODY_OFFSET, DLEDGER_INDEX_UNIT_SIZE,
                                     INDEX_UNIT_DTYPE, INDEX_UNIT_STRUCT)
from .segments import Segment, SegmentQueue

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
        total = ints_at(self.u8, p, 4)
        magic = ints_at(self.u8, p + 4, 4)
        phys = ints_at(self.u8, p + L.OFFSET_OF["physical_offset"], 8)
        # A position past the end reads some in-range int (ints_at): ``fits`` masks it.
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


class IndexStream:
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
