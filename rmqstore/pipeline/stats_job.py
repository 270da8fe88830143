"""The Spark stats job: per store, topic and queue, what ``rmqstore stats`` gives.

Tasks return per-queue partial aggregates of their split; the driver merges those of the
kept splits with :func:`stats.merge_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from .. import stats as ST
from ..scan import splits as S
from .tasks import (BOUNDARY, Progress, Stores, arrow_schema, boundary_from_row, maps_task_errors,
                    over_splits, quiet, store_files)


_STATS = BOUNDARY + [T.StructField("topic", T.StringType()), T.StructField("queue_id", T.LongType()),
                      T.StructField("count", T.LongType()), T.StructField("bytes", T.LongType()),
                      T.StructField("min_queue_offset", T.LongType()),
                      T.StructField("max_queue_offset", T.LongType()),
                      T.StructField("first_store_timestamp", T.LongType()),
                      T.StructField("last_store_timestamp", T.LongType())]


@dataclass
class StatsResult:
    stats: dict[str, list[ST.QueueStats]]  # per store, sorted by topic and queue id
    ends: dict[str, S.StoreEnd]


@maps_task_errors
def stats(spark: SparkSession, stores: Stores, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
          conf=None, progress: Progress = quiet) -> StatsResult:
    """Per store/topic/queue: count, bytes, min/max queue offset, first/last store time.
    Tasks aggregate their split with :func:`stats.queue_stats`; the driver merges the
    partials of the kept splits with :func:`stats.merge_stats`, as ``rmqstore stats``."""
    import pyarrow as pa

    progress("planning splits")
    files = store_files(stores, conf)
    splits = S.plan_splits(list(files.values()), split_size)

    def task(split, attempt):
        with S.open_split(split) as sc:
            b, qs = sc.boundary, ST.queue_stats(sc.records)
        rows = [{**b.as_row(), **{f: None for f in ST.STATS_FIELDS}}]
        rows += [{**b.as_row(), **q.__dict__} for q in qs]
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema(_STATS))

    progress(f"stats: {len(splits)} splits")
    rows = over_splits(spark, splits, task, T.StructType(_STATS)).collect()
    bounds, parts = {}, {}
    for r in rows:
        bounds[r["split_id"]] = boundary_from_row(r)
        if r["topic"] is not None:
            parts.setdefault(r["split_id"], []).append(ST.QueueStats(*[r[f] for f in ST.STATS_FIELDS]))

    def again(s):
        b, qs = S.split_stats(s)
        parts[s.split_id] = qs
        return b

    progress("checking split chain")
    st, _ = S.resolve(splits, bounds, again)
    by_store: dict[str, list] = {}
    for sid in st.keep:
        by_store.setdefault(splits[sid].store, []).append(parts.get(sid, []))
    return StatsResult({s: ST.merge_stats(by_store.get(s, [])) for s in files}, st.ends)
