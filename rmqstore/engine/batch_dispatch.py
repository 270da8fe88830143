"""Sync dispatch of a columnar batch just written (spec §6.1, §7.3): the bytes of
``Dispatcher.dispatch_columns`` for the equivalent messages, from the columns: tagsCodes
hashed once per distinct tag, the CQ units of each queue written as one dense block,
index keys hashed per token length from the topic's ``topic#`` prefix hash and put with
``IndexFile.put_many``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format import layout as L
from ..format.hashing import index_abs_many, pow31, prefix_hash
from ..format.message import parse_properties
from ..format.rules import gets_index_keys
from .results import Appended

_CQ_UNIT = L.CQ_UNIT_SIZE
_FAST_KEY_MAX = 256  # longest token hashed by the matrix form


@dataclass(slots=True)
class WrittenColumns:
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
    batch: Any  # the MessageBatch
    texts: list[str] | None
    cols: dict  # property name -> PropertyColumn, for the template's columns
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


def dispatch_columns(dispatcher, c: WrittenColumns) -> None:
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


def _index_entries(dispatcher, c: WrittenColumns, indexed):
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


def _column_hashes(c: WrittenColumns, name: str) -> np.ndarray | None:
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
