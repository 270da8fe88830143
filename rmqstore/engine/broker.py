"""Incoming messages: the append input format, and what a broker does to a message.

:func:`message_from_json` turns one object of the message JSON (the keys ``rmqstore
dump`` prints, see docs/engine.md) into a :class:`~rmqstore.format.message.Message` in its stored
form, validating every field first so a bad line is rejected before anything is written.

:func:`as_broker` applies the broker's own changes to an incoming message, as a 4.9.8 or
5.3.3 broker makes them before the store sees it (spec §3.2, §3.4, §5.2, §13): a
``UNIQ_KEY`` when the client sent none, the delay rewrite into ``SCHEDULE_TOPIC_XXXX``
(§6.1) with ``REAL_TOPIC``/``REAL_QID``, ``CLUSTER`` (and in 5.x ``MSG_REGION`` and
``TRACE_ON``), 4.9's removal of ``WAIT``, the store host, and properties serialised in
the iteration order of the broker's Java ``HashMap`` (§14.3).
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import itertools
import os
import random
from typing import Any

from ..format import layout as L
from ..format.rules import SCHEDULE_TOPIC, gets_cq_unit
from ..format.message import Host, Message, client_msg_id, parse_properties
from ..format.hashing import hashmap_order, java_hash  # noqa: F401 - hashmap_order: its home moved to format
from ..format.message import serialize_properties
from ..format.record import INNER_BATCH_FLAGS
from ..format.rules import INNER_NUM, java_length
from ..files.config import StoreConfig
from ..errors import InputError
from .results import PutResult, PutStatus

_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)
_INT_FIELDS = {
    "queueId": ("queue_id", _I32), "flag": ("flag", _I32), "sysFlag": ("sys_flag", _I32),
    "bornTimestamp": ("born_timestamp", _I64), "storeTimestamp": ("store_timestamp", _I64),
    "reconsumeTimes": ("reconsume_times", _I32),
    "preparedTransactionOffset": ("prepared_transaction_offset", _I64),
}


def _int(obj: dict, key: str, bounds) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{key} must be a whole number, got {v!r}")
    if not bounds[0] <= v <= bounds[1]:
        raise InputError(f"{key} {v} is out of range")
    return v


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise InputError(f"{what} must be a string, got {type(v).__name__}")
    return v


def _body(obj: dict) -> bytes:
    # storedBody: the stored (compressed) bytes a dump gives beside a decompressed body.
    for name in ("storedBody", "bodyBase64"):
        if name in obj and obj[name] is not None:
            try:
                return base64.b64decode(_text(obj[name], name), validate=True)
            except binascii.Error:
                raise InputError(f"{name} is not valid base64") from None
    body = obj.get("body")
    if body is None:
        return b""
    body = _text(body, "body")
    enc = obj.get("bodyEncoding") or "text"
    try:
        if enc == "base64":
            return base64.b64decode(body, validate=True)
        if enc == "hex":
            return bytes.fromhex(body)
        if enc == "text":
            charset = obj.get("bodyCharset") or "utf-8"
            return body.encode(charset, "surrogatepass" if charset == "utf-8" else "strict")
    except LookupError:
        raise InputError(f"unknown bodyCharset {obj.get('bodyCharset')!r}") from None
    except (binascii.Error, ValueError, UnicodeError):
        raise InputError(f"body is not valid {enc}") from None
    raise InputError(f"bodyEncoding must be base64, text or hex, got {enc!r}")


def _properties(obj: dict, what: str = "") -> tuple[dict[str, str] | None, str | None]:
    """(``properties`` checked, ``propertiesText``) of a message-JSON object."""
    props = obj.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise InputError(f"{what}properties must be an object of name: value strings")
        for k, v in props.items():
            if v is not None:
                _text(v, f"{what}property {k!r}")
            if not k or any(c in k + (v or "") for c in "\x01\x02"):
                raise InputError(f"{what}property {k!r} has an empty name or a \\x01/\\x02 separator")
        props = {k: v for k, v in props.items() if v is not None}
    text = obj.get("propertiesText")
    return props, None if text is None else _text(text, f"{what}propertiesText")


def _inner_batch_body(entries: Any, config: StoreConfig) -> bytes:
    """The body of an inner-batch record from the ``batch`` list of a message-JSON object:
    each entry (``flag``, a body as a message's, ``properties`` or ``propertiesText``)
    encoded as the client's ``MessageDecoder#encodeMessages`` does (spec §3.7)."""
    from ..format.message import serialize_properties
    from ..format.record import encode_batch_entry

    if not isinstance(entries, list) or not entries:
        raise InputError("batch must be a non-empty list of message objects")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise InputError(f"batch[{i}] must be a JSON object")
        flag = _int(e, "flag", _I32) or 0
        props, text = _properties(e, f"batch[{i}] ")
        if text is None:
            text = serialize_properties(props or {}, config.trailing_separator)
        out.append(encode_batch_entry(_body(e), text, flag))
    return b"".join(out)


def message_from_json(obj: Any, config: StoreConfig, *, now: int) -> Message:
    """A Message from one message-JSON object; :class:`InputError` says what is wrong.

    Absent timestamps become ``now``, an absent born host 127.0.0.1:0 and an absent store
    host ``brokerIP1:listenPort``. ``propertiesText`` wins over ``properties``.
    ``batch`` (a list of message objects: flag, body, properties) makes the message an
    inner batch (RocketMQ 5.x BatchCQ topics, design-14 §4.3): its body is the entries as
    a client encodes a batch, sysFlag gets 0x40|0x80 and INNER_NUM the entry count.
    """
    if not isinstance(obj, dict):
        raise InputError("a message must be a JSON object")
    topic = obj.get("topic")
    if not isinstance(topic, str) or not topic:
        raise InputError("topic is required (a non-empty string)")
    if any(c in topic for c in "\x00\x01\x02"):
        raise InputError("topic contains control characters")
    batch = obj.get("batch")
    if batch is not None:
        if any(obj.get(k) is not None for k in ("body", "bodyBase64", "storedBody")):
            raise InputError("give the body of an inner batch as its batch entries, not body")
        m = Message(topic=topic, body=_inner_batch_body(batch, config))
    else:
        m = Message(topic=topic, body=_body(obj))
    for key, (attr, bounds) in _INT_FIELDS.items():
        v = _int(obj, key, bounds)
        if v is not None:
            setattr(m, attr, v)
    if obj.get("bornTimestamp") is None:
        m.born_timestamp = now
    if obj.get("storeTimestamp") is None:
        m.store_timestamp = now
    m.born_host = Host.parse(_text(obj["bornHost"], "bornHost")) if obj.get("bornHost") \
        else Host(b"\x7f\x00\x00\x01", 0)
    m.store_host = Host.parse(_text(obj["storeHost"], "storeHost")) if obj.get("storeHost") \
        else store_host(config)
    props, text = _properties(obj)
    if props is not None:
        m.properties = props
    if text is not None:
        m.properties_text = text
        m.properties = parse_properties(m.properties_text)
    if batch is not None:
        n = str(len(batch))
        given = m.properties.get(INNER_NUM)
        if given is not None and given != n:
            raise InputError(f"{INNER_NUM} {given!r} disagrees with the {n} batch entries")
        m.sys_flag |= INNER_BATCH_FLAGS
        if given is None:
            if m.properties_text is not None:
                m.properties_text = serialize_properties(
                    list(m.properties.items()) + [(INNER_NUM, n)], config.trailing_separator)
            m.properties = {**m.properties, INNER_NUM: n}
    if config.broker_version != "4.9" and obj.get("magic") == "v2":
        m.magic = L.MAGIC_V2  # a 5.x record written with v2 although its topic is short
    return m


def store_host(config: StoreConfig) -> Host:
    return Host.parse(f"[{config.broker_ip1}]:{config.listen_port}" if ":" in config.broker_ip1
                      else f"{config.broker_ip1}:{config.listen_port}")


# --- UNIQ_KEY (spec §5.2) ----------------------------------------------------------------

_counter = itertools.count(random.randrange(1 << 16))
_loader_hash = random.getrandbits(31)


def new_uniq_key(ip: bytes, now: int) -> str:
    """A client-style message id for this process now: the month starts in local time."""
    local = _dt.datetime.fromtimestamp(now / 1000).astimezone()
    month = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return client_msg_id(ip, os.getpid(), _loader_hash, now - int(month.timestamp() * 1000),
                     next(_counter))


# --- the broker's serialisation (Java HashMap order: format.hashing.hashmap_order) ----------


def _serialize(props: dict[str, str], order: list[str], trailing: bool) -> str:
    text = "\x02".join(f"{k}\x01{props[k]}" for k in order if props.get(k) is not None)
    return text + "\x02" if trailing and text else text


def broker_hook_refusal(topic: str, config: StoreConfig) -> str | None:
    """Why a broker refuses a client's send to ``topic`` before the store sees it, or None
    (spec §3.6): the send check (``TopicValidator``: more than 127 characters), then, in
    5.x, the put hook (``HookUtils#checkBeforePutMessage``: more than 127 UTF-8 bytes, 255
    for %RETRY% topics, which only the broker's own send-back writes)."""
    if java_length(topic) > 127:
        return "the topic is longer than the topic max length (127)"
    if config.broker_version != "4.9":
        n = len(topic.encode("utf-8", "surrogatepass"))
        if n > 255 or (n > 127 and not topic.startswith("%RETRY%")):
            return "topic is too long"
    return None


def put_as_broker(store, msg: Message, config: StoreConfig, *, now: int,
                  send_context: bool = True, stamp: bool = True):
    """Put ``msg`` as a broker would: its put hook first (a refusal is a MESSAGE_ILLEGAL
    result and nothing is written), then :func:`as_broker`'s changes, then the store,
    which stamps STORETIMESTAMP under its lock (``stamp=False`` keeps ``now``)."""
    why = broker_hook_refusal(msg.topic, config)
    if why is not None:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, reason=why)
    return store.put(as_broker(msg, config, now=now, send_context=send_context), stamp=stamp)


