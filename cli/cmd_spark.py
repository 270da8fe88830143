"""``rmqstore spark ...``: the Spark jobs of :mod:`rmqstore.pipeline` (export, stats, audit,
rebuild-cq). pyspark and pyarrow are imported inside the commands only, so ``rmqstore
--help`` stays fast and works without the ``spark`` extra.

Every command checks what it can before Spark starts (:mod:`rmqstore.pipeline.preflight`:
config, stores, ``--out``, the executors' Python, Java) and reports the master and the
executors' Python with its results."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from cli.common import ConfigOption, app, fail, handles_errors, report_config
from cli.filters import (KeyOption, QueueIdOption, SinceOption, TagOption, UniqKeyOption,
                         UntilOption, filter_args, use_tz)
from cli.output import Output, output_options
from rmqstore.errors import EXIT_PROBLEMS

spark_app = typer.Typer(help="Run export, stats, audit and ConsumeQueue rebuilds on Apache Spark "
                             "(needs the 'spark' extra and Java 17).", no_args_is_help=True)
app.add_typer(spark_app, name="spark")

MasterOption = typer.Option(None, "--master", help="Spark master URL: local[N], spark://host:7077, yarn, k8s://... Default: local[*], or spark-submit's --master when run by spark-submit.")
ConfOption = typer.Option(None, "--conf", help="A Spark setting key=value; repeatable.")
SplitSizeOption = typer.Option("64MiB", "--split-size", help="Bytes of CommitLog per task: a number with an optional KiB/MiB/GiB suffix.")
PythonOption = typer.Option(None, "--python", help="The Python the executors run; it needs this rmqstore version with the 'spark' extra. Default: --conf spark.pyspark.python, else $PYSPARK_PYTHON, else the Python running this command. Reported in the output.")


def _size(text: str) -> int:
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10), ("g", 1 << 30),
                         ("m", 1 << 20), ("k", 1 << 10), ("b", 1), ("", 1)):
        if t.endswith(suffix) and t[:len(t) - len(suffix)].isdigit():
            n = int(t[:len(t) - len(suffix)]) * mult
            if n > 0:
                return n
    raise fail(f"--split-size: not a positive size like 64MiB: {text!r}")


def _confs(items: Optional[List[str]]) -> dict[str, str]:
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise fail(f"--conf expects key=value, got {item!r}")
        out[k.strip()] = v.strip()
    return out


def _start(stores: List[str], *, master: Optional[str], conf: Optional[List[str]], python: Optional[str],
           config: Optional[Path] = None, out: Optional[str] = None, local_only: Optional[str] = None,
           write: Optional[str] = None, dledger: bool = False):
    """Check everything that can be checked without Spark (``write``: as
    :func:`rmqstore.files.storekind.require_writable` checks it), then start it; the stores'
    configuration notes and warnings go to stderr. Returns the jobs module, the session,
    the progress printer and the checks' findings."""
    missing = [m for m in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(m) is None]
    if missing:
        raise fail(f"Spark commands need the 'spark' extra (pip install 'rmqstore[spark]'): "
                   f"no {', '.join(missing)}")
    confs = _confs(conf)
    from rmqstore.pipeline import preflight

    progress = _progress()
    progress("checking config, stores, output, Python and Java")
    master = preflight.resolve_master(master)
    ready = preflight.run(stores, out=out, conf=config, master=master, python=python,
                          spark_conf=confs, local_only=local_only, write=write, dledger=dledger)
    for cfg in ready.configs.values():
        report_config(cfg)
    progress(f"executors' Python: {ready.python} ({ready.python_from})")
    progress("starting Spark")
    try:
        from rmqstore.pipeline import jobs
    except ImportError as e:
        raise fail(f"Spark commands need the 'spark' extra (pip install 'rmqstore[spark]'): {e}") from None
    # A failed task is reported as one line (pipeline.taskerror); Spark's own ERROR log
    # lines about it would only repeat it, less clearly.
    quiet = "ERROR" if os.environ.get("RMQSTORE_DEBUG") else "FATAL"
    spark = jobs.session(master, confs, python=ready.python, log_level=quiet)
    return jobs, spark, progress, ready


def _spark_info(jobs, spark, ready) -> dict:
    """Where the job ran: the master and the executors' Python (and why that one)."""
    actual = jobs.executor_python(spark)
    return {"master": spark.sparkContext.master, "executorPython": actual,
            "executorPythonFrom": ready.python_from if actual == ready.python
            else "the SparkContext already running"}


