"""The one bulk dispatch (spec §6.1, §7.3, §9): the ConsumeQueue units and index keys of
many records just written, from columns, with the bytes :meth:`Dispatcher.dispatch_record`
writes one record at a time.

Every bulk dispatch is :func:`dispatch_columns` over a :class:`WrittenColumns`:

* the columnar put (``put_columns``): the properties as the columns it encoded;
* the vectorised ``put_batch`` (``batch.put_messages``): each message's properties, or
  its stored text;
* records as written (``Dispatcher.dispatch_many``: the general ``put_batch``, the
  background thread, the reput from the files), through :func:`appended_columns`.

tagsCodes are hashed once per distinct tag (the delivery time for ``SCHEDULE_TOPIC``,
:func:`rmqstore.format.rules.tags_code`), the CQ units of each queue are written as one
block (``Dispatcher.put_units``) when their queue offsets run on by one, index keys (each
record's UNIQ_KEY, then its KEYS tokens) are hashed all at once from their topics'
``topic#`` prefix hashes and put with ``IndexFile.put_many``."""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..format import layout as L
from ..format.hashing import index_hashes, joined_spans, key_token_spans, span_token_hashes
from ..format.message import parse_properties, split_keys
from ..format.rules import SCHEDULE_TOPIC, gets_cq_unit, gets_index_keys, tags_code
from .results import Appended

_CQ_UNIT = L.CQ_UNIT_SIZE
_SMALL = 16  # fewer records than this take the single-record path, one by one
_MISSING = object()


@dataclass(slots=True)
class WrittenColumns:
    """What dispatch needs of records just written, as columns (one entry per record,
    in CommitLog order).

    The properties come from one of: ``properties`` (name -> a ``str`` for every record,
    or a per-record sequence with None where absent; ``cols`` its encoded columns), 
    ``parsed`` (each record's dict) or ``texts`` (each record's stored text, parsed when
    needed). Queues: ``keys`` the (topic, queueId) of the records, ``codes`` each record's
    key (``len(keys)`` for one without a CQ unit), ``used`` the units per key, ``order``
    the records sorted by key, stably (None: already in that order), and ``base`` the
    first queue offset per key when each key's queue offsets run on by one from it
    (None: not known, the units go as they are)."""

    topic: str | None  # the one topic, or None (then ``topics``)
    topics: list[str] | None
    distinct: set
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    sys_flags: Any  # int or array
    tx: Any  # int or array: the transaction bits
    store_timestamps: Any  # int or array
    keys: list
    codes: np.ndarray
    used: np.ndarray
    order: np.ndarray | None
    base: np.ndarray | None
    properties: Mapping = field(default_factory=dict)
    cols: dict = field(default_factory=dict)  # property name -> PropertyColumn
    parsed: list | None = None
    texts: list | None = None
    topic_codes: tuple | None = None  # (topic names, each record's number) when ``topics``
    _named: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets)

    def column(self, name: str):
        """A property as a per-record sequence (None where absent) or a str for all;
        None when no record has it."""
        if self.parsed is None and self.texts is None:
            return self.properties.get(name)
        v = self._named.get(name, _MISSING)
        if v is _MISSING:
            v = list(map(operator.methodcaller("get", name), self.record_properties()))
            if v.count(None) == len(v):
                v = None
            self._named[name] = v
        return v

    def topic_list(self) -> list[str]:
        return [self.topic] * len(self) if self.topic is not None else self.topics

    def per_record(self, v) -> list:
        """A column given as an int for all, an array or a list, as a list."""
        if isinstance(v, np.ndarray):
            return v.tolist()
        if isinstance(v, (list, tuple)):
            return list(v)
        return [v] * len(self)

    def record_properties(self) -> list[dict]:
        """Each record's properties."""
        if self.parsed is not None:
            return self.parsed
        if self.texts is not None:
            self.parsed = list(map(parse_properties, self.texts))
            return self.parsed
        n = len(self)
        props = self.properties
        cols = [itertools.repeat(v, n) if isinstance(v, str) else v for v in props.values()]
        names = list(props)
        rows = zip(*cols) if cols else itertools.repeat((), n)
        return [{k: v for k, v in zip(names, row) if v is not None} for row in rows]

    def appended(self) -> list[Appended]:
        return [Appended(o, s, t, q, qo, f, x, p) for o, s, t, q, qo, f, x, p in zip(
            self.offsets.tolist(), self.sizes.tolist(), self.topic_list(), self.queue_ids.tolist(),
            self.queue_offsets.tolist(), self.per_record(self.sys_flags),
            self.per_record(self.store_timestamps), self.record_properties())]


