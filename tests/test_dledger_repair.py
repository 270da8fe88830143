"""Issue #14 WP G (DLedger part, design-14 D3, D4, §10 T6): repair of the 4.9.8 DLedger crash
store removes the IndexFile RocketMQ's recovery deletes and, unlike RocketMQ, re-indexes,
so every key is found again; it never writes dledger-*/."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.files.checkpoint import abort_exists, read_checkpoint
from rmqstore.files.config import load_config
from rmqstore.files.consumequeue import ConsumeQueue
from rmqstore.files.index_query import IndexReader
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair

CRASH = FIXTURES / "rocketmq-4.9.8-dledger" / "crash"
pytestmark = pytest.mark.skipif(not CRASH.is_dir(), reason=f"DLedger fixtures not under {FIXTURES}")
LOST_FILE = "20261124073013983"


def test_repair_of_the_4_9_dledger_crash_store(tmp_path):
    m = json.loads((CRASH / "manifest.json").read_text())
    rec = m["recovery"]
    store = copy_store(CRASH, tmp_path / "store")
    ledger = tree_hashes(store / "dledger-n0")
    r = repair(store, backup_dir=tmp_path / "backup")
    assert r.executed and not abort_exists(store)
    assert [s.action for s in r.steps if s.action != "create-abort"] == [
        "remove-index", "reindex", "write-checkpoint", "remove-abort"]
    assert tree_hashes(store / "dledger-n0") == ledger  # design-14 D3
    assert (tmp_path / "backup" / "index" / LOST_FILE).read_bytes() == \
        (CRASH / "index" / LOST_FILE).read_bytes()
    cfg = load_config(store)
    for q in rec["queues"]:  # RocketMQ's recovery left the queues as they were
        qdir = store / "consumequeue" / q["topic"] / str(q["queueId"])
        if not qdir.exists():
            assert q["cqEntries"] == []
            continue
        with ConsumeQueue(qdir, cfg.cq_file_size) as cq:
            got = [[u.queue_offset, u.commit_log_offset, u.size, u.tags_code] for u in cq.iter_units()]
            assert got == q["cqEntries"], (q["topic"], q["queueId"])
    # Every key is found again; record 405 (file 4's endPhyOffset) is indexed twice, as a
    # broker's re-dispatch from there would (spec §14.7).
    twice = {("TopicA", "order-405"),
             ("TopicA", "FD00000000000000000000000000000201F85FFD2B276D180F3A017D")}
    with IndexReader(store / "index") as idx:
        for before, after in zip(m["queriesBeforeCrash"], rec["queries"]):
            assert (before["topic"], before["key"]) == (after["topic"], after["key"])
            got = idx.query(before["topic"], before["key"], before["maxNum"], before["begin"],
                            before["end"]).phy_offsets
            want = [376942, 376942] if (before["topic"], before["key"]) in twice \
                else sorted(before["phyOffsets"])
            assert got == want, before
            assert set(after["phyOffsets"]) <= set(got)
    cp = read_checkpoint(store)
    last = m["messages"][-1]["stored"]["storeTimestamp"]
    # Newer than RocketMQ's stale checkpoint (design-14 T6): what the store now holds.
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
        last, last, m["checkpoint"]["indexMsgTimestamp"]) == (1795505414117, 1795505414117,
                                                              1795505413962)
    assert plan_repair(store).steps == []


def test_repair_leaves_dledger_damage_to_dledger_and_says_why(tmp_path):
    store = copy_store(FIXTURES / "rocketmq-4.9.8-dledger" / "basic", tmp_path / "store")
    with open(store / "dledger-n0" / "index" / f"{8192:020d}", "r+b") as f:
        f.seek(300 * 32 - 8192)
        f.write(bytes(32))
    plan = plan_repair(store)
    assert plan.steps == [] and plan.refused == []
    assert [(f.code, "dledger-*/" in why) for f, why in plan.unfixed] == [
        ("dledger-index-mismatch", True)]


def test_a_plan_that_would_cut_queues_of_a_dledger_store_is_refused(tmp_path):
    """A torn last entry: its queue unit points past the entry chain's end. Cutting it has no
    DLedger-framed evidence yet, so repair refuses and changes nothing."""
    from rmqstore.errors import RefusedError

    src = FIXTURES / "rocketmq-4.9.8-dledger" / "basic"
    store = copy_store(src, tmp_path / "store")
    m = json.loads((src / "manifest.json").read_text())
    pos = m["messages"][499]["stored"]["phyOffset"] - 48
    with open(store / "dledger-n0" / "data" / f"{pos - pos % 65536:020d}", "r+b") as f:
        f.seek(pos % 65536)
        f.write(bytes(8))
    before = tree_hashes(store)
    plan = plan_repair(store)
    assert [(s.action, "DLedger" in why) for s, why in plan.refused] == [("cut-queue", True)]
    assert [f.code for f, _ in plan.unfixed] == ["dledger-torn"]
    with pytest.raises(RefusedError):
        repair(store, backup_dir=tmp_path / "backup")
    assert tree_hashes(store) == before
