"""Columnar batch put: a regular batch (spec §3.7) given as columns, not Message objects.

:class:`MessageBatch` holds one batch as columns: the bodies, the queue ids, the
properties as an ordered mapping of name to a constant or a per-message column (TAGS,
KEYS, UNIQ_KEY, ...), or pre-serialised properties texts, and the fixed fields as scalars
or arrays. :meth:`rmqstore.engine.store.MessageStore.put_columns` writes it with the bytes,
queue offsets, statuses and dispatch of :meth:`~rmqstore.engine.store.MessageStore.put_batch`
given :meth:`MessageBatch.messages` (the equivalent Message list), without making a
Python object per message:

* properties texts come from one C-level join of the template's constant pieces and the
  columns' values, encoded once and split back per message
  (:mod:`rmqstore.engine.batch_properties`);
* the fixed fields are one ``RECORD_FIXED_DTYPE`` array (a template row copied, then the
  varying columns), records are joined once and copied into the segment with one write;
* BODYCRC is ``format.crc.crc32`` (zlib's CRC-32) per body (the store computes it; nothing is taken on trust);
* dispatch reads TAGS/KEYS/UNIQ_KEY from the columns: tagsCodes hashed once per distinct
  tag, CQ units of each queue written as one dense block, index keys hashed all at once
  from their topics' ``topic#`` prefix hashes and put with ``IndexFile.put_many``.

Anything unusual (a refused message, magic v2, a SCHEDULE_TOPIC delay, mixed host
widths, properties over 16 KiB, bodies over maxMessageSize) takes put_batch with the
equivalent messages, so results never depend on which path ran.

:func:`put_messages` is the same vector encoder for a batch of Message objects (what
``put_batch`` tries first). Both build the fixed parts as one ``RECORD_FIXED_DTYPE``
array and the topic fields with :func:`rmqstore.format.record.topic_field` (through the
appender's topic entries): the vector form of :func:`rmqstore.format.record.encode_record`,
which tests/test_one_encoder.py pins them to. The properties pieces are
:mod:`rmqstore.engine.batch_properties`'s; both hand what they wrote to dispatch as
:class:`~rmqstore.engine.batch_dispatch.WrittenColumns`.
"""
from __future__ import annotations

import itertools
import operator
from typing import Sequence

import numpy as np

from ..errors import StoreIOError
from ..format import layout as L
from ..format.crc import BODY_CRC_MASK, crc32
from ..format.message import Message, offset_msg_id_prefix, serialize_properties
from ..format.rules import SCHEDULE_TOPIC, advances_queue_offset
from .append import now_ms
from .batch_dispatch import WrittenColumns
from .batch_properties import encode_properties
from .message_batch import MessageBatch, is_scalar
from .prepare import FAST_PROPS_MAX
from .results import PutResults

_PROPS_LEN = L.RECORD_PROPERTIES_LENGTH_STRUCT
_HOST_BITS = L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6
_TX_MASK = L.SYSFLAG_TRANSACTION_MASK
_MAGIC_V1 = L.MAGIC_V1
_NAME_VALUE = L.PROPERTY_NAME_VALUE_SEPARATOR.join

__all__ = ["MessageBatch", "put_columns", "put_messages"]


# --- columns ---------------------------------------------------------------------------


def _int_column(v, n: int):
    """A scalar stays a Python int; a column becomes int64 (a scalar if all equal)."""
    if is_scalar(v):
        return int(v)
    a = np.asarray(v, dtype=np.int64)
    if n and a.min() == a.max():
        return int(a[0])
    return a


