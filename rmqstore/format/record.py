"""One CommitLog record: encode a :class:`~rmqstore.format.message.Message` to its bytes
and decode them back (spec §3.1, the §3.9 checks), with the ``struct`` forms derived in
:mod:`rmqstore.format.layout`; the ``construct`` schema there is the reference they are
tested against.
"""

from __future__ import annotations

import numpy as np

from ..errors import RecordError
from . import layout as L
from .crc import body_crc
from .rules import magic_for
from .message import Host, InnerBatch, Message, parse_properties, serialize_properties


_PROPS_LEN = L.RECORD_PROPERTIES_LENGTH_STRUCT
_SYS_FLAG, _SYS_FLAG_AT = L.HEAD_FIELD_STRUCT["sys_flag"], L.OFFSET_OF["sys_flag"]

#: What :func:`chain_step` finds where a walk along the TOTALSIZE chain arrives.
CHAIN_VERDICTS = ("record", "end", "short", "blank", "zeros", "bad magic", "bad size")


def chain_step(buf, at: int, left: int) -> str:
    """What the header at ``buf[at:]`` says to a walk along the TOTALSIZE chain, with
    ``left`` bytes of data from there (spec §3.9, §4): ``"record"`` (a message magic and a
    TOTALSIZE from :data:`~rmqstore.format.layout.MIN_RECORD_SIZE` up to ``left``: the walk
    goes on), or why valid data stops there: ``"end"`` (no bytes left), ``"short"``
    (fewer than 8), ``"blank"`` (the end-of-segment filler), ``"zeros"``, ``"bad magic"``
    or ``"bad size"``. Only the first 8 bytes are read, and only when ``left >= 8``."""
    if left < 8:
        return "end" if left == 0 else "short"
    total, magic = L.BLANK_STRUCT.unpack_from(buf, at)
    if magic in L.MESSAGE_MAGICS:
        return "record" if L.MIN_RECORD_SIZE <= total <= left else "bad size"
    if magic == L.MAGIC_BLANK:
        return "blank"
    return "zeros" if total == 0 and magic == 0 else "bad magic"


# --- is this a whole record: the §3.9 size rule (check side) ------------------------------

#: Why :func:`record_fits` finds no whole message record: :func:`chain_step`'s stops, and
#: ``"half record"`` (the length fields do not add up to TOTALSIZE).
FIT_VERDICTS = ("end", "short", "blank", "zeros", "bad magic", "bad size", "half record")

_SYS_FLAG, _SYS_FLAG_AT = L.HEAD_FIELD_STRUCT["sys_flag"], L.OFFSET_OF["sys_flag"]
_BODY_CRC, _BODY_CRC_AT = L.HEAD_FIELD_STRUCT["body_crc"], L.OFFSET_OF["body_crc"]
_BODY_LENGTH = {k: (L.RECORD_FIXED_OFFSETS[k]["body_length"][0], size)
                for k, size in L.RECORD_FIXED_SIZE.items()}


def fields_size(buf, at: int, left: int) -> int | None:
    """The TOTALSIZE the length fields of the message record at ``buf[at:]`` add up to, as
    the broker's ``calMsgLength`` computes it (spec §3.1: a negative body or properties
    length counts as none, :func:`~rmqstore.format.layout.record_size`); None when a field
    lies past the ``left`` bytes of data or the topic length is negative (the broker's
    parse throws there: a plain FAIL, §3.9)."""
    if left < L.RECORD_HEAD_SIZE:
        return None
    magic = L.BLANK_STRUCT.unpack_from(buf, at)[1]
    sys_flag = _SYS_FLAG.unpack_from(buf, at + _SYS_FLAG_AT)[0]
    body_at, fixed = _BODY_LENGTH[bool(sys_flag & L.SYSFLAG_BORNHOST_V6),
                                  bool(sys_flag & L.SYSFLAG_STOREHOST_V6)]
    if fixed > left:
        return None
    body_len = max(int.from_bytes(buf[at + body_at:at + fixed], "big", signed=True), 0)
    tsize = 2 if magic == L.MAGIC_V2 else 1
    p = fixed + body_len  # from ``at`` on
    if p + tsize > left:
        return None
    topic_len = int.from_bytes(buf[at + p:at + p + tsize], "big", signed=True)
    p += tsize + topic_len
    if topic_len < 0 or p + 2 > left:
        return None
    props_len = max(int.from_bytes(buf[at + p:at + p + 2], "big", signed=True), 0)
    return p + 2 + props_len


