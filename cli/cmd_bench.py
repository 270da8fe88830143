"""``rmqstore bench``: time the engine on generated data or on a given store (see
:mod:`rmqstore.bench`)."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Optional

import typer

from cli.common import app, handles_errors
from cli.formats import Format, FormatOption, NoPagerOption
from cli.output import Output

BENCH_HELP = """Time rmqstore on data it generates: messages/s, MB/s and seconds, the median of
--runs runs. With no benchmark named, runs them all. The data goes to a subfolder of --dir
(or of a temporary folder) and is removed afterwards. Generated messages look like what a
RocketMQ client and broker write (--shape broker: UNIQ_KEY, KEYS, TAGS, CLUSTER, user
properties, several body sizes); --shape easy is the old one-TAGS-one-KEYS shape. With
--store PATH the read-side benchmarks (scan, verify, rebuild, query-key, dump, spark-export)
time that store instead, without writing to it: rebuild runs on a copy under --dir, query-key
looks up keys drawn from the store's own records. A benchmark that cannot run here
(spark-export without pyspark or Java) is reported as skipped."""

bench_app = typer.Typer(help=BENCH_HELP, invoke_without_command=True, no_args_is_help=False,
                        context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(bench_app, name="bench")

class Shape(str, enum.Enum):
    broker = "broker"
    easy = "easy"


class AppendMode(str, enum.Enum):
    single = "single"
    batch = "batch"
    columns = "columns"
    sync = "sync"


COLUMNS = ("name", "messages", "bytes", "seconds", "msgsPerSec", "mbPerSec")
# Table cells: rates and times rounded for reading; json/jsonl/csv keep the numbers.
CELLS = {"seconds": lambda v: f"{v:.3f}", "msgsPerSec": lambda v: f"{v:,.0f}",
         "mbPerSec": lambda v: f"{v:,.1f}"}

_SIZE_HELP = "MiB of CommitLog data to generate (append writes about this much). Default 64."
_BODY_HELP = "Body size of each generated message, in bytes. Default 100."
_RUNS_HELP = "Runs per benchmark; the median is reported. Default 3."
_DIR_HELP = "Folder to put the generated data in (to choose the disk); the data goes in a subfolder that is removed afterwards. Default: a temporary folder."
_SEG_HELP = "CommitLog segment size in MiB (mappedFileSizeCommitLog). Default 1024, RocketMQ's."
_LOOKUPS_HELP = "Keys looked up by the query-key benchmark per run. Default 1000."
_SHAPE_HELP = "Messages to generate: broker (what a RocketMQ 4.9 client and broker write: UNIQ_KEY, KEYS with 1-3 tokens, TAGS, CLUSTER, user properties on some, bodies of 0.5-1.5x --body-size, --topics x 8 queues) or easy (one TAGS and one KEYS property, one body size). Default broker."
_STORE_HELP = "Time this existing store instead of generated data (read-side benchmarks only; the store is never written: rebuild runs on a sparse copy under --dir)."
_TOPICS_HELP = "Topics of the generated data (8 queues each). Default 4."
_MODE_HELP = "For append: single (MessageStore.put), batch (put_batch, 1000 a call), columns (put_columns, 1000 a call) or sync (SYNC_FLUSH group commit, 4 writer threads). Default single."


# One set of options, shared by `rmqstore bench` and each `rmqstore bench NAME`.
SIZE_MB = typer.Option(None, "--size-mb", min=0.01, help=_SIZE_HELP)
BODY_SIZE = typer.Option(None, "--body-size", min=0, help=_BODY_HELP)
RUNS = typer.Option(None, "--runs", min=1, help=_RUNS_HELP)
DIRECTORY = typer.Option(None, "--dir", help=_DIR_HELP)
SEGMENT_MB = typer.Option(None, "--segment-mb", min=1, max=2047, help=_SEG_HELP)
LOOKUPS = typer.Option(None, "--lookups", min=1, help=_LOOKUPS_HELP)
APPEND_MODE = typer.Option(None, "--append-mode", help=_MODE_HELP, case_sensitive=False)
SHAPE = typer.Option(None, "--shape", help=_SHAPE_HELP, case_sensitive=False)
STORE = typer.Option(None, "--store", help=_STORE_HELP)
TOPICS = typer.Option(None, "--topics", min=1, max=99, help=_TOPICS_HELP)


def _opts(ctx: typer.Context, **given):
    from rmqstore.bench import BenchOptions

    base = dict(ctx.obj or {})
    base.update({k: v for k, v in given.items() if v is not None})
    for name in ("append_mode", "shape"):
        if isinstance(base.get(name), enum.Enum):
            base[name] = base[name].value
    if base.get("store") is not None:
        base["store"] = str(base["store"])
    fmt, no_pager = base.pop("fmt", None), base.pop("no_pager", False)
    return BenchOptions(**{k: v for k, v in base.items() if v is not None}), (fmt, no_pager)


def _run(names, opts, output) -> None:
    """Each benchmark's row as soon as it is measured; skipped ones on stderr."""
    from rmqstore.bench import STORE_BENCHMARKS, check, run

    if opts.store and len(names) > 1:
        names = [n for n in names if n in STORE_BENCHMARKS]
    check(names, opts)  # refused before anything runs
    fmt, no_pager = output
    with Output(fmt, pager=not no_pager) as out:
        def results():
            for name in names:
                if sys.stderr.isatty():
                    sys.stderr.write(f"bench: {name} ...\n")
                    sys.stderr.flush()
                r = run(name, opts)
                if r.skipped:
                    out.warn(f"bench {name} skipped: {r.skipped}")
                    continue
                yield r.as_dict()

        data = f"store {opts.store}" if opts.store else f"{opts.shape} shape"
        out.rows(results(), COLUMNS, title=f"rmqstore bench, {data} (median of {opts.runs} runs)",
                 cells=CELLS)


