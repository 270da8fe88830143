"""Index files written like the broker's IndexService (spec §7.3-7.5): a directory of
IndexFiles named for their creation time, a new one when the last fills;
:meth:`~IndexService.put_key` is the broker's putKey (§7.4),
:meth:`~IndexService.build_index` the per-record dispatch rules (§7.3), and
:meth:`~IndexService.put_hashes` a vectorised bulk form that writes the same bytes as
repeated putKey. :func:`recover_unfinished` undoes what an interrupted writer left.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..format import layout as L
from ..format.hashing import index_hash
from ..format.rules import index_keys
from .index import DEFAULT_MAX_MSGS_NUM_BATCH, LONG_MAX, IndexFile, IndexGeometry, list_index_files
from .index_query import IndexQueryResult, query_offset


def index_file_name(epoch_ms: int, tz: tzinfo | None = None) -> str:
    """``yyyyMMddHHmmssSSS`` in ``tz`` (default: local time, as the broker does)."""
    t = datetime.fromtimestamp(epoch_ms / 1000, tz) if tz else datetime.fromtimestamp(epoch_ms / 1000)
    return t.strftime("%Y%m%d%H%M%S") + f"{epoch_ms % 1000:03d}"


def recover_unfinished(index_dir: str | os.PathLike, geometry: IndexGeometry) -> None:
    """After a crash: undo what an interrupted write left in the last index file.

    * :meth:`IndexFile.create` makes the file and then sizes it; a writer killed in between
      (the sizing can wait on the filesystem journal) leaves a 0-byte file that holds
      nothing and fits no geometry: it is deleted (the next key creates it again).
    * A put writes its entries, then the slot heads, then the header (spec §7.4); a writer
      killed before the header leaves heads pointing at entries the header does not count.
      Each such head goes back to the head it replaced, the prevIndex of the entry it
      points at, so the next put neither links to nor counts the unfinished entries.
    """
    d = Path(index_dir)
    files = list_index_files(d) if d.is_dir() else []
    if not files:
        return
    if files[-1].stat().st_size == 0:
        files[-1].unlink()
        return
    f = IndexFile(files[-1], geometry, writable=True)
    try:
        count, slots, entries = f.header.index_count, f.slots, f.entries
        for s in np.flatnonzero(slots >= count).tolist():
            head = int(slots[s])
            for _ in range(geometry.index_num):
                if head < count or head >= geometry.index_num:
                    break
                head = int(entries[head]["prev_index"])
            slots[s] = head if 0 <= head < count else 0
        del slots, entries  # no view of the map may outlive it
    finally:
        f.close()


class IndexService:
    """Writes index files in a directory like the broker's IndexService (spec §7.3-7.5).

    ``clock`` returns epoch milliseconds and names new files; a name already used is
    bumped by a millisecond so two files never collide. A file that fills is msync'ed,
    as the broker does, unless ``flush_full_files`` is off (tests, scratch builds).
    The caller holds the store lock.
    """

    def __init__(self, index_dir: str | os.PathLike, geometry: IndexGeometry, *,
                 clock: Callable[[], int] | None = None, tz: tzinfo | None = None,
                 max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
                 flush_full_files: bool = True, on_full: Callable[[], None] | None = None):
        self.path = Path(index_dir)
        self.on_full = on_full  # called once a full file is flushed (the store's checkpoint)
        self.path.mkdir(parents=True, exist_ok=True)
        self.flush_full_files = flush_full_files
        self.geometry = geometry
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.tz = tz
        self.max_msgs_num_batch = max_msgs_num_batch
        paths = list_index_files(self.path)
        self.files = [IndexFile(p, geometry, writable=(i == len(paths) - 1))
                      for i, p in enumerate(paths)]
        #: endTimestamp of the last file that filled and was flushed (checkpoint §8.1).
        self.index_msg_timestamp: int | None = None

    def _new_file(self) -> IndexFile:
        ms = self.clock()
        name = index_file_name(ms, self.tz)
        last = self.files[-1].path.name if self.files else ""
        while name <= last or (self.path / name).exists():
            ms += 1
            name = index_file_name(ms, self.tz)
        prev = self.files[-1] if self.files else None
        f = IndexFile.create(self.path / name, self.geometry, prev)
        self.files.append(f)
        if prev is not None:
            if self.flush_full_files:
                prev.flush()
            self.index_msg_timestamp = prev.header.end_timestamp
            if self.on_full is not None:
                self.on_full()
        return f

    def current_file(self) -> IndexFile:
        """getAndCreateLastIndexFile: the last file, or a new one if none or full."""
        if not self.files or self.files[-1].is_write_full:
            return self._new_file()
        return self.files[-1]

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> None:
        """putKey of ``topic#key`` (spec §7.4), rolling to a new file when full."""
        self.put_hash(index_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> None:
        if not 0 <= key_hash <= L.INT32_MAX:
            raise ValueError(f"index hashes are 0 .. 2^31-1 (spec §7.2), got {key_hash}")
        f = self.files[-1] if self.files else self._new_file()
        if not f.put(key_hash, phy_offset, store_timestamp):
            self._new_file().put(key_hash, phy_offset, store_timestamp)

    def build_index(self, topic: str, uniq_key: str | None, keys: str | Iterable[str] | None,
                    phy_offset: int, store_timestamp: int, sys_flag: int = 0) -> int:
        """Dispatch one record (spec §7.3); returns the number of keys put.

        ``keys`` is the KEYS property text (split on single spaces) or its tokens.
        """
        f = self.current_file()
        if phy_offset < f.header.end_phy_offset:
            return 0
        todo = index_keys(topic, uniq_key, keys, sys_flag)
        for k in todo:
            self.put_key(k, phy_offset, store_timestamp)
        return len(todo)

    def put_hashes(self, key_hashes, phy_offsets, store_timestamps, *,
                   skip_stale: bool = False) -> int:
        """Bulk putKey of index hashes in dispatch order; same bytes as :meth:`put_hash`.

        ``skip_stale`` applies the ``offset < endPhyOffset`` rule of spec §7.3 per entry
        (equal to the per-record rule, as a record's keys share one offset).
        """
        h = np.asarray(key_hashes, dtype=np.int64)
        phy = np.asarray(phy_offsets, dtype=np.int64)
        ts = np.asarray(store_timestamps, dtype=np.int64)
        if len(h) and (h.min() < 0 or h.max() > L.INT32_MAX):
            raise ValueError("index hashes are 0 .. 2^31-1 (spec §7.2)")
        if skip_stale and len(phy):
            end0 = self.files[-1].header.end_phy_offset if self.files else 0
            keep = phy >= np.maximum.accumulate(np.concatenate(([end0], phy[:-1])))
            h, phy, ts = h[keep], phy[keep], ts[keep]
        i, n = 0, len(h)
        while i < n:
            f = self.files[-1] if self.files else self._new_file()
            if f.is_write_full:
                f = self._new_file()
            m = min(self.geometry.index_num - f.header.index_count, n - i)
            f.put_many(h[i:i + m], phy[i:i + m], ts[i:i + m])
            i += m
        return n

    def query(self, topic: str, key: str, max_num: int = DEFAULT_MAX_MSGS_NUM_BATCH,
              begin: int = 0, end: int = LONG_MAX) -> IndexQueryResult:
        return query_offset(self.files, topic, key, max_num, begin, end, self.max_msgs_num_batch)

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    def __enter__(self) -> "IndexService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def build_index(index_dir: str | os.PathLike, geometry: IndexGeometry, key_hashes,
                phy_offsets, store_timestamps, *, clock: Callable[[], int] | None = None,
                tz: tzinfo | None = None, flush: bool = False) -> list[Path]:
    """Bulk-write index files for entries in dispatch order; returns the files' paths."""
    with IndexService(index_dir, geometry, clock=clock, tz=tz, flush_full_files=flush) as svc:
        svc.put_hashes(key_hashes, phy_offsets, store_timestamps)
        if flush:
            svc.flush()
        return [f.path for f in svc.files]
