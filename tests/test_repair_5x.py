"""`repair` of a crashed RocketMQ 5.3.3 store ends where the broker's own recovery and
clean shutdown ended (issue #14, design-14 §10 T6): the ``crash`` fixture repaired equals
what RocketMQ made of it (``crash-recovered`` and its manifest's ``recovery`` section), and
``restore`` puts back every byte."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.files.checkpoint import read_checkpoint
from rmqstore.reader import open_store
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.recovery.undo import restore
from rmqstore.recovery.verify import verify

R5 = FIXTURES / "rocketmq-5.3.3"


def _files(root, part):
    base = root / part
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def test_repair_of_the_533_crash_ends_where_rocketmqs_recovery_ended(tmp_path):
    if not (R5 / "crash").is_dir():
        pytest.skip(f"no RocketMQ-written fixture at {R5}")
    store = copy_store(R5 / "crash", tmp_path / "s")
    (store / "manifest.json").unlink()
    before = tree_hashes(store)
    ref = R5 / "crash-recovered"
    rec = json.loads((ref / "manifest.json").read_text())["recovery"]
    res = repair(store, backup_dir=tmp_path / "bk")
    assert res.executed
    assert _files(store, "commitlog") == _files(ref, "commitlog")  # 524288 gone, data kept
    assert _files(store, "consumequeue") == _files(ref, "consumequeue")
    cp, want = read_checkpoint(store), rec["checkpointAfterShutdown"]
    assert (cp.logics_msg_timestamp, cp.index_msg_timestamp, cp.master_flushed_offset,
            cp.confirm_phy_offset) == (want["logicsMsgTimestamp"], want["indexMsgTimestamp"],
                                       want["masterFlushedOffset"], want["confirmPhyOffset"])
    assert cp.confirm_phy_offset == 467284
    assert not (store / "abort").exists()
    assert (store / "abort.bak").read_bytes() == (ref / "abort.bak").read_bytes() == b"9974"
    assert (store / "compaction" / "position-checkpoint").read_bytes() == \
        (ref / "compaction" / "position-checkpoint").read_bytes()
    with open_store(store) as s:
        for q in rec["queries"]:
            got = s.query_key(q["topic"], q["key"], q["maxNum"])
            assert sorted(m.commit_log_offset for m in got) == sorted(set(q["phyOffsets"])), q
    assert verify(store).problems == []
    assert plan_repair(store).steps == []
    restore(res.backup_dir)
    assert tree_hashes(store) == before
