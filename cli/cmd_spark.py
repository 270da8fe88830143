"""``rmqstore spark ...``: the Spark jobs of :mod:`rmqstore.pipeline` (export, stats, audit,
rebuild-cq). pyspark and pyarrow are imported inside the commands only, so ``rmqstore
--help`` stays fast and works without the ``spark`` extra."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from cli.common import ConfigOption, app, fail, handles_errors, report_config
from cli.output import Output, output_options
from rmqstore.errors import EXIT_PROBLEMS

spark_app = typer.Typer(help="Run export, stats, audit and ConsumeQueue rebuilds on Apache Spark "
                             "(needs the 'spark' extra and Java 17).", no_args_is_help=True)
app.add_typer(spark_app, name="spark")

MasterOption = typer.Option("local[*]", "--master", help="Spark master URL: local[N], spark://host:7077, yarn, k8s://...")
ConfOption = typer.Option(None, "--conf", help="A Spark setting key=value; repeatable.")
SplitSizeOption = typer.Option("64MiB", "--split-size", help="Bytes of CommitLog per task: a number with an optional KiB/MiB/GiB suffix.")


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


def _session(master: str, conf: Optional[List[str]]):
    try:
        from rmqstore.pipeline import jobs
    except ImportError as e:
        raise fail(f"Spark commands need the 'spark' extra (pip install 'rmqstore[spark]'): {e}") from None
    confs = _confs(conf)
    progress = _progress()
    progress("starting Spark")
    return jobs, jobs.session(master, confs), progress


def _progress():
    """One line per stage on stderr when it is a terminal; silent when piped."""
    if not sys.stderr.isatty():
        return lambda stage: None
    t0 = time.monotonic()
    return lambda stage: typer.echo(f"[{time.monotonic() - t0:7.1f}s] {stage}", err=True)


def _check_stores(stores: List[str], config: Optional[Path] = None,
                  write: Optional[str] = None) -> List[str]:
    """Local stores must exist and be ones rmqstore can read (checked before Spark starts,
    with ``write`` as :func:`rmqstore.storekind.require_writable` checks it); their notes
    and warnings go to stderr."""
    from rmqstore.config import load_config
    from rmqstore.storekind import require_writable

    for s in stores:
        if "://" in s:
            continue
        if not Path(s).is_dir():
            raise fail(f"{s}: no such store directory")
        cfg = load_config(s, config)
        if write:
            require_writable(cfg, write)
        report_config(cfg)
    return stores


@spark_app.command("export")
@handles_errors
@output_options
def export(
    stores: List[str] = typer.Argument(..., help="Store roots (local paths or hdfs://, s3a:// ... URIs)."),
    out_dir: str = typer.Option(..., "--out", "-o", help="Output directory for the Parquet dataset (must be new or empty)."),
    partition_by: Optional[str] = typer.Option(None, "--partition-by", help="Partition the dataset by this column: topic."),
    body: bool = typer.Option(True, "--body/--no-body", help="Include message bodies (binary column)."),
    writer: str = typer.Option("pyarrow", "--writer", help="pyarrow (tasks write Parquet, faster) or spark (Spark's writer)."),
    master: str = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    *, out: Output,
) -> None:
    """Every valid CommitLog record of the stores as one Parquet dataset: the message JSON
    fields as typed columns, plus store and crcOk (see docs/pipeline.md)."""
    if partition_by not in (None, "topic"):
        raise fail("--partition-by supports: topic")
    if writer not in ("pyarrow", "spark"):
        raise fail("--writer must be pyarrow or spark")
    size = _size(split_size)
    _check_stores(stores)
    jobs, spark, progress = _session(master, conf)
    r = jobs.export(spark, stores, out_dir, split_size=size, partition_by=partition_by,
                    body=body, writer=writer, progress=progress)
    progress("done")
    out.record({"out": r.out, "records": r.records, "splits": r.splits, "files": len(r.files),
                "rereadSplits": r.reread}, title="spark export")


QUEUE_COLUMNS = ("store", "topic", "queueId", "messages", "bytes", "minQueueOffset",
                 "maxQueueOffset", "firstStoreTime", "lastStoreTime")
FINDING_COLUMNS = ("store", "topic", "queueId", "queueOffset", "kind", "expectedOffset",
                   "actualOffset", "detail")


@spark_app.command("stats")
@handles_errors
@output_options
def stats(
    stores: List[str] = typer.Argument(..., help="Store roots."),
    master: str = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    *, out: Output,
) -> None:
    """Per store/topic/queue: messages, bytes, min/max queue offset, first/last store time
    -- the same numbers as ``rmqstore stats``. jsonl, csv and tsv: one row per queue;
    json: the queues and each store's CommitLog end."""
    size = _size(split_size)
    _check_stores(stores)
    jobs, spark, progress = _session(master, conf)
    r = jobs.stats(spark, stores, split_size=size, progress=progress)
    progress("done")
    rows = [{"store": s, "topic": q.topic, "queueId": q.queue_id, "messages": q.count, "bytes": q.bytes,
             "minQueueOffset": q.min_queue_offset, "maxQueueOffset": q.max_queue_offset,
             "firstStoreTime": q.first_store_timestamp, "lastStoreTime": q.last_store_timestamp}
            for s, qs in r.stats.items() for q in qs]
    out.rows(rows, QUEUE_COLUMNS, key="queues", title="Queues",
             times=("firstStoreTime", "lastStoreTime"))
    out.record({s: {"minOffset": e.min_offset, "endOffset": e.end_offset, "endReason": e.reason}
                for s, e in r.ends.items()}, key="commitLog", items=False, table=False)