_APPENDED = operator.attrgetter("offset", "size", "topic", "queue_id", "queue_offset",
                                "sys_flag", "store_timestamp", "properties")


def appended_columns(records: Sequence[Appended]) -> WrittenColumns:
    """Records as written (CommitLog order) as :class:`WrittenColumns`; their queue
    offsets go to the queues as they are (``base`` None)."""
    n = len(records)
    offs, sizes, topics, qids, qoffs, flags, stamps, props = zip(*map(_APPENDED, records))
    sys_flags = np.array(flags, dtype=np.int64)
    kmap: dict = {}
    codes = np.fromiter((kmap.setdefault(k, len(kmap)) for k in zip(topics, qids)),
                        dtype=np.int64, count=n)
    keys = list(kmap)
    codes = np.where(gets_cq_unit(sys_flags), codes, len(keys))
    used = np.bincount(codes, minlength=len(keys) + 1)[:len(keys)]
    distinct = set(topics)
    return WrittenColumns(
        topics[0] if len(distinct) == 1 else None, list(topics), distinct,
        np.array(qids, dtype=np.int64), np.array(qoffs, dtype=np.int64),
        np.array(offs, dtype=np.int64), np.array(sizes, dtype=np.int64), sys_flags,
        sys_flags & L.SYSFLAG_TRANSACTION_MASK, np.array(stamps, dtype=np.int64),
        keys, codes, used, np.argsort(codes, kind="stable"), None, parsed=list(props))


def dispatch_columns(dispatcher, c: WrittenColumns) -> None:
    """Dispatch the records of ``c`` with ``dispatcher`` (a
    :class:`~rmqstore.engine.dispatch.Dispatcher`): the bytes of
    ``dispatcher.dispatch_record`` for each record in turn."""
    dispatcher.settle_index()
    n = len(c)
    if n < _SMALL:
        _one_by_one(dispatcher, c)
        return
    ts = c.store_timestamps
    # --- ConsumeQueue: tagsCode per distinct tag, one block per queue --------------------
    if c.used.any():
        codes = _tags_codes(dispatcher, c)
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
        if c.base is not None:
            firsts = c.base.tolist()
        else:  # queue offsets as written: a block where they run on by one
            qo = c.queue_offsets if order is None else c.queue_offsets[order]
            firsts = _runs(qo, c.used)
        at = 0
        for key, u, first in zip(c.keys, c.used.tolist(), firsts):
            if u:
                if first is not None:
                    dispatcher.put_units(key, first, data[at * _CQ_UNIT:(at + u) * _CQ_UNIT],
                                         ends[at], ends[at + u - 1], units[at:at + u])
                else:
                    u_ = units[at:at + u]
                    dispatcher.queue_writer(key).put_many(
                        qo[at:at + u], u_["commit_log_offset"], u_["size"], u_["tags_code"])
                at += u
        if isinstance(ts, np.ndarray):
            last = int(np.flatnonzero(c.codes < len(c.keys))[-1])
            dispatcher.logics_timestamp = int(ts[last])
        else:
            dispatcher.logics_timestamp = int(ts)
    # --- IndexFile ----------------------------------------------------------------------
    index = dispatcher.index
    if index is not None:
        if not index.files or index.files[-1].is_write_full:
            index.current_file()  # every dispatched record gets a file with room (§7.5)
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


def _one_by_one(dispatcher, c: WrittenColumns) -> None:
    """A few records: :meth:`Dispatcher.dispatch_record` each (stored texts parsed there)."""
    n = len(c)
    texts = c.texts
    props = itertools.repeat(None, n) if texts is not None else c.record_properties()
    for t, q, qo, o, s, f, x, p, text in zip(
            c.topic_list(), c.queue_ids.tolist(), c.queue_offsets.tolist(), c.offsets.tolist(),
            c.sizes.tolist(), c.per_record(c.sys_flags), c.per_record(c.store_timestamps),
            props, texts if texts is not None else itertools.repeat("", n)):
        dispatcher.dispatch_record(t, q, qo, o, s, f, x, p, text)


def _runs(qo: np.ndarray, used: np.ndarray) -> list:
    """Per key (records sorted by key, ``used`` each), its first queue offset when its
    queue offsets run on by one, else None."""
    ends = np.cumsum(used)
    starts = ends - used
    q = qo[:int(ends[-1])]
    breaks = np.concatenate(([0], np.cumsum(np.diff(q) != 1)))  # steps not by one, so far
    last = np.maximum(ends - 1, 0)
    run = (used > 0) & (breaks[last] == breaks[np.minimum(starts, last)])
    return [int(q[s]) if r else None for s, r in zip(starts.tolist(), run.tolist())]


