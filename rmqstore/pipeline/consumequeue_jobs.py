"""The Spark jobs over the ConsumeQueue units the CommitLog implies: audit (compare them with
the queues on disk, :mod:`pipeline.audit`) and rebuild-cq (write a ``consumequeue/`` tree).

Tasks return the implied units of their split, grouped per queue with ``applyInPandas``.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..errors import InputError
from ..scan import arrow as AV
from ..scan import splits as S
from . import audit as A
from . import output as O
from . import preflight as P
from .tasks import (BOUNDARY, Progress, Stores, arrow_schema, boundary_from_row, in_task, locations,
                    maps_task_errors, over_splits, quiet, store_files)


_UNITS = BOUNDARY + [T.StructField("kind", T.StringType()), T.StructField("store", T.StringType()),
                      T.StructField("topic", T.StringType()), T.StructField("queueId", T.IntegerType()),
                      T.StructField("queueOffset", T.LongType()),
                      T.StructField("commitLogOffset", T.LongType()),
                      T.StructField("size", T.IntegerType()), T.StructField("tagsCode", T.LongType())]


def _units_batch(split: S.Split, b: S.Boundary, units, delay=None):
    import pyarrow as pa

    n = units.num_rows
    rows = [{**b.as_row(), "kind": "b", "store": split.store}]
    head = pa.RecordBatch.from_pylist(rows, schema=arrow_schema(_UNITS))
    cols = [pa.array([b.split_id] * n, pa.int64()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.string()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.bool_()),
            pa.array(["u"] * n, pa.string()), pa.array([split.store] * n, pa.string())]
    cols += [units.column(i).combine_chunks() for i in range(units.num_columns)]
    return [head, pa.RecordBatch.from_arrays(cols, schema=arrow_schema(_UNITS))]


def _units_task(delay_by_store):
    def task(split, attempt):
        with S.open_split(split) as sc:
            units = AV.implied_units(sc.records, delay_by_store[split.store])
            yield from _units_batch(split, sc.boundary, units)
    return task


def _implied(spark, stores, split_size, progress, conf=None) -> tuple[DataFrame, S.Stitched, list[S.Split], dict]:
    """(DataFrame of the implied units of valid data, verdict, splits, store geometry)."""
    from pyspark import StorageLevel

    progress("planning splits")
    files = store_files(stores, conf)
    splits = S.plan_splits(list(files.values()), split_size)
    delay = {s: f.delay_millis for s, f in files.items()}
    progress(f"reading units: {len(splits)} splits")
    df = over_splits(spark, splits, _units_task(delay), T.StructType(_UNITS))
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    rows = df.filter(F.col("kind") == "b").select(*[f.name for f in BOUNDARY]).collect()
    bounds = {r["split_id"]: boundary_from_row(r) for r in rows}
    extra: dict[int, list] = {}

    def again(s):
        with S.open_split(s) as sc:
            extra[s.split_id] = _units_batch(s, sc.boundary, AV.implied_units(sc.records, delay[s.store]))
            return sc.boundary

    progress("checking split chain")
    st, replaced = S.resolve(splits, bounds, again)
    first_pass = [sid for sid in st.keep if sid not in replaced]
    units = df.filter((F.col("kind") == "u") & F.col("split_id").isin(first_pass))
    if replaced:
        import pyarrow as pa

        tables = [pa.Table.from_batches(extra[sid][1:]) for sid in replaced if sid in st.keep]
        if tables:
            t = pa.concat_tables(tables).to_pandas()
            units = units.unionByName(spark.createDataFrame(t, schema=T.StructType(_UNITS)))
    return units.select("store", "topic", "queueId", "queueOffset", "commitLogOffset", "size",
                        "tagsCode"), st, splits, files


# --- audit -------------------------------------------------------------------------------

_FINDINGS = T.StructType([
    T.StructField("store", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("queueId", T.IntegerType()), T.StructField("kind", T.StringType()),
    T.StructField("queueOffset", T.LongType()), T.StructField("expectedOffset", T.LongType()),
    T.StructField("expectedSize", T.LongType()), T.StructField("expectedTagsCode", T.LongType()),
    T.StructField("actualOffset", T.LongType()), T.StructField("actualSize", T.LongType()),
    T.StructField("actualTagsCode", T.LongType()), T.StructField("detail", T.StringType())])


@dataclass
class AuditResult:
    findings: list[dict]  # problems (see audit.PROBLEMS), sorted
    info: dict[str, int]  # counts of informational kinds (expired units)
    ends: dict[str, S.StoreEnd]
    queues: int

    @property
    def problems(self) -> int:
        return len(self.findings)


@maps_task_errors
def audit(spark: SparkSession, stores: Stores, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
          conf=None, progress: Progress = quiet) -> AuditResult:
    """Compare every ConsumeQueue unit with what the CommitLog implies (pipeline.audit)."""
    import pandas as pd

    from ..files.config import load_config
    from ..files.consumequeue import list_queues

    where = locations(stores)
    for s, uri in where.items():
        if S.is_remote(uri):
            raise InputError(f"audit reads ConsumeQueue files from local paths only: {s}")
    roots = {s: P.local_path(uri) for s, uri in where.items()}
    units, st, splits, files = _implied(spark, where, split_size, progress, conf)
    ends = {s: (e.min_offset, e.end_offset) for s, e in st.ends.items()}
    cq_size = {s: load_config(roots[s], conf).cq_file_size for s in files}
    listed = [(s, q.topic, q.queue_id) for s in files for q in list_queues(roots[s]).queues]
    markers = spark.createDataFrame(listed, "store string, topic string, queueId int") \
        .withColumn("queueOffset", F.lit(None).cast("long")).withColumn("commitLogOffset", F.lit(None).cast("long")) \
        .withColumn("size", F.lit(None).cast("int")).withColumn("tagsCode", F.lit(None).cast("long"))
    allrows = units.unionByName(markers)

    def per_queue(pdf: pd.DataFrame) -> pd.DataFrame:
        store, topic, qid = pdf["store"].iloc[0], pdf["topic"].iloc[0], int(pdf["queueId"].iloc[0])
        u = pdf[pdf["queueOffset"].notna()]
        ex = A.read_units(roots[store], topic, qid, cq_size[store])
        lo, hi = ends[store]
        found = A.audit_queue(*ex, u["queueOffset"].to_numpy("int64"), u["commitLogOffset"].to_numpy("int64"),
                              u["size"].to_numpy("int64"), u["tagsCode"].to_numpy("int64"), lo, hi)
        out = pd.DataFrame(found, columns=list(A.FINDING_FIELDS))
        out.insert(0, "queueId", qid)
        out.insert(0, "topic", topic)
        out.insert(0, "store", store)
        return out[[f.name for f in _FINDINGS]]

    progress("auditing queues")
    rows = allrows.groupBy("store", "topic", "queueId").applyInPandas(in_task(per_queue), _FINDINGS).collect()
    found = [{k: (None if v != v else v) for k, v in r.asDict().items()} for r in rows]
    info = {}
    problems = []
    for f in found:
        if f["kind"] in A.INFO:
            info[f["kind"]] = info.get(f["kind"], 0) + 1
        else:
            problems.append(f)
    problems.sort(key=lambda f: (f["store"], f["topic"], f["queueId"], f["queueOffset"] or 0, f["kind"]))
    queues = len({(s, t, q) for s, t, q in listed})
    return AuditResult(problems, info, st.ends, queues)


# --- rebuild-cq --------------------------------------------------------------------------------


@dataclass
class RebuildResult:
    out: str
    queues: int
    units: int
    end: S.StoreEnd


@maps_task_errors
def rebuild_cq(spark: SparkSession, store: str, out: str, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
               conf=None, progress: Progress = quiet) -> RebuildResult:
    """Write ``out/{topic}/{queueId}/{segment}`` — a whole ``consumequeue/`` tree — from the
    CommitLog, with consumequeue_writer.build_consume_queue (the dispatch-identical writer) on
    executors, one queue per group. Each queue is built in a fresh temporary directory
    and renamed into place, so a retried task cannot leave a mixed queue."""
    import pandas as pd

    from ..files.config import load_config
    from ..files.consumequeue_writer import build_consume_queue
    from ..files.names import is_safe_topic, queue_dir

    if S.is_remote(out) or S.is_remote(store):
        raise InputError("rebuild-cq writes with the local ConsumeQueue writer: use local paths "
                         "(or a mounted shared filesystem)")
    from ..files.storekind import require_writable

    cfg = load_config(P.local_path(P.absolute_uri(store)), conf)
    require_writable(cfg, "rebuild --consumequeue")  # the new files take the store's geometry
    out = P.absolute_uri(out)
    O.prepare(out)
    out_abs = P.local_path(out)
    file_size = cfg.cq_file_size
    units, st, _, _ = _implied(spark, [store], split_size, progress, conf)
    job = uuid.uuid4().hex[:12]

    def per_queue(pdf: pd.DataFrame) -> pd.DataFrame:
        topic, qid = pdf["topic"].iloc[0], int(pdf["queueId"].iloc[0])
        pdf = pdf.sort_values("commitLogOffset", kind="stable")  # dispatch order (spec §9)
        first = int(pdf["commitLogOffset"].iloc[0])
        if not is_safe_topic(topic):  # never a path: the driver refuses, naming the record
            return pd.DataFrame({"topic": [topic], "queueId": [qid], "units": [-1],
                                 "first": [first]})
        tmp = posixpath.join(out_abs, "_temporary", job, f"{uuid.uuid4().hex}")
        n = build_consume_queue(tmp, pdf["queueOffset"].to_numpy("int64"),
                                pdf["commitLogOffset"].to_numpy("int64"), pdf["size"].to_numpy("int64"),
                                pdf["tagsCode"].to_numpy("int64"), file_size)
        dest = os.path.join(out_abs, topic, str(qid))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)  # another attempt finished this queue
        return pd.DataFrame({"topic": [topic], "queueId": [qid], "units": [n], "first": [first]})

    progress("writing queues")
    rows = units.groupBy("topic", "queueId").applyInPandas(
        in_task(per_queue), "topic string, queueId int, units long, first long").collect()
    import shutil

    shutil.rmtree(os.path.join(out_abs, "_temporary"), ignore_errors=True)
    bad = sorted((r["first"], r["topic"]) for r in rows if r["units"] < 0)
    if bad:
        queue_dir(out_abs, bad[0][1], 0, where=store, offset=bad[0][0])  # raises UnsafePathError
    return RebuildResult(out, len(rows), sum(r["units"] for r in rows), st.ends[store])
