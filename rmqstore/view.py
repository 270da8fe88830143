"""Messages and units as plain dicts: the message JSON every command and script shares.

Keys are fixed (see docs/reading.md): ``commitLogOffset, storeSize, magic, bodyCRC, queueId,
flag, queueOffset, sysFlag, bornTimestamp, bornHost, storeTimestamp, storeHost,
reconsumeTimes, preparedTransactionOffset, topic, properties, tags, keys, uniqKey,
offsetMsgId, body``, then the body's companions (:func:`body_fields`:
``bodyEncoding`` whenever a body is given; ``bodyCharset``, ``bodyCompression``,
``storedBody``, ``bodyNote``, ``bodyFile`` only when they apply), ``propertiesText`` when the
properties object cannot reproduce the stored text (duplicate names, as batch records have,
or malformed pairs), and last ``crcOk`` (the stored body matches BODYCRC) and
``uniqKeyInfo`` (the UNIQ_KEY taken apart, :mod:`rmqstore.uniqkey`; null without one), and
for a message unwrapped from an inner-batch record (RocketMQ 5.x BatchCQ topics)
``innerBatch``: ``{index, count, entrySize}`` (design-14 §4.3).

Body modes: ``text`` (decoded in a charset; a body that is not valid text in it is given
as base64 instead, and ``bodyEncoding`` says so), ``base64``, ``hex``, ``none``, and ``raw``
(the stored bytes, not decompressed, as base64: what BODYCRC covers). Compressed bodies
are decompressed first (:mod:`rmqstore.format.compression`); :class:`BodyDir` writes each
body to a file named by the record's offsetMsgId.
"""

from __future__ import annotations

import base64
import codecs
import os
from pathlib import Path
from typing import Any

from .format import layout as L
from .format.compression import DecodedBody, compression_of, decode_body as decompress_body
from .format.message import (Host, Message, is_offset_msg_id, offset_msg_id_at,
                              offset_msg_id_prefix, properties_need_text)
from .format.crc import body_crc
from .errors import InputError, StoreIOError
from .uniqkey import uniq_key_info

#: Every key a message object can have, in order (csv columns, docs); the body's
#: companions, propertiesText and store appear only when they apply.
MESSAGE_FIELDS = ("commitLogOffset", "storeSize", "magic", "bodyCRC", "queueId", "flag",
                  "queueOffset", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp",
                  "storeHost", "reconsumeTimes", "preparedTransactionOffset", "topic",
                  "properties", "tags", "keys", "uniqKey", "offsetMsgId", "body",
                  "bodyEncoding", "bodyCharset", "bodyCompression", "storedBody", "bodyNote",
                  "bodyFile", "propertiesText", "crcOk", "uniqKeyInfo", "innerBatch", "store")


BODY_MODES = ("text", "base64", "hex", "none", "raw")


def check_charset(charset: str) -> str:
    """The canonical codec name, or :class:`InputError` for an unknown charset."""
    try:
        return codecs.lookup(charset).name
    except LookupError:
        raise InputError(f"unknown charset {charset!r} (utf-8, gbk, latin-1, ...)") from None


def check_mode(mode: str) -> str:
    if mode not in BODY_MODES:
        raise InputError(f"body mode must be one of {', '.join(BODY_MODES)}, got {mode!r}")
    return mode


def render(data: bytes, mode: str, charset: str = "utf-8") -> tuple[str | None, str | None]:
    """(value, bodyEncoding) for ``data`` in ``mode`` (``raw`` is base64 here; which bytes
    are given is the caller's choice). ``text`` that does not decode strictly in
    ``charset`` comes back as base64, labelled so."""
    if mode == "none":
        return None, None
    if mode == "text":
        try:
            return data.decode(charset), "text"
        except UnicodeDecodeError:
            return base64.b64encode(data).decode("ascii"), "base64"
    if mode == "hex":
        return data.hex(), "hex"
    return base64.b64encode(data).decode("ascii"), "base64"


