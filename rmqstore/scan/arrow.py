"""Arrow views of scanned records: the message JSON fields as typed columns (the Parquet
export schema) and the ConsumeQueue units the CommitLog implies (audit, rebuild-cq).

Plain numpy and pyarrow (imported inside the functions); no pyspark. The row for a
record equals :func:`rmqstore.view.message_dict` of it, field for field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..format import layout as L
from . import records as scan
from ..format.rules import SCHEDULE_TOPIC, gets_cq_unit, parse_delay_levels, tags_code
from ..format.message import Host, offset_msg_ids


# --- decoded columns (Arrow) ---------------------------------------------------------------

#: header, body, topic length, topic, properties length, properties, and what lies between
#: the properties' end and the next record (nothing on a record chain; a DLedger entry
#: header between the records of a DLedger log, design-14 D1).
_SPAN_PARTS = 7
_BODY, _TOPIC, _PROPS = 1, 3, 5


def _hosts(records: scan.RecordColumns) -> dict[str, np.ndarray]:
    """Born/store host address bytes (zero-padded to 16) and ports, at the offsets layout
    derives for each host-width combination (spec §3.1)."""
    n = len(records)
    out: dict[str, np.ndarray] = {}
    combo = records.combo
    for h in ("born_host", "store_host"):
        addr = np.zeros((n, 16), np.uint8)
        for c in np.unique(combo).tolist():
            key = (bool(c & 2), bool(c & 1))
            off, width = L.RECORD_FIXED_OFFSETS[key][f"{h}_address"]
            sel = np.flatnonzero(combo == c)
            addr[sel, :width] = records.u8[(records.pos[sel] + off)[:, None] + np.arange(width)]
        out[f"{h}_address"] = addr
        out[f"{h}_port"] = getattr(records, f"{h}_port")
    out["born_v6"] = (records.sys_flag & L.SYSFLAG_BORNHOST_V6) != 0
    out["store_v6"] = (records.sys_flag & L.SYSFLAG_STOREHOST_V6) != 0
    return out


def _host_strings(addr: np.ndarray, port: np.ndarray, v6: np.ndarray):
    """``ip:port`` / ``[v6]:port`` as Host prints them, formatted once per distinct
    host and gathered with Arrow ``take``."""
    import pyarrow as pa

    n = len(port)
    key = np.zeros((n, 24), np.uint8)
    key[:, :16] = addr
    key[:, 16:20] = port.astype(">i4").view(np.uint8).reshape(n, 4)
    key[:, 20] = v6
    keyv = np.ascontiguousarray(key).view(np.dtype((np.void, 24))).reshape(-1)
    uniq, inv = np.unique(keyv, return_inverse=True)
    texts = []
    for u in uniq:
        b = bytes(u)
        alen = 16 if b[20] else 4
        texts.append(str(Host(b[:alen], int.from_bytes(b[16:20], "big", signed=True))))
    return pa.array(texts, pa.string()).take(pa.array(inv.reshape(-1).astype(np.int32)))


def _offset_msg_ids(hosts: dict, phys: np.ndarray):
    """offsetMsgId (spec §5.1) of each record, as :func:`offset_msg_ids` spells it."""
    import pyarrow as pa

    offsets, data = offset_msg_ids(hosts["store_host_address"], hosts["store_host_port"],
                                   hosts["store_v6"], phys)
    return pa.Array.from_buffers(pa.string(), len(phys), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                          pa.py_buffer(data)])


def _spans(records: scan.RecordColumns):
    """A binary array over the window whose elements are each record's header, body,
    topic length, topic, properties length and properties, then the gap to the next
    record, back to back. ``take`` then gathers bodies or topics without a loop."""
    import pyarrow as pa

    n = len(records)
    cuts = np.empty((n, _SPAN_PARTS), np.int64)
    cuts[:, 0] = records.pos
    cuts[:, 1] = records.body_pos
    cuts[:, 2] = records.body_pos + records.body_len
    cuts[:, 3] = records.topic_pos
    cuts[:, 4] = records.topic_pos + records.topic_len
    cuts[:, 5] = records.props_pos
    cuts[:, 6] = records.props_pos + records.props_len
    offsets = np.empty(n * _SPAN_PARTS + 1, np.int64)
    offsets[:-1] = cuts.reshape(-1)
    offsets[-1] = records.props_pos[-1] + records.props_len[-1] if n else 0
    if n and offsets[-1] >= 2**31:
        offsets = offsets - int(offsets[0])
        data = pa.py_buffer(records.u8[int(records.pos[0]):])
    else:
        data = pa.py_buffer(records.u8)
    return pa.Array.from_buffers(pa.binary(), n * _SPAN_PARTS,
                                 [None, pa.py_buffer(offsets.astype(np.int32)), data])


def _part(spans, n: int, which: int):
    import pyarrow as pa

    return spans.take(pa.array(np.arange(n, dtype=np.int64) * _SPAN_PARTS + which))


def _utf8(binary):
    """binary -> string; invalid UTF-8 becomes U+FFFD as Python's ``replace`` does (record
    decoding's rule), taking the slow path only when the fast cast refuses."""
    import pyarrow as pa

    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace")
                         for v in binary.to_pylist()], pa.string())


