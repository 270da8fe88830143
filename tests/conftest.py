"""Shared test fixtures: the RocketMQ-written stores in ../shared/fixtures.

Tests that need them skip with a clear reason when that folder is absent (a user's clone
has none); CI and the developers' machines have it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("RMQSTORE_FIXTURES", REPO.parent / "shared" / "fixtures"))
ROCKETMQ_498 = FIXTURES / "rocketmq-4.9.8"
SEGMENT_4X = FIXTURES / "rocketmq-4.x-segment" / "00000000000000000000"
NO_FIXTURES = f"RocketMQ-written fixtures not found at {FIXTURES} (they live beside the repo, in ../shared/fixtures)"

SCENARIOS = sorted(p.name for p in ROCKETMQ_498.iterdir()) if ROCKETMQ_498.is_dir() else []
#: Scenarios whose manifest lists every message (the torn copies point at crash/'s list).
MESSAGE_SCENARIOS = [s for s in SCENARIOS if not s.startswith("crash-")]


def scenario_params(names=None):
    names = SCENARIOS if names is None else names
    if not names:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_FIXTURES))]
    return names


@pytest.fixture(scope="session")
def fixtures_root() -> Path:
    if not ROCKETMQ_498.is_dir():
        pytest.skip(NO_FIXTURES)
    return ROCKETMQ_498


_manifests: dict[str, dict] = {}


def manifest(scenario: str) -> dict:
    """A scenario's manifest.json (cached; they are large)."""
    if scenario not in _manifests:
        _manifests[scenario] = json.loads((ROCKETMQ_498 / scenario / "manifest.json").read_text())
    return _manifests[scenario]


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``: to prove read-only commands change nothing."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def store_expectations(scenario: str) -> dict:
    """What RocketMQ reported for the files now on disk in ``scenario``.

    ``queues``, ``queries`` and ``checkpoint`` as in the manifest; for ``crash`` the
    pre-crash observations (the JVM was halted, so page cache = disk); for the torn copies
    those of ``crash``, after proving from the manifests' sha256 lists that only CommitLog
    bytes differ; for ``*-recovered`` the ``recovery`` block, with ``truncate_at`` = the
    recovered CommitLog end (recovery cuts CQ units there but leaves their bytes).
    ``walk``/``messages`` give CommitLog order and the stored records, when known.
    """
    m = manifest(scenario)
    if scenario in ("crash-torn", "crash-torn-tail"):
        mine = {f["path"]: f["sha256"] for f in m["files"]}
        crash = {f["path"]: f["sha256"] for f in manifest("crash")["files"]}
        changed = {p for p in mine.keys() | crash.keys() if mine.get(p) != crash.get(p)}
        assert all(p.startswith("commitlog/") for p in changed), changed
        return dict(store_expectations("crash"), scenario=scenario)
    if scenario == "crash":
        return dict(scenario=scenario, queues=m["queuesBeforeCrash"],
                    queries=m["queriesBeforeCrash"], checkpoint=m["checkpoint"],
                    truncate_at=None, min_phy_offset=m["minPhyOffset"], walk=m["commitlogWalk"], messages=m["messages"])
    if "recovery" in m:
        r = m["recovery"]
        return dict(scenario=scenario, queues=r["queues"], queries=r["queries"],
                    checkpoint=r["checkpointAfterShutdown"], truncate_at=r["maxPhyOffset"],
                    min_phy_offset=r["minPhyOffset"], walk=r["commitlogWalk"],
                    messages=manifest("crash")["messages"])
    return dict(scenario=scenario, queues=m["queues"], queries=m["queries"],
                checkpoint=m["checkpoint"], truncate_at=None, min_phy_offset=m["minPhyOffset"],
                walk=m["commitlogWalk"], messages=m["messages"])


def copy_store(src: Path, dst: Path) -> Path:
    """A writable copy of a (read-only) fixture store."""
    import shutil

    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


# Scenario names as the fixtures README lists them: a test parametrised with one of them,
# or whose body names the fixture paths, needs ../shared/fixtures.
KNOWN_SCENARIOS = {"basic", "unicode", "ipv6", "special", "sync-flush", "async-transient",
                   "crash", "crash-torn", "crash-torn-tail", "crash-recovered",
                   "crash-torn-recovered", "crash-torn-tail-recovered"}
_FIXTURE_NAMES = {"ROCKETMQ_498", "SEGMENT_4X", "FIXTURES", "manifest", "store_expectations"}


def _needs_fixtures(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(isinstance(v, str) and v in KNOWN_SCENARIOS for v in params.values()):
        return True
    if "fixtures_root" in getattr(item, "fixturenames", ()):
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    return bool(code and _FIXTURE_NAMES & set(code.co_names))


def pytest_runtest_setup(item):
    if not ROCKETMQ_498.is_dir() and _needs_fixtures(item):
        pytest.skip(NO_FIXTURES)


def pytest_collection_modifyitems(config, items):
    """The long stress runs are not part of the normal suite: without RMQSTORE_STRESS=1
    they are deselected (reported as such), not skipped."""
    if os.environ.get("RMQSTORE_STRESS") == "1":
        return
    keep = [i for i in items if i.get_closest_marker("stress") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every Spark test in the run (each start costs 10-20 s);
    the CLI's Spark commands, run in-process, use it too (getOrCreate)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'rmqstore[spark]')")
    from rmqstore.pipeline import jobs

    s = jobs.session("local[2]", {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        "spark.driver.host": "127.0.0.1",
    }, python=sys.executable)
    yield s
    s.stop()


@pytest.fixture
def walk_spans(monkeypatch):
    """The byte spans the record walk (``scan.records.walk_range``) is asked to cover, in
    order, while the test runs: how much of a segment a read touches."""
    import rmqstore.scan.records as records

    asked: list[int] = []
    walk = records.walk_range

    def counting(buf, pos, end, limit):
        asked.append(end - pos)
        return walk(buf, pos, end, limit)

    monkeypatch.setattr(records, "walk_range", counting)
    return asked