def _progress():
    """One line per stage on stderr when it is a terminal; silent when piped."""
    if not sys.stderr.isatty():
        return lambda stage: None
    t0 = time.monotonic()
    return lambda stage: typer.echo(f"[{time.monotonic() - t0:7.1f}s] {stage}", err=True)


@spark_app.command("export")
@handles_errors
@output_options
def export(
    stores: List[str] = typer.Argument(..., help="Store roots (local paths or hdfs://, s3a:// ... URIs)."),
    out_dir: str = typer.Option(..., "--out", "-o", help="Output directory for the Parquet dataset (must be new or empty); a local path or an hdfs://, s3a:// ... URI."),
    partition_by: Optional[str] = typer.Option(None, "--partition-by", help="Partition the dataset by this column: topic."),
    body: bool = typer.Option(True, "--body/--no-body", help="Include message bodies (binary column)."),
    writer: str = typer.Option("pyarrow", "--writer", help="pyarrow (tasks write Parquet, faster) or spark (Spark's writer)."),
    topic: Optional[List[str]] = typer.Option(None, "--topic", "-t", help="Only messages of this topic; repeat for several."),
    queue_id: Optional[List[int]] = QueueIdOption,
    tag: Optional[List[str]] = TagOption,
    key: Optional[List[str]] = KeyOption,
    uniq_key: Optional[List[str]] = UniqKeyOption,
    from_offset: Optional[int] = typer.Option(None, "--from-offset", min=0, help="Only records at or after this CommitLog offset. Segments before it are not read; the one holding it is walked from its start, as dump walks it."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", min=0, help="Only records before this CommitLog offset; the CommitLog past it is not read (to within one --split-size)."),
    since: Optional[str] = SinceOption,
    until: Optional[str] = UntilOption,
    tz: Optional[str] = typer.Option(None, "--tz", help="Time zone for --since/--until given without one: an IANA name (Asia/Shanghai), UTC, local, or +08:00. Default: $RMQSTORE_TZ, else UTC."),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", min=0, help="Only records within this many CommitLog bytes from where the range starts (--from-offset, else the first segment), per store; a record counts whole (as dump counts)."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=0, help="At most this many records: the first ones dump prints with the same filters (the stores in turn, each in CommitLog order), exactly, not a sample. Every split in range is still read. Needs --writer pyarrow."),
    config: Optional[Path] = ConfigOption,
    master: Optional[str] = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    python: Optional[str] = PythonOption,
    *, out: Output,
) -> None:
    """Every valid CommitLog record of the stores as one Parquet dataset: the message JSON
    fields as typed columns, plus store and crcOk (see docs/pipeline.md). With filters,
    exactly the records rmqstore dump prints with the same options."""
    if partition_by not in (None, "topic"):
        raise fail("--partition-by supports: topic")
    if writer not in ("pyarrow", "spark"):
        raise fail("--writer must be pyarrow or spark")
    if limit is not None and writer == "spark":
        raise fail("--limit needs --writer pyarrow (Spark's writer cannot stop at an exact record)")
    size = _size(split_size)
    flt = _filter(topic=topic, queue_id=queue_id, tag=tag, key=key, uniq_key=uniq_key,
                  since=since, until=until, tz=tz, from_offset=from_offset,
                  to_offset=to_offset, max_bytes=max_bytes, limit=limit)
    jobs, spark, progress, ready = _start(stores, master=master, conf=conf, python=python,
                                          config=config, out=out_dir, dledger=True)
    r = jobs.export(spark, ready.stores, ready.out, split_size=size, partition_by=partition_by,
                    body=body, writer=writer, conf=config, filter=flt, progress=progress)
    progress("done")
    out.record({"out": r.out, "records": r.records, "splits": r.splits, "files": len(r.files),
                "rereadSplits": r.reread, **_spark_info(jobs, spark, ready)}, title="spark export")


def _filter(*, tz, limit, **options):
    """dump's :class:`~rmqstore.selection.MessageFilter` from the same options, made the
    same way (:func:`cli.filters.filter_args`); None when no filter is given."""
    from rmqstore.selection import MessageFilter

    use_tz(tz)
    given = filter_args(**options)
    if limit is None and all(v is None for v in given.values()):
        return None
    return MessageFilter.make(**given, limit=limit)


#: Why audit and rebuild-cq refuse hdfs://, s3a:// ... locations.
LOCAL_ONLY = ("ConsumeQueue files are read and written through local paths: use a local path "
              "(or a filesystem mounted at the same path on every node)")

QUEUE_COLUMNS = ("store", "topic", "queueId", "messages", "bytes", "minQueueOffset",
                 "maxQueueOffset", "firstStoreTime", "lastStoreTime")
FINDING_COLUMNS = ("store", "topic", "queueId", "queueOffset", "kind", "expectedOffset",
                   "actualOffset", "detail")


@spark_app.command("stats")
@handles_errors
@output_options
def stats(
    stores: List[str] = typer.Argument(..., help="Store roots (local paths or hdfs://, s3a:// ... URIs)."),
    config: Optional[Path] = ConfigOption,
    master: Optional[str] = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    python: Optional[str] = PythonOption,
    *, out: Output,
) -> None:
    """Per store/topic/queue: messages, bytes, min/max queue offset, first/last store time
    -- the same numbers as ``rmqstore stats``. jsonl, csv and tsv: one row per queue;
    json: the queues, each store's CommitLog end and where the job ran."""
    size = _size(split_size)
    jobs, spark, progress, ready = _start(stores, master=master, conf=conf, python=python,
                                          config=config)
    r = jobs.stats(spark, ready.stores, split_size=size, conf=config, progress=progress)
    progress("done")
    rows = [{"store": s, "topic": q.topic, "queueId": q.queue_id, "messages": q.count, "bytes": q.bytes,
             "minQueueOffset": q.min_queue_offset, "maxQueueOffset": q.max_queue_offset,
             "firstStoreTime": q.first_store_timestamp, "lastStoreTime": q.last_store_timestamp}
            for s, qs in r.stats.items() for q in qs]
    out.rows(rows, QUEUE_COLUMNS, key="queues", title="Queues",
             times=("firstStoreTime", "lastStoreTime"))
    out.record({s: {"minOffset": e.min_offset, "endOffset": e.end_offset, "endReason": e.reason}
                for s, e in r.ends.items()}, key="commitLog", items=False, table=False)
    out.record(_spark_info(jobs, spark, ready), key="spark", items=False, title="Spark")


@spark_app.command("audit")
@handles_errors
@output_options
def audit(
    stores: List[str] = typer.Argument(..., help="Store roots (local paths, or a filesystem mounted at the same path on every node)."),
    config: Optional[Path] = ConfigOption,
    master: Optional[str] = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    python: Optional[str] = PythonOption,
    *, out: Output,
) -> None:
    """Compare every ConsumeQueue unit with what the CommitLog implies: missing, extra,
    beyond-end, mismatch (offset/size/tagsCode), hole, duplicate. Exit 1 when any.
    jsonl, csv and tsv: one row per finding; json: findings, info, the queue count and
    where the job ran."""
    size = _size(split_size)
    jobs, spark, progress, ready = _start(stores, master=master, conf=conf, python=python,
                                          config=config, local_only=LOCAL_ONLY)
    r = jobs.audit(spark, ready.stores, split_size=size, conf=config, progress=progress)
    progress("done")
    out.rows(r.findings, FINDING_COLUMNS, key="findings", prose=("detail",),
             title=f"Findings ({len(r.findings)} in {r.queues} queues)")
    out.record(r.info, key="info", items=False, table=bool(r.info), title="Not errors")
    out.record({"queues": r.queues}, items=False, table=False)
    out.record(_spark_info(jobs, spark, ready), key="spark", items=False, title="Spark")
    if r.findings:
        raise typer.Exit(EXIT_PROBLEMS)


@spark_app.command("rebuild-cq")
@handles_errors
@output_options
def rebuild_cq(
    store: str = typer.Argument(..., help="The store root (a local path, or a filesystem mounted at the same path on every node)."),
    out_dir: str = typer.Option(..., "--out", "-o", help="New directory that receives a whole consumequeue/ tree (local, or mounted at the same path on every node)."),
    config: Optional[Path] = ConfigOption,
    master: Optional[str] = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    python: Optional[str] = PythonOption,
    *, out: Output,
) -> None:
    """Rebuild every ConsumeQueue of STORE from its CommitLog into OUT/{topic}/{queueId}/,
    byte-identical to what the broker's dispatch writes. The store is not modified."""
    size = _size(split_size)
    jobs, spark, progress, ready = _start([store], master=master, conf=conf, python=python,
                                          config=config, out=out_dir, local_only=LOCAL_ONLY,
                                          write="rebuild --consumequeue")
    r = jobs.rebuild_cq(spark, ready.stores[store], ready.out, split_size=size, conf=config,
                        progress=progress)
    progress("done")
    out.record({"out": r.out, "queues": r.queues, "units": r.units,
                "commitLogEnd": r.end.end_offset, "endReason": r.end.reason,
                **_spark_info(jobs, spark, ready)}, title="spark rebuild-cq")