def body_crc_ok(buf, at: int, left: int) -> bool | None:
    """Does the body of the message record at ``buf[at:]`` match its BODYCRC (spec §3.9;
    an empty body always does)? None when the body lies past the ``left`` bytes of data."""
    if left < L.RECORD_HEAD_SIZE:
        return None
    sys_flag = _SYS_FLAG.unpack_from(buf, at + _SYS_FLAG_AT)[0]
    body_at, fixed = _BODY_LENGTH[bool(sys_flag & L.SYSFLAG_BORNHOST_V6),
                                  bool(sys_flag & L.SYSFLAG_STOREHOST_V6)]
    if fixed > left:
        return None
    body_len = int.from_bytes(buf[at + body_at:at + fixed], "big", signed=True)
    if body_len <= 0:
        return True
    if fixed + body_len > left:
        return None
    p = at + fixed
    return body_crc(buf[p:p + body_len]) == _BODY_CRC.unpack_from(buf, at + _BODY_CRC_AT)[0]


def record_fits(buf, at: int, left: int, magics: tuple[int, ...] = L.MESSAGE_MAGICS) -> int | str:
    """TOTALSIZE of the whole message record at ``buf[at:]``, with ``left`` bytes of data
    from there, or why there is none (one of :data:`FIT_VERDICTS`).

    Whole means the spec's §3.9 framing without the CRC: a message magic (one of
    ``magics``), a TOTALSIZE from :data:`~rmqstore.format.layout.MIN_RECORD_SIZE` up to
    ``left`` (:func:`chain_step`), and body, topic and properties lengths that add up to it
    exactly (:func:`fields_size`; the broker's FAIL_WITH_SIZE, "half message", when not).
    The vector form over many records is :func:`rmqstore.scan.records.consistent` after a
    chain walk; tests hold the two to the same golden headers."""
    if left < 8:
        return "end" if left == 0 else "short"
    total, magic = L.BLANK_STRUCT.unpack_from(buf, at)
    if magic not in magics:
        if magic == L.MAGIC_BLANK:
            return "blank"
        return "zeros" if total == 0 and magic == 0 else "bad magic"
    if not L.MIN_RECORD_SIZE <= total <= left:
        return "bad size"
    return total if fields_size(buf, at, left) == total else "half record"


def head_store_timestamp(buf, pos: int, limit: int) -> int | None:
    """STORETIMESTAMP of a record header at ``pos`` (at 48+B, spec §3.1), if readable."""
    if limit - pos < 64:
        return None
    sys_flag = L.HEAD_FIELD_STRUCT["sys_flag"].unpack_from(buf, pos + L.OFFSET_OF["sys_flag"])[0]
    at = pos + L.RECORD_FIXED_OFFSETS[bool(sys_flag & L.SYSFLAG_BORNHOST_V6), False]["store_timestamp"][0]
    if at + 8 > limit:
        return None
    return int.from_bytes(buf[at:at + 8], "big", signed=True)


def _host_bits(born: Host, store: Host) -> int:
    return (L.SYSFLAG_BORNHOST_V6 if born.is_v6 else 0) | (L.SYSFLAG_STOREHOST_V6 if store.is_v6 else 0)


# The encoder in two halves, so a writer can make the variable part outside its append
# lock and the fixed part (which holds the offsets the lock assigns) under it:
# record = pack_head(...) + record_tail(...). The bulk forms (the engine's columnar put,
# the fast single put) build the same bytes from the same layout-derived structs and are
# tested against encode_record.


def topic_field(topic_b: bytes, magic: int) -> bytes:
    """TOPICLENGTH (as wide as ``magic`` says) and the topic's bytes (spec §3.1)."""
    return len(topic_b).to_bytes(L.TOPIC_LENGTH_SIZE[magic], "big") + topic_b


def record_tail(body: bytes, topic_block: bytes, props_b: bytes) -> bytes:
    """Everything after BODYLENGTH: body, :func:`topic_field`, PROPERTIESLENGTH and the
    properties text."""
    return b"".join((body, topic_block, _PROPS_LEN.pack(len(props_b)), props_b))


def pack_head(key: tuple[bool, bool], total: int, magic: int, crc: int, sys_flag: int,
              msg: Message, queue_offset: int, physical_offset: int, store_timestamp: int,
              body_length: int) -> bytes:
    """The fixed part (fields 1..14 and BODYLENGTH) for host widths ``key`` (born v6,
    store v6): the other fields come from ``msg``."""
    born, store = msg.born_host, msg.store_host
    return L.RECORD_FIXED_STRUCT[key].pack(
        total, magic, crc, msg.queue_id, msg.flag, queue_offset, physical_offset, sys_flag,
        msg.born_timestamp, born.address, born.port, store_timestamp, store.address,
        store.port, msg.reconsume_times, msg.prepared_transaction_offset, body_length)


