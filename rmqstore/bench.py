"""Benchmarks behind ``rmqstore bench``: each times one library call and reports messages,
bytes and seconds (the median of several runs).

The data is generated (:func:`rmqstore.bench_data.make_store`, in the message shape
``BenchOptions.shape`` of :mod:`rmqstore.bench_shapes`: ``broker`` by default, ``easy``
the old one), or with ``BenchOptions.store`` an existing store is timed as it is: the
read-side benchmarks only, and nothing of it is ever written (rebuild runs on a sparse copy
under ``dir``; query-key draws its keys from the store's own records).

==============  =============================================================
append          :func:`rmqstore.bench_append.run_append` (put to clean close)
scan            :func:`rmqstore.stats.commitlog_stats` (what ``rmqstore stats`` does)
verify          :func:`rmqstore.recovery.verify.bench_verify` (with CRC)
rebuild         :func:`rmqstore.recovery.rebuild.bench_rebuild` (CRC, CQ + IndexFile)
query-key       :meth:`rmqstore.reader.StoreReader.query_key` in a loop
dump            the message JSON of every record (``dump --format jsonl``), to /dev/null
spark-export    :func:`rmqstore.pipeline.jobs.export` on a warm local session
                (needs pyspark and Java; the session start is not timed)
==============  =============================================================

Nothing here prints; the CLI renders :class:`BenchResult`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .bench_data import GeneratedStore, make_store
from .bench_shapes import BENCH_EPOCH_MS, SHAPES
from .errors import InputError, RefusedError

MB = 1024 * 1024
BENCHMARKS = ("append", "scan", "verify", "rebuild", "query-key", "dump", "spark-export")
#: What ``--store`` times: benchmarks that only read a store (rebuild: a copy of it).
STORE_BENCHMARKS = ("scan", "verify", "rebuild", "query-key", "dump", "spark-export")

__all__ = ["BENCHMARKS", "STORE_BENCHMARKS", "SHAPES", "BENCH_EPOCH_MS", "BenchOptions",
           "BenchResult", "GeneratedStore", "make_store", "run", "spark_available"]


@dataclass
class BenchResult:
    """One benchmark: the median run, or why it did not run."""

    name: str
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    runs: list[float] = field(default_factory=list)
    skipped: str | None = None

    @property
    def msgs_per_sec(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_sec(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        """The JSON form: exactly these keys (``rmqstore bench --format json``)."""
        return {"name": self.name, "messages": int(self.messages), "bytes": int(self.bytes),
                "seconds": round(float(self.seconds), 6),
                "msgsPerSec": round(self.msgs_per_sec, 1), "mbPerSec": round(self.mb_per_sec, 2)}


@dataclass
class BenchOptions:
    size_mb: float = 64.0
    body_size: int = 100
    runs: int = 3
    dir: str | None = None  # the disk to measure; a temp dir when None. Data is removed.
    segment_mb: int = 1024
    topics: int = 4
    queues: int = 8
    lookups: int = 1000
    #: append path: single (put), batch (put_batch of 1000), columns (put_columns of
    #: 1000), sync (SYNC_FLUSH group commit, 4 writer threads)
    append_mode: str = "single"
    shape: str = "broker"  # of the generated messages: broker or easy (bench_shapes)
    store: str | None = None  # time this existing store (read-side benchmarks) instead

    @property
    def size_bytes(self) -> int:
        return max(int(self.size_mb * MB), 1)

    @property
    def segment_size(self) -> int:
        return self.segment_mb * MB


def _median(name: str, runs: int, once: Callable[[int], tuple[int, int, float]]) -> BenchResult:
    """Run ``once(k)`` -> (messages, bytes, seconds) ``runs`` times; keep the median run."""
    results = [once(k) for k in range(max(1, runs))]
    secs = [r[2] for r in results]
    med = statistics.median(secs)
    pick = min(results, key=lambda r: abs(r[2] - med))
    return BenchResult(name, pick[0], pick[1], med, secs)


class _Workdir:
    """A fresh subfolder per benchmark in ``opts.dir`` or a temp dir; removed on exit."""

    def __init__(self, opts: BenchOptions, name: str):
        self._tmp = None
        if opts.dir:
            base = Path(opts.dir)
            base.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.mkdtemp(prefix="rmqstore-bench-")
            base = Path(self._tmp)
        self.path = base / f"bench-{name}"
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self._tmp if self._tmp else self.path, ignore_errors=True)


def _store(opts: BenchOptions, d: Path, *, queues_and_index: bool = True) -> Path:
    """The store a read-side benchmark times: ``opts.store`` as it is, or one generated
    into ``d``."""
    if opts.store:
        return Path(opts.store)
    make_store(d / "store", opts.size_bytes, shape=opts.shape, body_size=opts.body_size,
               topics=opts.topics, queues=opts.queues, segment_size=opts.segment_size,
               queues_and_index=queues_and_index)
    return d / "store"


def bench_append(opts: BenchOptions) -> BenchResult:
    from .bench_append import bench_messages, run_append as run
    from .format.record import encode_record

    modes = {"single": {}, "batch": {"batch": 1000}, "columns": {"batch": 1000, "columns": True},
             "sync": {"flush_disk_type": "SYNC_FLUSH", "threads": 4}}
    if opts.append_mode not in modes:
        raise ValueError(f"append mode must be one of {', '.join(modes)}")
    shape = {"shape": opts.shape, "topics": opts.topics, "queues": opts.queues}
    sample = list(bench_messages(64, opts.body_size, **shape))
    rsize = sum(len(encode_record(m)) for m in sample) / len(sample)
    count = max(1, int(opts.size_bytes // rsize))
    if opts.append_mode == "sync":
        count = min(count, 20_000)  # one fdatasync per group: keep the run short
    name = "append" if opts.append_mode == "single" else f"append-{opts.append_mode}"
    with _Workdir(opts, "append") as d:
        def once(k: int):
            r = run(d / f"run{k}", count, body_size=opts.body_size,
                    segment_size=opts.segment_size, **shape, **modes[opts.append_mode])
            shutil.rmtree(d / f"run{k}", ignore_errors=True)
            return r["messages"], r["bytes"], r["seconds"]

        return _median(name, opts.runs, once)


def bench_scan(opts: BenchOptions) -> BenchResult:
    """What ``rmqstore stats`` spends its time on: the bulk scan of the CommitLog into
    per-queue statistics."""
    from .stats import commitlog_stats

    with _Workdir(opts, "scan") as d:
        root = _store(opts, d, queues_and_index=False)

        def once(k: int):
            t0 = time.perf_counter()
            queues, _end = commitlog_stats(str(root))
            secs = time.perf_counter() - t0
            return sum(q.count for q in queues), sum(q.bytes for q in queues), secs

        return _median("scan", opts.runs, once)


def _triple(r: dict) -> tuple[int, int, float]:
    return int(r["messages"]), int(r["bytes"]), float(r["seconds"])


def bench_verify(opts: BenchOptions) -> BenchResult:
    from .recovery.verify import bench_verify as verify

    with _Workdir(opts, "verify") as d:
        root = _store(opts, d)
        return _median("verify", opts.runs, lambda k: _triple(verify(root)))


def bench_rebuild(opts: BenchOptions) -> BenchResult:
    """Rebuild rewrites ConsumeQueues and IndexFiles: a given store is timed on a sparse
    copy made under ``dir`` (not timed), never in place."""
    from .files.sparse import copy_tree
    from .recovery.rebuild import bench_rebuild as rebuild

    with _Workdir(opts, "rebuild") as d:
        if opts.store:
            root = d / "copy"
            copy_tree(opts.store, root, fsync=False)
        else:
            root = _store(opts, d, queues_and_index=False)
        return _median("rebuild", opts.runs, lambda k: _triple(rebuild(root)))


def sample_keys(root: str | os.PathLike, count: int, *, seed: int = 7) -> list[tuple[str, str]]:
    """(topic, key) of ``count`` records drawn (seeded) through the store's ConsumeQueues:
    alternately the UNIQ_KEY and the first KEYS token, whichever a record has. Records
    with neither are passed over; fewer keys come back when the store has fewer."""
    from .errors import RmqStoreError
    from .format.message import split_keys
    from .reader import open_store

    rng = np.random.default_rng(seed)
    out: list[tuple[str, str]] = []
    with open_store(root) as reader:
        ranges = []
        for q in reader.queues().queues:
            try:
                with reader.consume_queue(q.topic, q.queue_id) as cq:
                    lo, hi = cq.min_offset(), cq.max_offset
            except RmqStoreError:
                continue
            if hi > lo:
                ranges.append((q.topic, q.queue_id, lo, hi))
        if not ranges:
            return out
        sizes = np.array([hi - lo for _t, _q, lo, hi in ranges], dtype=np.int64)
        ends = np.cumsum(sizes)
        for k, x in enumerate(rng.integers(0, int(ends[-1]), size=4 * count).tolist()):
            if len(out) == count:
                break
            r = int(np.searchsorted(ends, x, "right"))
            topic, qid, lo, _hi = ranges[r]
            try:
                m = reader.get_by_queue_offset(topic, qid, lo + x - int(ends[r] - sizes[r]))
            except RmqStoreError:
                continue
            keys = split_keys(m.properties.get("KEYS"))
            choice = [m.uniq_key, keys[0] if keys else None]
            key = choice[k % 2] or choice[1 - k % 2]
            if key:
                out.append((m.topic, key))
    return out


def bench_query_key(opts: BenchOptions) -> BenchResult:
    from .reader import open_store

    with _Workdir(opts, "query-key") as d:
        root = _store(opts, d)
        keys = sample_keys(root, max(1, opts.lookups))
        if not keys:
            return BenchResult("query-key", skipped="no ConsumeQueue unit leads to a record "
                                                    "with a UNIQ_KEY or KEYS")

        def once(k: int):
            found = nbytes = 0
            with open_store(root) as reader:
                t0 = time.perf_counter()
                for topic, key in keys:
                    for m in reader.query_key(topic, key):
                        found += 1
                        nbytes += m.store_size
                secs = time.perf_counter() - t0
            if found < len(keys) and not opts.store:
                raise RuntimeError(f"query-key bench found {found} of {len(keys)} keys")
            return found, nbytes, secs

        return _median("query-key", opts.runs, once)


def bench_dump(opts: BenchOptions) -> BenchResult:
    """Every message as the message JSON with a base64 body, as ``rmqstore dump --format
    jsonl`` renders and writes it (JSON Lines blocks, UTF-8), to /dev/null."""
    from .reader import open_store
    from .selection import MessageFilter

    with _Workdir(opts, "dump") as d:
        root = _store(opts, d, queues_and_index=False)
        with open_store(root) as reader:  # the records' bytes, counted outside the timing
            nbytes = sum(int(cols.size[keep].sum())
                         for cols, keep in reader.scan(MessageFilter(), unwrap=False).chunks())

        def once(k: int):
            n = 0
            with open(os.devnull, "wb") as sink, open_store(root) as reader:
                t0 = time.perf_counter()
                for block in reader.scan(MessageFilter()).json_lines("base64"):
                    sink.write(block.data)
                    n += block.count
                secs = time.perf_counter() - t0
            return n, nbytes, secs

        return _median("dump", opts.runs, once)


def spark_available() -> str | None:
    """None when the Spark bench can run, else why not."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'rmqstore[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime found (Spark needs Java 17)"
    return None


