"""Queries of the index files of a directory, the broker's way (queryOffset, spec §7.6):
:class:`IndexReader` maps them read-only; :func:`query_offset` also answers for the files
an :class:`~rmqstore.files.index_service.IndexService` writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..format.hashing import index_hash
from .index import (DEFAULT_MAX_MSGS_NUM_BATCH, LONG_MAX, IndexFile, IndexGeometry, list_index_files,
                    infer_index_geometry)


@dataclass
class IndexQueryResult:
    phy_offsets: list[int]  # ascending, duplicates kept (spec §7.6 step 4)
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


def query_offset(files: list[IndexFile], topic: str, key: str, max_num: int, begin: int, end: int,
           max_msgs_num_batch: int) -> IndexQueryResult:
    """queryOffset (spec §7.6): newest to oldest, time-overlap filter, early stops."""
    h = index_hash(f"{topic}#{key}")
    max_num = min(max_num, max_msgs_num_batch)
    out: list[int] = []
    last_ts = last_phy = 0
    for i, f in enumerate(reversed(files)):
        if i == 0:
            last_ts, last_phy = f.header.end_timestamp, f.header.end_phy_offset
        if f.time_matched(begin, end):
            f.select(h, max_num, begin, end, out)
        if f.header.begin_timestamp < begin or len(out) >= max_num:
            break
    return IndexQueryResult(sorted(out), last_ts, last_phy)


class IndexReader:
    """The index files of a directory, mapped read-only, oldest first (spec §7.5)."""

    def __init__(self, index_dir: str | os.PathLike, geometry: IndexGeometry | None = None,
                 *, max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH):
        self.path = Path(index_dir)
        self.max_msgs_num_batch = max_msgs_num_batch
        paths = list_index_files(self.path) if self.path.is_dir() else []
        if geometry is None and paths:
            sizes = {p.stat().st_size for p in paths}
            if len(sizes) > 1:
                raise ConfigError(f"index files have different sizes {sorted(sizes)}; "
                                  "pass maxHashSlotNum and maxIndexNum", self.path)
            geometry = infer_index_geometry(sizes.pop(), path=paths[0])
        self.geometry = geometry
        self.files = [IndexFile(p, geometry) for p in paths]

    def query(self, topic: str, key: str, max_num: int = DEFAULT_MAX_MSGS_NUM_BATCH,
              begin: int = 0, end: int = LONG_MAX) -> IndexQueryResult:
        return query_offset(self.files, topic, key, max_num, begin, end, self.max_msgs_num_batch)

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> "IndexReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