def encode_record(msg: Message, *, trailing_separator: bool = False, auto: bool = True) -> bytes:
    """Record bytes for ``msg`` exactly as the broker lays them out (spec §3.1).

    The host bits of SYSFLAG follow the host widths; TOTALSIZE, the lengths and BODYCRC
    are computed. QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP are taken from the
    message as they are. The magic is :func:`~rmqstore.format.rules.magic_for` the topic
    (``auto``: the 5.x rule for topics over 127 Java characters; off for a 4.9 store).
    """
    sys_flag = (msg.sys_flag & ~(L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6)) | _host_bits(
        msg.born_host, msg.store_host)
    topic = msg.topic.encode("utf-8", "replace")
    text = msg.properties_text
    if text is None:
        text = serialize_properties(msg.properties, trailing_separator)
    props = text.encode("utf-8", "replace")
    magic = magic_for(msg.topic, msg.magic, auto=auto)
    body = msg.body
    total = L.record_size(sys_flag, magic, len(body), len(topic), len(props))
    key = (msg.born_host.is_v6, msg.store_host.is_v6)
    head = pack_head(key, total, magic, body_crc(body), sys_flag, msg, msg.queue_offset,
                     msg.commit_log_offset, msg.store_timestamp, len(body))
    return head + record_tail(body, topic_field(topic, magic), props)


def set_head_field(records: np.ndarray, name: str, values, starts=None,
                   key: tuple[bool, bool] = (False, False)) -> None:
    """Set fixed field ``name`` (a :data:`~rmqstore.format.layout.RECORD_FIXED` field such
    as ``queue_offset``) of many encoded records at once, the vector form of
    :func:`pack_head` for one field: ``records`` is a uint8 array, 2-D with one record
    per row, or 1-D with the records starting at ``starts``; ``values`` one per record.
    ``key`` (born v6, store v6) says which fixed layout the records have."""
    off, width = L.RECORD_FIXED_OFFSETS[key][name]
    raw = np.asarray(values).astype(L.RECORD_FIXED_DTYPE[key].fields[name][0])
    raw = raw.view(np.uint8).reshape(-1, width)
    if starts is None:
        records[:, off:off + width] = raw
    else:
        records[np.asarray(starts)[:, None] + (off + np.arange(width))] = raw


def decode_record(buf, pos: int = 0, *, limit: int | None = None, path=None,
                  base: int = 0, check_crc: bool = False) -> Message:
    """Decode the message record at ``pos`` of ``buf`` (spec §3.9 rules).

    Raises :class:`RecordError` naming ``path`` and the absolute offset ``base + pos``.
    """
    end = len(buf) if limit is None else limit
    where = base + pos

    def bad(why: str) -> RecordError:
        return RecordError(why, path, where)

    if end - pos < 8:
        raise bad(f"only {max(end - pos, 0)} bytes left, too few for a record")
    total, magic = L.BLANK_STRUCT.unpack_from(buf, pos)
    if magic == L.MAGIC_BLANK:
        raise bad("BLANK end-of-segment record, not a message")
    if magic not in L.MESSAGE_MAGICS:
        raise bad(f"bad magic 0x{magic & 0xFFFFFFFF:08X}")
    if total <= 0 or total > end - pos:
        raise bad(f"record size {total} does not fit the {end - pos} bytes left")
    sys_flag, = _SYS_FLAG.unpack_from(buf, pos + _SYS_FLAG_AT)
    key = (bool(sys_flag & L.SYSFLAG_BORNHOST_V6), bool(sys_flag & L.SYSFLAG_STOREHOST_V6))
    fixed = L.RECORD_FIXED_SIZE[key]
    least = L.record_size(sys_flag, L.MAGIC_V1, 0, 0, 0)
    if total < least:
        raise bad(f"record size {total} is below the {least}-byte minimum")
    (_, _, crc, queue_id, flag, queue_offset, physical_offset, _, born_ts, born_addr,
     born_port, store_ts, store_addr, store_port, reconsume, prepared,
     body_len) = L.RECORD_FIXED_STRUCT[key].unpack_from(buf, pos)
    p = pos + fixed
    stop = pos + total
    blen = max(body_len, 0)
    if p + blen > stop:
        raise bad(f"body length {body_len} runs past the record end")
    body = bytes(buf[p:p + blen])
    p += blen
    tsize = L.TOPIC_LENGTH_SIZE[magic]
    if p + tsize > stop:
        raise bad("topic length runs past the record end")
    tlen = int.from_bytes(buf[p:p + tsize], "big", signed=True)
    p += tsize
    if tlen < 0 or p + tlen + _PROPS_LEN.size > stop:
        raise bad(f"topic length {tlen} runs past the record end")
    topic = bytes(buf[p:p + tlen]).decode("utf-8", "replace")
    p += tlen
    plen, = _PROPS_LEN.unpack_from(buf, p)
    p += _PROPS_LEN.size
    plen = max(plen, 0)
    if p + plen != stop:
        raise bad(f"lengths add up to {p + plen - pos} bytes but the record says {total}")
    text = bytes(buf[p:p + plen]).decode("utf-8", "replace")
    if check_crc and body_crc(body) != crc:
        raise bad(f"body CRC mismatch: stored {crc}, computed {body_crc(body)}")
    return Message(
        topic=topic, body=body, properties=parse_properties(text), queue_id=queue_id,
        flag=flag, sys_flag=sys_flag, born_timestamp=born_ts,
        born_host=Host(born_addr, born_port), store_timestamp=store_ts,
        store_host=Host(store_addr, store_port), reconsume_times=reconsume,
        prepared_transaction_offset=prepared, queue_offset=queue_offset,
        commit_log_offset=physical_offset, store_size=total, body_crc=crc, magic=magic,
        properties_text=text)