class QueueRanks:
    """Where each message of a batch goes in its queue (spec §3.2, §3.7): the batch's
    (topic, queueId) ``keys``, each message's key ``codes`` (``len(keys)`` for one that
    does not advance its queue offset: PREPARED, ROLLBACK), its ``rank`` among the
    messages of its queue (batch order), how many each key takes (``used``), and
    ``order``, the messages sorted by key, stably (None when they are in one queue).
    ``queue_ids`` is the queue ids as an array. ``topic_codes`` (the distinct topic names,
    each message's number among them) may stand in for ``topics``."""

    __slots__ = ("keys", "codes", "rank", "used", "order", "queue_ids", "advance")

    def __init__(self, topic: str | None, topics, qids, advance, n: int, topic_codes=None):
        # advance: True, False or a bool array (rules.advances_queue_offset)
        q = np.broadcast_to(np.asarray(qids, dtype=np.int64), (n,))
        if topic is not None and isinstance(qids, int):
            codes = np.zeros(n, dtype=np.int64)
            keys = [(topic, qids)]
        elif topic is not None:
            lo, hi = int(q.min()), int(q.max())
            if lo >= 0 and hi < 1 << 20:
                present = np.flatnonzero(np.bincount(q, minlength=hi + 1))
                lut = np.empty(hi + 1, dtype=np.int64)
                lut[present] = np.arange(len(present))
                codes = lut[q]
                keys = [(topic, x) for x in present.tolist()]
            else:
                uq, codes = np.unique(q, return_inverse=True)
                keys = [(topic, x) for x in uq.tolist()]
        elif topic_codes is not None and int(q.min()) >= 0 and int(q.max()) < 1 << 20:
            names, tc = topic_codes
            span = int(q.max()) + 1
            comb = tc * span + q
            present = np.flatnonzero(np.bincount(comb, minlength=len(names) * span))
            lut = np.empty(len(names) * span, dtype=np.int64)
            lut[present] = np.arange(len(present))
            codes = lut[comb]
            keys = [(names[x // span], x % span) for x in present.tolist()]
        else:
            kmap: dict = {}
            codes = np.fromiter((kmap.setdefault(x, len(kmap)) for x in zip(topics, q.tolist())),
                                dtype=np.int64, count=n)
            keys = list(kmap)
        nk = len(keys)
        if advance is False:
            codes = np.full(n, nk, dtype=np.int64)
        elif advance is not True:
            codes = np.where(advance, codes, nk)
        if nk == 1 and advance is True:
            order = None
            used = np.array([n], dtype=np.int64)
            rank = np.arange(n, dtype=np.int64)
        else:
            # Small codes sort stably in linear time (radix) as int16.
            order = np.argsort(codes.astype(np.int16) if nk < 32767 else codes, kind="stable")
            counts = np.bincount(codes, minlength=nk + 1)
            gstart = np.cumsum(counts) - counts
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n, dtype=np.int64) - gstart[codes[order]]
            used = counts[:nk]
        self.keys, self.codes, self.rank, self.used, self.order = keys, codes, rank, used, order
        self.queue_ids, self.advance = q, advance

    def queue_offsets(self, counters: dict) -> tuple[np.ndarray, np.ndarray]:
        """(first queue offset per key and a trailing 0, each message's QUEUEOFFSET) from
        the appender's ``counters``; the caller holds the append lock."""
        base = np.array([counters.get(key, 0) for key in self.keys] + [0], dtype=np.int64)
        advance = self.advance
        if advance is True:
            return base, base[self.codes] + self.rank
        if advance is False:
            return base, np.zeros(len(self.codes), dtype=np.int64)
        return base, np.where(advance, base[self.codes] + self.rank, 0)

    def advance_counters(self, counters: dict, base: np.ndarray) -> None:
        """Move ``counters`` past the batch, once its records are written."""
        for key, b, u in zip(self.keys, base.tolist(), self.used.tolist()):
            if u:
                counters[key] = b + u


_header_templates: dict = {}
_TEMPLATE_FIELDS = ("flag", "born_timestamp", "reconsume_times", "prepared_transaction_offset")


def record_headers(n: int, dtype, born, store, flag, born_timestamp, reconsume_times,
                   prepared_transaction_offset, **fields) -> np.ndarray:
    """The fixed parts (``layout.RECORD_FIXED_DTYPE`` ``dtype``) of ``n`` records: magic v1,
    the hosts (a Host for all, or a list of one per record), the four fields after them
    (an int for all, or an array) and ``fields`` by name (total_size, body_crc, ...).
    What is the same for every record is one template row, repeated as bytes (far
    cheaper than a structured fill) and cached while it repeats."""
    shared = isinstance(born, tuple) and isinstance(store, tuple)
    values = (flag, born_timestamp, reconsume_times, prepared_transaction_offset)
    tkey = (dtype, *values, born, store) if shared and all(map(is_scalar, values)) else None
    row = _header_templates.get(tkey) if tkey is not None else None
    if row is None:
        row = np.zeros(1, dtype=dtype)
        row["magic"] = _MAGIC_V1
        for name, h in (("born_host", born), ("store_host", store)):
            if isinstance(h, tuple):
                row[name + "_address"] = np.frombuffer(h[0], dtype=np.uint8)
                row[name + "_port"] = h[1]
        for name, v in zip(_TEMPLATE_FIELDS, values):
            if is_scalar(v):
                row[name] = v
        if tkey is not None:
            if len(_header_templates) > 64:
                _header_templates.clear()
            _header_templates[tkey] = row
    hdr = np.frombuffer(bytearray(row.tobytes() * n), dtype=dtype)
    if tkey is None:
        for name, h in (("born_host", born), ("store_host", store)):
            if not isinstance(h, tuple):
                hdr[name + "_address"] = np.frombuffer(b"".join([x[0] for x in h]),
                                                       dtype=np.uint8).reshape(n, -1)
                hdr[name + "_port"] = np.array([x[1] for x in h], dtype=np.int64)
        for name, v in zip(_TEMPLATE_FIELDS, values):
            if not is_scalar(v):
                hdr[name] = v
    for name, v in fields.items():
        hdr[name] = v
    return hdr


def put_columns(a, batch: MessageBatch, stamp: bool, record=None):
    """:meth:`MessageStore.put_columns` (see the module docstring) with appender ``a``:
    the results, or None when the batch needs put_batch with its messages.
    ``record(WrittenColumns)`` dispatches the records under the append lock."""
    n = len(batch)
    # --- checks that send the batch the general way --------------------------------------
    topic = batch.topic
    single = isinstance(topic, str)
    distinct = {topic} if single else set(topic)
    if SCHEDULE_TOPIC in distinct:
        return None
    blocks = {}
    for t in distinct:
        entry = a.topic_entry(t)
        if entry is None or entry[0] != L.MAGIC_V1:
            return None
        blocks[t] = entry[1]
    born, st_host = batch.born_host, batch.store_host
    k = (len(born[0]) == 16) + 2 * (len(st_host[0]) == 16)
    fixed, dtype, host_bits = a.host_layout(k)
    bodies = batch.bodies
    try:
        blens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    except TypeError:  # a None body is an empty one
        bodies = [b if b is not None else b"" for b in bodies]
        blens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if int(blens.max()) > a.max_body:
        return None
    if single:
        tblocks, topic_codes, topics = [blocks[topic]], None, None
        tlens = len(blocks[topic])
    else:
        topics = list(topic)
        tnames = list(blocks)
        tblocks = [blocks[t] for t in tnames]
        tcode = {t: i for i, t in enumerate(tnames)}
        topic_codes = np.fromiter(map(tcode.__getitem__, topics), dtype=np.int64, count=n)
        tlens = np.array([len(b) for b in tblocks], dtype=np.int64)[topic_codes]
    enc = encode_properties(batch, n, a.trailing, tblocks, topic_codes)
    if enc is None:
        return None
    pieces, plens, cols_info, texts = enc
    totals = fixed + blens + tlens + 2 + plens
    total = int(totals.sum())
    if int(totals.max()) > a.max_total or total + L.END_FILE_MIN_BLANK_LENGTH > a.size:
        return None
    # --- the fixed fields -------------------------------------------------------------------
    crcs = np.fromiter(map(crc32, bodies), dtype=np.int64, count=n)
    crcs &= BODY_CRC_MASK
    sys_flag = _int_column(batch.sys_flag, n)
    sys_arr = (sys_flag & ~_HOST_BITS) | host_bits
    tx = sys_arr & _TX_MASK
    qids = _int_column(batch.queue_ids, n)
    # PREPARED / ROLLBACK take no queue offset (and so no CQ unit: gets_cq_unit)
    advance = advances_queue_offset(tx)
    tcodes = None if single else (tnames, topic_codes)
    ranks = QueueRanks(topic if single else None, topics, qids, advance, n, tcodes)
    rel = np.cumsum(totals)
    rel -= totals
    hdr = record_headers(n, dtype, born, st_host, _int_column(batch.flag, n),
                         _int_column(batch.born_timestamp, n),
                         _int_column(batch.reconsume_times, n),
                         _int_column(batch.prepared_transaction_offset, n),
                         total_size=totals, body_crc=crcs, queue_id=qids, sys_flag=sys_arr,
                         body_length=blens)
    if not stamp:
        store_ts = _int_column(batch.store_timestamp, n)
        hdr["store_timestamp"] = store_ts
    # --- under the append lock: offsets, timestamps, bytes, dispatch ---------------------
    with a.lock:
        start = a.reserve(total)
        phys = rel + start
        counters = a.queue_offsets
        base, qoffs = ranks.queue_offsets(counters)
        if stamp:
            store_ts = now_ms()
            hdr["store_timestamp"] = store_ts
        hdr["queue_offset"] = qoffs
        hdr["physical_offset"] = phys
        heads = hdr.view(f"V{fixed}").tolist()
        data = b"".join(itertools.chain.from_iterable(zip(heads, bodies, *pieces)))
        a.place(data, total)
        ranks.advance_counters(counters, base)  # once written
        a.last_store_timestamp = store_ts if isinstance(store_ts, int) else int(store_ts[-1])
        if record is not None:
            cols = WrittenColumns(topic if single else None, topics, distinct, ranks.queue_ids,
                                  qoffs, phys, totals, sys_arr, tx, store_ts, ranks.keys,
                                  ranks.codes, ranks.used, ranks.order, base,
                                  properties=batch.properties, cols=cols_info, texts=texts,
                                  topic_codes=tcodes)
            try:
                record(cols)
            except StoreIOError as e:  # the batch is written: it is put (MessageStore._failed)
                a.dispatch_failed(e)
    if isinstance(store_ts, int):
        ts_list = itertools.repeat(store_ts, n)
    else:
        ts_list = store_ts.tolist()
    prefix = a.msg_id_prefix(st_host)
    return PutResults(phys, totals, qoffs, ts_list, itertools.repeat(prefix, n))


# --- Message objects -------------------------------------------------------------------


_BATCH_FIELDS = operator.attrgetter(
    "topic", "body", "properties", "properties_text", "queue_id", "flag", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "prepared_transaction_offset", "magic")


def _props_text(props: dict, trailing: bool) -> str:
    return serialize_properties(props, trailing) if props else ""


def _column(values, dtype=np.int64) -> np.ndarray | int:
    """A column for the header array: a scalar when every value is the same."""
    first = values[0]
    if values.count(first) == len(values):
        return first
    return np.array(values, dtype=dtype)


def put_messages(a, msgs: Sequence[Message], stamp: bool, record=None):
    """A regular batch (spec §3.7) encoded with numpy: the bytes, checks and statuses
    of prepare() + :meth:`append_batch` for the usual batch. Returns None when the
    batch needs the general path (a refused message, magic v2, mixed host widths,
    long properties or bodies), or (results, first record offset).

    ``record(WrittenColumns)`` dispatches the records under the lock.
    """
    n = len(msgs)
    cols = list(zip(*map(_BATCH_FIELDS, msgs)))
    (topics, bodies, props, texts, queue_ids, flags, sys_flags, born_ts, born_hosts,
     store_ts, store_hosts, reconsume, prepared, magics) = cols
    if magics.count(_MAGIC_V1) != n:
        return None
    distinct = set(topics)
    blocks = {}
    for t in distinct:
        entry = a.topic_entry(t)
        if entry is None or entry[0] != _MAGIC_V1:
            return None
        blocks[t] = entry[1]
    born_set, store_set = set(born_hosts), set(store_hosts)
    born6 = {len(h[0]) == 16 for h in born_set}
    store6 = {len(h[0]) == 16 for h in store_set}
    if len(born6) != 1 or len(store6) != 1:
        return None
    k = born6.pop() + 2 * store6.pop()
    fixed, dtype, host_bits = a.host_layout(k)
    # Properties text, as prepare() makes it.
    if texts.count(None) == n:
        try:
            texts = ["\x02".join(map(_NAME_VALUE, p.items())) if p else "" for p in props]
        except TypeError:  # a None (skipped) or non-str value somewhere
            texts = [_props_text(p, False) for p in props]
        if a.trailing:
            texts = [t + "\x02" if t else t for t in texts]
        parsed = props
    else:
        # Some messages carry their stored text: dispatch parses the texts (prepare()).
        texts = [_props_text(p, a.trailing) if t is None else t for t, p in zip(texts, props)]
        parsed = None
    try:
        props_b = list(map(str.encode, texts))
    except UnicodeEncodeError:
        props_b = [t.encode("utf-8", "replace") for t in texts]
    if None in bodies:
        bodies = [b or b"" for b in bodies]
    plens = np.fromiter(map(len, props_b), dtype=np.int64, count=n)
    blens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if int(plens.max()) > FAST_PROPS_MAX or int(blens.max()) > a.max_body:
        return None
    if len(distinct) == 1:
        tblock = blocks[topics[0]]
        tblocks = itertools.repeat(tblock, n)
        tlens = len(tblock)
    else:
        tblocks = [blocks[t] for t in topics]
        tlens = np.fromiter(map(len, tblocks), dtype=np.int64, count=n)
    totals = fixed + blens + tlens + 2 + plens
    total = int(totals.sum())
    if int(totals.max()) > a.max_total or total + L.END_FILE_MIN_BLANK_LENGTH > a.size:
        return None  # prepare() refuses a record, or the batch cannot fit a segment
    crcs = np.fromiter(map(crc32, bodies), dtype=np.int64, count=n) & BODY_CRC_MASK
    sys_arr = (np.array(sys_flags, dtype=np.int64) & ~_HOST_BITS) | host_bits
    advance = advances_queue_offset(sys_arr)
    if advance.all():
        advance = True
    qids = np.array(queue_ids, dtype=np.int64)
    ranks = QueueRanks(topics[0] if len(distinct) == 1 else None, topics, qids, advance, n)
    plen_b = list(map(_PROPS_LEN.pack, plens.tolist()))
    rel = np.cumsum(totals) - totals
    hosts = [next(iter(hset)) if len(hset) == 1 else list(h)
             for h, hset in ((born_hosts, born_set), (store_hosts, store_set))]
    hdr = record_headers(n, dtype, *hosts, _column(flags), _column(born_ts), _column(reconsume),
                         _column(prepared), total_size=totals, body_crc=crcs, queue_id=qids,
                         sys_flag=sys_arr, body_length=blens)
    with a.lock:
        start = a.reserve(total)
        phys = start + rel
        counters = a.queue_offsets
        base, qoffs = ranks.queue_offsets(counters)
        if stamp:
            ts = now_ms()
            ts_list = [ts] * n
        else:
            ts_list = store_ts
            ts = _column(store_ts)
        hdr["store_timestamp"] = ts
        hdr["queue_offset"] = qoffs
        hdr["physical_offset"] = phys
        heads = hdr.view(f"V{fixed}").tolist()
        data = b"".join(itertools.chain.from_iterable(zip(heads, bodies, tblocks, plen_b, props_b)))
        a.place(data, total)
        ranks.advance_counters(counters, base)  # once written
        a.last_store_timestamp = ts_list[-1]
        if record is not None:
            cols = WrittenColumns(topics[0] if len(distinct) == 1 else None, list(topics),
                                  distinct, ranks.queue_ids, qoffs, phys, totals, sys_arr,
                                  sys_arr & _TX_MASK, ts, ranks.keys, ranks.codes, ranks.used,
                                  ranks.order, base, parsed=parsed,
                                  texts=texts if parsed is None else None)
            try:
                record(cols)
            except StoreIOError as e:
                a.dispatch_failed(e)
    if len(store_set) == 1:
        prefix = a.msg_id_prefix(store_hosts[0])
        prefixes = itertools.repeat(prefix, n)
    else:
        prefixes = [offset_msg_id_prefix(h) for h in store_hosts]
    return PutResults(phys, totals, qoffs, ts_list, prefixes)