@dataclass
class ParsedProperties:
    """Properties of many records parsed exactly like :func:`~rmqstore.format.message.parse_properties`."""

    text: object  # pa.StringArray
    names: object  # pa.StringArray, one per kept pair, record-major, stored order
    values: object
    owner: np.ndarray  # record index of each pair
    offsets: np.ndarray  # map offsets (n + 1)
    need_text: np.ndarray  # bool: the map cannot reproduce the stored text

    def lookup(self, name: str):
        """The value of property ``name`` for each record, null when absent."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.offsets) - 1
        idx = np.full(n, -1, np.int64)
        hit = np.flatnonzero(pc.equal(self.names, name).to_numpy(zero_copy_only=False))
        idx[self.owner[hit]] = hit
        return self.values.take(pa.array(idx, mask=idx < 0))

    def map_array(self):
        import pyarrow as pa

        return pa.MapArray.from_arrays(pa.array(self.offsets.astype(np.int32)), self.names,
                                       self.values)


def parse_properties_many(text) -> ParsedProperties:
    """Vectorised spec §3.4 parsing: split on 0x02; keep a segment when it has a 0x01
    that is neither first nor last; a later duplicate name replaces the value but keeps
    the first one's place (as a Python dict / Java HashMap put does)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(text)
    segs = pc.split_pattern(text, L.PROPERTY_SEPARATOR)
    seg_off = segs.offsets.to_numpy().astype(np.int64)
    flat = segs.flatten()
    seg_owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(seg_off))
    nv = pc.split_pattern(flat, L.PROPERTY_NAME_VALUE_SEPARATOR, max_splits=1)
    nv_len = pc.list_value_length(nv).to_numpy(zero_copy_only=False)
    nv_off = nv.offsets.to_numpy().astype(np.int64)
    nv_flat = nv.flatten()
    has2 = nv_len == 2
    name_idx = nv_off[:-1][has2]
    names_all = nv_flat.take(pa.array(name_idx))
    values_all = nv_flat.take(pa.array(name_idx + 1))
    nonempty = (pc.binary_length(names_all).to_numpy(zero_copy_only=False) > 0) & (
        pc.binary_length(values_all).to_numpy(zero_copy_only=False) > 0)
    valid = np.zeros(len(flat), bool)
    valid[np.flatnonzero(has2)[nonempty]] = True
    vsel = np.flatnonzero(nonempty)
    names = names_all.take(pa.array(vsel))
    values = values_all.take(pa.array(vsel))
    owner = seg_owner[valid]
    # duplicates: group by (record, name); first place, last value
    keep = np.arange(len(names), dtype=np.int64)
    src = keep
    if len(names):
        enc = pc.dictionary_encode(names)
        nid = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        key = owner * (len(enc.dictionary) + 1) + nid
        order = np.argsort(key, kind="stable")
        ks = key[order]
        newgrp = np.r_[True, ks[1:] != ks[:-1]]
        if not newgrp.all():
            lastgrp = np.r_[ks[1:] != ks[:-1], True]
            first_pos, last_pos = order[newgrp], order[lastgrp]
            o = np.argsort(first_pos)
            keep, src = first_pos[o], last_pos[o]
            names, values, owner_k = names.take(pa.array(keep)), values.take(pa.array(src)), owner[keep]
        else:
            owner_k = owner
    else:
        owner_k = owner
    counts = np.bincount(owner_k, minlength=n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    # Can the map reproduce the text? Every segment a kept pair, except one empty trailing
    # segment (the 0x02 terminator some versions write, spec §3.4), and no duplicates.
    seg_count = np.diff(seg_off)
    flat_len = pc.binary_length(flat).to_numpy(zero_copy_only=False)
    is_last = np.zeros(len(flat), bool)
    has_seg = seg_count > 0
    is_last[seg_off[1:][has_seg] - 1] = True
    allowed = valid | (is_last & (flat_len == 0) & (seg_count[seg_owner] >= 2))
    bad = np.bincount(seg_owner[~allowed], minlength=n) > 0
    valid_count = np.bincount(owner, minlength=n)
    text_len = pc.binary_length(text).to_numpy(zero_copy_only=False)
    need = (bad | (valid_count != counts)) & (text_len > 0)
    return ParsedProperties(text, names, values, owner_k, offsets, need)


def decode_arrow(records: scan.RecordColumns, store: str, *, body: bool = True):
    """The message JSON fields of ``records`` as a ``pyarrow.RecordBatch`` with
    :data:`ARROW_SCHEMA` (the same values :mod:`rmqstore.view` gives per message)."""
    import pyarrow as pa

    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA())
    spans = _spans(records)
    names, tid = records.topic_table()
    topic = pa.array(names, pa.string()).take(pa.array(tid.astype(np.int32)))
    props = parse_properties_many(_utf8(_part(spans, n, _PROPS)))
    hosts = _hosts(records)
    keys_val = props.lookup("KEYS")
    keys = _split_keys_many(keys_val, n)
    i32 = lambda a: pa.array(a.astype(np.int32))
    i64 = lambda a: pa.array(a.astype(np.int64))
    magic = pa.array(["v1", "v2"]).take(pa.array((records.magic == L.MAGIC_V2).astype(np.int8)))
    cols = {
        "store": pa.array([store], pa.string()).take(pa.array(np.zeros(n, np.int8))),
        "commitLogOffset": i64(records.physical_offset),
        "storeSize": i32(records.size),
        "magic": magic,
        "bodyCRC": i32(records.body_crc),
        "queueId": i32(records.queue_id),
        "flag": i32(records.flag),
        "queueOffset": i64(records.queue_offset),
        "sysFlag": i32(records.sys_flag),
        "bornTimestamp": i64(records.born_timestamp),
        "bornHost": _host_strings(hosts["born_host_address"], hosts["born_host_port"], hosts["born_v6"]),
        "storeTimestamp": i64(records.store_timestamp),
        "storeHost": _host_strings(hosts["store_host_address"], hosts["store_host_port"], hosts["store_v6"]),
        "reconsumeTimes": i32(records.reconsume_times),
        "preparedTransactionOffset": i64(records.prepared_transaction_offset),
        "topic": topic,
        "properties": props.map_array(),
        "tags": props.lookup("TAGS"),
        "keys": keys,
        "uniqKey": props.lookup("UNIQ_KEY"),
        "offsetMsgId": _offset_msg_ids(hosts, records.physical_offset),
        "body": _part(spans, n, _BODY) if body else pa.nulls(n, pa.binary()),
        "propertiesText": _mask_text(props),
        "crcOk": pa.array(records.crc_ok()),
    }
    return pa.RecordBatch.from_arrays(list(cols.values()), schema=ARROW_SCHEMA())


