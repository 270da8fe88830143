"""Every on-disk layout of a RocketMQ store, written down once as ``construct`` schemas.

This module is the only place a field width or byte offset is stated. The fast forms
used by bulk code (``struct.Struct`` formats and numpy structured dtypes) are *derived*
from these schemas by :func:`derive_struct` and :func:`derive_dtype`; tests prove both
forms read and write the same bytes. All integers are big-endian and signed (spec §0).
"""

from __future__ import annotations

import struct

import numpy as np
from construct import (
    Bytes,
    Const,
    Construct,
    FormatField,
    IfThenElse,
    Int8sb,
    Int16sb,
    Int32sb,
    Int64sb,
    Padded,
    Pass,
    Rebuild,
    Renamed,
    Struct,
    len_,
    this,
)

# --- constants (spec §3.2, §3.3, §4, §6.1, §7.1, §8.1) ---------------------------------

MAGIC_V1 = -626843481  # 0xDAA320A7: 1-byte topic length
MAGIC_V2 = -626843477  # 0xDAA320AB: 2-byte topic length (5.1.0+)
MAGIC_BLANK = -875286124  # 0xCBD43194: end-of-segment filler
MESSAGE_MAGICS = (MAGIC_V1, MAGIC_V2)

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80
SYSFLAG_COMPRESSION_TYPE_MASK = 0x700

END_FILE_MIN_BLANK_LENGTH = 8
CQ_PLACEHOLDER_SIZE = 0x7FFFFFFF
CHECKPOINT_FILE_SIZE = 4096
INT32_MAX = 2**31 - 1

PROPERTY_NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# --- CommitLog record (spec §3.1) --------------------------------------------------------

HostV4 = Struct("address" / Bytes(4), "port" / Int32sb)
HostV6 = Struct("address" / Bytes(16), "port" / Int32sb)

#: Fields 1..9, identical for every record: the first 48 bytes.
RecordHead = Struct(
    "total_size" / Int32sb,
    "magic" / Int32sb,
    "body_crc" / Int32sb,
    "queue_id" / Int32sb,
    "flag" / Int32sb,
    "queue_offset" / Int64sb,
    "physical_offset" / Int64sb,
    "sys_flag" / Int32sb,
    "born_timestamp" / Int64sb,
)

_TAIL_FIXED = (
    "reconsume_times" / Int32sb,
    "prepared_transaction_offset" / Int64sb,
)


def _host(bit: int) -> Construct:
    return IfThenElse(this.sys_flag & bit, HostV6, HostV4)


def _record_size(ctx) -> int:
    return (
        RecordHead.sizeof()
        + (HostV6 if ctx.sys_flag & SYSFLAG_BORNHOST_V6 else HostV4).sizeof()
        + 8
        + (HostV6 if ctx.sys_flag & SYSFLAG_STOREHOST_V6 else HostV4).sizeof()
        + 4 + 8
        + 4 + len(ctx.body)
        + (2 if ctx.magic == MAGIC_V2 else 1) + len(ctx.topic)
        + 2 + len(ctx.properties)
    )


#: One whole message record. ``total_size`` and the length fields are rebuilt on build.
CommitLogRecord = Struct(
    "total_size" / Rebuild(Int32sb, _record_size),
    *RecordHead.subcons[1:],
    "born_host" / _host(SYSFLAG_BORNHOST_V6),
    "store_timestamp" / Int64sb,
    "store_host" / _host(SYSFLAG_STOREHOST_V6),
    *_TAIL_FIXED,
    # Java reads a body only when its length is > 0 (spec §3.9), so a negative length
    # means "no body" rather than an error.
    "body_length" / Rebuild(Int32sb, len_(this.body)),
    "body" / Bytes(lambda ctx: max(ctx.body_length, 0)),
    "topic_length" / Rebuild(IfThenElse(this.magic == MAGIC_V2, Int16sb, Int8sb),
                             len_(this.topic)),
    "topic" / Bytes(this.topic_length),
    "properties_length" / Rebuild(Int16sb, len_(this.properties)),
    "properties" / Bytes(lambda ctx: max(ctx.properties_length, 0)),
)


def record_fixed(born_v6: bool, store_v6: bool) -> Struct:
    """The fixed-width prefix of a record (fields 1..14 and the body length)."""
    return Struct(
        *RecordHead.subcons,
        "born_host" / (HostV6 if born_v6 else HostV4),
        "store_timestamp" / Int64sb,
        "store_host" / (HostV6 if store_v6 else HostV4),
        *_TAIL_FIXED,
        "body_length" / Int32sb,
    )


