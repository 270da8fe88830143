"""The index side of sync dispatch (spec §7.3): each record's ``topic#UNIQ_KEY`` and
``topic#token`` keys into the IndexFiles, the usual record's keys waiting to be put
together.

A usual record's keys do not go in at once: they join a list of waiting keys, which are
hashed and put together (``IndexService.put_hashes``, the vectorised path the batches
use), with exactly the bytes one-at-a-time puts write (docs/engine.md, *Index
write-behind*). The wait is bounded: at most :data:`DEFER_MAX` keys, none from a record
starting more than :data:`DEFER_BYTES` before the end of the last record dispatched (the
bound a reopen after a crash re-indexes from: :func:`rmqstore.engine.reput.keys_behind`),
and all fitting in the current index file. :class:`IndexKeys` holds that list and the
index side of :class:`~rmqstore.engine.dispatch.Dispatcher`, which is one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..format.hashing import index_hashes, prefix_hash, token_hash, token_hashes

# At most this many keys wait, all from records starting at most DEFER_BYTES before the
# end of the last record dispatched (the bound a reopen after a crash relies on:
# MessageStore re-indexes that much).
DEFER_MAX = 1024
PENDING_MAX = 4 * DEFER_MAX  # the flat list's length when it holds DEFER_MAX keys
DEFER_BYTES = 1 << 20
_PREFIX_CACHE_MAX = 1 << 16


class IndexKeys:
    """The index keys of dispatched records, some waiting (the caller serialises calls).

    The state is read inline by ``Dispatcher.dispatch_record`` (the single put's fast
    path, one object so no call or lookup is added a put): ``_pending`` (flat runs of
    topic, key, offset, timestamp), ``_room`` (keys that may still wait: room left in the
    last index file) and ``_lag_end`` (records ending past it put their keys at once).
    """

    def __init__(self, index) -> None:
        self.index = index
        self._index_num = index.geometry.index_num if index is not None else 0
        self._key_prefix: dict[str, int] = {}  # topic -> prefix_hash(topic)
        self._pending: list = []
        self._room = 0
        self._lag_end = 0

    def prefix_of(self, topic: str) -> int:
        """:func:`~rmqstore.format.hashing.prefix_hash` of ``topic`` (cached)."""
        ph = self._key_prefix.get(topic)
        return ph if ph is not None else self._topic_prefix_hash(topic)

    def _topic_prefix_hash(self, topic: str) -> int:
        ph = prefix_hash(topic)
        if len(self._key_prefix) < _PREFIX_CACHE_MAX:
            self._key_prefix[topic] = ph
        return ph

    def _index_record(self, topic: str, props: dict, k: str | None, offset: int, end: int,
                      store_timestamp: int) -> None:
        """The index part of :meth:`dispatch_record`, written at once after the waiting
        keys; it also opens the next window of write-behind."""
        index = self.index
        self._drain()
        files = index.files
        if not files or files[-1].header.index_count >= self._index_num:
            files = self._index_files(index)
        f = files[-1]
        if offset >= f.header.end_phy_offset:  # the §7.3 endPhyOffset rule
            uniq = props.get("UNIQ_KEY")
            if k or uniq is not None:
                self._put_keys(files, topic, uniq, k, offset, store_timestamp)
        self._room = self._index_num - files[-1].header.index_count
        self._lag_end = end + DEFER_BYTES

    def _wait_tokens(self, topic: str, keys: str, offset: int, store_timestamp: int) -> None:
        """The tokens of a KEYS value with spaces join the waiting keys, or, when the
        current index file has no room for all of them, everything is put now."""
        tokens = keys.split(" ")
        if "" in tokens:
            tokens = [t for t in tokens if t]  # split_keys: empty tokens dropped
        if len(tokens) <= self._room:
            pend = self._pending
            for t in tokens:
                pend += (topic, t, offset, store_timestamp)
            self._room -= len(tokens)
            return
        self._drain()  # this record's UNIQ_KEY included
        files = self._index_files(self.index)
        if offset >= files[-1].header.end_phy_offset:  # §7.3, as for the UNIQ_KEY
            self._put_keys(files, topic, None, keys, offset, store_timestamp)
        self._room = self._index_num - files[-1].header.index_count

    def _drain(self) -> None:
        """Put the keys waiting in the write-behind list (see :meth:`settle_index`)."""
        pend = self._pending
        if not pend:
            return
        self._pending = []
        topics, keys, phys, stamps = pend[0::4], pend[1::4], pend[2::4], pend[3::4]
        if topics.count(topics[0]) == len(topics):
            prefix = self.prefix_of(topics[0])
        else:  # several topics: each key's own topic# hash
            table = {t: self.prefix_of(t) for t in set(topics)}
            prefix = np.fromiter(map(table.__getitem__, topics), dtype=np.uint64,
                                 count=len(topics))
        h = token_hashes(prefix, keys)
        if h is None:
            h = index_hashes([f"{t}#{k}" for t, k in zip(topics, keys)])
        self.index.put_hashes(h, phys, stamps, skip_stale=True)

    @property
    def keys_waiting(self) -> int:
        """Index keys in the write-behind list."""
        return len(self._pending) // 4

    def settle_index(self) -> None:
        """Write every index key still waiting: the index files then hold exactly what
        one-at-a-time puts would have written. Called before any other index write or
        read, on flush and on close."""
        self._drain()
        self._room = 0

    def _put_keys(self, files, topic: str, uniq: str | None, keys: str | None, offset: int,
                  store_timestamp: int) -> None:
        """Index entries of ``topic#UNIQ_KEY`` and ``topic#token`` per KEYS token, in that
        order, into the last of ``files`` (the index's list, which a full file extends)."""
        ph = self._key_prefix.get(topic)
        if ph is None:
            ph = self._topic_prefix_hash(topic)
        toks = [uniq] if uniq is not None else []
        if keys:
            toks += [t for t in keys.split(" ") if t]
        for t in toks:
            h = token_hash(ph, topic, t)
            if not files[-1].put(h, offset, store_timestamp):
                self.index.put_hash(h, offset, store_timestamp)  # full: next file

    @staticmethod
    def _index_files(index):
        """The index files, the last one with room (build_index's
        getAndCreateLastIndexFile, §7.5)."""
        files = index.files
        if not files or files[-1].header.index_count >= index.geometry.index_num:
            index.current_file()
            files = index.files
        return files