def _mask_text(props: ParsedProperties):
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.if_else(pa.array(props.need_text), props.text, pa.scalar(None, pa.string()))


def _split_keys_many(keys_val, n: int):
    """KEYS split on single spaces, empty tokens dropped (message.split_keys); [] when absent."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = pc.split_pattern(keys_val.fill_null(""), " ")
    off = parts.offsets.to_numpy().astype(np.int64)
    toks = parts.flatten()
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(off))
    nonempty = pc.binary_length(toks).to_numpy(zero_copy_only=False) > 0
    kept = toks.filter(pa.array(nonempty))
    counts = np.bincount(owner[nonempty], minlength=n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), kept)


def ARROW_SCHEMA():
    """The export row: ``store``, the message JSON fields as typed columns, ``crcOk``."""
    import pyarrow as pa

    return pa.schema([
        pa.field("store", pa.string(), False),
        pa.field("commitLogOffset", pa.int64(), False),
        pa.field("storeSize", pa.int32(), False),
        pa.field("magic", pa.string(), False),
        pa.field("bodyCRC", pa.int32(), False),
        pa.field("queueId", pa.int32(), False),
        pa.field("flag", pa.int32(), False),
        pa.field("queueOffset", pa.int64(), False),
        pa.field("sysFlag", pa.int32(), False),
        pa.field("bornTimestamp", pa.int64(), False),
        pa.field("bornHost", pa.string(), False),
        pa.field("storeTimestamp", pa.int64(), False),
        pa.field("storeHost", pa.string(), False),
        pa.field("reconsumeTimes", pa.int32(), False),
        pa.field("preparedTransactionOffset", pa.int64(), False),
        pa.field("topic", pa.string(), False),
        pa.field("properties", pa.map_(pa.string(), pa.string()), False),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.list_(pa.string()), False),
        pa.field("uniqKey", pa.string()),
        pa.field("offsetMsgId", pa.string(), False),
        pa.field("body", pa.binary()),
        pa.field("propertiesText", pa.string()),
        pa.field("crcOk", pa.bool_(), False),
    ])


def iter_batches(records: scan.RecordColumns, store: str, *, body: bool = True,
                 rows: int = 65536) -> Iterator:
    """:func:`decode_arrow` in chunks of ``rows`` records (bounded memory per batch)."""
    for i in range(0, len(records), rows):
        yield decode_arrow(records.take(slice(i, i + rows)), store, body=body)


# --- implied ConsumeQueue units (audit, rebuild) -----------------------------------------


def implied_units(records: scan.RecordColumns, delay_millis: Sequence[int] = parse_delay_levels()):
    """The ConsumeQueue units dispatch writes for ``records`` (spec §6.1, §9), in
    CommitLog order, as a pyarrow Table: topic, queueId, queueOffset, commitLogOffset
    (the stored PHYSICALOFFSET), size, tagsCode. PREPARED and ROLLBACK records get none.
    """
    import pyarrow as pa

    from ..format.hashing import java_hash_many

    sel = np.flatnonzero(gets_cq_unit(records.sys_flag))
    r = records.take(sel)
    n = len(r)
    schema = UNITS_SCHEMA()
    if n == 0:
        return schema.empty_table()
    spans = _spans(r)
    names, tid = r.topic_table()
    props = parse_properties_many(_utf8(_part(spans, n, _PROPS)))
    tags = props.lookup("TAGS")
    enc = tags.dictionary_encode()
    uniq = enc.dictionary.to_pylist()
    hashes = java_hash_many(uniq).astype(np.int64)
    idx = enc.indices.to_numpy(zero_copy_only=False)
    code = np.zeros(n, np.int64)
    has = ~np.asarray(enc.indices.is_null().to_numpy(zero_copy_only=False))
    code[has] = hashes[idx[has].astype(np.int64)]
    if SCHEDULE_TOPIC in names:
        delay = props.lookup("DELAY").to_pylist()
        tag_list = tags.to_pylist()
        sched = names.index(SCHEDULE_TOPIC)
        for i in np.flatnonzero(tid == sched):
            if delay[i] is not None:
                p = {"DELAY": delay[i]}
                if tag_list[i] is not None:
                    p["TAGS"] = tag_list[i]
                code[i] = tags_code(SCHEDULE_TOPIC, p, int(r.store_timestamp[i]), delay_millis)
    return pa.Table.from_arrays([
        pa.array(names, pa.string()).take(pa.array(tid.astype(np.int32))),
        pa.array(r.queue_id.astype(np.int32)),
        pa.array(r.queue_offset),
        pa.array(r.physical_offset),
        pa.array(r.size.astype(np.int32)),
        pa.array(code),
    ], schema=schema)


def UNITS_SCHEMA():
    import pyarrow as pa

    return pa.schema([
        pa.field("topic", pa.string(), False),
        pa.field("queueId", pa.int32(), False),
        pa.field("queueOffset", pa.int64(), False),
        pa.field("commitLogOffset", pa.int64(), False),
        pa.field("size", pa.int32(), False),
        pa.field("tagsCode", pa.int64(), False),
    ])