def encode_batch_entry(body: bytes, properties_text: str, flag: int = 0) -> bytes:
    """One entry of a batch-send body (spec §3.7): MAGIC and BODYCRC are 0."""
    props = properties_text.encode("utf-8")
    return L.BatchEntry.build(dict(magic=0, body_crc=0, flag=flag, body=body, properties=props))


# --- inner-batch records (RocketMQ 5.x BatchCQ topics, design-14 §4.3) ------------------------

#: sysFlag bits of a record whose body holds a whole batch, stored as one record.
INNER_BATCH_FLAGS = L.SYSFLAG_NEED_UNWRAP | L.SYSFLAG_INNER_BATCH
_ENTRY_HEAD = L.BATCH_ENTRY_HEAD_STRUCT


def is_inner_batch(sys_flag):
    """Does a consumer unwrap the record into the messages of its body (sysFlag has both
    NEED_UNWRAP 0x40 and INNER_BATCH 0x80, as ``SendMessageProcessor#sendBatchMessage``
    @5.x sets them)? Int or numpy array."""
    return (sys_flag & INNER_BATCH_FLAGS) == INNER_BATCH_FLAGS


def inner_entries(body) -> list[tuple[int, int, bytes, str]]:
    """(entry totalSize, flag, body, properties text) of each entry of a batch body (spec
    §3.7: totalSize, magic, bodyCRC, flag, body length, body, i16 properties length,
    properties); :class:`RecordError` when the entries do not tile the body exactly."""
    out = []
    p, end = 0, len(body)
    while p < end:
        if p + _ENTRY_HEAD.size > end:
            raise RecordError(f"inner batch entry {len(out)} at body byte {p}: "
                              f"{end - p} bytes left, an entry head is {_ENTRY_HEAD.size}")
        total, _magic, _crc, flag, blen = _ENTRY_HEAD.unpack_from(body, p)
        q = p + _ENTRY_HEAD.size
        if blen < 0 or q + blen + _PROPS_LEN.size > end:
            raise RecordError(f"inner batch entry {len(out)} at body byte {p}: body length "
                              f"{blen} runs past the batch")
        ebody = bytes(body[q:q + blen])
        q += blen
        plen, = _PROPS_LEN.unpack_from(body, q)
        q += _PROPS_LEN.size
        if plen < 0 or q + plen > end or q + plen - p != total:
            raise RecordError(f"inner batch entry {len(out)} at body byte {p}: its lengths "
                              f"add up to {q + max(plen, 0) - p} bytes, totalSize says {total}")
        out.append((total, flag, ebody, bytes(body[q:q + plen]).decode("utf-8", "replace")))
        q += plen
        p = q
    return out


def inner_messages(msg: Message) -> list[Message]:
    """The messages a consumer gets from an inner-batch record (``MessageDecoder#decodeMessage``
    @5.x as the client's pull applies it): message i keeps the record's topic, queue id,
    hosts, times, sysFlag, offsets, size and BODYCRC, takes flag, body and properties from
    entry i, and has queue offset QUEUEOFFSET + i (design-14 §4.3). A record that is not an
    inner batch is returned alone; :class:`RecordError` when its body does not unwrap."""
    if not is_inner_batch(msg.sys_flag):
        return [msg]
    entries = inner_entries(msg.body)
    crc_ok = not msg.body or body_crc(msg.body) == msg.body_crc
    out = []
    for i, (total, flag, body, text) in enumerate(entries):
        m = Message(**{f: getattr(msg, f) for f in Message.__slots__})
        m.flag, m.body, m.properties_text = flag, body, text
        m.properties = parse_properties(text)
        m.queue_offset = msg.queue_offset + i
        m.inner_batch = InnerBatch(i, len(entries), total, crc_ok)
        out.append(m)
    return out