def record_size(sys_flag: int, magic: int, body_len: int, topic_len: int,
                properties_len: int) -> int:
    """TOTALSIZE as the broker's ``calMsgLength`` computes it (spec §3.1)."""
    fixed = RECORD_FIXED_SIZE[bool(sys_flag & SYSFLAG_BORNHOST_V6),
                              bool(sys_flag & SYSFLAG_STOREHOST_V6)]
    return (fixed + max(body_len, 0) + TOPIC_LENGTH_SIZE[magic] + topic_len
            + PROPERTIES_LENGTH_SIZE + max(properties_len, 0))


#: The 8 bytes a writer puts at a segment's end when the next record does not fit (§4).
BlankRecord = Struct("total_size" / Int32sb, "magic" / Const(MAGIC_BLANK, Int32sb))

#: One message inside the body of a batch send (spec §3.7).
BatchEntry = Struct(
    "total_size" / Rebuild(Int32sb, lambda ctx: 4 * 5 + len(ctx.body) + 2 + len(ctx.properties)),
    "magic" / Int32sb,
    "body_crc" / Int32sb,
    "flag" / Int32sb,
    "body_length" / Rebuild(Int32sb, len_(this.body)),
    "body" / Bytes(lambda ctx: max(ctx.body_length, 0)),
    "properties_length" / Rebuild(Int16sb, len_(this.properties)),
    "properties" / Bytes(lambda ctx: max(ctx.properties_length, 0)),
)

#: The property a 5.2+ writer with ``enabledAppendPropCRC`` ends every record's
#: properties with (spec §3.8): the CRC of the record before these bytes, as ten ASCII
#: digits least significant first.
PROP_CRC_NAME = b"__CRC32#"
PropCrcEntry = Struct(
    "name" / Const(PROP_CRC_NAME + PROPERTY_NAME_VALUE_SEPARATOR.encode()),
    "digits" / Bytes(10),
    "end" / Const(PROPERTY_SEPARATOR.encode()),
)

# --- ConsumeQueue (spec §6.1, §6.4) ------------------------------------------------------

ConsumeQueueUnit = Struct(
    "commit_log_offset" / Int64sb,
    "size" / Int32sb,
    "tags_code" / Int64sb,
)

BatchConsumeQueueUnit = Struct(
    "commit_log_offset" / Int64sb,
    "size" / Int32sb,
    "tags_code" / Int64sb,
    "store_timestamp" / Int64sb,
    "msg_base_offset" / Int64sb,
    "batch_size" / Int16sb,
    "compacted_offset" / Int32sb,
    "reserved" / Int32sb,
)

# --- offsetMsgId (spec §5.1) -------------------------------------------------------------

#: The bytes an offsetMsgId's hex text spells: the store host as the record holds it
#: (4- or 16-byte address, i32 port), then the i64 PHYSICALOFFSET.
OffsetMsgIdV4 = Struct(*HostV4.subcons, "physical_offset" / Int64sb)
OffsetMsgIdV6 = Struct(*HostV6.subcons, "physical_offset" / Int64sb)

# --- IndexFile (spec §7.1) ---------------------------------------------------------------

IndexHeader = Struct(
    "begin_timestamp" / Int64sb,
    "end_timestamp" / Int64sb,
    "begin_phy_offset" / Int64sb,
    "end_phy_offset" / Int64sb,
    "hash_slot_count" / Int32sb,
    "index_count" / Int32sb,
)

IndexSlot = Struct("head" / Int32sb)

IndexEntry = Struct(
    "key_hash" / Int32sb,
    "phy_offset" / Int64sb,
    "time_diff" / Int32sb,
    "prev_index" / Int32sb,
)


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return IndexHeader.sizeof() + hash_slot_num * IndexSlot.sizeof() + index_num * IndexEntry.sizeof()


def index_slot_position(slot: int) -> int:
    return IndexHeader.sizeof() + slot * IndexSlot.sizeof()


def index_entry_position(hash_slot_num: int, entry: int) -> int:
    return index_slot_position(hash_slot_num) + entry * IndexEntry.sizeof()


# --- checkpoint (spec §8.1) --------------------------------------------------------------

_CHECKPOINT_V4_FIELDS = (
    "physic_msg_timestamp" / Int64sb,
    "logics_msg_timestamp" / Int64sb,
    "index_msg_timestamp" / Int64sb,
)
_CHECKPOINT_V5_FIELDS = _CHECKPOINT_V4_FIELDS + (
    "master_flushed_offset" / Int64sb,
    "confirm_phy_offset" / Int64sb,
)
CheckpointV4 = Padded(CHECKPOINT_FILE_SIZE, Struct(*_CHECKPOINT_V4_FIELDS))
CheckpointV5 = Padded(CHECKPOINT_FILE_SIZE, Struct(*_CHECKPOINT_V5_FIELDS))