def as_broker(msg: Message, config: StoreConfig, *, now: int, send_context: bool = True) -> Message:
    """What the broker does to ``msg`` before storing it (see module doc). Mutates and
    returns ``msg``; its ``properties_text`` is set to the broker's serialisation.

    ``send_context``: 5.x adds ``MSG_REGION`` and ``TRACE_ON`` while it builds the send
    context of a client request (``AbstractSendMessageProcessor#buildMsgContext``, spec
    §12.3); a put that does not come through that request handler (RocketMQ's own
    fixtures were written that way) has neither."""
    v5 = config.broker_version != "4.9"
    props = dict(msg.properties)  # insertion order = incoming text order
    max_size = len(props)
    if "UNIQ_KEY" not in props:
        props["UNIQ_KEY"] = new_uniq_key(store_host(config).address, now)
    props["CLUSTER"] = config.broker_cluster_name
    if v5 and send_context:
        props.setdefault("MSG_REGION", config.region_id)
        props.setdefault("TRACE_ON", "true" if config.trace_on else "false")
    max_size = max(max_size, len(props))
    msg.store_host = store_host(config)
    msg.store_timestamp = now
    delay = props.get("DELAY")
    rewritten = False
    # Only records dispatch will give a unit are delayed (not PREPARED, not ROLLBACK).
    if delay is not None and gets_cq_unit(msg.sys_flag):
        try:
            level = int(delay)
        except ValueError:
            level = 0
        if level > 0:
            level = min(level, len(config.delay_millis))
            props["DELAY"] = str(level)
            props["REAL_TOPIC"] = msg.topic
            props["REAL_QID"] = str(msg.queue_id)
            msg.topic, msg.queue_id = SCHEDULE_TOPIC, level - 1
            rewritten = True
    max_size = max(max_size, len(props))
    if not v5 and not rewritten:
        # 4.9 strips WAIT from what it stores for single sends; the delay path re-serialises
        # the whole map, WAIT included (spec §3.4, fixtures/special).
        props.pop("WAIT", None)
    order = hashmap_order(list(props), 128 if v5 else 16, max_size)
    msg.properties = props
    msg.properties_text = _serialize(props, order, config.trailing_separator)
    return msg
