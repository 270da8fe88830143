"""verify on RocketMQ-written stores: clean where RocketMQ left a consistent store, and
the documented findings on the crash copies (spec §10, fixtures README)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import ROCKETMQ_498, SCENARIOS, scenario_params, store_expectations, tree_hashes
from rmqstore.recovery.verify import CODES, ERROR, INFO, verify

CLEAN = [s for s in SCENARIOS if not s.startswith("crash") or s in ("crash-recovered", "crash-torn-recovered")]

# What the crash copies report, and why (docs/playbook.md):
#   crash            abort present (abnormal recovery from 131072, index file deleted);
#                    the preallocated zero segment is a note.
#   crash-torn       also the torn last record (error), its CQ unit and index entries
#                    past the end.
#   crash-torn-tail  the zeroed properties pass §3.9 (RocketMQ keeps the record too) but
#                    the CQ unit's tagsCode no longer matches the record: a real problem
#                    RocketMQ's recovery misses, so crash-torn-tail-recovered reports it too.
EXPECTED = {
    "crash": {"abort-present"},
    "crash-torn": {"abort-present", "commitlog-tail", "cq-beyond-end", "index-beyond-end"},
    "crash-torn-tail": {"abort-present", "cq-tags-mismatch"},
    "crash-torn-tail-recovered": {"cq-tags-mismatch"},
}


def _codes(report, severities=("error", "warning")):
    return {f.code for f in report.findings if f.severity in severities}


@pytest.mark.parametrize("scenario", scenario_params(CLEAN))
def test_consistent_fixtures_are_clean(scenario):
    before = tree_hashes(ROCKETMQ_498 / scenario)
    r = verify(ROCKETMQ_498 / scenario, deep=True)
    assert r.ok, [f for f in r.problems]
    exp = store_expectations(scenario)
    assert r.end == (exp["truncate_at"] or max(w["offset"] + w["size"] for w in exp["walk"] if w["type"] == "MESSAGE"))
    assert r.messages == sum(w["type"] == "MESSAGE" for w in exp["walk"])
    assert tree_hashes(ROCKETMQ_498 / scenario) == before


@pytest.mark.parametrize("scenario", scenario_params(sorted(EXPECTED)))
def test_crash_fixtures_report_their_damage(scenario):
    r = verify(ROCKETMQ_498 / scenario, deep=True)
    assert not r.ok
    assert _codes(r) == EXPECTED[scenario]
    if scenario.startswith("crash") and not scenario.endswith("recovered"):
        assert r.forecast.mode == "abnormal"
        assert r.forecast.start_offset == 131072  # fixtures README: file 131072
        assert r.forecast.index_files_deleted == ["20261122042611140"]


def test_torn_tail_is_located_exactly(fixtures_root):
    r = verify(fixtures_root / "crash-torn")
    tail = next(f for f in r.findings if f.code == "commitlog-tail")
    # fixtures README: record at 464829 (1716 B) zeroed from 465687 to 466545.
    assert (tail.file, tail.offset, tail.data["kind"]) == ("commitlog/00000000000000458752", 464829 - 458752, "torn")
    assert tail.severity == ERROR and r.end == 464829
    cq = next(f for f in r.findings if f.code == "cq-beyond-end")
    assert (cq.file, cq.offset, cq.data["queueOffset"]) == ("consumequeue/TopicHot/0/00000000000000002560", (159 - 128) * 20, 159)


def test_recovered_torn_store_notes_rocketmqs_leftovers(fixtures_root):
    r = verify(fixtures_root / "crash-torn-recovered")
    notes = {f.code for f in r.findings if f.severity == INFO}
    assert {"commitlog-debris", "cq-stale-unit", "commitlog-end"} <= notes


def test_debris_needs_a_checkpoint_that_describes_the_store(fixtures_root, tmp_path):
    """The torn bytes RocketMQ left after its own cut are debris only while the checkpoint's
    logicsMsgTimestamp covers every valid record (the fixture's does). A bogus one (1000)
    said nothing: verify called the tail debris, repair rewrote the checkpoint, and the
    next run found the tail (fuzz campaign seed 3193: not idempotent)."""
    import shutil
    import struct

    from rmqstore.recovery.repair import repair
    from rmqstore.recovery.repair_plan import plan_repair

    store = tmp_path / "s"
    shutil.copytree(fixtures_root / "crash-torn-recovered", store)
    with open(store / "checkpoint", "r+b") as f:
        f.write(struct.pack(">3q", 1000, 1000, 1000))
    codes = {f.code for f in verify(store).findings}
    assert "commitlog-tail" in codes and "commitlog-debris" not in codes
    repair(store, backup_dir=tmp_path / "b", allow_data_loss=True)
    assert plan_repair(store).steps == []


def test_every_code_is_documented():
    assert all(sev in ("error", "warning", "info") for sev, _ in CODES.values())


@pytest.mark.parametrize("scenario", scenario_params(["basic", "crash-torn"]))
def test_cli_exit_codes_and_json(scenario, tmp_path):
    store = ROCKETMQ_498 / scenario
    before = tree_hashes(store)
    p = subprocess.run([sys.executable, "-m", "cli.main", "verify", str(store), "-f", "json"],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout)
    assert p.returncode == (0 if scenario == "basic" else 1), p.stderr
    assert doc["ok"] is (scenario == "basic") and doc["validUpTo"] > 0
    assert tree_hashes(store) == before
    bad = subprocess.run([sys.executable, "-m", "cli.main", "verify", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1


def test_duplicate_unit_is_reported(tmp_path):
    """Two units of one queue pointing at one record: cq-duplicate, at the second one."""
    import test_faults as faults

    store = faults.make_store(tmp_path / "s", seed=9)
    qdir = store / "consumequeue" / "T0" / "0"
    seg = sorted(qdir.iterdir())[0]
    data = bytearray(seg.read_bytes())
    data[5 * 20:6 * 20] = data[4 * 20:5 * 20]  # unit 5 repeats unit 4
    seg.write_bytes(bytes(data))
    found = [(f.code, f.file, f.offset) for f in verify(store).findings]
    assert ("cq-duplicate", f"consumequeue/T0/0/{seg.name}", 5 * 20) in found


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "hole before the garbage"])
def test_garbage_after_a_hole_is_found_as_in_a_dense_file(fixtures_root, tmp_path, sparse):
    # verify reads only the data extents after the end (a preallocated segment's hole is
    # zeros by definition): garbage past a hole must be found, counted and located exactly
    # as in a file that spells the zeros out.
    from conftest import copy_store

    store = copy_store(fixtures_root / "basic", tmp_path / "s")
    seg = sorted((store / "commitlog").iterdir())[-1]
    data = seg.read_bytes()
    size = len(data)
    end = size - len(data.rstrip(b"\0"))  # zeros at the end of the newest segment
    end = size - end
    garbage_at = size - 100
    seg.unlink()
    with open(seg, "wb") as f:
        if sparse:
            f.write(data[:end])
            f.seek(garbage_at)
            f.write(b"\1\2\3\4\5")
            f.truncate(size)
        else:
            f.write(data[:end] + bytes(garbage_at - end) + b"\1\2\3\4\5" + bytes(size - garbage_at - 5))
    tails = [f for f in verify(store).findings if f.code == "commitlog-tail"]
    assert len(tails) == 1
    assert f"5 non-zero bytes of garbage within the next {garbage_at + 5 - end} bytes" in tails[0].explanation


@settings(max_examples=300, deadline=None)
@given(ephy=st.lists(st.integers(0, 20), max_size=12), sort=st.booleans(), cut=st.integers(0, 12),
       m=st.integers(0, 8), other=st.lists(st.integers(0, 21), max_size=8))
def test_cq_unit_positions_are_searchsorted(ephy, sort, cut, m, other):
    """verify_cq's one-search form of the units' positions is ``np.searchsorted``, also
    where expected offsets repeat or are out of order (stored PHYSICALOFFSETs)."""
    from rmqstore.recovery.verify_cq import _positions

    e = np.array(sorted(ephy) if sort else ephy, np.int64)
    for off in (e[cut:cut + m], np.array(sorted(other), np.int64)):
        assert np.array_equal(_positions(e, off), np.searchsorted(e, off))