# --- derived fast forms ------------------------------------------------------------------


def _flatten(con: Construct, prefix: str = "") -> list[tuple[str, str]]:
    """(name, struct code) for each fixed field of a schema, nested structs flattened."""
    fields: list[tuple[str, str]] = []
    for sub in con.subcons:
        name = prefix + (sub.name or "")
        inner = sub
        while isinstance(inner, (Renamed, Rebuild, Const)):
            inner = inner.subcon
        if isinstance(inner, FormatField):
            fields.append((name, inner.fmtstr[1:]))
        elif isinstance(inner, Struct):
            fields.extend(_flatten(inner, name + "_"))
        elif isinstance(inner, Bytes) and isinstance(inner.length, int):
            fields.append((name, f"{inner.length}s"))
        elif isinstance(inner, Padded) and inner.subcon is Pass:
            fields.append(("", f"{inner.length}x"))
        else:
            raise TypeError(f"field {name!r} of {con!r} has no fixed width")
    return fields


def derive_struct(con: Construct) -> struct.Struct:
    """A big-endian ``struct.Struct`` that packs the same bytes as a fixed schema."""
    return struct.Struct(">" + "".join(code for _, code in _flatten(con)))


def derive_fields(con: Construct) -> tuple[str, ...]:
    """Flattened field names of a fixed schema, in :func:`derive_struct` order."""
    return tuple(name for name, code in _flatten(con) if name)


def derive_dtype(con: Construct) -> np.dtype:
    """A numpy structured dtype (big-endian, packed) laid out like a fixed schema."""
    spec = []
    for name, code in _flatten(con):
        kind = code[-1]
        if kind == "s":
            spec.append((name, "u1", (int(code[:-1]),)))
        elif kind == "x":
            spec.append((f"_pad{len(spec)}", f"V{int(code[:-1])}"))
        else:
            spec.append((name, ">" + {"b": "i1", "h": "i2", "i": "i4", "l": "i4", "q": "i8"}[kind]))
    return np.dtype(spec)


RECORD_FIXED = {(b, s): record_fixed(b, s) for b in (False, True) for s in (False, True)}
RECORD_FIXED_SIZE = {k: v.sizeof() for k, v in RECORD_FIXED.items()}
RECORD_FIXED_STRUCT = {k: derive_struct(v) for k, v in RECORD_FIXED.items()}
RECORD_FIXED_DTYPE = {k: derive_dtype(v) for k, v in RECORD_FIXED.items()}
RECORD_FIXED_FIELDS = {k: derive_fields(v) for k, v in RECORD_FIXED.items()}



def derive_offsets(con: Construct) -> dict[str, tuple[int, int]]:
    """(byte offset, width) of each field of a fixed schema, nested names flattened."""
    out, pos = {}, 0
    for name, code in _flatten(con):
        width = struct.calcsize(">" + code)
        if name:
            out[name] = (pos, width)
        pos += width
    return out


RECORD_FIXED_OFFSETS = {k: derive_offsets(v) for k, v in RECORD_FIXED.items()}
RECORD_HEAD_STRUCT = derive_struct(RecordHead)


