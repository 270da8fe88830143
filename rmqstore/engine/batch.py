"""Columnar batch put: a regular batch (spec §3.7) given as columns, not Message objects.

:class:`MessageBatch` holds one batch as columns: the bodies, the queue ids, the
properties as an ordered mapping of name to a constant or a per-message column (TAGS,
KEYS, UNIQ_KEY, ...), or pre-serialised properties texts, and the fixed fields as scalars
or arrays. :meth:`rmqstore.engine.store.MessageStore.put_columns` writes it with the bytes,
queue offsets, statuses and dispatch of :meth:`~rmqstore.engine.store.MessageStore.put_batch`
given :meth:`MessageBatch.messages` (the equivalent Message list), without making a
Python object per message:

* properties texts come from one C-level join of the template's constant pieces and the
  columns' values, encoded once and split back per message (the separator is checked
  to occur nowhere else);
* the fixed fields are one ``RECORD_FIXED_DTYPE`` array (a template row copied, then the
  varying columns), records are joined once and copied into the segment with one write;
* BODYCRC is ``zlib.crc32`` per body (the store computes it; nothing is taken on trust);
* dispatch reads TAGS/KEYS/UNIQ_KEY from the columns: tagsCodes hashed once per distinct
  tag, CQ units of each queue written as one dense block, index keys hashed per token
  length from the topic's ``topic#`` prefix hash and put with ``IndexService.put_hashes``.

Anything unusual (a refused message, magic v2, a SCHEDULE_TOPIC delay, mixed host
widths, properties over 16 KiB, bodies over maxMessageSize) takes put_batch with the
equivalent messages, so results never depend on which path ran.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..format import layout as L
from .append import Appended, PutResults, now_ms
from ..format.rules import SCHEDULE_TOPIC, advances_queue_offset, gets_index_keys
from ..format.message import (Host, Message, offset_msg_id_prefix, parse_properties,
                              serialize_properties)
from ..format.hashing import index_abs_many, pow31, prefix_hash
from ..errors import StoreIOError
from ..format.crc import BODY_CRC_MASK

_DEFAULT_BORN = Message.__dataclass_fields__["born_host"].default
_DEFAULT_STORE = Message.__dataclass_fields__["store_host"].default
_PROPS_LEN = L.RECORD_PROPERTIES_LENGTH_STRUCT
_HOST_BITS = L.SYSFLAG_BORNHOST_V6 | L.SYSFLAG_STOREHOST_V6
_TX_MASK = L.SYSFLAG_TRANSACTION_MASK
_CQ_UNIT = L.CQ_UNIT_SIZE
_SEP = L.PROPERTY_SEPARATOR
_NV = L.PROPERTY_NAME_VALUE_SEPARATOR
_FAST_PROPS_MAX = 16383  # below this neither §3.6 properties rule can apply
_FAST_KEY_MAX = 256  # longest token hashed by the matrix form


def _is_scalar(v) -> bool:
    return isinstance(v, (int, np.integer))


@dataclass
class MessageBatch:
    """One regular batch as columns. Each numeric field is a scalar (every message) or a
    sequence/array with one value per message.

    ``properties`` maps names, in order, to a ``str`` (every message) or a sequence with
    one ``str`` or ``None`` (no such property) per message; ``properties_texts`` instead
    gives each message's stored text (then ``properties`` must be empty). ``bodies`` is a
    sequence of bytes, or one ``bytes`` blob cut at ``body_offsets`` (n + 1 offsets).
    ``topic`` is one topic or one per message.
    """

    topic: str | Sequence[str]
    bodies: Sequence[bytes] | bytes
    queue_ids: int | Sequence[int] = 0
    properties: Mapping[str, Any] = field(default_factory=dict)
    properties_texts: Sequence[str] | None = None
    body_offsets: Sequence[int] | None = None
    flag: int | Sequence[int] = 0
    sys_flag: int | Sequence[int] = 0
    born_timestamp: int | Sequence[int] = 0
    store_timestamp: int | Sequence[int] = 0
    reconsume_times: int | Sequence[int] = 0
    prepared_transaction_offset: int | Sequence[int] = 0
    born_host: Host = _DEFAULT_BORN
    store_host: Host = _DEFAULT_STORE

    def __post_init__(self):
        if isinstance(self.bodies, (bytes, bytearray, memoryview)):
            if self.body_offsets is None:
                raise ValueError("a bodies blob needs body_offsets (n + 1 offsets)")
            blob = bytes(self.bodies)
            offs = np.asarray(self.body_offsets, dtype=np.int64).tolist()
            self.bodies = [blob[a:b] for a, b in zip(offs, offs[1:])]
        elif self.body_offsets is not None:
            raise ValueError("body_offsets go with a bodies blob")
        n = len(self.bodies)
        if self.properties_texts is not None:
            if self.properties:
                raise ValueError("give properties or properties_texts, not both")
            if len(self.properties_texts) != n:
                raise ValueError("properties_texts needs one text per message")
        for name, v in self.properties.items():
            if not isinstance(v, str) and len(v) != n:
                raise ValueError(f"property column {name!r} has {len(v)} values for {n} messages")
        if not isinstance(self.topic, str) and len(self.topic) != n:
            raise ValueError("topic needs one value per message")
        for name in ("queue_ids", "flag", "sys_flag", "born_timestamp", "store_timestamp",
                     "reconsume_times", "prepared_transaction_offset"):
            v = getattr(self, name)
            if not _is_scalar(v) and len(v) != n:
                raise ValueError(f"{name} needs one value per message")

    def __len__(self) -> int:
        return len(self.bodies)

    def _values(self, name: str) -> list:
        v = getattr(self, name)
        n = len(self)
        return [int(v)] * n if _is_scalar(v) else np.asarray(v, dtype=np.int64).tolist()

    def messages(self) -> list[Message]:
        """The equivalent messages: what :meth:`MessageStore.put_batch` would be given."""
        n = len(self)
        topics = [self.topic] * n if isinstance(self.topic, str) else list(self.topic)
        if self.properties_texts is not None:
            texts = list(self.properties_texts)
            props = [parse_properties(t) for t in texts]
        else:
            texts = [None] * n
            cols = [(k, itertools.repeat(v, n) if isinstance(v, str) else v)
                    for k, v in self.properties.items()]
            names = [k for k, _ in cols]
            rows = zip(*[c for _, c in cols]) if cols else itertools.repeat((), n)
            props = [{k: v for k, v in zip(names, row) if v is not None} for row in rows]
        fields = [self._values(f) for f in ("queue_ids", "flag", "sys_flag", "born_timestamp",
                                            "store_timestamp", "reconsume_times",
                                            "prepared_transaction_offset")]
        return [Message(topic=t, body=b if b is not None else b"", properties=p, queue_id=q,
                        flag=fl, sys_flag=sf, born_timestamp=bt, store_timestamp=st,
                        reconsume_times=rt, prepared_transaction_offset=pt,
                        born_host=self.born_host, store_host=self.store_host,
                        properties_text=tx)
                for t, b, p, tx, q, fl, sf, bt, st, rt, pt in zip(
                    topics, self.bodies, props, texts, *fields)]


# --- properties ------------------------------------------------------------------------


def _template(properties: Mapping[str, Any], trailing: bool):
    """(constant pieces, column names, columns) so that text_i = c0 + col1[i] + c1 + ...
    + colk[i] + ck, valid when no column holds None."""
    consts, names, cols, acc, first = [], [], [], "", True
    for name, v in properties.items():
        acc += ("" if first else _SEP) + name + _NV
        first = False
        if isinstance(v, str):
            acc += v
        else:
            consts.append(acc)
            names.append(name)
            cols.append(v)
            acc = ""
    if not first and trailing:
        acc += _SEP
    consts.append(acc)
    return consts, names, cols


def _texts_generic(properties: Mapping[str, Any], n: int, trailing: bool) -> list[str]:
    """Per message, exactly as put_batch serialises a properties dict (None skipped)."""
    names = list(properties)
    cols = [itertools.repeat(v, n) if isinstance(v, str) else v for v in properties.values()]
    return [serialize_properties(zip(names, row), trailing)
            for row in (zip(*cols) if cols else itertools.repeat((), n))]


def _encode_texts(texts: list[str]) -> list[bytes]:
    try:
        return list(map(str.encode, texts))
    except UnicodeEncodeError:
        return [t.encode("utf-8", "replace") for t in texts]


@dataclass(slots=True)
class _Col:
    """One per-message property column as encoded, kept for dispatch.

    Categorical (few distinct values): ``codes`` index ``distinct``. Free: ``buf`` holds
    the values UTF-8 encoded, each followed by the template's next constant and a NUL;
    value i is ``buf[ends[i] - lens[i]:ends[i]]``; ``ascii`` says every value is ASCII.
    """

    values: Sequence
    lens: np.ndarray
    codes: np.ndarray | None = None
    distinct: list | None = None
    buf: np.ndarray | None = None
    ends: np.ndarray | None = None
    ascii: bool = False
    spaces: int = -1  # free: spaces inside the values (not the constants between them)


def _categorical(col, n: int) -> bool:
    """Few distinct values in the first 64 (then a dict code per message pays off)."""
    try:
        sample = set(col[:64]) if n > 64 else set(col)
    except TypeError:
        return False  # unhashable values: the join refuses them
    return len(sample) <= max(1, min(n, 64) // 4)


def _encode_columns(consts: list[str], cols: list, n: int):
    """(per-record piece lists after the lead piece, the leading categorical columns,
    encoded constants, _Col per column) or None when the template way does not apply
    (a None or non-str value, a NUL, an unencodable character)."""
    # A None (or any non-str) value fails the join or the type check below.
    try:
        cenc = [c.encode() for c in consts]
    except UnicodeEncodeError:
        return None
    if any(b"\x00" in c for c in cenc):
        return None
    infos: list[_Col] = []
    for j, col in enumerate(cols, start=1):
        tail = consts[j]
        if _categorical(col, n):
            idx = _Pieces(lambda v, d=None: len(idx))  # codes in order of first appearance
            try:
                codes = np.fromiter(map(idx.__getitem__, col), dtype=np.int64, count=n)
            except TypeError:
                return None  # an unhashable value
            distinct = list(idx)
            if not all(type(v) is str for v in distinct):
                return None
            try:
                enc = [v.encode() for v in distinct]
            except UnicodeEncodeError:
                return None
            lens = np.array([len(e) for e in enc], dtype=np.int64)[codes]
            infos.append(_Col(col, lens, codes, distinct))
        else:
            try:
                text = (tail + "\x00").join(col) + tail
                data = text.encode()
            except (TypeError, UnicodeEncodeError):
                return None
            parts = data.split(b"\x00")
            if len(parts) != n:
                return None  # a value holds a NUL
            buf = np.frombuffer(data, dtype=np.uint8)
            ends = np.empty(n, dtype=np.int64)
            ends[:-1] = np.flatnonzero(buf == 0)
            ends[-1] = len(data)
            starts = np.empty(n, dtype=np.int64)
            starts[0] = 0
            starts[1:] = ends[:-1] + 1
            ends -= len(cenc[j])
            spaces = text.count(" ") - n * tail.count(" ")
            infos.append(_Col(col, ends - starts, buf=buf, ends=ends, ascii=text.isascii(),
                              codes=None, distinct=parts, spaces=spaces))  # distinct: pieces, for now
    lead = 0
    while lead < len(infos) and infos[lead].codes is not None:
        lead += 1
    pieces = []
    for j, info in enumerate(infos, start=1):
        if j <= lead:
            continue
        if info.codes is not None:
            table = [v.encode() + cenc[j] for v in info.distinct]
            pieces.append(list(map(table.__getitem__, info.codes.tolist())))
        else:
            pieces.append(info.distinct)
            info.distinct = None
    return pieces, lead, cenc, infos


def _lead_pieces(tblocks: list[bytes], topic_codes, plens: np.ndarray, cenc0: bytes,
                 cats: list[tuple[_Col, bytes]]) -> list[bytes] | None:
    """Per record: topic length + topic, properties length, the first constant and the
    leading categorical columns with their constants, one bytes object per distinct
    combination (a dict lookup per record). None if the combinations do not fit int64."""
    comb = plens if topic_codes is None else plens + topic_codes * (_FAST_PROPS_MAX + 1)
    span = (_FAST_PROPS_MAX + 1) * len(tblocks)
    for info, _ in cats:
        d = len(info.distinct)
        span *= d
        if span >= 1 << 62:
            return None
        comb = comb * d + info.codes
    def piece(u: int) -> bytes:
        rest, tail = u, []
        for info, cj in reversed(cats):
            rest, c = divmod(rest, len(info.distinct))
            tail.append(info.distinct[c].encode() + cj)
        t, pl = divmod(rest, _FAST_PROPS_MAX + 1)
        return b"".join([tblocks[t], _PROPS_LEN.pack(pl), cenc0, *reversed(tail)])

    return list(map(_Pieces(piece).__getitem__, comb.tolist()))


class _Pieces(dict):
    """A dict that makes a missing value with ``make(key)`` (once per distinct key)."""

    __slots__ = ("make",)

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        v = self[key] = self.make(key)
        return v


def _encode_properties(batch: MessageBatch, n: int, trailing: bool, tblocks: list[bytes],
                       topic_codes):
    """(pieces per record after the body, properties lengths, {name: _Col}, texts) or
    None when some text exceeds the fast limit. ``texts`` is the stored-texts column (then
    dispatch parses them), else None."""
    cols_info: dict[str, _Col] = {}
    texts = None
    enc = None
    if batch.properties_texts is None:
        consts, names, cols = _template(batch.properties, trailing)
        enc = _encode_columns(consts, cols, n) if n else None
    if enc is not None:
        pieces, lead, cenc, infos = enc
        plens = np.full(n, sum(map(len, cenc)), dtype=np.int64)
        for info in infos:
            plens += info.lens
        if int(plens.max()) > _FAST_PROPS_MAX:
            return None
        cats = [(infos[j], cenc[j + 1]) for j in range(lead)]
        first = _lead_pieces(tblocks, topic_codes, plens, cenc[0], cats)
        if first is not None:
            return [first] + pieces, plens, dict(zip(names, infos)), None
    if batch.properties_texts is not None:
        texts = list(batch.properties_texts)
        props_b = _encode_texts(texts)
    else:
        props_b = _encode_texts(_texts_generic(batch.properties, n, trailing))
    plens = np.fromiter(map(len, props_b), dtype=np.int64, count=n)
    if int(plens.max()) > _FAST_PROPS_MAX:
        return None
    return [_lead_pieces(tblocks, topic_codes, plens, b"", []), props_b], plens, cols_info, texts


# --- the fast put ----------------------------------------------------------------------


def _int_column(v, n: int):
    """A scalar stays a Python int; a column becomes int64 (a scalar if all equal)."""
    if _is_scalar(v):
        return int(v)
    a = np.asarray(v, dtype=np.int64)
    if n and a.min() == a.max():
        return int(a[0])
    return a


_header_templates: dict = {}


def _fallback(store, batch: MessageBatch, stamp: bool):
    return store.put_batch(batch.messages(), stamp=stamp)


def put_columns(store, batch: MessageBatch, *, stamp: bool = False):
    """:meth:`MessageStore.put_columns`: see the module docstring."""
    store._check_open()
    n = len(batch)
    if n == 0:
        return []
    a = store.appender
    # --- checks that send the batch the general way --------------------------------------
    topic = batch.topic
    single = isinstance(topic, str)
    distinct = {topic} if single else set(topic)
    if SCHEDULE_TOPIC in distinct:
        return _fallback(store, batch, stamp)
    blocks = {}
    for t in distinct:
        entry = a._topics.get(t) or a._topic_entry(t)
        if entry is None or entry[0] != L.MAGIC_V1:
            return _fallback(store, batch, stamp)
        blocks[t] = entry[1]
    born, st_host = batch.born_host, batch.store_host
    k = (len(born[0]) == 16) + 2 * (len(st_host[0]) == 16)
    fixed, _, host_bits = a._fixed[k]
    dtype = a._batch_dtypes[k]
    bodies = batch.bodies
    try:
        blens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    except TypeError:  # a None body is an empty one
        bodies = [b if b is not None else b"" for b in bodies]
        blens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if int(blens.max()) > a._max_body:
        return _fallback(store, batch, stamp)
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
    enc = _encode_properties(batch, n, a._trailing, tblocks, topic_codes)
    if enc is None:
        return _fallback(store, batch, stamp)
    pieces, plens, cols_info, texts = enc
    totals = fixed + blens + tlens + 2 + plens
    total = int(totals.sum())
    if int(totals.max()) > a._max_total or total + L.END_FILE_MIN_BLANK_LENGTH > a.size:
        return _fallback(store, batch, stamp)
    # --- the fixed fields -------------------------------------------------------------------
    crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n)
    crcs &= BODY_CRC_MASK
    sys_flag = _int_column(batch.sys_flag, n)
    sys_arr = (sys_flag & ~_HOST_BITS) | host_bits
    tx = sys_arr & _TX_MASK
    qids = _int_column(batch.queue_ids, n)
    if isinstance(tx, int):
        advance = advances_queue_offset(tx)
        advance_arr = None
    else:
        advance_arr = advances_queue_offset(tx)  # and so gets_cq_unit: the units below
        advance = None
    # Queue keys and each message's rank within its queue (consecutive queue offsets).
    if single:
        q = np.broadcast_to(np.asarray(qids, dtype=np.int64), (n,))
        if isinstance(qids, int):
            codes = np.zeros(n, dtype=np.int64)
            keys = [(topic, qids)]
        else:
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
    else:
        q = np.broadcast_to(np.asarray(qids, dtype=np.int64), (n,))
        kmap: dict = {}
        codes = np.fromiter((kmap.setdefault(x, len(kmap)) for x in zip(topics, q.tolist())),
                            dtype=np.int64, count=n)
        keys = list(kmap)
    nk = len(keys)
    if advance is False:
        codes = np.full(n, nk, dtype=np.int64)
    elif advance_arr is not None:
        codes = np.where(advance_arr, codes, nk)
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
    rel = np.cumsum(totals)
    rel -= totals
    tkey = (k, batch.flag, batch.born_timestamp, born, st_host, batch.reconsume_times,
            batch.prepared_transaction_offset) if all(
        _is_scalar(v) for v in (batch.flag, batch.born_timestamp, batch.reconsume_times,
                                batch.prepared_transaction_offset)) else None
    row = _header_templates.get(tkey) if tkey is not None else None
    if row is None:
        row = np.zeros(1, dtype=dtype)
        row["magic"] = L.MAGIC_V1
        for name in ("born_host", "store_host"):
            h = born if name == "born_host" else st_host
            row[name + "_address"] = np.frombuffer(h[0], dtype=np.uint8)
            row[name + "_port"] = h[1]
        if tkey is not None:
            row["flag"] = batch.flag
            row["born_timestamp"] = batch.born_timestamp
            row["reconsume_times"] = batch.reconsume_times
            row["prepared_transaction_offset"] = batch.prepared_transaction_offset
            if len(_header_templates) > 64:
                _header_templates.clear()
            _header_templates[tkey] = row
    # The template row repeated (a bytes product: far cheaper than a structured fill).
    hdr = np.frombuffer(bytearray(row.tobytes() * n), dtype=dtype)
    if tkey is None:
        for name, v in (("flag", batch.flag), ("born_timestamp", batch.born_timestamp),
                        ("reconsume_times", batch.reconsume_times),
                        ("prepared_transaction_offset", batch.prepared_transaction_offset)):
            hdr[name] = _int_column(v, n)
    hdr["total_size"] = totals
    hdr["body_crc"] = crcs
    hdr["queue_id"] = qids
    hdr["sys_flag"] = sys_arr
    hdr["body_length"] = blens
    if not stamp:
        store_ts = _int_column(batch.store_timestamp, n)
        hdr["store_timestamp"] = store_ts
    # --- under the append lock: offsets, timestamps, bytes, dispatch ---------------------
    record = store._columns_record
    with a.lock:
        start = a.reserve(total)
        phys = rel + start
        counters = a.queue_offsets
        base = np.array([counters.get(key, 0) for key in keys] + [0], dtype=np.int64)
        if advance is True:
            qoffs = base[codes] + rank
        elif advance is False:
            qoffs = np.zeros(n, dtype=np.int64)
        else:
            qoffs = np.where(advance_arr, base[codes] + rank, 0)
        if stamp:
            store_ts = now_ms()
            hdr["store_timestamp"] = store_ts
        hdr["queue_offset"] = qoffs
        hdr["physical_offset"] = phys
        heads = hdr.view(f"V{fixed}").tolist()
        data = b"".join(itertools.chain.from_iterable(zip(heads, bodies, *pieces)))
        a._place(data, total)
        for key, b, u in zip(keys, base[:nk].tolist(), used.tolist()):  # once written
            if u:
                counters[key] = b + u
        a.last_store_timestamp = store_ts if isinstance(store_ts, int) else int(store_ts[-1])
        a.last_record_offset = int(phys[-1])
        if record is not None:
            cols = _Dispatched(topic if single else None, topics, distinct, q, qoffs, phys,
                               totals, sys_arr, tx, store_ts, batch, texts, cols_info,
                               order, codes, keys, used, base)
            try:
                record(cols)
            except StoreIOError as e:  # the batch is written: it is put (MessageStore._failed)
                a.dispatch_failed(e)
    if isinstance(store_ts, int):
        ts_list = itertools.repeat(store_ts, n)
    else:
        ts_list = store_ts.tolist()
    prefix = a._msg_id_prefix.get(st_host) or offset_msg_id_prefix(st_host)
    results = PutResults(phys, totals, qoffs, ts_list, itertools.repeat(prefix, n))
    if store._sync_flush and not store.flusher.wait_flushed(results.end):
        from .append import PutStatus
        for r in results:
            r.status = PutStatus.FLUSH_DISK_TIMEOUT
    return results


@dataclass(slots=True)
class _Dispatched:
    """What dispatch needs of a columnar batch just written."""

    topic: str | None  # the one topic, or None (then ``topics``)
    topics: list[str] | None
    distinct: set
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    sys_flags: Any  # int or array
    tx: Any  # int or array
    store_timestamps: Any  # int or array
    batch: MessageBatch
    texts: list[str] | None
    cols: dict  # property name -> _Col, for the template's columns
    order: np.ndarray | None  # messages sorted by queue (stable), None: one queue
    codes: np.ndarray  # queue key code per message (len(keys) for no CQ unit)
    keys: list
    used: np.ndarray  # messages per key
    base: np.ndarray  # first queue offset per key

    def __len__(self) -> int:
        return len(self.offsets)

    def column(self, name: str):
        """A property as a per-message sequence (or a str for all), None if absent."""
        return self.batch.properties.get(name)

    def topic_list(self) -> list[str]:
        return [self.topic] * len(self) if self.topic is not None else self.topics

    def full(self, v) -> list:
        n = len(self)
        if isinstance(v, np.ndarray):
            return v.tolist()
        return [v] * n

    def props(self) -> list[dict]:
        b = self.batch
        if self.texts is not None:
            return [parse_properties(t) for t in self.texts]
        n = len(self)
        cols = [itertools.repeat(v, n) if isinstance(v, str) else v for v in b.properties.values()]
        names = list(b.properties)
        rows = zip(*cols) if cols else itertools.repeat((), n)
        return [{k: v for k, v in zip(names, row) if v is not None} for row in rows]

    def appended(self) -> list[Appended]:
        return [Appended(o, s, t, q, qo, f, x, p) for o, s, t, q, qo, f, x, p in zip(
            self.offsets.tolist(), self.sizes.tolist(), self.topic_list(), self.queue_ids.tolist(),
            self.queue_offsets.tolist(), self.full(self.sys_flags),
            self.full(self.store_timestamps), self.props())]


def dispatch_columns(dispatcher, c: _Dispatched) -> None:
    """Dispatch a columnar batch (sync mode): the bytes of ``Dispatcher.dispatch_columns``
    for the equivalent messages."""
    dispatcher.settle_index()
    n = len(c)
    if c.texts is not None or n < 16:
        # Stored texts: parse them, as put_batch's dispatch does.
        dispatcher.dispatch_columns(c.topic_list(), c.distinct, c.queue_ids, c.queue_offsets,
                                    c.offsets, c.sizes, np.broadcast_to(c.sys_flags, (n,)),
                                    c.full(c.store_timestamps),
                                    None if c.texts is not None else c.props(),
                                    c.texts if c.texts is not None else [""] * n)
        return
    ts = c.store_timestamps
    # --- ConsumeQueue: tagsCode per distinct tag, one dense block per queue --------------
    cq_any = bool(c.used.any())
    if cq_any:
        tags = c.column("TAGS")
        info = c.cols.get("TAGS")
        if tags is None:
            codes = 0
        elif isinstance(tags, str):
            codes = dispatcher.tags_code_of(tags)
        elif info is not None and info.codes is not None:
            codes = np.array([dispatcher.tags_code_of(t) for t in info.distinct],
                             dtype=np.int64)[info.codes]
        else:
            table = {t: dispatcher.tags_code_of(t) for t in set(tags)}
            codes = np.fromiter(map(table.__getitem__, tags), dtype=np.int64, count=n)
        units = np.empty(n, dtype=L.CQ_UNIT_DTYPE)
        order = c.order
        if order is None:
            phy, size = c.offsets, c.sizes
            units["tags_code"] = codes
        else:
            phy, size = c.offsets[order], c.sizes[order]
            units["tags_code"] = codes if isinstance(codes, int) else codes[order]
        units["commit_log_offset"] = phy
        units["size"] = size
        data = units.tobytes()
        ends = (phy + size).tolist()
        at = 0
        for key, u, b in zip(c.keys, c.used.tolist(), c.base.tolist()):
            if u:
                dispatcher.put_units(key, b, data[at * _CQ_UNIT:(at + u) * _CQ_UNIT],
                                     ends[at], ends[at + u - 1], units[at:at + u])
                at += u
        if isinstance(ts, int):
            dispatcher.logics_timestamp = ts
        else:
            last = int(np.flatnonzero(c.codes < len(c.keys))[-1])
            dispatcher.logics_timestamp = int(ts[last])
    # --- IndexFile ----------------------------------------------------------------------
    index = dispatcher.index
    if index is not None:
        if not index.files or index.files[-1].is_write_full:
            index.current_file()  # the first dispatched record creates a file (§7.5)
        tx = c.tx
        if isinstance(tx, int):
            indexed = None if gets_index_keys(tx) else False
        else:
            indexed = gets_index_keys(tx)
            if indexed.all():
                indexed = None
        if indexed is not False:
            h, phy, kts = _index_entries(dispatcher, c, indexed)
            if h is not None and len(h):
                put_index_hashes(index, h, phy, kts)
    dispatcher.dispatched += n


def _single_tokens(keys) -> bool:
    """Every KEYS value is one non-empty token (no None, no space)."""
    return None not in keys and "" not in keys and " " not in "".join(keys)


def _index_entries(dispatcher, c: _Dispatched, indexed):
    """(hashes, offsets, timestamps) of the index keys in dispatch order: per message
    UNIQ_KEY, then each KEYS token (spec §7.3); ``indexed`` None means every message."""
    n = len(c)
    uniq, keys = c.column("UNIQ_KEY"), c.column("KEYS")
    if uniq is None and keys is None:
        return None, None, None
    ts = c.store_timestamps
    tsa = np.broadcast_to(np.asarray(ts, dtype=np.int64), (n,))
    if c.topic is not None and indexed is None:
        cols = []
        for name in ("UNIQ_KEY", "KEYS"):
            h = _column_hashes(c, name)
            if h is None:
                cols = None
                break
            if len(h):
                cols.append(h)
        if cols is not None:
            if not cols:
                return None, None, None
            if len(cols) == 1:
                return cols[0], c.offsets, tsa
            return (np.column_stack(cols).ravel(), np.repeat(c.offsets, 2), np.repeat(tsa, 2))
    # The general case: key strings, hashed together.
    from ..format.hashing import index_hashes
    topics = c.topic_list()
    us = itertools.repeat(uniq, n) if uniq is None or isinstance(uniq, str) else uniq
    ks = itertools.repeat(keys, n) if keys is None or isinstance(keys, str) else keys
    ok = itertools.repeat(True, n) if indexed is None else indexed.tolist()
    full, kphy, kts = [], [], []
    for t, u, kk, o, p, x in zip(topics, us, ks, ok, c.offsets.tolist(), tsa.tolist()):
        if not o:
            continue
        if u is not None:
            full.append(f"{t}#{u}")
            kphy.append(p)
            kts.append(x)
        if kk:
            for tok in kk.split(" "):
                if tok:
                    full.append(f"{t}#{tok}")
                    kphy.append(p)
                    kts.append(x)
    if not full:
        return None, None, None
    return index_hashes(full), kphy, kts


_POW31_N = pow31(_FAST_KEY_MAX + 1).copy()
_POW31_F = _POW31_N.astype(np.float64)
_prefix_terms: dict[str, np.ndarray] = {}


def _column_hashes(c: _Dispatched, name: str) -> np.ndarray | None:
    """Index hashes of one key per message from UNIQ_KEY (the whole value) or KEYS (one
    token each): an empty array when the property is absent or an empty KEYS, None
    when the fast forms do not apply (several tokens, not ASCII, ...)."""
    v = c.column(name)
    n = len(c)
    keys = name == "KEYS"
    if v is None or (keys and isinstance(v, str) and v == ""):
        return np.zeros(0, dtype=np.int64)
    if isinstance(v, str):
        if keys and " " in v:
            return None
        h = _token_hashes(c.topic, [v])
        return None if h is None else np.repeat(h, n)
    info = c.cols.get(name)
    if keys:
        if info is not None and info.codes is None:
            if info.spaces or not info.lens.all():
                return None  # several tokens, or an empty KEYS (no tokens)
        elif not _single_tokens(v if info is None else info.distinct):
            return None
    if info is None:
        return None if None in v else _token_hashes(c.topic, v)
    if info.codes is not None:
        h = _token_hashes(c.topic, info.distinct)
        return None if h is None else h[info.codes]
    if not info.ascii:
        return None
    return _span_hashes(c.topic, info.buf, info.ends, info.lens)


def _token_hashes(topic: str, tokens) -> np.ndarray | None:
    """Index hashes (spec §7.2) of ``topic#token`` for ASCII tokens without NUL, as int64
    (None otherwise: the caller then hashes the key strings)."""
    n = len(tokens)
    try:
        joined = "\x00".join(tokens)
    except TypeError:
        return None
    if not joined.isascii():
        return None
    buf = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    ends = np.empty(n, dtype=np.int64)
    seps = np.flatnonzero(buf == 0)
    if len(seps) != n - 1:
        return None  # a token holds a NUL
    ends[:-1] = seps
    ends[-1] = len(buf)
    lens = np.empty(n, dtype=np.int64)
    lens[0] = ends[0]
    np.subtract(ends[1:], seps + 1, out=lens[1:])
    return _span_hashes(topic, buf, ends, lens)


def _span_hashes(topic: str, buf: np.ndarray, ends: np.ndarray,
                 lens: np.ndarray) -> np.ndarray | None:
    """Index hashes of ``topic#token`` for the ASCII tokens ``buf[ends - lens:ends]``:
    right-aligned into an (n, longest) matrix (bytes before a token zeroed) and summed
    against powers of 31 (exact in float64: each sum is below 2**47), plus the topic's
    ``topic#`` hash times 31**len (mod 2**32). None for a token over 256 bytes."""
    width = int(lens.max()) if len(lens) else 0
    if width > _FAST_KEY_MAX:
        return None
    terms = _prefix_terms.get(topic)
    if terms is None:
        ph = prefix_hash(topic)
        terms = (_POW31_N * np.uint64(ph)) & np.uint64(0xFFFFFFFF)
        if len(_prefix_terms) >= 4096:
            _prefix_terms.clear()
        _prefix_terms[topic] = terms
    h = terms[lens]
    if width:
        padded = np.zeros(width + len(buf), dtype=np.uint8)
        padded[width:] = buf
        cols = np.arange(width)
        mat = padded[ends[:, None] + cols]  # token i ends at column width - 1
        mat[cols < (width - lens)[:, None]] = 0  # bytes before the token
        part = mat.astype(np.float64) @ _POW31_F[width - 1::-1]
        h = h + part.astype(np.uint64)
    h &= np.uint64(0xFFFFFFFF)
    return index_abs_many(h)


def put_index_hashes(index, key_hashes, phy_offsets, store_timestamps) -> None:
    """``IndexService.put_hashes(..., skip_stale=True)`` for the keys of one batch (offsets
    ascending), same bytes, without the general path's stale-key filtering when no key
    can be stale (each file's entries are linked by :meth:`IndexFile.put_many`)."""
    h = np.asarray(key_hashes, dtype=np.int64)
    phy = np.asarray(phy_offsets, dtype=np.int64)
    ts = np.asarray(store_timestamps, dtype=np.int64)
    files = index.files
    end0 = files[-1].header.end_phy_offset if files else 0
    if not files or int(phy[0]) < end0 or len(h) >= 1 << 31 \
            or index.geometry.hash_slot_num >= 1 << 31:
        index.put_hashes(h, phy, ts, skip_stale=True)  # stale keys to drop: the general way
        return
    i, n = 0, len(h)
    while i < n:
        f = index.files[-1]
        if f.is_write_full:
            f = index.current_file()
        m = min(index.geometry.index_num - f.header.index_count, n - i)
        f.put_many(h[i:i + m], phy[i:i + m], ts[i:i + m])
        i += m