def bench_spark_export(opts: BenchOptions) -> BenchResult:
    why = spark_available()
    if why:
        return BenchResult("spark-export", skipped=why)
    from .pipeline import jobs

    with _Workdir(opts, "spark-export") as d:
        root = _store(opts, d, queues_and_index=False)
        spark = jobs.session()

        def once(k: int):
            out = d / f"out{k}"
            t0 = time.perf_counter()
            res = jobs.export(spark, [str(root)], str(out))
            secs = time.perf_counter() - t0
            shutil.rmtree(out, ignore_errors=True)
            span = sum(e.end_offset - e.min_offset for e in res.ends.values())  # CommitLog read
            return res.records, span, secs

        try:
            return _median("spark-export", opts.runs, once)
        finally:
            spark.stop()


RUNNERS: dict[str, Callable[[BenchOptions], BenchResult]] = {
    "append": bench_append, "scan": bench_scan, "verify": bench_verify,
    "rebuild": bench_rebuild, "query-key": bench_query_key, "dump": bench_dump,
    "spark-export": bench_spark_export,
}


def check(names, opts: BenchOptions) -> None:
    """Refuse what cannot run before anything runs: an unknown shape, a ``--store`` that
    is not a store root, an append benchmark on a given store. A ``--store`` given as its
    commitlog folder is set to the store root."""
    if opts.shape not in SHAPES:
        raise InputError(f"--shape must be one of {', '.join(SHAPES)}, got {opts.shape!r}")
    if opts.store is None:
        return
    from .reader import classify

    kind = classify(opts.store)
    if kind.kind != "store":
        raise InputError(f"--store {opts.store}: not a store root")
    opts.store = str(kind.root)
    writes = [n for n in names if n not in STORE_BENCHMARKS]
    if writes:
        raise RefusedError(f"bench {writes[0]} writes a new store; --store only times the "
                           f"read-side benchmarks ({', '.join(STORE_BENCHMARKS)})")


def run(name: str, opts: BenchOptions) -> BenchResult:
    check([name], opts)
    return RUNNERS[name](opts)
