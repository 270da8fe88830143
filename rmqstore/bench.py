"""Benchmarks behind ``rmqstore bench``: each makes its own data, times one library call,
and reports messages, bytes and seconds (the median of several runs).

The data comes from :func:`make_store`, a vectorised store writer: one record per
(topic, queue) is encoded with :func:`rmqstore.format.record.encode_record` as a template, and
numpy copies the templates into whole segments; the fields that differ per message
(QUEUEOFFSET, PHYSICALOFFSET, the timestamps) are set with the format's vector form,
:func:`rmqstore.format.record.set_head_field`, and the digits of the KEYS token patched.
Records are therefore all one size, which makes the segment layout arithmetic (how many
fit before the BLANK, spec §4) a division. ConsumeQueues and IndexFiles are built with the
bulk writers, in CommitLog order, so they hold the bytes dispatch would write (a test
compares them with :meth:`rmqstore.engine.dispatch.Dispatcher.dispatch_log`).

Timed calls, and where they come from when the owning module offers a bench hook:

==============  =============================================================
append          :func:`rmqstore.bench_append.run_append` (put to clean close)
scan            ``rmqstore.stats.commitlog_stats`` (``segment_partials`` before it)
verify          ``rmqstore.recovery.verify.bench_verify`` when present, else skipped
rebuild         ``rmqstore.recovery.rebuild.bench_rebuild`` when present, else
                :func:`rmqstore.recovery.rebuild.rebuild`, else (older trees)
                :meth:`Dispatcher.dispatch_log` into empty ConsumeQueue/index
query-key       :meth:`rmqstore.reader.StoreReader.query_key` in a loop
spark-export    :func:`rmqstore.pipeline.jobs.export` on a warm local session
                (needs pyspark and Java; the session start is not timed)
==============  =============================================================

Nothing here prints; the CLI renders :class:`BenchResult`.
"""

from __future__ import annotations

import importlib
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

from .format import layout as L
from .format.message import Host, Message
from .format.record import encode_record, set_head_field
from .format.hashing import index_abs_many, java_hash

MB = 1024 * 1024
BENCHMARKS = ("append", "scan", "verify", "rebuild", "query-key", "spark-export")

#: First store timestamp of generated data; one millisecond per message after that.
BENCH_EPOCH_MS = 1_700_000_000_000
KEY_DIGITS = 10


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

    @property
    def size_bytes(self) -> int:
        return max(int(self.size_mb * MB), 1)


# --- data --------------------------------------------------------------------------------


@dataclass
class GeneratedStore:
    root: Path
    messages: int
    bytes: int  # CommitLog bytes holding records (BLANKs excluded)
    record_size: int
    topics: int
    queues: int

    @property
    def templates(self) -> int:
        return self.topics * self.queues

    def topic_of(self, i: np.ndarray | int):
        """Topic number of message ``i`` (templates are topic-major)."""
        return (i % self.templates) // self.queues

    def key(self, i: int) -> tuple[str, str]:
        """(topic, KEYS token) of message ``i``."""
        return _topic(int(self.topic_of(i))), _key(i)


def _topic(t: int) -> str:
    return f"BenchTopic{t:02d}"  # equal lengths: every record is the same size


def _key(i: int) -> str:
    return f"bk{i:0{KEY_DIGITS}d}"


def _templates(topics: int, queues: int, body_size: int) -> tuple[np.ndarray, dict, int]:
    """One encoded record per (topic, queue), all the same size, and where the per-message
    fields sit in it."""
    born = Host.parse("10.0.0.17:50000")
    store = Host.parse("10.0.0.1:10911")
    body = (b"rmqstore-bench-" * (body_size // 15 + 1))[:body_size]
    rows = []
    for t in range(topics):
        for q in range(queues):
            m = Message(topic=_topic(t), body=body, queue_id=q,
                        properties={"TAGS": f"Tag{q % 4}", "KEYS": _key(0)},
                        born_timestamp=BENCH_EPOCH_MS, born_host=born,
                        store_timestamp=BENCH_EPOCH_MS, store_host=store)
            rows.append(encode_record(m))
    size = len(rows[0])
    assert all(len(r) == size for r in rows)
    marker = ("KEYS\x01" + _key(0)).encode()
    key_at = rows[0].rfind(marker) + len(marker) - KEY_DIGITS
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), size), key_at, size


