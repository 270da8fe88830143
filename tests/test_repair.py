"""repair against RocketMQ's own recovery of the crash fixtures (manifest → recovery):
same CommitLog max offset, every queue's units and min/max offsets, query results,
checkpoint; backups, idempotence, dry runs, confirmation and the store lock."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROCKETMQ_498, copy_store, manifest, scenario_params, tree_hashes
from rmqstore.files.checkpoint import abort_exists, hold_lock, read_checkpoint
from rmqstore.files.config import load_config
from rmqstore.files.consumequeue import ConsumeQueue
from rmqstore.errors import StoreLockedError
from rmqstore.files.index import IndexGeometry
from rmqstore.files.index_query import IndexReader
from rmqstore.recovery.journal_state import read_backup
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.recovery.verify import verify

CRASHES = ["crash", "crash-torn", "crash-torn-tail"]


def _cli(*args, input=None):
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], input=input,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("scenario", scenario_params(CRASHES))
def test_repair_ends_where_rocketmq_recovery_ends(scenario, tmp_path):
    store = copy_store(ROCKETMQ_498 / scenario, tmp_path / scenario)
    rec = manifest(f"{scenario}-recovered")["recovery"]
    result = repair(store, backup_dir=tmp_path / "backup")
    assert result.executed and not abort_exists(store)
    after = verify(store, deep=True)
    assert after.end == rec["maxPhyOffset"]
    cfg = load_config(store)
    for q in rec["queues"]:
        qdir = store / "consumequeue" / q["topic"] / str(q["queueId"])
        if not qdir.exists():
            assert q["cqEntries"] == [] and q["maxOffset"] == 0
            continue
        with ConsumeQueue(qdir, cfg.cq_file_size) as cq:
            got = [[u.queue_offset, u.commit_log_offset, u.size, u.tags_code] for u in cq.iter_units()]
            assert got == q["cqEntries"], (q["topic"], q["queueId"])
            assert (cq.min_offset(rec["minPhyOffset"]), cq.max_offset) == (q["minOffset"], q["maxOffset"])
    with IndexReader(store / "index", IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)) as idx:
        for q in rec["queries"]:
            got = idx.query(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"]).phy_offsets
            assert got == q["phyOffsets"], q  # incl. [352309, 352309], the §14.7 duplicate
    cp, want = read_checkpoint(store), rec["checkpointAfterShutdown"]
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
        want["physicMsgTimestamp"], want["logicsMsgTimestamp"], want["indexMsgTimestamp"])
    assert not (store / "commitlog" / "00000000000000524288").exists()  # RocketMQ removed it
    # Only the problem RocketMQ's recovery also leaves stays (crash-torn-tail: tagsCode).
    assert {f.code for f in after.problems} == ({"cq-tags-mismatch"} if scenario == "crash-torn-tail" else set())
    assert plan_repair(store).steps == []  # idempotent: nothing left to do


def test_backup_holds_every_changed_byte(fixtures_root, tmp_path):
    src = fixtures_root / "crash-torn"
    store = copy_store(src, tmp_path / "s")
    backup = tmp_path / "b"
    repair(store, backup_dir=backup)
    # What each step saved is in the journal's start records (manifest.json holds the plan).
    ranges = [s for s in read_backup(backup).items if s["kind"] == "range"]
    assert ranges and all((backup / s["saved"]).stat().st_size == s["length"] for s in ranges)
    torn = next(s for s in ranges if s["path"] == "commitlog/00000000000000458752")
    original = (src / torn["path"]).read_bytes()[torn["offset"]:torn["offset"] + torn["length"]]
    assert (backup / torn["saved"]).read_bytes() == original and any(original)
    for rel in ("commitlog/00000000000000524288", "index/20261122042611140", "checkpoint"):
        assert (backup / rel).read_bytes() == (src / rel).read_bytes()
    assert (backup / "consumequeue/TopicHot/0").is_dir()


@pytest.mark.parametrize("scenario", scenario_params(["basic", "crash-recovered", "crash-torn-recovered"]))
def test_nothing_to_repair_on_consistent_stores(scenario, tmp_path):
    store = copy_store(ROCKETMQ_498 / scenario, tmp_path / scenario)
    before = tree_hashes(store)
    r = repair(store, backup_dir=tmp_path / "b")
    assert not r.executed and r.plan.steps == [] and tree_hashes(store) == before
    assert not (tmp_path / "b").exists()


def test_cli_dry_run_confirmation_and_lock(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    before = tree_hashes(store)
    dry = _cli("repair", store, "--dry-run", "-f", "jsonl")
    assert dry.returncode == 1
    actions = [json.loads(l)["action"] for l in dry.stdout.splitlines()]
    assert actions[:2] == ["zero-tail", "move-segment"] and actions[-1] == "remove-abort"
    refused = _cli("repair", store, input="")  # stdin is not a terminal
    assert refused.returncode == 2 and "--yes" in refused.stderr
    with hold_lock(store):  # this process is "the broker" now
        locked = _cli("repair", store, "--yes")
        assert locked.returncode == 2 and "locked" in locked.stderr
        with pytest.raises(StoreLockedError):
            repair(store)
    assert tree_hashes(store) == before
    ok = _cli("repair", store, "--yes", "--no-backup")
    assert ok.returncode == 0, ok.stderr
    assert _cli("verify", store).returncode == 0
    again = _cli("repair", store, "--yes", "-f", "table")
    assert again.returncode == 0 and "nothing to repair" in again.stdout
    assert "Traceback" not in ok.stderr + refused.stderr + locked.stderr
