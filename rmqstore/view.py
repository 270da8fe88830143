"""Messages and units as plain dicts: the message JSON every command and script shares.

Keys are fixed (see docs/cli.md): ``commitLogOffset, storeSize, magic, bodyCRC, queueId,
flag, queueOffset, sysFlag, bornTimestamp, bornHost, storeTimestamp, storeHost,
reconsumeTimes, preparedTransactionOffset, topic, properties, tags, keys, uniqKey,
offsetMsgId, body``. Two more appear only when needed to stay lossless: ``bodyEncoding``
whenever a body is given, and ``propertiesText`` when the properties object cannot
reproduce the stored text (duplicate names, as batch records have, or malformed pairs).
"""

from __future__ import annotations

import base64
from typing import Any

from . import layout as L
from .codec import Host, Message, properties_need_text

BODY_MODES = ("base64", "text", "hex", "none")


def encode_body(body: bytes, mode: str) -> str | None:
    if mode == "base64":
        return base64.b64encode(body).decode("ascii")
    if mode == "text":
        return body.decode("utf-8", "replace")
    if mode == "hex":
        return body.hex()
    return None


def decode_body(value: str, encoding: str) -> bytes:
    """Inverse of :func:`encode_body`; raises ValueError on bad input."""
    if encoding == "base64":
        return base64.b64decode(value, validate=True)
    if encoding == "hex":
        return bytes.fromhex(value)
    if encoding == "text":
        return value.encode("utf-8")
    raise ValueError(f"unknown bodyEncoding {encoding!r} (base64, text or hex)")


def message_dict(msg: Message, body: str = "base64") -> dict[str, Any]:
    """The message JSON object for one record, keys in the documented order."""
    d: dict[str, Any] = {
        "commitLogOffset": msg.commit_log_offset,
        "storeSize": msg.store_size,
        "magic": "v2" if msg.magic == L.MAGIC_V2 else "v1",
        "bodyCRC": msg.body_crc,
        "queueId": msg.queue_id,
        "flag": msg.flag,
        "queueOffset": msg.queue_offset,
        "sysFlag": msg.sys_flag,
        "bornTimestamp": msg.born_timestamp,
        "bornHost": str(msg.born_host),
        "storeTimestamp": msg.store_timestamp,
        "storeHost": str(msg.store_host),
        "reconsumeTimes": msg.reconsume_times,
        "preparedTransactionOffset": msg.prepared_transaction_offset,
        "topic": msg.topic,
        "properties": dict(msg.properties),
        "tags": msg.tags,
        "keys": msg.keys,
        "uniqKey": msg.uniq_key,
        "offsetMsgId": msg.offset_msg_id,
        "body": encode_body(msg.body, body),
    }
    if body != "none":
        d["bodyEncoding"] = body
    if msg.properties_text is not None and properties_need_text(msg.properties, msg.properties_text):
        d["propertiesText"] = msg.properties_text
    return d


def unit_dict(queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> dict[str, int]:
    """A ConsumeQueue unit as printed: ``queueOffset, commitLogOffset, size, tagsCode``."""
    return {"queueOffset": queue_offset, "commitLogOffset": commit_log_offset,
            "size": size, "tagsCode": tags_code}


def host_text(host: Host) -> str:
    return str(host)