def _digits(i: np.ndarray) -> np.ndarray:
    powers = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)
    return ((i[:, None] // powers) % 10 + ord("0")).astype(np.uint8)


def _fill(block: np.ndarray, templates: np.ndarray, key_at: int, first: int, phys0: int,
          rsize: int) -> None:
    n = len(block)
    i = np.arange(first, first + n, dtype=np.int64)
    j = len(templates)
    np.take(templates, i % j, axis=0, out=block)
    set_head_field(block, "queue_offset", i // j)
    set_head_field(block, "physical_offset", phys0 + np.arange(n, dtype=np.int64) * rsize)
    set_head_field(block, "born_timestamp", BENCH_EPOCH_MS + i)
    set_head_field(block, "store_timestamp", BENCH_EPOCH_MS + i)
    block[:, key_at:key_at + KEY_DIGITS] = _digits(i)  # the KEYS token's digits


def write_commitlog(root: str | os.PathLike, size_bytes: int, *, body_size: int = 100,
                    topics: int = 4, queues: int = 8, segment_size: int = 1 << 30,
                    chunk_records: int = 1 << 16) -> GeneratedStore:
    """A CommitLog of about ``size_bytes`` of records under ``root/commitlog``.

    Message ``i`` goes to template ``i % (topics*queues)`` (topic-major), so its queue
    offset is ``i // (topics*queues)``; its KEYS token is ``bk`` + ``i`` in ten digits.
    Segments are full-size files; the last one's tail stays sparse zeros."""
    root = Path(root)
    cl = root / "commitlog"
    cl.mkdir(parents=True, exist_ok=True)
    templates, key_at, rsize = _templates(topics, queues, body_size)
    per_segment = (segment_size - L.END_FILE_MIN_BLANK_LENGTH) // rsize
    if per_segment < 1:
        raise ValueError(f"a {rsize}-byte record does not fit a {segment_size}-byte segment")
    total = max(1, size_bytes // rsize)
    done = 0
    seg_start = 0
    buf = np.empty((chunk_records, rsize), dtype=np.uint8)
    while done < total:
        n_here = min(per_segment, total - done)
        with open(cl / f"{seg_start:020d}", "wb") as f:
            k = 0
            while k < n_here:
                m = min(chunk_records, n_here - k)
                block = buf[:m]
                _fill(block, templates, key_at, done + k, seg_start + k * rsize, rsize)
                f.write(block.data)
                k += m
            if n_here == per_segment and done + n_here < total:
                left = segment_size - n_here * rsize
                f.write(L.BLANK_STRUCT.pack(left, L.MAGIC_BLANK))  # spec §4
            f.truncate(segment_size)
        done += n_here
        seg_start += segment_size
    return GeneratedStore(root, total, total * rsize, rsize, topics, queues)


def _positions(g: GeneratedStore, segment_size: int) -> np.ndarray:
    per_segment = (segment_size - L.END_FILE_MIN_BLANK_LENGTH) // g.record_size
    i = np.arange(g.messages, dtype=np.int64)
    return (i // per_segment) * segment_size + (i % per_segment) * g.record_size


def key_hashes(g: GeneratedStore) -> np.ndarray:
    """Index hashes of ``topic#bkNNNNNNNNNN`` for every message, without making strings:
    Java's hash is linear, h(prefix + digits) = h(prefix)*31^10 + h'(digits) (mod 2^32)."""
    i = np.arange(g.messages, dtype=np.int64)
    t = g.topic_of(i)
    mask = np.uint64(0xFFFFFFFF)
    pre = np.array([java_hash(f"{_topic(k)}#bk") & 0xFFFFFFFF for k in range(g.topics)], dtype=np.uint64)
    h = pre[t]
    d = _digits(i).astype(np.uint64)
    for k in range(KEY_DIGITS):
        h = (h * np.uint64(31) + d[:, k]) & mask
    return index_abs_many(h)


def make_store(root: str | os.PathLike, size_bytes: int, *, body_size: int = 100,
               topics: int = 4, queues: int = 8, segment_size: int = 1 << 30,
               queues_and_index: bool = True) -> GeneratedStore:
    """A whole clean store: CommitLog, ConsumeQueues, IndexFiles (RocketMQ's default
    geometry) and a checkpoint, as dispatch would leave them."""
    from .files import checkpoint as ckpt
    from .files.config import StoreConfig
    from .files.consumequeue_writer import build_consume_queue
    from .files.index import IndexGeometry
    from .files.index_service import build_index
    from .files.names import queue_dir

    g = write_commitlog(root, size_bytes, body_size=body_size, topics=topics, queues=queues,
                        segment_size=segment_size)
    last_ts = BENCH_EPOCH_MS + g.messages - 1
    if queues_and_index:
        cfg = StoreConfig(store_path_root_dir=str(g.root), mapped_file_size_commit_log=segment_size)
        phys = _positions(g, segment_size)
        i = np.arange(g.messages, dtype=np.int64)
        j = i % g.templates
        for t in range(topics):
            for q in range(queues):
                sel = j == t * queues + q
                n = int(sel.sum())
                if not n:
                    continue
                build_consume_queue(queue_dir(g.root / "consumequeue", _topic(t), q),
                                    np.arange(n, dtype=np.int64), phys[sel],
                                    np.full(n, g.record_size, dtype=np.int64),
                                    np.full(n, java_hash(f"Tag{q % 4}"), dtype=np.int64),
                                    cfg.cq_file_size)
        geometry = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
        build_index(g.root / "index", geometry, key_hashes(g), phys, BENCH_EPOCH_MS + i,
                    clock=lambda: BENCH_EPOCH_MS)
    ckpt.write_checkpoint(g.root, ckpt.Checkpoint(last_ts, last_ts if queues_and_index else 0, 0),
                          version="4.9")
    return g


# --- timing ------------------------------------------------------------------------------


def _median(name: str, runs: int, once: Callable[[int], tuple[int, int, float]]) -> BenchResult:
    """Run ``once(k)`` -> (messages, bytes, seconds) ``runs`` times; keep the median run."""
    results = [once(k) for k in range(max(1, runs))]
    secs = [r[2] for r in results]
    med = statistics.median(secs)
    pick = min(results, key=lambda r: abs(r[2] - med))
    return BenchResult(name, pick[0], pick[1], med, secs)


def _hook(module: str, name: str):
    """``module.name`` when that module exists and defines it (others' bench hooks)."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except ModuleNotFoundError:
        return None
    return getattr(importlib.import_module(module), name, None)


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


def _segment_size(opts: BenchOptions) -> int:
    return opts.segment_mb * MB


def bench_append(opts: BenchOptions) -> BenchResult:
    from .bench_append import bench_messages, run_append as run

    modes = {"single": {}, "batch": {"batch": 1000}, "columns": {"batch": 1000, "columns": True},
             "sync": {"flush_disk_type": "SYNC_FLUSH", "threads": 4}}
    if opts.append_mode not in modes:
        raise ValueError(f"append mode must be one of {', '.join(modes)}")
    rsize = len(encode_record(next(bench_messages(1, opts.body_size))))
    count = max(1, opts.size_bytes // rsize)
    if opts.append_mode == "sync":
        count = min(count, 20_000)  # one fdatasync per group: keep the run short
    name = "append" if opts.append_mode == "single" else f"append-{opts.append_mode}"
    with _Workdir(opts, "append") as d:
        def once(k: int):
            r = run(d / f"run{k}", count, body_size=opts.body_size,
                    segment_size=_segment_size(opts), **modes[opts.append_mode])
            shutil.rmtree(d / f"run{k}", ignore_errors=True)
            return r["messages"], r["bytes"], r["seconds"]

        return _median(name, opts.runs, once)


def bench_scan(opts: BenchOptions) -> BenchResult:
    """What ``rmqstore stats`` spends its time on: the bulk scan of the CommitLog into
    per-queue statistics (``stats.commitlog_stats``; ``segment_partials`` in older trees)."""
    from . import stats

    with _Workdir(opts, "scan") as d:
        make_store(d, opts.size_bytes, body_size=opts.body_size, topics=opts.topics,
                   queues=opts.queues, segment_size=_segment_size(opts), queues_and_index=False)

        def once(k: int):
            if hasattr(stats, "commitlog_stats"):
                t0 = time.perf_counter()
                queues, _end = stats.commitlog_stats(str(d))
                secs = time.perf_counter() - t0
                return sum(q.count for q in queues), sum(q.bytes for q in queues), secs
            from .files.segments import SegmentQueue

            with SegmentQueue([d / "commitlog"], _segment_size(opts)) as q:
                t0 = time.perf_counter()
                parts = stats.segment_partials(q.segments)
                secs = time.perf_counter() - t0
            return sum(p.records for p in parts), sum(p.bytes for p in parts), secs

        return _median("scan", opts.runs, once)


def bench_verify(opts: BenchOptions) -> BenchResult:
    hook = _hook("rmqstore.recovery.verify", "bench_verify")
    if hook is None:
        return BenchResult("verify", skipped="rmqstore.recovery.verify has no bench_verify yet")
    with _Workdir(opts, "verify") as d:
        g = make_store(d, opts.size_bytes, body_size=opts.body_size, topics=opts.topics,
                       queues=opts.queues, segment_size=_segment_size(opts))

        def once(k: int):
            r = hook(d)
            return _triple(r, g)

        return _median("verify", opts.runs, once)


def _triple(r, g: GeneratedStore) -> tuple[int, int, float]:
    """(messages, bytes, seconds) from another module's bench hook result (a dict)."""
    if isinstance(r, dict):
        return (int(r.get("messages", g.messages)), int(r.get("bytes", g.bytes)),
                float(r["seconds"]))
    return g.messages, g.bytes, float(r)


def bench_rebuild(opts: BenchOptions) -> BenchResult:
    hook = _hook("rmqstore.recovery.rebuild", "bench_rebuild")
    library = _hook("rmqstore.recovery.rebuild", "rebuild")
    with _Workdir(opts, "rebuild") as d:
        g = make_store(d / "store", opts.size_bytes, body_size=opts.body_size, topics=opts.topics,
                       queues=opts.queues, segment_size=_segment_size(opts), queues_and_index=False)

        def once(k: int):
            if hook is not None:
                return _triple(hook(g.root), g)
            if library is not None:
                t0 = time.perf_counter()
                r = library(g.root, clock=lambda: BENCH_EPOCH_MS)
                return r.messages, r.bytes, time.perf_counter() - t0
            return _dispatch_log(g, d / f"run{k}", _segment_size(opts))

        return _median("rebuild", opts.runs, once)


def _dispatch_log(g: GeneratedStore, scratch: Path, segment_size: int) -> tuple[int, int, float]:
    """Re-dispatch the whole CommitLog into empty ConsumeQueues and IndexFiles: what a
    rebuild does, timed through the engine's own reput path."""
    from .files.commitlog import CommitLog
    from .files.config import StoreConfig
    from .engine.dispatch import Dispatcher
    from .files.index import IndexGeometry
    from .files.index_service import IndexService

    scratch.mkdir(parents=True)
    (scratch / "commitlog").symlink_to((g.root / "commitlog").resolve())
    cfg = StoreConfig(store_path_root_dir=str(scratch), mapped_file_size_commit_log=segment_size)
    t0 = time.perf_counter()
    index = IndexService(cfg.index_dir, IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num),
                         clock=lambda: BENCH_EPOCH_MS, flush_full_files=False)
    disp = Dispatcher(cfg, index=index)
    with CommitLog(cfg) as log:
        disp.dispatch_log(log, 0)
    disp.flush()
    disp.close()
    secs = time.perf_counter() - t0
    n = disp.dispatched
    shutil.rmtree(scratch, ignore_errors=True)
    return n, g.bytes, secs


def bench_query_key(opts: BenchOptions) -> BenchResult:
    from .reader import open_store

    with _Workdir(opts, "query-key") as d:
        g = make_store(d, opts.size_bytes, body_size=opts.body_size, topics=opts.topics,
                       queues=opts.queues, segment_size=_segment_size(opts))
        rng = np.random.default_rng(7)
        picks = rng.integers(0, g.messages, size=max(1, opts.lookups)).tolist()
        keys = [g.key(i) for i in picks]

        def once(k: int):
            found = nbytes = 0
            with open_store(d) as reader:
                t0 = time.perf_counter()
                for topic, key in keys:
                    for m in reader.query_key(topic, key):
                        found += 1
                        nbytes += m.store_size
                secs = time.perf_counter() - t0
            if found != len(keys):
                raise RuntimeError(f"query-key bench found {found} of {len(keys)} keys")
            return found, nbytes, secs

        return _median("query-key", opts.runs, once)


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
        g = make_store(d / "store", opts.size_bytes, body_size=opts.body_size, topics=opts.topics,
                       queues=opts.queues, segment_size=_segment_size(opts), queues_and_index=False)
        spark = jobs.session()

        def once(k: int):
            out = d / f"out{k}"
            t0 = time.perf_counter()
            res = jobs.export(spark, [str(g.root)], str(out))
            secs = time.perf_counter() - t0
            shutil.rmtree(out, ignore_errors=True)
            return res.records, g.bytes, secs

        try:
            return _median("spark-export", opts.runs, once)
        finally:
            spark.stop()


RUNNERS: dict[str, Callable[[BenchOptions], BenchResult]] = {
    "append": bench_append, "scan": bench_scan, "verify": bench_verify,
    "rebuild": bench_rebuild, "query-key": bench_query_key, "spark-export": bench_spark_export,
}


def run(name: str, opts: BenchOptions) -> BenchResult:
    return RUNNERS[name](opts)