def ints_at(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """The big-endian signed ints of ``width`` bytes (every field here is one, spec §0) at
    each of ``pos`` (>= 0) in the uint8 buffer ``u8``, as int64: the vector form of the
    ``>i`` structs above, for many records at once.

    A position with fewer than ``width`` bytes left reads some in-range int instead: such
    positions only come from damaged lengths, and every caller checks that what it keeps
    fits (a size check, a ``fits`` mask) rather than paying for a mask here."""
    if len(pos) == 0:
        return np.zeros(0, dtype=np.int64)
    n = len(u8) - width + 1
    if n <= 0:
        return np.zeros(len(pos), dtype=np.int64)
    # Gathering native-order ints and swapping after is ~3x faster than gathering through
    # a big-endian view.
    view = np.ndarray(shape=(n,), dtype=f"<i{width}", buffer=u8, offset=0, strides=(1,))
    got = view[np.minimum(pos, n - 1)]
    if width > 1:
        got.byteswap(inplace=True)
    return got.astype(np.int64)


def _record_field(name: str) -> Construct:
    return next(sc for sc in CommitLogRecord.subcons if sc.name == name)


#: Single record fields a writer stores on their own: TOTALSIZE (written last, so a
#: concurrent scan never sees a partial record) and the properties length.
RECORD_TOTAL_SIZE_STRUCT = derive_struct(Struct(_record_field("total_size")))
RECORD_PROPERTIES_LENGTH_STRUCT = derive_struct(Struct(_record_field("properties_length")))
RECORD_HEAD_SIZE = RecordHead.sizeof()
PROPERTIES_LENGTH_SIZE = RECORD_PROPERTIES_LENGTH_STRUCT.size
# The schema's topic_length is Renamed(Rebuild(IfThenElse(magic == v2, i16, i8))).
_TOPIC_LENGTH = _record_field("topic_length").subcon.subcon
#: Width of the TOPICLENGTH field by magic: 1 byte for v1, 2 for v2 (spec §3.1).
TOPIC_LENGTH_SIZE = {MAGIC_V1: _TOPIC_LENGTH.elsesubcon.sizeof(),
                     MAGIC_V2: _TOPIC_LENGTH.thensubcon.sizeof()}
#: The smallest record (spec §3.1): IPv4 hosts, no body, 1-byte topic length, no topic,
#: no properties. A TOTALSIZE below it cannot start a record.
MIN_RECORD_SIZE = record_size(0, MAGIC_V1, 0, 0, 0)
BLANK_STRUCT = derive_struct(Struct("total_size" / Int32sb, "magic" / Int32sb))

#: By store-host width (is it IPv6?): the offsetMsgId's bytes, their struct and dtype,
#: and the prefix (store host) and suffix (offset) structs a writer packs separately.
OFFSET_MSG_ID = {False: OffsetMsgIdV4, True: OffsetMsgIdV6}
OFFSET_MSG_ID_SIZE = {v6: con.sizeof() for v6, con in OFFSET_MSG_ID.items()}
OFFSET_MSG_ID_STRUCT = {v6: derive_struct(con) for v6, con in OFFSET_MSG_ID.items()}
OFFSET_MSG_ID_DTYPE = {v6: derive_dtype(con) for v6, con in OFFSET_MSG_ID.items()}
#: Hex characters (two per byte) -> is the store host IPv6: 32 -> False, 56 -> True.
OFFSET_MSG_ID_HEX_LENGTHS = {2 * size: v6 for v6, size in OFFSET_MSG_ID_SIZE.items()}
OFFSET_MSG_ID_HOST_STRUCT = {False: derive_struct(HostV4), True: derive_struct(HostV6)}
OFFSET_MSG_ID_OFFSET_STRUCT = derive_struct(Struct(OffsetMsgIdV4.subcons[-1]))
CQ_UNIT_SIZE = ConsumeQueueUnit.sizeof()
CQ_UNIT_STRUCT = derive_struct(ConsumeQueueUnit)
CQ_UNIT_DTYPE = derive_dtype(ConsumeQueueUnit)
BCQ_UNIT_SIZE = BatchConsumeQueueUnit.sizeof()
BCQ_UNIT_DTYPE = derive_dtype(BatchConsumeQueueUnit)
BCQ_UNIT_STRUCT = derive_struct(BatchConsumeQueueUnit)
#: compactedOffset of every unit a broker writes (no compaction): spec §6.4, design-14 §4.1.
BCQ_COMPACTED_NONE = -1
BATCH_ENTRY_HEAD_STRUCT = derive_struct(Struct(*BatchEntry.subcons[:5]))

INDEX_HEADER_SIZE = IndexHeader.sizeof()
INDEX_HEADER_STRUCT = derive_struct(IndexHeader)
INDEX_HEADER_DTYPE = derive_dtype(IndexHeader)
INDEX_SLOT_SIZE = IndexSlot.sizeof()
INDEX_SLOT_DTYPE = derive_dtype(IndexSlot)
INDEX_SLOT_STRUCT = derive_struct(IndexSlot)
INDEX_ENTRY_SIZE = IndexEntry.sizeof()
INDEX_ENTRY_STRUCT = derive_struct(IndexEntry)
INDEX_ENTRY_DTYPE = derive_dtype(IndexEntry)

PROP_CRC_ENTRY_SIZE = PropCrcEntry.sizeof()  # 20: the record's last bytes
PROP_CRC_PREFIX = PropCrcEntry.subcons[0].value  # name and separator, before the digits

CHECKPOINT_V4_STRUCT = derive_struct(Struct(*_CHECKPOINT_V4_FIELDS))
CHECKPOINT_V5_STRUCT = derive_struct(Struct(*_CHECKPOINT_V5_FIELDS))

#: Offsets of the head fields, the same for every record.
OFFSET_OF = {name: off for name, (off, _) in derive_offsets(RecordHead).items()}
#: One struct per head field, to read or write that field alone at ``pos + OFFSET_OF[name]``.
HEAD_FIELD_STRUCT = {name: derive_struct(Struct(_record_field(name))) for name in OFFSET_OF}