@bench_app.callback()
@handles_errors
def bench(
    ctx: typer.Context,
    size_mb: Optional[float] = SIZE_MB,
    body_size: Optional[int] = BODY_SIZE,
    runs: Optional[int] = RUNS,
    directory: Optional[str] = DIRECTORY,
    segment_mb: Optional[int] = SEGMENT_MB,
    lookups: Optional[int] = LOOKUPS,
    append_mode: Optional[AppendMode] = APPEND_MODE,
    shape: Optional[Shape] = SHAPE,
    store: Optional[Path] = STORE,
    topics: Optional[int] = TOPICS,
    fmt: Optional[Format] = FormatOption,
    no_pager: bool = NoPagerOption,
) -> None:
    ctx.obj = {"size_mb": size_mb, "body_size": body_size, "runs": runs, "dir": directory,
               "segment_mb": segment_mb, "lookups": lookups, "append_mode": append_mode,
               "shape": shape, "store": store, "topics": topics,
               "fmt": fmt, "no_pager": no_pager}
    if ctx.invoked_subcommand is None:
        from rmqstore.bench import BENCHMARKS

        opts, output = _opts(ctx)
        _run(BENCHMARKS, opts, output)


def _command(name: str, doc: str):
    @handles_errors
    def command(
        ctx: typer.Context,
        size_mb: Optional[float] = SIZE_MB,
        body_size: Optional[int] = BODY_SIZE,
        runs: Optional[int] = RUNS,
        directory: Optional[str] = DIRECTORY,
        segment_mb: Optional[int] = SEGMENT_MB,
        lookups: Optional[int] = LOOKUPS,
        append_mode: Optional[AppendMode] = APPEND_MODE,
        shape: Optional[Shape] = SHAPE,
        store: Optional[Path] = STORE,
        topics: Optional[int] = TOPICS,
        fmt: Optional[Format] = FormatOption,
        no_pager: bool = NoPagerOption,
    ) -> None:
        from rmqstore.bench import BENCHMARKS

        opts, output = _opts(ctx, size_mb=size_mb, body_size=body_size, runs=runs,
                             dir=directory, segment_mb=segment_mb, lookups=lookups,
                             append_mode=append_mode, shape=shape, store=store, topics=topics,
                             fmt=fmt, no_pager=no_pager or None)
        _run(BENCHMARKS if name == "all" else (name,), opts, output)

    command.__doc__ = doc
    command.__name__ = f"bench_{name.replace('-', '_')}"
    bench_app.command(name)(command)


_command("append", "Append generated messages through MessageStore.put, from the first put to a clean close (flush and dispatch included).")
_command("scan", "Bulk-scan the CommitLog into per-queue statistics (what `rmqstore stats` does).")
_command("verify", "Verify a store (CommitLog with body CRCs, ConsumeQueues, IndexFiles).")
_command("rebuild", "Rebuild ConsumeQueues and IndexFiles from the CommitLog (on a copy of a --store).")
_command("query-key", "Look keys up through the IndexFiles, one query per key (UNIQ_KEYs and KEYS tokens of records drawn from the store).")
_command("dump", "Every message as the message JSON, encoded as `rmqstore dump --format jsonl` encodes it, to /dev/null.")
_command("spark-export", "Export the store to Parquet with Spark in local mode (needs pyspark and Java; the session start is not timed).")
_command("all", "Run every benchmark.")
