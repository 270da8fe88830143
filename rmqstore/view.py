"""Messages and units as plain dicts: the message JSON every command and script shares.

Keys are fixed (see docs/reading.md): ``commitLogOffset, storeSize, magic, bodyCRC, queueId,
flag, queueOffset, sysFlag, bornTimestamp, bornHost, storeTimestamp, storeHost,
reconsumeTimes, preparedTransactionOffset, topic, properties, tags, keys, uniqKey,
offsetMsgId, body``, then the body's companions (:func:`rmqstore.bodies.body_fields`:
``bodyEncoding`` whenever a body is given; ``bodyCharset``, ``bodyCompression``,
``storedBody``, ``bodyNote``, ``bodyFile`` only when they apply), ``propertiesText`` when the
properties object cannot reproduce the stored text (duplicate names, as batch records have,
or malformed pairs), and last ``crcOk`` (the stored body matches BODYCRC) and
``uniqKeyInfo`` (the UNIQ_KEY taken apart, :mod:`rmqstore.uniqkey`; null without one).
"""

from __future__ import annotations

import base64
from typing import Any

from . import layout as L
from .bodies import BODY_MODES, body_fields
from .codec import Host, Message, body_crc, properties_need_text
from .uniqkey import uniq_key_info

#: Every key a message object can have, in order (csv columns, docs); the body's
#: companions, propertiesText and store appear only when they apply.
MESSAGE_FIELDS = ("commitLogOffset", "storeSize", "magic", "bodyCRC", "queueId", "flag",
                  "queueOffset", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp",
                  "storeHost", "reconsumeTimes", "preparedTransactionOffset", "topic",
                  "properties", "tags", "keys", "uniqKey", "offsetMsgId", "body",
                  "bodyEncoding", "bodyCharset", "bodyCompression", "storedBody", "bodyNote",
                  "bodyFile", "propertiesText", "crcOk", "uniqKeyInfo", "store")


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


def message_dict(msg: Message, body: str = "base64", *, charset: str = "utf-8", tz=None,
                 sink=None) -> dict[str, Any]:
    """The message JSON object for one record, keys in the documented order.

    ``body`` is a mode of :mod:`rmqstore.bodies` (compressed bodies are decompressed except
    in ``raw``), ``charset`` the text mode's charset, ``tz`` the zone UNIQ_KEY times are
    read in, ``sink`` a :class:`~rmqstore.bodies.BodyDir` that also writes each body out."""
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
    }
    d.update(body_fields(msg.body, msg.sys_flag, body, charset, sink, d["offsetMsgId"]))
    if msg.properties_text is not None and properties_need_text(msg.properties, msg.properties_text):
        d["propertiesText"] = msg.properties_text
    d["crcOk"] = not msg.body or body_crc(msg.body) == msg.body_crc
    d["uniqKeyInfo"] = uniq_key_info(msg.uniq_key, msg.store_timestamp, tz)
    return d


def message_dicts(cols, body: str = "base64", indices=None, *, charset: str = "utf-8",
                  tz=None, sink=None):
    """Message JSON objects for records of a :class:`~rmqstore.scan.RecordColumns`, the
    same as :func:`message_dict` of each decoded record but built from the gathered
    columns: per record only the properties and body are decoded; topics, hosts and
    offsetMsgId prefixes come from small caches; body CRCs are checked vectorised."""
    import numpy as np

    from .times import resolve_tz

    from .codec import parse_properties, split_keys

    idx = np.arange(len(cols)) if indices is None else np.asarray(indices)
    if len(idx) == 0:
        return
    names, tids = cols.topic_table()
    mv = memoryview(cols.u8)
    born_keys, store_keys = cols.host_keys("born_host"), cols.host_keys("store_host")
    born_text: dict = {}
    store_text: dict = {}
    prefixes: dict = {}
    fields = ("size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
              "sys_flag", "born_timestamp", "store_timestamp", "reconsume_times",
              "prepared_transaction_offset", "physical_offset", "body_pos", "body_len",
              "props_pos", "props_len")
    v2 = L.MAGIC_V2
    zone = resolve_tz(tz)
    for start in range(0, len(idx), 8192):
        chunk = idx[start:start + 8192]
        columns = [getattr(cols, f)[chunk].tolist() for f in fields]
        columns += [tids[chunk].tolist(), born_keys[chunk].tolist(), store_keys[chunk].tolist(),
                    cols.take(chunk).crc_ok().tolist(), chunk.tolist()]
        for (size, magic, crc, qid, flag, qoff, sysf, born_ts, store_ts, recon, prep, phys,
             bpos, blen, ppos, plen, tid, bkey, skey, crc_ok, i) in zip(*columns):
            born = born_text.get(bkey)
            if born is None:
                born = born_text[bkey] = str(cols.host("born_host", i))
            store = store_text.get(skey)
            if store is None:
                store = store_text[skey] = str(cols.host("store_host", i))
            prefix = prefixes.get(skey)
            if prefix is None:
                h = cols.host("store_host", i)
                prefix = prefixes[skey] = h.address + h.port.to_bytes(4, "big", signed=True)
            text = mv[ppos:ppos + plen].tobytes().decode("utf-8", "replace")
            props = parse_properties(text)
            d = {
                "commitLogOffset": phys, "storeSize": size, "magic": "v2" if magic == v2 else "v1",
                "bodyCRC": crc, "queueId": qid, "flag": flag, "queueOffset": qoff, "sysFlag": sysf,
                "bornTimestamp": born_ts, "bornHost": born, "storeTimestamp": store_ts,
                "storeHost": store, "reconsumeTimes": recon, "preparedTransactionOffset": prep,
                "topic": names[tid], "properties": props, "tags": props.get("TAGS"),
                "keys": split_keys(props.get("KEYS")), "uniqKey": props.get("UNIQ_KEY"),
                "offsetMsgId": (prefix + phys.to_bytes(8, "big", signed=True)).hex().upper(),
            }
            d.update(body_fields(mv[bpos:bpos + blen].tobytes(), sysf, body, charset, sink,
                                 d["offsetMsgId"]))
            if properties_need_text(props, text):
                d["propertiesText"] = text
            d["crcOk"] = crc_ok
            d["uniqKeyInfo"] = uniq_key_info(d["uniqKey"], store_ts, zone)
            yield d


def unit_dict(queue_offset: int, commit_log_offset: int, size: int, tags_code: int) -> dict[str, int]:
    """A ConsumeQueue unit as printed: ``queueOffset, commitLogOffset, size, tagsCode``."""
    return {"queueOffset": queue_offset, "commitLogOffset": commit_log_offset,
            "size": size, "tagsCode": tags_code}


def host_text(host: Host) -> str:
    return str(host)
