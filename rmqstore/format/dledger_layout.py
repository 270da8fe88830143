"""The on-disk layout of a DLedger CommitLog (design-14 §1.1, §1.2), written down once as
``construct`` schemas with their derived struct/numpy forms, as :mod:`rmqstore.format.layout`
does for the plain store.

They sit in the format layer beside ``RecordHead``/``BlankRecord`` of
:mod:`rmqstore.format.layout`, in a module of their own: one file format, one module.
"""

from __future__ import annotations

from dataclasses import dataclass

from construct import Const, Int32sb, Int64sb, Struct

from . import layout as L

DLEDGER_MAGIC = 1  # DLedgerMmapFileStore.CURRENT_MAGIC (= MAGIC_1): the only magic recovery keeps
DLEDGER_BLANK_MAGIC = -1  # MmapFileList.BLANK_MAGIC_CODE: rest of the data file is filler
DLEDGER_HEADER_SIZE = 44  # DLedgerEntry.HEADER_SIZE: recovery requires size > this
DLEDGER_BODY_OFFSET = 48  # DLedgerEntry.BODY_OFFSET: the record starts here
DLEDGER_INDEX_UNIT_SIZE = 32  # DLedgerMmapFileStore.INDEX_UNIT_SIZE
DLEDGER_MIN_BLANK = 8  # MmapFileList.MIN_BLANK_LEN: an entry never ends closer to the file end
#: DLedgerConfig.mappedFileSizeForEntryIndex default (32 x 5 Mi); RocketMQ never sets it.
DEFAULT_INDEX_FILE_SIZE = DLEDGER_INDEX_UNIT_SIZE * 5 * 1024 * 1024

#: DLedgerEntryCoder#encode: the header before each record (big-endian, like the CommitLog).
DLedgerEntryHeader = Struct(
    "magic" / Int32sb,
    "size" / Int32sb,  # whole entry, header included
    "index" / Int64sb,  # +1 per entry
    "term" / Int64sb,  # Raft term, never decreasing
    "pos" / Int64sb,  # absolute offset of the entry itself
    "channel" / Int32sb,  # reserved (0)
    "chain_crc" / Int32sb,  # not computed by DLedger 0.3.1.2 (0)
    "body_crc" / Int32sb,  # not computed by DLedger 0.3.1.2 (0)
    "body_size" / Int32sb,  # the record's TOTALSIZE; body_size + 48 == size
)

#: MmapFileList#preAppend: magic -1, the bytes left in the file, then zeros to its end.
#: (The CommitLog BLANK is size-then-magic; this one is magic-then-size.)
DLedgerBlank = Struct("magic" / Const(DLEDGER_BLANK_MAGIC, Int32sb), "size" / Int32sb)

#: DLedgerEntryCoder#encodeIndex: unit ``i`` of the index stream sits at ``i * 32``.
DLedgerIndexUnit = Struct(
    "magic" / Int32sb,
    "pos" / Int64sb,
    "size" / Int32sb,
    "index" / Int64sb,
    "term" / Int64sb,
)

ENTRY_HEADER_STRUCT = L.derive_struct(DLedgerEntryHeader)
ENTRY_HEADER_DTYPE = L.derive_dtype(DLedgerEntryHeader)
ENTRY_HEADER_FIELDS = L.derive_fields(DLedgerEntryHeader)
ENTRY_HEADER_SIZE = DLedgerEntryHeader.sizeof()  # 48: header fields incl. body_size
DLEDGER_BLANK_STRUCT = L.derive_struct(DLedgerBlank)
INDEX_UNIT_STRUCT = L.derive_struct(DLedgerIndexUnit)
INDEX_UNIT_DTYPE = L.derive_dtype(DLedgerIndexUnit)
INDEX_UNIT_FIELDS = L.derive_fields(DLedgerIndexUnit)
#: One big-endian int (a field read alone: a magic, a size).
I32_STRUCT = L.derive_struct(Struct("v" / Int32sb))

assert ENTRY_HEADER_SIZE == DLEDGER_BODY_OFFSET
assert INDEX_UNIT_DTYPE.itemsize == DLEDGER_INDEX_UNIT_SIZE


@dataclass(frozen=True)
class EntryHeader:
    """One decoded entry header (the fields of :data:`DLedgerEntryHeader`)."""

    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_size: int

    @property
    def record_offset(self) -> int:
        """The CommitLog offset of the record inside (PHYSICALOFFSET, CQ, IndexFile)."""
        return self.pos + DLEDGER_BODY_OFFSET


def record_offset(entry_pos: int) -> int:
    """CommitLog offset of the record in the entry at ``entry_pos`` (design-14 §1.4)."""
    return entry_pos + DLEDGER_BODY_OFFSET


def entry_pos(record_offset: int) -> int:
    """Position of the entry holding the record at CommitLog offset ``record_offset``."""
    return record_offset - DLEDGER_BODY_OFFSET


def java_int(v: int) -> int:
    """``v`` as a Java int after overflow (``bodySize + BODY_OFFSET`` is int arithmetic)."""
    return (v + 2**31) % 2**32 - 2**31