def body_fields(stored: bytes, sys_flag: int, mode: str, charset: str = "utf-8",
                sink=None, msg_id: str | None = None) -> dict:
    """The body part of the message JSON (see :func:`message_dict`), in key order:
    ``body``, ``bodyEncoding``, ``bodyCharset`` (text in a charset other than UTF-8),
    ``bodyCompression`` (compressed records), ``storedBody`` (base64 of the stored bytes,
    whenever ``body`` was decompressed, so the object stays lossless), ``bodyNote`` (a body
    that could not be decompressed), ``bodyFile`` (where ``sink`` wrote it)."""
    kind = compression_of(sys_flag)
    if mode == "raw" or (kind is None and sink is None):
        dec = DecodedBody(stored, kind, False)
    else:
        dec = decompress_body(stored, sys_flag)
    value, enc = render(dec.data, mode, charset)
    out: dict = {"body": value}
    if enc is not None:
        out["bodyEncoding"] = enc
        if enc == "text" and charset not in ("utf-8", "utf_8"):
            out["bodyCharset"] = charset
    if kind is not None:
        out["bodyCompression"] = kind
        if dec.decompressed and mode != "none":
            out["storedBody"] = base64.b64encode(stored).decode("ascii")
        if dec.note and mode != "raw":
            out["bodyNote"] = dec.note
    if sink is not None and msg_id is not None:
        out["bodyFile"] = sink(msg_id, dec.data)
    return out


class BodyDir:
    """Writes each body to ``DIR/<offsetMsgId>``: the name is the hex id the store
    derives, never text from disk, and the file is created next to its final name and
    renamed over it, so a symlink planted at the name is replaced, never followed."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreIOError(f"cannot create the body directory: {e.strerror}", self.dir,
                               errno=e.errno) from None
        if not self.dir.is_dir():
            raise InputError("not a directory", self.dir)

    def __call__(self, msg_id: str, data: bytes) -> str:
        name = msg_id.upper()
        if not is_offset_msg_id(name):
            raise InputError(f"refusing body file name {msg_id!r}: not an offsetMsgId")
        final = self.dir / name
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise StoreIOError(f"cannot write body file: {e.strerror}", final, errno=e.errno) from None
        return str(final)


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

    ``body`` is a mode of :data:`BODY_MODES` (compressed bodies are decompressed except
    in ``raw``), ``charset`` the text mode's charset, ``tz`` the zone UNIQ_KEY times are
    read in, ``sink`` a :class:`BodyDir` that also writes each body out."""
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
    ib = msg.inner_batch
    # An unwrapped message's body is its entry's; BODYCRC covers the record's (§4.3).
    d["crcOk"] = ib.record_crc_ok if ib is not None else (
        not msg.body or body_crc(msg.body) == msg.body_crc)
    d["uniqKeyInfo"] = uniq_key_info(msg.uniq_key, msg.store_timestamp, tz)
    if ib is not None:
        d["innerBatch"] = {"index": ib.index, "count": ib.count, "entrySize": ib.entry_size}
    return d


def message_dicts(cols, body: str = "base64", indices=None, *, charset: str = "utf-8",
                  tz=None, sink=None):
    """Message JSON objects for records of a :class:`~rmqstore.scan.records.RecordColumns`, the
    same as :func:`message_dict` of each decoded record but built from the gathered
    columns: per record only the properties and body are decoded; topics, hosts and
    offsetMsgId prefixes come from small caches; body CRCs are checked vectorised."""
    import numpy as np

    from .times import resolve_tz

    from .format.message import parse_properties, split_keys

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
                    cols.crc_ok(chunk).tolist(), chunk.tolist()]
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
                prefix = prefixes[skey] = offset_msg_id_prefix(cols.host("store_host", i))
            text = mv[ppos:ppos + plen].tobytes().decode("utf-8", "replace")
            props = parse_properties(text)
            d = {
                "commitLogOffset": phys, "storeSize": size, "magic": "v2" if magic == v2 else "v1",
                "bodyCRC": crc, "queueId": qid, "flag": flag, "queueOffset": qoff, "sysFlag": sysf,
                "bornTimestamp": born_ts, "bornHost": born, "storeTimestamp": store_ts,
                "storeHost": store, "reconsumeTimes": recon, "preparedTransactionOffset": prep,
                "topic": names[tid], "properties": props, "tags": props.get("TAGS"),
                "keys": split_keys(props.get("KEYS")), "uniqKey": props.get("UNIQ_KEY"),
                "offsetMsgId": offset_msg_id_at(prefix, phys),
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
