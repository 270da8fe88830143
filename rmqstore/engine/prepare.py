"""A message made ready for the appender: checked against the limits of spec §3.6 in the
broker's order (a failed check is a returned :class:`~rmqstore.engine.results.PutResult`,
never an exception) and its variable part encoded (§3.1) outside the append lock, with
:mod:`rmqstore.format.record`'s encoder halves; the appender adds the fixed part."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..files.config import StoreConfig
from ..files.names import shown, topic_problem
from ..format import layout as L
from ..format.crc import body_crc
from ..format.message import Message, parse_properties, serialize_properties, without_prop_crc
from ..format.record import record_tail, topic_field
from ..format.rules import java_length, magic_for, topic_field_refusal
from .results import PutResult, PutStatus

_HOST_BITS = L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6
_SHORT_MAX = 32767
#: Properties up to this many UTF-8 bytes pass both §3.6 properties rules (4.9's 32767
#: Java characters, the 32767-byte PROPERTIESLENGTH) without measuring: the fast paths'
#: limit; longer ones take prepare().
FAST_PROPS_MAX = 16383


def topic_length_refusal(topic: str, topic_b: bytes, v5: bool) -> str | None:
    """Why the store refuses the topic's length (spec §3.6), or None. 4.9's
    DefaultMessageStore counts Java characters (127). A 5.x store writes a longer topic
    with magic v2 and its 2-byte length (§3.2), so it refuses only what that field cannot
    hold (:func:`~rmqstore.format.rules.topic_field_refusal`, once the magic is known);
    the 5.x broker's own limits (127 UTF-8 bytes, 255 for %RETRY%) are a put hook
    the broker runs before the store (:func:`~rmqstore.engine.broker.broker_hook_refusal`):
    RocketMQ 5.3.3 stored 128- and 255-byte plain topics put with its hooks off (the
    long-topics fixture)."""
    if not v5:
        if java_length(topic) > 127:
            return "topic is longer than 127 characters"
    return None


@dataclass(slots=True)
class Prepared:
    """A message checked and encoded up to the fields the append lock assigns."""

    msg: Message
    key: tuple[bool, bool]  # (born host v6, store host v6): which fixed layout
    magic: int
    sys_flag: int
    crc: int
    total: int
    tail: bytes  # body, topic and properties with their length fields
    properties: dict = field(default_factory=dict)
    prop_crc: bool = False  # the tail ends in room for the __CRC32# entry (spec §3.8)


def prepare(msg: Message, config: StoreConfig) -> Prepared | PutResult:
    """Check ``msg`` against the limits in the broker's order and encode its variable part
    (spec §3.6). Returns a failed :class:`PutResult` instead of raising."""
    v5 = config.broker_version != "4.9"
    topic = msg.topic
    topic_b = topic.encode("utf-8", "replace")
    text = msg.properties_text
    why = topic_length_refusal(topic, topic_b, v5)
    if why is not None:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=why)
    if not v5 and msg.magic == L.MAGIC_V2:
        # 4.9's DefaultMessageStore checks Java lengths, then the magic: MESSAGE_ILLEGAL.
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="magic v2 is unknown to a 4.9 store")
    why = topic_problem(topic)
    if why is not None:
        # The topic becomes consumequeue/{topic}/ (spec §6.1): it must be one safe name.
        return PutResult(PutStatus.MESSAGE_ILLEGAL,
                         reason=f"topic {shown(topic)} cannot be a directory name ({why})")
    if text is None:
        props = msg.properties
        text = serialize_properties(props, config.trailing_separator) if props else ""
    else:
        props = None
    prop_crc = config.enabled_append_prop_crc
    if prop_crc:
        text = without_prop_crc(text)
    if not v5 and len(text) > _SHORT_MAX // 2 and java_length(text) > _SHORT_MAX:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason="properties are longer than 32767 characters")
    props_b = text.encode("utf-8", "replace")
    if prop_crc:  # filled in once the record's offsets are known (CommitLogAppender._encode)
        props_b += bytes(L.PROP_CRC_ENTRY_SIZE)
    if len(props_b) > _SHORT_MAX:
        return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                         reason=f"properties are {len(props_b)} bytes, more than 32767")
    body = msg.body or b""
    if len(body) > config.max_message_size:
        return PutResult(PutStatus.MESSAGE_ILLEGAL,
                         reason=f"body is {len(body)} bytes, more than maxMessageSize {config.max_message_size}")
    magic = magic_for(topic, msg.magic, auto=v5)  # 4.9 refused v2 above
    why = topic_field_refusal(topic_b, magic)
    if why is not None:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=why)
    born6, store6 = msg.born_host.is_v6, msg.store_host.is_v6
    sys_flag = (msg.sys_flag & ~_HOST_BITS) | (L.SYSFLAG_BORNHOST_V6 if born6 else 0) | (
        L.SYSFLAG_STOREHOST_V6 if store6 else 0)
    total = L.record_size(sys_flag, magic, len(body), len(topic_b), len(props_b))
    if total > config.max_message_size + 65536:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=f"record of {total} bytes is over the limit")
    if total + L.END_FILE_MIN_BLANK_LENGTH > config.mapped_file_size_commit_log:
        # The broker would write a BLANK over a whole fresh segment and fail; refuse early.
        return PutResult(PutStatus.MESSAGE_ILLEGAL,
                         reason=f"record of {total} bytes cannot fit a {config.mapped_file_size_commit_log}-byte segment")
    tail = record_tail(body, topic_field(topic_b, magic), props_b)
    if props is None or prop_crc:
        props = parse_properties(text)
    return Prepared(msg, (born6, store6), magic, sys_flag, body_crc(body), total, tail, props,
                    prop_crc)
