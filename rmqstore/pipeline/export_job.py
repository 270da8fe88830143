"""The Spark export job: every valid record of some stores as one Parquet dataset.

Tasks return nothing but their split's boundary (and row count): with the pyarrow writer
they write and commit their own files (:mod:`pipeline.output`); with Spark's writer a
boundary-only pass (:func:`boundaries`) first gives every split its exact start.
"""

from __future__ import annotations

import os
from typing import Sequence

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from ..errors import InputError
from ..scan import arrow as AV
from ..scan import splits as S
from ..selection import MessageFilter
from . import output as O
from . import preflight as P
from .tasks import (BOUNDARY, Progress, Stores, arrow_schema, boundary_batch, boundary_from_row,
                    maps_task_errors, over_splits, quiet, store_files)


def _spark_schema(arrow_schema) -> T.StructType:
    def conv(t):
        import pyarrow as pa

        if pa.types.is_string(t):
            return T.StringType()
        if pa.types.is_int64(t):
            return T.LongType()
        if pa.types.is_int32(t):
            return T.IntegerType()
        if pa.types.is_boolean(t):
            return T.BooleanType()
        if pa.types.is_binary(t):
            return T.BinaryType()
        if pa.types.is_map(t):
            return T.MapType(conv(t.key_type), conv(t.item_type), True)
        if pa.types.is_list(t):
            return T.ArrayType(conv(t.value_type), True)
        raise TypeError(t)

    return T.StructType([T.StructField(f.name, conv(f.type), f.nullable) for f in arrow_schema])


_EXPORTED = BOUNDARY + [T.StructField("rows", T.LongType())]


@maps_task_errors
def export(spark: SparkSession, stores: Stores, out: str, *,
           split_size: int = S.DEFAULT_SPLIT_SIZE, partition_by: str | None = None,
           body: bool = True, writer: str = "pyarrow", conf=None,
           filter: MessageFilter | None = None, progress: Progress = quiet) -> O.ExportResult:
    """Every valid record of ``stores`` as one Parquet dataset at ``out`` (schema:
    :func:`splits.ARROW_SCHEMA`). ``writer="pyarrow"`` (default, measured faster): tasks
    write and commit their own files. ``writer="spark"``: Spark's Parquet writer, after a
    boundary-only pass so every split knows its exact start. The result's ``out`` is
    the absolute URI written to.

    ``filter``: only the records ``rmqstore dump`` gives with the same
    :class:`~rmqstore.selection.MessageFilter` (applied in the tasks to each split's
    columns); splits outside its offset range are not read. Its ``limit`` (the first rows
    in the stores' order and CommitLog order) needs ``writer="pyarrow"``."""
    if filter is not None and filter.limit is not None and writer == "spark":
        raise InputError("a limit needs the pyarrow writer: Spark's writer cannot stop at an "
                         "exact record")
    progress("planning splits")
    splits, starts = O.plan(list(store_files(stores, conf).values()), split_size, filter)
    out = P.absolute_uri(out)
    job = O.ExportJob(out, partition_by=partition_by, body=body, filter=filter, starts=starts)
    if writer == "spark":
        return _export_spark_writer(spark, splits, job, progress)
    O.prepare(out)

    def task(split, attempt):
        b, n = O.write_split(split, job, attempt)
        yield _exported_batch(b, n)

    progress(f"export: {len(splits)} splits")
    rows = over_splits(spark, splits, task, T.StructType(_EXPORTED)).collect()
    bounds = {r["split_id"]: boundary_from_row(r) for r in rows}
    return O.finish(job, splits, bounds, {r["split_id"]: r["rows"] for r in rows}, progress)


def _exported_batch(b: S.Boundary, rows: int):
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([{**b.as_row(), "rows": rows}], schema=arrow_schema(_EXPORTED))


@maps_task_errors
def boundaries(spark: SparkSession, splits: Sequence[S.Split]) -> tuple[S.Stitched, dict[int, S.Split]]:
    """The chain check alone (no decoding): a cheap first pass for jobs that need every
    split's exact start before they decode."""
    def task(split, attempt):
        yield boundary_batch([S.split_boundary(split)])

    rows = over_splits(spark, splits, task, T.StructType(BOUNDARY)).collect()
    return S.resolve(splits, {r["split_id"]: boundary_from_row(r) for r in rows}, S.split_boundary)


def _exact(splits, st: S.Stitched, replaced) -> list[S.Split]:
    """Kept splits with forced starts (so a decode pass cannot resync differently).
    ``splits`` may be a subset of a plan (an export's offset range): found by id."""
    by_id = {s.split_id: s for s in splits}
    return [replaced.get(sid, by_id[sid]) for sid in st.keep]


def _export_spark_writer(spark, splits, job: O.ExportJob, progress) -> O.ExportResult:
    progress(f"boundaries: {len(splits)} splits")
    st, replaced = boundaries(spark, splits)
    todo = _exact(splits, st, replaced)
    schema = AV.ARROW_SCHEMA()

    def task(split, attempt):
        with S.open_split(split) as sc:
            yield from AV.iter_batches(job.select(sc.records, split), split.store, body=job.body)

    progress(f"export (Spark writer): {len(todo)} splits")
    # re-number so task i reads todo[i]
    todo = [S.Split(i, *[getattr(s, f) for f in S.Split.__dataclass_fields__ if f != "split_id"])
            for i, s in enumerate(todo)]
    df = over_splits(spark, todo, task, _spark_schema(schema))
    out = job.out
    if not S.is_remote(out) and os.path.isdir(P.local_path(out)):
        os.rmdir(P.local_path(out))  # empty (checked): Spark's writer wants to create it
    w = df.write.mode("errorifexists").option("compression", "snappy")
    if job.partition_by:
        w = w.partitionBy(job.partition_by)
    w.parquet(out)
    records = st.records if job.filter is None else O.count_rows(out)
    return O.ExportResult(out, len(splits), records, [], st.ends, len(replaced))