@spark_app.command("audit")
@handles_errors
@output_options
def audit(
    stores: List[str] = typer.Argument(..., help="Store roots (local paths)."),
    master: str = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    *, out: Output,
) -> None:
    """Compare every ConsumeQueue unit with what the CommitLog implies: missing, extra,
    beyond-end, mismatch (offset/size/tagsCode), hole, duplicate. Exit 1 when any.
    jsonl, csv and tsv: one row per finding; json: findings, info and the queue count."""
    size = _size(split_size)
    _check_stores(stores)
    jobs, spark, progress = _session(master, conf)
    r = jobs.audit(spark, stores, split_size=size, progress=progress)
    progress("done")
    out.rows(r.findings, FINDING_COLUMNS, key="findings", prose=("detail",),
             title=f"Findings ({len(r.findings)} in {r.queues} queues)")
    out.record(r.info, key="info", items=False, table=bool(r.info), title="Not errors")
    out.record({"queues": r.queues}, items=False, table=False)
    if r.findings:
        raise typer.Exit(EXIT_PROBLEMS)


@spark_app.command("rebuild-cq")
@handles_errors
@output_options
def rebuild_cq(
    store: str = typer.Argument(..., help="The store root (local path)."),
    out_dir: str = typer.Option(..., "--out", "-o", help="New directory that receives a whole consumequeue/ tree."),
    config: Optional[Path] = ConfigOption,
    master: str = MasterOption,
    conf: Optional[List[str]] = ConfOption,
    split_size: str = SplitSizeOption,
    *, out: Output,
) -> None:
    """Rebuild every ConsumeQueue of STORE from its CommitLog into OUT/{topic}/{queueId}/,
    byte-identical to what the broker's dispatch writes. The store is not modified."""
    size = _size(split_size)
    _check_stores([store], config, "rebuild --consumequeue")
    jobs, spark, progress = _session(master, conf)
    r = jobs.rebuild_cq(spark, store, out_dir, split_size=size, conf=config, progress=progress)
    progress("done")
    out.record({"out": r.out, "queues": r.queues, "units": r.units,
                "commitLogEnd": r.end.end_offset, "endReason": r.end.reason},
               title="spark rebuild-cq")
