"""The PySpark jobs: export, stats, audit, rebuild-cq. The only module importing pyspark.

Every job has the same first stage: the driver plans splits (:func:`splits.plan_splits`),
``spark.range(n, numPartitions=n)`` gives one task per split, and ``mapInArrow`` runs the
shared split reader in the task. Each task also returns its split's boundary; the driver
checks the chain (:func:`splits.resolve`), re-reads any wrongly resynced split itself, and
keeps only records of valid data. What differs is what tasks return:

* export: nothing but boundaries; tasks write Parquet themselves (pipeline.output);
* stats: per-queue partial aggregates, merged on the driver with stats.merge_stats;
* audit / rebuild-cq: implied CQ units, grouped per queue with ``applyInPandas``.

Tasks never see a path the driver has not made absolute (:func:`preflight.absolute_uri`:
a task runs in another directory, maybe on another machine); a store is named in results
as the caller gave it. An error inside a task reaches the caller as the typed error the
task raised (:mod:`pipeline.taskerror`), never as Spark's stack traces.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, Union

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..scan import splits as S

from ..scan import arrow as AV

from .. import stats as ST
from .. import __version__
from ..errors import InputError, RmqStoreError, SparkError
from ..selection import MessageFilter
from . import audit as A
from . import output as O
from . import preflight as P
from . import taskerror as TE

Progress = Callable[[str], None]
#: Stores as given (each a local path or URI), or a mapping from the name results use
#: to the location (what the CLI passes after its checks).
Stores = Union[Sequence[str], Mapping[str, str]]


def _quiet(_: str) -> None:
    pass


def session(master: str | None = "local[*]", conf: dict[str, str] | None = None,
            app: str = "rmqstore", python: str | None = None, log_level: str = "ERROR") -> SparkSession:
    """A SparkSession set up the way these jobs need: executors' Python chosen explicitly
    (``python``, else :data:`preflight.PYTHON_RULE`: by default the driver's interpreter,
    which has this package), a local driver bound to 127.0.0.1, speculation off (task
    outputs are committed by rename, one attempt per split). ``master=None``: the one
    spark-submit was given. When a SparkContext exists already (a notebook) it is used as
    it is: see :func:`executor_python`."""
    exe, _ = P.executor_python(python, conf)
    b = SparkSession.builder.appName(app)
    if master is not None:
        b = b.master(master)
    defaults = {
        "spark.speculation": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if P.is_local_master(master):
        defaults.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                         "spark.ui.enabled": "false"})
    for k, v in {**defaults, **(conf or {}), "spark.pyspark.python": exe}.items():
        b = b.config(k, v)
    # pyspark takes the executors' Python from PYSPARK_PYTHON when the context starts
    # (SparkContext.pythonExec); set it for that moment only.
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = exe
    try:
        spark = b.getOrCreate()
    except Exception as e:
        if not _from_spark(e):
            raise
        raise SparkError(f"Spark did not start: {TE.from_spark(e).message} (Spark's own messages, "
                         "if any, are above)") from e
    finally:
        if before is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = before
    spark.sparkContext.setLogLevel(log_level)
    return spark


def executor_python(spark: SparkSession) -> str:
    """The Python this session's executors run."""
    return spark.sparkContext.pythonExec


def _from_spark(e: BaseException) -> bool:
    return type(e).__module__.startswith(("pyspark", "py4j"))


def _maps_task_errors(fn):
    """A job raises what its tasks raised (or one SparkError line), not Spark's traces."""
    @functools.wraps(fn)
    def job(spark, *args, **kwargs):
        try:
            return fn(spark, *args, **kwargs)
        except RmqStoreError:
            raise
        except Exception as e:
            if not _from_spark(e):
                raise
            raise TE.from_spark(e, executor_python(spark)) from e
    return job


def _in_task(fn):
    """``fn`` (one pandas argument) as a task runs it: same rmqstore version as the
    driver, typed errors marked for the driver (pipeline.taskerror)."""
    version = __version__

    def task(pdf):
        try:
            TE.check_version(version)
            return fn(pdf)
        except Exception as e:
            raise TE.task_failure(e) from None
    return task


def _locations(stores: Stores) -> dict[str, str]:
    """Name in results -> absolute URI of the store root."""
    if isinstance(stores, Mapping):
        return {name: P.absolute_uri(where) for name, where in stores.items()}
    return {s: P.absolute_uri(s) for s in dict.fromkeys(stores)}


