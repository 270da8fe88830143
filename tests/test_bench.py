"""``rmqstore bench``: every benchmark runs at a tiny size with the documented JSON keys;
``--store`` times an existing store without writing a byte of it. (The generated data:
tests/test_bench_data.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import REPO, copy_store, tree_hashes
from rmqstore import bench as B

KEYS = ["name", "messages", "bytes", "seconds", "msgsPerSec", "mbPerSec"]


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
    # Only Spark may be skipped, without pyspark/Java.
    allowed = {"spark-export"} if B.spark_available() else set()
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


@pytest.mark.parametrize("shape", B.SHAPES)
def test_generated_store_verifies_clean(tmp_path, shape):
    from rmqstore.recovery.verify import verify

    B.make_store(tmp_path, 2_000_000, shape=shape, topics=3, queues=4, segment_size=512 * 1024)
    report = verify(tmp_path)
    assert report.ok, [(f.code, f.severity) for f in report.findings]
    assert report.messages > 0


@pytest.fixture(scope="module")
def fixture_copy(tmp_path_factory, fixtures_root):
    return copy_store(fixtures_root / "basic", tmp_path_factory.mktemp("store") / "basic")


@pytest.mark.parametrize("name", ["scan", "verify", "rebuild", "query-key", "dump"])
def test_store_benchmarks_never_write_the_store(tmp_path, fixture_copy, name):
    """--store times a RocketMQ-written store as it is: every file keeps its bytes (rebuild
    runs on a copy under --dir, which is removed afterwards)."""
    before = tree_hashes(fixture_copy)
    out, _ = _bench(name, "--store", str(fixture_copy), "--runs", "2", "--lookups", "40",
                    "--dir", str(tmp_path), "--format", "json")
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = json.loads(out.stdout)
    assert row["name"] == name and row["messages"] > 0
    if name != "query-key":  # the fixture's 500 records, 427140 record bytes
        assert (row["messages"], row["bytes"]) == (500, 427140)
    assert tree_hashes(fixture_copy) == before
    assert list(tmp_path.iterdir()) == []


def test_append_on_a_store_is_refused_in_one_line(fixture_copy):
    before = tree_hashes(fixture_copy)
    for args in (("append",), ("--append-mode", "batch", "append")):
        out, _ = _bench(*args, "--store", str(fixture_copy))
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and "--store" in out.stderr, out.stderr
    assert tree_hashes(fixture_copy) == before


def test_query_key_draws_its_keys_from_the_store(fixture_copy):
    """Keys come from records reached through the ConsumeQueues, UNIQ_KEYs and KEYS
    tokens alternately; each is found again through the IndexFiles."""
    from rmqstore.reader import open_store

    keys = B.sample_keys(fixture_copy, 30)
    assert len(keys) == 30 and keys == B.sample_keys(fixture_copy, 30)  # seeded
    stored = {(r["stored"]["topic"], k) for r in manifest_messages("basic")
              for k in [r["stored"]["uniqKey"], *(r["stored"]["keys"] or "").split(" ")] if k}
    assert set(keys) <= stored
    assert any(len(k) == 56 for _t, k in keys) and any(len(k) < 32 for _t, k in keys)
    with open_store(fixture_copy) as r:
        assert all(r.query_key(t, k) for t, k in keys)


def manifest_messages(scenario):
    from conftest import manifest

    return manifest(scenario)["messages"]


def test_bad_shape_and_store_are_exit_2(tmp_path):
    out, _ = _bench("scan", "--shape", "nonsense")
    assert out.returncode == 2
    out, _ = _bench("scan", "--store", str(tmp_path))
    assert out.returncode == 2 and "not a RocketMQ store" in out.stderr