def _tags_codes(dispatcher, c: WrittenColumns):
    """Each record's tagsCode (an int for all, or an array): the TAGS hash, hashed once per
    distinct tag, or for ``SCHEDULE_TOPIC`` the delivery time (spec §6.1)."""
    n = len(c)
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
    if SCHEDULE_TOPIC in c.distinct:
        codes = np.array(np.broadcast_to(codes, (n,)), dtype=np.int64)
        topics, props = c.topic_list(), c.record_properties()
        ts = c.per_record(c.store_timestamps)
        for i in np.flatnonzero(c.codes < len(c.keys)).tolist():
            if topics[i] == SCHEDULE_TOPIC:
                codes[i] = tags_code(topics[i], props[i], ts[i], dispatcher.delay_millis)
    return codes


def _index_entries(dispatcher, c: WrittenColumns, indexed):
    """(hashes, offsets, timestamps) of the index keys in dispatch order: per message
    UNIQ_KEY, then each KEYS token (spec §7.3); ``indexed`` None means every message."""
    n = len(c)
    uniq, keys = c.column("UNIQ_KEY"), c.column("KEYS")
    if uniq is None and keys is None:
        return None, None, None
    ts = c.store_timestamps
    tsa = np.broadcast_to(np.asarray(ts, dtype=np.int64), (n,))
    got = _vector_keys(dispatcher, c, uniq, keys)
    if got is not None:
        h, rec = got
        if indexed is not None:
            keep = indexed[rec]
            h, rec = h[keep], rec[keep]
        return h, c.offsets[rec], tsa[rec]
    # The general case (a key not ASCII or over 256 bytes): key strings.
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
        for tok in split_keys(kk):
            full.append(f"{t}#{tok}")
            kphy.append(p)
            kts.append(x)
    if not full:
        return None, None, None
    return index_hashes(full), kphy, kts


def _vector_keys(dispatcher, c: WrittenColumns, uniq, keys):
    """(index hashes, record of each) of every record's UNIQ_KEY and KEYS tokens, in
    dispatch order, hashed in bulk from the topics' prefix hashes
    (:func:`~rmqstore.format.hashing.span_token_hashes`); None when a key is not ASCII
    or is over 256 bytes."""
    n = len(c)
    if c.topic is not None:
        prefix = dispatcher.prefix_of(c.topic)
    elif c.topic_codes is not None:
        names, codes = c.topic_codes
        prefix = np.array([dispatcher.prefix_of(t) for t in names], dtype=np.uint64)[codes]
    else:
        table = {t: dispatcher.prefix_of(t) for t in c.distinct}
        prefix = np.fromiter(map(table.__getitem__, c.topics), dtype=np.uint64, count=n)
    many = not isinstance(prefix, int)
    hs, recs = [], []
    if uniq is not None:
        info = c.cols.get("UNIQ_KEY")
        if info is not None and info.buf is not None and info.ascii:
            rec, spans = np.arange(n, dtype=np.int64), (info.buf, info.ends, info.lens)
        else:
            if isinstance(uniq, str):
                uniq = [uniq] * n
            if None in uniq:
                rec = np.flatnonzero(np.fromiter((u is not None for u in uniq), dtype=bool,
                                                 count=n))
                uniq = [u for u in uniq if u is not None]
            else:
                rec = np.arange(n, dtype=np.int64)
            spans = joined_spans(uniq) if len(uniq) else ()
        if spans is None:
            return None
        if spans:
            h = span_token_hashes(prefix[rec] if many else prefix, *spans)
            if h is None:
                return None
            hs.append(h)
            recs.append(rec)
    if keys is not None:
        info = c.cols.get("KEYS")
        if info is not None and info.buf is not None and info.ascii and not info.gap_space:
            buf, ends, lens = info.buf, info.ends, info.lens
        else:
            if isinstance(keys, str):
                keys = [keys] * n
            if None in keys:
                keys = [k if k is not None else "" for k in keys]
            spans = joined_spans(keys)
            if spans is None:
                return None
            buf, ends, lens = spans
        rec, ends, lens = key_token_spans(buf, ends, lens)
        h = span_token_hashes(prefix[rec] if many else prefix, buf, ends, lens)
        if h is None:
            return None
        hs.append(h)
        recs.append(rec)
    if len(hs) == 1:
        return hs[0], recs[0]
    if not hs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rec = np.concatenate(recs)
    # per record its UNIQ_KEY first, then its tokens in order (a stable sort keeps it)
    order = np.argsort(rec, kind="stable")
    return np.concatenate(hs)[order], rec[order]


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