def store_files(stores: Stores, conf=None) -> dict[str, S.StoreFiles]:
    """Each store's CommitLog files as absolute URIs, with the geometry ``conf`` (a
    broker.conf) and the files give (:func:`rmqstore.files.config.load_config`, as every other
    command); named as the caller named the store."""
    from ..files.config import load_config

    out = {}
    for name, uri in _locations(stores).items():
        if S.is_remote(uri):
            sf = S.list_store(uri)
            if conf is not None:
                cfg = load_config(None, conf, infer=False)
                if cfg.sources.get("mapped_file_size_commit_log") == "broker.conf":
                    sf = S.list_store(uri, segment_size=cfg.mapped_file_size_commit_log)
                sf = dataclasses.replace(sf, max_record=cfg.max_message_size + 65536,
                                         delay_millis=cfg.delay_millis)
        else:
            sf = S.list_store(P.local_path(uri), conf=conf)
            sf = dataclasses.replace(sf, files=[(P.absolute_uri(p), start, n) for p, start, n in sf.files])
        out[name] = dataclasses.replace(sf, store=name)
    return out


_BOUNDARY = [T.StructField("split_id", T.LongType(), False), T.StructField("first", T.LongType()),
             T.StructField("chain_end", T.LongType()), T.StructField("stop", T.StringType()),
             T.StructField("records", T.LongType()), T.StructField("forced", T.BooleanType())]


def _boundary_batch(bs: Sequence[S.Boundary]):
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([b.as_row() for b in bs], schema=pa.schema([
        ("split_id", pa.int64()), ("first", pa.int64()), ("chain_end", pa.int64()),
        ("stop", pa.string()), ("records", pa.int64()), ("forced", pa.bool_())]))


def _boundary(row) -> S.Boundary:
    return S.Boundary(row["split_id"], row["first"], row["chain_end"], row["stop"],
                      row["records"], row["forced"])


def _over_splits(spark: SparkSession, splits: Sequence[S.Split], fn, schema: T.StructType) -> DataFrame:
    """One task per split: ``fn(split, attempt)`` yields Arrow batches of ``schema``."""
    plan = list(splits)
    version = __version__

    def run(batches):
        from pyspark import TaskContext

        try:
            TE.check_version(version)
            tc = TaskContext.get()
            attempt = f"{tc.stageId()}-{tc.attemptNumber()}-{uuid.uuid4().hex[:6]}" if tc else uuid.uuid4().hex
            for b in batches:
                for sid in b.column(0).to_pylist():
                    yield from fn(plan[sid], attempt)
        except Exception as e:
            raise TE.task_failure(e) from None

    return spark.range(len(plan), numPartitions=max(len(plan), 1)).mapInArrow(run, schema)


# --- export ----------------------------------------------------------------------------


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


_EXPORTED = _BOUNDARY + [T.StructField("rows", T.LongType())]


@_maps_task_errors
def export(spark: SparkSession, stores: Stores, out: str, *,
           split_size: int = S.DEFAULT_SPLIT_SIZE, partition_by: str | None = None,
           body: bool = True, writer: str = "pyarrow", conf=None,
           filter: MessageFilter | None = None, progress: Progress = _quiet) -> O.ExportResult:
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
    rows = _over_splits(spark, splits, task, T.StructType(_EXPORTED)).collect()
    bounds = {r["split_id"]: _boundary(r) for r in rows}
    return O.finish(job, splits, bounds, {r["split_id"]: r["rows"] for r in rows}, progress)


def _exported_batch(b: S.Boundary, rows: int):
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([{**b.as_row(), "rows": rows}], schema=_arrow(_EXPORTED))


@_maps_task_errors
def boundaries(spark: SparkSession, splits: Sequence[S.Split]) -> tuple[S.Stitched, dict[int, S.Split]]:
    """The chain check alone (no decoding): a cheap first pass for jobs that need every
    split's exact start before they decode."""
    def task(split, attempt):
        yield _boundary_batch([S.split_boundary(split)])

    rows = _over_splits(spark, splits, task, T.StructType(_BOUNDARY)).collect()
    return S.resolve(splits, {r["split_id"]: _boundary(r) for r in rows}, S.split_boundary)


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
    df = _over_splits(spark, todo, task, _spark_schema(schema))
    out = job.out
    if not S.is_remote(out) and os.path.isdir(P.local_path(out)):
        os.rmdir(P.local_path(out))  # empty (checked): Spark's writer wants to create it
    w = df.write.mode("errorifexists").option("compression", "snappy")
    if job.partition_by:
        w = w.partitionBy(job.partition_by)
    w.parquet(out)
    records = st.records if job.filter is None else O.count_rows(out)
    return O.ExportResult(out, len(splits), records, [], st.ends, len(replaced))


# --- stats -----------------------------------------------------------------------------

