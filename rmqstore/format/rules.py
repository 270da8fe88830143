"""Broker rules, each written down once: what append and dispatch derive from a record.

Which records take a queue offset (:func:`advances_queue_offset`, spec §3.2) and get a
ConsumeQueue unit (:func:`gets_cq_unit`, §6.1), which put index keys and which keys
(:func:`gets_index_keys`, :func:`index_keys`, §7.3), and the unit's tagsCode
(:func:`tags_code`: the TAGS hash, or the delivery time for SCHEDULE_TOPIC_XXXX, §6.1)
with the delay levels it reads, and which magic a record is written with
(:func:`magic_for`, §3.1). The transaction rules take an int or a numpy array alike.
Where bodies failing their CRC end valid data: the broker's rule (:func:`broker_end`) and
rmqstore's (:func:`rmqstore_end`, spec §10.5), side by side.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import InputError
from . import layout as L
from .hashing import hashmap_order, java_hash
from .message import parse_properties, serialize_properties, split_keys

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def java_length(s: str) -> int:
    """Java ``String.length()``: UTF-16 code units (a character outside the BMP counts 2)."""
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


#: Topics longer than this (Java length) get magic v2 under the 5.x auto rule (§3.1).
V1_TOPIC_MAX = 127


def magic_for(topic: str, magic: int = L.MAGIC_V1, *, auto: bool = True) -> int:
    """The magic a record of ``topic`` is written with (spec §3.1): v2 when the message
    asks for it, or when ``auto`` (RocketMQ 5.1+'s ``autoMessageVersionOnTopicLen``, on by
    default) and the topic's Java ``String.length()`` is over 127; v1 otherwise. The
    rule counts UTF-16 code units, not UTF-8 bytes (``CommitLog#asyncPutMessage`` @5.x)."""
    if magic == L.MAGIC_V2 or (auto and java_length(topic) > V1_TOPIC_MAX):
        return L.MAGIC_V2
    return L.MAGIC_V1


def topic_field_refusal(topic_b: bytes, magic: int) -> str | None:
    """Why a topic of these UTF-8 bytes does not fit the record's topic length field, or
    None (spec §3.1): one signed byte in v1, two in v2. RocketMQ counts Java characters
    when it picks the magic, so a short non-ASCII topic can need more bytes than v1 holds;
    the broker would write a length its own decoder reads as negative (a record it cannot
    read back), so rmqstore refuses it."""
    limit = V1_TOPIC_MAX if magic == L.MAGIC_V1 else 32767
    if len(topic_b) > limit:
        return (f"topic is {len(topic_b)} UTF-8 bytes; the {'v1' if magic == L.MAGIC_V1 else 'v2'} "
                f"record's topic length field holds at most {limit}")
    return None


def parse_delay_levels(text: str = DEFAULT_DELAY_LEVELS) -> tuple[int, ...]:
    """``messageDelayLevel`` as milliseconds; level L is element L-1."""
    out = []
    for item in text.split():
        try:
            out.append(int(item[:-1]) * _UNIT_MS[item[-1]])
        except (KeyError, ValueError):
            raise InputError(f"bad messageDelayLevel item {item!r}") from None
    return tuple(out)


def tags_hash(tags: str | None) -> int:
    """tagsCode outside SCHEDULE_TOPIC_XXXX: the Java hash of TAGS, 0 without TAGS (spec
    §6.1; ``"".hashCode()`` is 0 too). Bulk forms hash each distinct value with
    :mod:`rmqstore.format.hashing`'s vector forms."""
    return java_hash(tags) if tags else 0


def tags_code(topic: str, properties: Mapping[str, str], store_timestamp: int,
              delay_millis: Sequence[int] = parse_delay_levels()) -> int:
    """The 8-byte tagsCode dispatch writes into a ConsumeQueue unit."""
    if topic == SCHEDULE_TOPIC and "DELAY" in properties:
        try:
            level = min(int(properties["DELAY"]), len(delay_millis))
        except ValueError:
            level = 0  # Java would throw here (spec §14.12); we report tagsCode 0
        if level > 0:
            return store_timestamp + (delay_millis[level - 1] if level <= len(delay_millis) else 1000)
    return tags_hash(properties.get("TAGS"))


# --- transactions (spec §3.2, §6.1, §7.3) ------------------------------------------------

#: The bit PREPARED (0x4) and ROLLBACK (0xC) have and NOT_TYPE (0x0) and COMMIT (0x8) lack:
#: the records that take no queue offset and get no ConsumeQueue unit. The single-put path
#: tests it inline (``sys_flag & NO_QUEUE_OFFSET_BIT``); everything else calls the rules below.
NO_QUEUE_OFFSET_BIT = L.TRANSACTION_PREPARED
assert all(bool(t & NO_QUEUE_OFFSET_BIT) == (t in (L.TRANSACTION_PREPARED, L.TRANSACTION_ROLLBACK))
           for t in (L.TRANSACTION_NOT_TYPE, L.TRANSACTION_PREPARED, L.TRANSACTION_COMMIT,
                     L.TRANSACTION_ROLLBACK))


def gets_cq_unit(sys_flag):
    """Does dispatch write a ConsumeQueue unit for the record? NOT_TYPE and COMMIT records
    do, PREPARED and ROLLBACK do not (spec §6.1, §9). ``sys_flag`` (or just its transaction
    bits) as an int gives a bool, as a numpy array a bool array."""
    return (sys_flag & NO_QUEUE_OFFSET_BIT) == 0


def advances_queue_offset(sys_flag):
    """Does appending the record take its queue's next offset? PREPARED and ROLLBACK store
    QUEUEOFFSET 0 and leave the counter (spec §3.2): queue offsets number exactly the records
    that get a ConsumeQueue unit. Int or numpy array, as :func:`gets_cq_unit`."""
    return (sys_flag & NO_QUEUE_OFFSET_BIT) == 0


def gets_index_keys(sys_flag):
    """Does dispatch put the record's keys into the IndexFile? All but ROLLBACK records do
    (spec §7.3; the endPhyOffset skip is the IndexFile's own). Int or numpy array."""
    return (sys_flag & L.SYSFLAG_TRANSACTION_MASK) != L.TRANSACTION_ROLLBACK


def index_keys(topic: str, uniq_key: str | None, keys, sys_flag: int = 0) -> list[str]:
    """The keys dispatch puts into the IndexFile for one record, in put order (spec §7.3):
    ``topic#UNIQ_KEY``, then ``topic#token`` for each KEYS token (``keys`` is the KEYS text,
    split on single spaces with empty tokens dropped, or its tokens); none for ROLLBACK.
    The bulk form over many records is :func:`rmqstore.scan.dispatch.index_keys`."""
    if not gets_index_keys(sys_flag):
        return []
    if keys is None or isinstance(keys, str):
        keys = split_keys(keys)
    out = [f"{topic}#{uniq_key}"] if uniq_key is not None else []
    out.extend(f"{topic}#{k}" for k in keys if k)
    return out


# --- where bodies failing their CRC end valid data (spec §10.1, §10.5) ----------------------
# Two rules on purpose: rmqstore reports what the broker would do, and keeps what it can.
# Both take, for the whole records (§3.9 size rule) of a chain in order, whether each body
# matches its BODYCRC (a bool sequence or numpy array), and say how many lead records stay.


def broker_end(crc_ok) -> int:
    """The broker's recovery: a CRC failure is a FAIL and a FAIL ends valid data (§10.1),
    so the records before the first failure stay. ``files.commitlog.CommitLog.find_end``
    walks by this rule (``engine`` reopens a store with it, as a broker would)."""
    ok = np.asarray(crc_ok, bool)
    return len(ok) if ok.all() else int(np.argmin(ok))


def rmqstore_end(crc_ok, finished: bool) -> int:
    """rmqstore's verify, repair and rebuild: a run of CRC failures that ends the chain is a
    torn tail (§10.5), cut; a failure followed by a record that passes is damage in place,
    kept and reported (cutting there, as the broker would, loses every later record). A
    segment whose chain ``finished`` (at its BLANK or its last byte, at full size) has no
    torn tail. ``scan.dispatch.store_scan`` applies it per segment."""
    ok = np.asarray(crc_ok, bool)
    if finished or not len(ok) or ok[-1]:
        return len(ok)
    passed = np.flatnonzero(ok)
    return int(passed[-1]) + 1 if len(passed) else 0


# --- BatchConsumeQueue (RocketMQ 5.x, design-14 §4) -----------------------------------------
# Siblings of gets_cq_unit/advances_queue_offset: which records of a BatchCQ topic get a unit
# is the same transaction rule (gets_cq_unit); what the unit says about queue offsets is here.

#: Properties an inner-batch record carries (``MessageConst`` @5.x).
INNER_NUM, INNER_BASE = "INNER_NUM", "INNER_BASE"
_SHORT = (-2**15, 2**15 - 1)
_LONG = (-2**63, 2**63 - 1)


def java_parse_long(text: str | None, bounds: tuple[int, int] = _LONG) -> int | None:
    """Java ``Long.parseLong``/``Short.parseShort``: an optional sign and ASCII digits within
    the type's range; None where Java throws."""
    if not text or not (text.isascii() and (text.isdigit() or (text[0] in "+-" and text[1:].isdigit()))):
        return None
    v = int(text)
    return v if bounds[0] <= v <= bounds[1] else None


def bcq_base_and_num(properties: Mapping[str, str], queue_offset: int) -> tuple[int, int]:
    """(msgBaseOffset, batchNum) of a record's BatchConsumeQueue unit (design-14 §4.1,
    ``CommitLog#setBatchSizeIfNeeded`` @5.x): INNER_BASE and INNER_NUM (a Java short) when the
    record has **both**, else (QUEUEOFFSET, 1). A value Java cannot parse gives (-1, -1),
    which :func:`bcq_unit_ok` rejects (the broker's dispatch would throw on it)."""
    if INNER_NUM in properties and INNER_BASE in properties:
        base = java_parse_long(properties[INNER_BASE])
        num = java_parse_long(properties[INNER_NUM], _SHORT)
        if base is None or num is None:
            return -1, -1
        return base, num
    return queue_offset, 1


def bcq_base_and_num_many(queue_offset, inner_base, inner_num):
    """The vector form of :func:`bcq_base_and_num`: ``inner_base``/``inner_num`` are int64
    arrays with -1 where the record lacks the property (or Java cannot parse it: pass -2)."""
    qo = np.asarray(queue_offset, np.int64)
    b, n = np.asarray(inner_base, np.int64), np.asarray(inner_num, np.int64)
    both = (b != -1) & (n != -1)
    bad = both & ((b == -2) | (n == -2))
    base = np.where(both, b, qo)
    num = np.where(both, n, 1)
    return np.where(bad, -1, base), np.where(bad, -1, num)


def bcq_unit_ok(base, num):
    """Does the broker write (dispatch) or keep (recover) a unit with this base and batchNum?
    Dispatch skips base < 0 or batchNum < 0; recovery keeps units with base >= 0 and
    batchNum > 0 (``BatchConsumeQueue#putBatchMessagePositionInfo``/``recover`` @5.x), so a
    written unit is a kept one exactly when batchNum > 0. Int or numpy array."""
    return (base >= 0) & (num > 0)


def inner_num(properties: Mapping[str, str]) -> int | None:
    """INNER_NUM as the store reads it (a Java short), None when absent or unparsable."""
    return java_parse_long(properties.get(INNER_NUM), _SHORT)


def inner_batch_refusal(sys_flag: int, properties: Mapping[str, str], batch_cq: bool) -> str | None:
    """Why a 5.x store refuses a message for its inner-batch marks, or None
    (``DefaultMessageStore#asyncPutMessage`` @5.x: INNER_NUM without the INNER_BATCH flag,
    the flag on a topic that is not BatchCQ; both MESSAGE_ILLEGAL). rmqstore also refuses
    an INNER_NUM the broker cannot parse or below 1: the broker would throw, or write a
    unit its own recovery drops (design-14 §4.2), leaving the queue broken."""
    inner = bool(sys_flag & L.SYSFLAG_INNER_BATCH)
    if INNER_NUM in properties and not inner:
        return f"{INNER_NUM} is set but sysFlag lacks the inner-batch bit (0x80)"
    if inner and not batch_cq:
        return "an inner batch (sysFlag 0x80) goes to a BatchCQ topic only"
    if inner and INNER_NUM in properties:
        n = inner_num(properties)
        if n is None or n < 1:
            return f"{INNER_NUM} {properties[INNER_NUM]!r} is not a count from 1 to 32767"
    return None


def gets_inner_base(sys_flag: int, batch_cq: bool) -> bool:
    """Does the store add INNER_BASE (the record's queue offset) to the message's
    properties? Inner batches of a BatchCQ topic taking a queue offset
    (``BatchConsumeQueue#assignQueueOffset`` @5.x)."""
    return batch_cq and bool(sys_flag & L.SYSFLAG_INNER_BATCH) and bool(advances_queue_offset(sys_flag))


def queue_offset_advance(sys_flag: int, properties: Mapping[str, str], batch_cq: bool) -> int:
    """How far appending the record moves its queue's offset counter (design-14 §4.2,
    ``CommitLog#getMessageNum`` @5.x): 0 for PREPARED/ROLLBACK (:func:`advances_queue_offset`),
    INNER_NUM (at least 1) for an inner batch or a BatchCQ topic's record carrying it, else 1."""
    if not advances_queue_offset(sys_flag):
        return 0
    if (batch_cq or sys_flag & L.SYSFLAG_INNER_BATCH) and INNER_NUM in properties:
        n = inner_num(properties)
        return n if n is not None and n >= 1 else 1
    return 1


#: Initial capacity of the properties map a 5.x broker parses a message's text into
#: (``MessageDecoder#string2messageProperties`` @5.x; design-14 §2).
STORE_MAP_CAPACITY = 128
WAIT = "WAIT"


def with_store_properties(text: str, added: Sequence[tuple[str, str]],
                          move_last: Sequence[str] = ()) -> str:
    """The properties text after a 5.x store put ``added`` into the message's map and
    re-serialised it (``messageProperties2String``, design-14 §2): the map holds the
    parsed text in its order, an added name already there keeps its place and takes the
    new value, a name in ``move_last`` is removed and put again (LMQ's WAIT); iteration
    is a Java HashMap's of capacity 128; every pair ends in 0x02 (5.x)."""
    props = parse_properties(text)
    keys = list(props)
    for k, v in added:
        if k not in props:
            keys.append(k)
        props[k] = v
    for k in move_last:
        if k in props:
            keys.remove(k)
            keys.append(k)
    order = hashmap_order(keys, STORE_MAP_CAPACITY)
    return serialize_properties([(k, props[k]) for k in order], True)


# --- LMQ multi-dispatch (RocketMQ 5.x, design-14 §5) ---------------------------------------
# Sibling of gets_cq_unit: the extra ConsumeQueue units a record gets besides its own.

INNER_MULTI_DISPATCH, INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET"
LMQ_PREFIX = "%LMQ%"
RETRY_PREFIX, SYSTEM_TOPIC_PREFIX = "%RETRY%", "rmq_sys_"


def topic_allows_lmq(topic: str) -> bool:
    """``MixAll#topicAllowsLMQ``/``MultiDispatchUtils#isNeedHandleMultiDispatch`` @5.x: not a
    retry topic, not a system topic, not the schedule topic."""
    return not (topic.startswith(RETRY_PREFIX) or topic.startswith(SYSTEM_TOPIC_PREFIX)
                or topic == SCHEDULE_TOPIC)


def java_split_comma(text: str) -> list[str]:
    """Java ``String.split(",")``: trailing empty strings are dropped."""
    parts = text.split(",")
    while parts and parts[-1] == "":
        parts.pop()
    return parts or [""] if text == "" else parts


class LmqTargets(list):
    """The (queue name, queue id, queue offset) units LMQ dispatch adds for a record, in
    dispatch order; ``problem`` names why dispatch stopped early or wrote nothing."""

    problem: str | None = None


def lmq_targets(topic: str, properties: Mapping[str, str], queue_id: int, *,
                enable_lmq: bool = True, multi_dispatch: bool = True) -> LmqTargets:
    """The extra ConsumeQueue units dispatch writes for one record (design-14 §5.2,
    ``ConsumeQueue#multiDispatchLmqQueue`` @5.x): with multi-dispatch on, an allowed topic
    and both INNER_MULTI_DISPATCH and INNER_MULTI_QUEUE_OFFSET non-blank, the names and
    offsets split on ``,`` pair up (lengths differ: none); names holding ``/`` are skipped;
    queue id 0 for ``%LMQ%`` names when LMQ is on, else the record's. An offset Java cannot
    parse stops dispatch there (``problem`` says so)."""
    out = LmqTargets()
    if not multi_dispatch or not topic_allows_lmq(topic):
        return out
    names, offsets = properties.get(INNER_MULTI_DISPATCH), properties.get(INNER_MULTI_QUEUE_OFFSET)
    if not names or not names.strip() or not offsets or not offsets.strip():
        return out
    names_, offsets_ = java_split_comma(names), java_split_comma(offsets)
    if len(names_) != len(offsets_):
        out.problem = (f"{INNER_MULTI_DISPATCH} names {len(names_)} queue(s) but "
                       f"{INNER_MULTI_QUEUE_OFFSET} holds {len(offsets_)} offset(s)")
        return out
    for name, text in zip(names_, offsets_):
        if "/" in name:
            continue
        offset = java_parse_long(text)
        if offset is None:
            out.problem = f"{INNER_MULTI_QUEUE_OFFSET} value {text!r} for {name!r} is not a number"
            return out
        qid = 0 if enable_lmq and name.startswith(LMQ_PREFIX) else queue_id
        out.append((name, qid, offset))
    return out


def lmq_wrap_applies(topic: str, properties: Mapping[str, str], *, enable_lmq: bool) -> bool:
    """Does a 5.x store's append wrap the message for LMQ (design-14 §5.1,
    ``MessageExtBrokerInner#needDispatchLMQ`` @5.x): LMQ on, an allowed topic, a non-blank
    INNER_MULTI_DISPATCH."""
    names = properties.get(INNER_MULTI_DISPATCH)
    return bool(enable_lmq and names and names.strip() and topic_allows_lmq(topic))


def lmq_wrap(topic: str, properties: Mapping[str, str], next_offset, *,
             enable_lmq: bool) -> tuple[str, list[str]] | None:
    """What a 5.x store's append adds to an LMQ message (design-14 §5.1,
    ``LmqDispatch#wrapLmqDispatch`` @5.x) when :func:`lmq_wrap_applies`: the
    INNER_MULTI_QUEUE_OFFSET value (the next offset of queue ``(name, 0)`` for each
    ``%LMQ%`` name, ``next_offset(name)``; ``null`` for another name, in the names' order)
    and the ``%LMQ%`` names whose offsets then advance by one (``updateLmqOffsets``).
    None when the store adds nothing."""
    if not lmq_wrap_applies(topic, properties, enable_lmq=enable_lmq):
        return None
    parts = java_split_comma(properties[INNER_MULTI_DISPATCH])
    lmq = [n for n in parts if n.startswith(LMQ_PREFIX)]
    return ",".join(str(next_offset(n)) if n.startswith(LMQ_PREFIX) else "null"
                    for n in parts), lmq


def lmq_refusal(topic: str, properties: Mapping[str, str], batch_cq: bool, *,
                enable_lmq: bool, multi_dispatch: bool) -> str | None:
    """Why rmqstore refuses a message for its LMQ properties, or None. A broker would
    store these and leave its queues inconsistent (never make a store worse): an LMQ
    message to a BatchCQ topic (its offsets advance, but a BatchConsumeQueue dispatches no
    LMQ units, design-14 §4.2), one naming a queue that is not ``%LMQ%`` (offset ``null``)
    or an ``%LMQ%`` queue twice (two offsets taken, one unit written), and a client-set INNER_MULTI_QUEUE_OFFSET that dispatch would use
    because the store does not wrap (enableLmq off)."""
    if lmq_wrap_applies(topic, properties, enable_lmq=enable_lmq):
        if batch_cq:
            return f"{INNER_MULTI_DISPATCH} on a BatchCQ topic: LMQ dispatches no BatchConsumeQueue record"
        names = java_split_comma(properties[INNER_MULTI_DISPATCH])
        other = [n for n in names if not n.startswith(LMQ_PREFIX)]
        if other:
            return (f"{INNER_MULTI_DISPATCH} names {other[0]!r}, not an {LMQ_PREFIX} queue: its "
                    "offset would be stored as null, which dispatch cannot read")
        if len(set(names)) != len(names):
            return f"{INNER_MULTI_DISPATCH} names an LMQ queue twice"
    elif not batch_cq and lmq_targets(topic, properties, 0, enable_lmq=enable_lmq,
                                      multi_dispatch=multi_dispatch):
        return f"{INNER_MULTI_QUEUE_OFFSET} is the store's to assign (enableLmq is off)"
    return None
