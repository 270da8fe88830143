"""What every Spark job shares: the session, one task per split, errors out of tasks.

Every job has the same first stage: the driver plans splits (:func:`splits.plan_splits`),
``spark.range(n, numPartitions=n)`` gives one task per split, and ``mapInArrow`` runs the
shared split reader in the task (:func:`over_splits`). Each task also returns its split's
boundary; the driver checks the chain (:func:`splits.resolve`), re-reads any wrongly
resynced split itself, and keeps only records of valid data.

Tasks never see a path the driver has not made absolute (:func:`preflight.absolute_uri`:
a task runs in another directory, maybe on another machine); a store is named in results
as the caller gave it. An error inside a task reaches the caller as the typed error the
task raised (:mod:`pipeline.taskerror`), never as Spark's stack traces.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import uuid
from typing import Callable, Mapping, Sequence, Union

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from .. import __version__
from ..errors import RmqStoreError, SparkError
from ..scan import splits as S
from . import preflight as P
from . import taskerror as TE

Progress = Callable[[str], None]
#: Stores as given (each a local path or URI), or a mapping from the name results use
#: to the location (what the CLI passes after its checks).
Stores = Union[Sequence[str], Mapping[str, str]]


def quiet(_: str) -> None:
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


def maps_task_errors(fn):
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


def in_task(fn):
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


def locations(stores: Stores) -> dict[str, str]:
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
    for name, uri in locations(stores).items():
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


BOUNDARY = [T.StructField("split_id", T.LongType(), False), T.StructField("first", T.LongType()),
             T.StructField("chain_end", T.LongType()), T.StructField("stop", T.StringType()),
             T.StructField("records", T.LongType()), T.StructField("forced", T.BooleanType())]


def boundary_batch(bs: Sequence[S.Boundary]):
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([b.as_row() for b in bs], schema=pa.schema([
        ("split_id", pa.int64()), ("first", pa.int64()), ("chain_end", pa.int64()),
        ("stop", pa.string()), ("records", pa.int64()), ("forced", pa.bool_())]))


def boundary_from_row(row) -> S.Boundary:
    return S.Boundary(row["split_id"], row["first"], row["chain_end"], row["stop"],
                      row["records"], row["forced"])


def over_splits(spark: SparkSession, splits: Sequence[S.Split], fn, schema: T.StructType) -> DataFrame:
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


def arrow_schema(fields: Sequence[T.StructField]):
    import pyarrow as pa

    m = {T.LongType(): pa.int64(), T.StringType(): pa.string(), T.BooleanType(): pa.bool_(),
         T.IntegerType(): pa.int32()}
    return pa.schema([(f.name, m[f.dataType]) for f in fields])