_STATS = _BOUNDARY + [T.StructField("topic", T.StringType()), T.StructField("queue_id", T.LongType()),
                      T.StructField("count", T.LongType()), T.StructField("bytes", T.LongType()),
                      T.StructField("min_queue_offset", T.LongType()),
                      T.StructField("max_queue_offset", T.LongType()),
                      T.StructField("first_store_timestamp", T.LongType()),
                      T.StructField("last_store_timestamp", T.LongType())]


@dataclass
class StatsResult:
    stats: dict[str, list[ST.QueueStats]]  # per store, sorted by topic and queue id
    ends: dict[str, S.StoreEnd]


@_maps_task_errors
def stats(spark: SparkSession, stores: Stores, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
          conf=None, progress: Progress = _quiet) -> StatsResult:
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
        yield pa.RecordBatch.from_pylist(rows, schema=_arrow(_STATS))

    progress(f"stats: {len(splits)} splits")
    rows = _over_splits(spark, splits, task, T.StructType(_STATS)).collect()
    bounds, parts = {}, {}
    for r in rows:
        bounds[r["split_id"]] = _boundary(r)
        if r["topic"] is not None:
            parts.setdefault(r["split_id"], []).append(ST.QueueStats(*[r[f] for f in ST.STATS_FIELDS]))

    def again(s):
        b, qs = S._stats_task(s)
        parts[s.split_id] = qs
        return b

    progress("checking split chain")
    st, _ = S.resolve(splits, bounds, again)
    by_store: dict[str, list] = {}
    for sid in st.keep:
        by_store.setdefault(splits[sid].store, []).append(parts.get(sid, []))
    return StatsResult({s: ST.merge_stats(by_store.get(s, [])) for s in files}, st.ends)


def _arrow(fields: Sequence[T.StructField]):
    import pyarrow as pa

    m = {T.LongType(): pa.int64(), T.StringType(): pa.string(), T.BooleanType(): pa.bool_(),
         T.IntegerType(): pa.int32()}
    return pa.schema([(f.name, m[f.dataType]) for f in fields])


# --- implied units (audit, rebuild) -----------------------------------------------------------

_UNITS = _BOUNDARY + [T.StructField("kind", T.StringType()), T.StructField("store", T.StringType()),
                      T.StructField("topic", T.StringType()), T.StructField("queueId", T.IntegerType()),
                      T.StructField("queueOffset", T.LongType()),
                      T.StructField("commitLogOffset", T.LongType()),
                      T.StructField("size", T.IntegerType()), T.StructField("tagsCode", T.LongType())]


def _units_batch(split: S.Split, b: S.Boundary, units, delay=None):
    import pyarrow as pa

    n = units.num_rows
    rows = [{**b.as_row(), "kind": "b", "store": split.store}]
    head = pa.RecordBatch.from_pylist(rows, schema=_arrow(_UNITS))
    cols = [pa.array([b.split_id] * n, pa.int64()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.string()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.bool_()),
            pa.array(["u"] * n, pa.string()), pa.array([split.store] * n, pa.string())]
    cols += [units.column(i).combine_chunks() for i in range(units.num_columns)]
    return [head, pa.RecordBatch.from_arrays(cols, schema=_arrow(_UNITS))]


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
    df = _over_splits(spark, splits, _units_task(delay), T.StructType(_UNITS))
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    rows = df.filter(F.col("kind") == "b").select(*[f.name for f in _BOUNDARY]).collect()
    bounds = {r["split_id"]: _boundary(r) for r in rows}
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


@_maps_task_errors
def audit(spark: SparkSession, stores: Stores, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
          conf=None, progress: Progress = _quiet) -> AuditResult:
    """Compare every ConsumeQueue unit with what the CommitLog implies (pipeline.audit)."""
    import pandas as pd

    from ..files.config import load_config
    from ..files.consumequeue import list_queues

    where = _locations(stores)
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
    rows = allrows.groupBy("store", "topic", "queueId").applyInPandas(_in_task(per_queue), _FINDINGS).collect()
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


@_maps_task_errors
def rebuild_cq(spark: SparkSession, store: str, out: str, *, split_size: int = S.DEFAULT_SPLIT_SIZE,
               conf=None, progress: Progress = _quiet) -> RebuildResult:
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
        _in_task(per_queue), "topic string, queueId int, units long, first long").collect()
    import shutil

    shutil.rmtree(os.path.join(out_abs, "_temporary"), ignore_errors=True)
    bad = sorted((r["first"], r["topic"]) for r in rows if r["units"] < 0)
    if bad:
        queue_dir(out_abs, bad[0][1], 0, where=store, offset=bad[0][0])  # raises UnsafePathError
    return RebuildResult(out, len(rows), sum(r["units"] for r in rows), st.ends[store])
