"""The checked-in sample stores: reproducible byte for byte, healthy ones verify clean,
the crashed one is reported, and the README tour runs on them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, tree_hashes
from rmqstore import samples as S

SAMPLES_DIR = REPO / "samples"
HEALTHY = ("multi-segment", "ipv6-unicode")
CLI = [sys.executable, "-m", "cli.main"]


def rmq(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, **kw)


def test_regenerating_gives_the_checked_in_bytes(tmp_path):
    S.generate(tmp_path)
    for name in S.SAMPLES:
        fresh, kept = tree_hashes(tmp_path / name), tree_hashes(SAMPLES_DIR / name)
        assert fresh.keys() == kept.keys(), f"{name}: file lists differ"
        changed = [p for p in fresh if fresh[p] != kept[p]]
        assert not changed, f"{name}: regenerated files differ: {changed} (run samples/make_samples.py)"


def test_generator_ignores_the_machine_time_zone(tmp_path):
    # IndexFile names are wall-clock text in RocketMQ; the generator pins the zone.
    env = dict(os.environ, TZ="Pacific/Kiritimati")
    subprocess.run([sys.executable, str(SAMPLES_DIR / "make_samples.py"), str(tmp_path)],
                   check=True, env=env, cwd=REPO, capture_output=True, timeout=120)
    assert sorted(p.name for p in (tmp_path / "multi-segment" / "index").iterdir()) == \
        sorted(p.name for p in (SAMPLES_DIR / "multi-segment" / "index").iterdir())


def test_samples_are_small():
    for name in S.SAMPLES:
        files = [p for p in (SAMPLES_DIR / name).rglob("*") if p.is_file()]
        # Apparent size: git stores the zero tails compressed, so this bounds the repo cost.
        assert sum(p.stat().st_size for p in files) < 1_000_000, name


def test_multi_segment_has_what_the_readme_promises():
    import json

    out = rmq("stats", SAMPLES_DIR / "multi-segment", "--format", "json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["commitLog"]["messages"] == S.MULTI_COUNT
    assert s["commitLog"]["segments"] >= 3
    queues = {(q["topic"], q["queueId"]) for q in s["queues"]}
    assert queues == {(t, q) for t, n in S.MULTI_TOPICS.items() for q in range(n)}
    assert len(s["indexFiles"]) > 1
    hits = rmq("query-key", SAMPLES_DIR / "multi-segment", "--topic", "OrderEvents",
               "--key", "order-1010", "--format", "jsonl")
    assert hits.returncode == 0 and len(hits.stdout.splitlines()) == 3


def test_ipv6_unicode_round_trips_hosts_and_text():
    import json

    out = rmq("dump", SAMPLES_DIR / "ipv6-unicode", "--format", "jsonl", "--body", "text")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == S.UNICODE_COUNT
    assert {r["tags"] for r in rows} == set(S.UNICODE_TAGS)
    assert any(r["bornHost"].startswith("[2001:db8:") for r in rows)
    assert any(r["bornHost"] == "192.0.2.10:50505" for r in rows)
    assert all(r["storeHost"].startswith("[2001:db8:0:1:") for r in rows)
    hits = rmq("query-key", SAMPLES_DIR / "ipv6-unicode", "--topic", "Unicode-Orders",
               "--key", "ключ-1", "--format", "jsonl")
    assert hits.returncode == 0, hits.stderr
    assert all("ключ-1" in json.loads(line)["keys"] for line in hits.stdout.splitlines())


def test_crashed_sample_looks_crashed():
    import json

    root = SAMPLES_DIR / "crashed"
    assert (root / "abort").exists()
    out = rmq("stats", root, "--format", "json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    # The torn last record is not a message; its ConsumeQueue unit still exists.
    assert s["commitLog"]["messages"] == S.CRASHED_COUNT - 1
    assert s["abortFile"] is True
    assert sum(q["cqMaxOffset"] for q in s["queues"]) == S.CRASHED_COUNT


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_samples_verify_clean(name):
    out = rmq("verify", SAMPLES_DIR / name)
    assert out.returncode == 0, out.stdout + out.stderr


def test_crashed_sample_fails_verify():
    before = tree_hashes(SAMPLES_DIR / "crashed")
    out = rmq("verify", SAMPLES_DIR / "crashed")
    assert out.returncode == 1, out.stdout + out.stderr
    assert tree_hashes(SAMPLES_DIR / "crashed") == before


def test_tour_runs_and_changes_nothing():
    before = {n: tree_hashes(SAMPLES_DIR / n) for n in S.SAMPLES}
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["sh", str(SAMPLES_DIR / "tour.sh")], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    assert "tour: done" in out.stdout
    assert "order-1010" in out.stdout
    assert "(exit 1, as expected)" in out.stdout
    assert {n: tree_hashes(SAMPLES_DIR / n) for n in S.SAMPLES} == before
