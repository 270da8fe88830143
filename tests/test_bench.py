"""``rmqstore bench``: the generator writes what dispatch would, and every benchmark runs
at a tiny size with the documented JSON keys."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

from conftest import REPO, tree_hashes
from rmqstore import bench as B
from rmqstore.format.hashing import index_hash_many

KEYS = ["name", "messages", "bytes", "seconds", "msgsPerSec", "mbPerSec"]


def test_generated_commitlog_reads_back(tmp_path):
    from rmqstore.reader import open_store

    g = B.make_store(tmp_path, 300_000, body_size=50, topics=3, queues=2,
                     segment_size=64 * 1024, queues_and_index=False)
    with open_store(tmp_path) as r:
        msgs = list(r.messages())
    assert len(msgs) == g.messages
    # Several segments, each closed with a BLANK: offsets jump at segment starts.
    assert len(list((tmp_path / "commitlog").iterdir())) >= 4
    positions = B._positions(g, 64 * 1024)
    for i in (0, 1, g.messages // 2, g.messages - 1):
        m = msgs[i]
        topic, key = g.key(i)
        assert (m.topic, m.keys, m.store_timestamp) == (topic, [key], B.BENCH_EPOCH_MS + i)
        assert m.queue_offset == i // g.templates and m.queue_id == i % g.queues
        assert m.commit_log_offset == positions[i]  # PHYSICALOFFSET field = real position
    assert all(m.store_size == g.record_size for m in msgs)


def test_vectorised_key_hashes_equal_java_hash(tmp_path):
    g = B.write_commitlog(tmp_path, 100_000, topics=5, queues=3)
    keys = [f"{t}#{k}" for t, k in (g.key(i) for i in range(g.messages))]
    assert np.array_equal(B.key_hashes(g), index_hash_many(keys).astype(np.int64))


def test_generated_queues_and_index_equal_dispatch(tmp_path):
    """make_store's bulk ConsumeQueues and IndexFiles hold the bytes the engine's own
    re-dispatch writes from the same CommitLog."""
    seg = 256 * 1024
    g = B.make_store(tmp_path / "gen", 900_000, topics=2, queues=3, segment_size=seg)
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "commitlog").symlink_to(g.root / "commitlog")
    from rmqstore.files.commitlog import CommitLog
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.dispatch import Dispatcher
    from rmqstore.files.index import IndexGeometry
    from rmqstore.files.index_service import IndexService

    cfg = StoreConfig(store_path_root_dir=str(ref), mapped_file_size_commit_log=seg)
    idx = IndexService(cfg.index_dir, IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num),
                       clock=lambda: B.BENCH_EPOCH_MS, flush_full_files=False)
    d = Dispatcher(cfg, index=idx)
    with CommitLog(cfg) as log:
        d.dispatch_log(log, 0)
    d.close()
    assert tree_hashes(g.root / "consumequeue") == tree_hashes(ref / "consumequeue")
    assert tree_hashes(g.root / "index") == tree_hashes(ref / "index")


def _bench(*args, timeout=300):
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "cli.main", "bench", *args], capture_output=True,
                         text=True, cwd=REPO, timeout=timeout)
    return out, time.perf_counter() - t0


def test_every_benchmark_runs_tiny_with_json_keys(tmp_path):
    out, _ = _bench("--size-mb", "0.5", "--runs", "1", "--lookups", "20", "--segment-mb", "1",
                       "--dir", str(tmp_path), "--format", "json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    skipped = {line.split("bench ")[1].split(" skipped")[0]
               for line in out.stderr.splitlines() if " skipped: " in line}
    names = [r["name"] for r in rows]
    assert sorted(names + sorted(skipped)) == sorted(B.BENCHMARKS), (names, skipped)
    # Only benchmarks whose engine part has not landed may be skipped, and Spark only
    # without pyspark/Java.
    allowed = {"verify"} if B._hook("rmqstore.recovery.verify", "bench_verify") is None else set()
    if B.spark_available():
        allowed.add("spark-export")
    assert skipped <= allowed, out.stderr
    for r in rows:
        assert list(r) == KEYS
        assert isinstance(r["name"], str)
        assert isinstance(r["messages"], int) and r["messages"] > 0
        assert isinstance(r["bytes"], int) and r["bytes"] > 0
        for k in ("seconds", "msgsPerSec", "mbPerSec"):
            assert isinstance(r[k], float) and r[k] > 0, (r["name"], k)
    assert list(tmp_path.iterdir()) == [], "bench left data behind in --dir"


def test_single_benchmark_median_and_formats():
    out, _ = _bench("scan", "--size-mb", "1", "--runs", "3", "--format", "jsonl")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["name"] == "scan"
    table, _ = _bench("--size-mb", "0.2", "--runs", "1", "query-key", "--lookups", "5",
                      "--format", "table")
    assert table.returncode == 0, table.stderr
    assert "query-key" in table.stdout and "median of 1" in table.stdout


def test_bad_bench_usage_is_exit_2():
    out, _ = _bench("scan", "--runs", "0")
    assert out.returncode == 2
    out, _ = _bench("nonsense")
    assert out.returncode == 2


def test_median_picks_the_middle_run():
    seconds = iter([3.0, 1.0, 2.0])
    r = B._median("x", 3, lambda k: (10, 100, next(seconds)))
    assert r.seconds == 2.0 and r.runs == [3.0, 1.0, 2.0]
    assert r.as_dict()["msgsPerSec"] == 5.0


def test_generated_store_verifies_clean(tmp_path):
    from rmqstore.recovery.verify import verify

    B.make_store(tmp_path, 2_000_000, topics=3, queues=4, segment_size=512 * 1024)
    report = verify(tmp_path)
    assert report.ok, [(f.code, f.severity) for f in report.findings]
    assert report.messages > 0
