"""Issue #14 WP D1/D2 (DLedger part): rebuild re-dispatches a DLedger log the way the broker
does (design-14 §1.8, §10 T5): ConsumeQueues byte-identical and IndexFiles with identical
contents to RocketMQ's, from the DLedger data files alone."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import FIXTURES, copy_store
from rmqstore.files.checkpoint import read_checkpoint
from rmqstore.files.config import load_config
from rmqstore.recovery.rebuild import SCRATCH_PREFIX, rebuild
from rmqstore.recovery.verify import verify

FOLDERS = {
    "4.9.8/basic": FIXTURES / "rocketmq-4.9.8-dledger" / "basic",
    "4.9.8/crash": FIXTURES / "rocketmq-4.9.8-dledger" / "crash",
    "5.3.3/basic": FIXTURES / "rocketmq-5.3.3-dledger" / "basic",
}
NO_DLEDGER = f"RocketMQ-written DLedger fixtures not found under {FIXTURES} (../shared/fixtures)"


def folders():
    return [pytest.param(n, marks=pytest.mark.skipif(not p.is_dir(), reason=NO_DLEDGER))
            for n, p in FOLDERS.items()]


def _cq_files(root):
    return {str(p.relative_to(root)): p.read_bytes()
            for p in (root / "consumequeue").rglob("*") if p.is_file()}


def _index_contents(root):
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


@pytest.mark.parametrize("name", folders())
def test_rebuild_from_the_dledger_log_alone(name, tmp_path):
    src = FOLDERS[name]
    m = json.loads((src / "manifest.json").read_text())
    store = copy_store(src, tmp_path / "store")
    cfg = load_config(src).with_values(store_path_root_dir=str(store))  # RocketMQ's geometry
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    ledger = {str(p.relative_to(store)): p.read_bytes()
              for p in (store / "dledger-n0").rglob("*") if p.is_file()}
    r = rebuild(store, config=cfg, clock=lambda: 1_700_000_000_000)
    assert _cq_files(store) == _cq_files(src)
    # The crash folder's index/ holds the file RocketMQ's recovery deleted afterwards: the
    # files on disk are what the broker dispatched before the crash.
    assert _index_contents(store) == _index_contents(src)  # names differ, bytes do not
    queues = m.get("queuesBeforeCrash") or m["queues"]
    assert r.units == sum(len(q["cqEntries"]) for q in queues) == 500
    assert r.messages == len(m["messages"]) == 500 and r.end == m["maxPhyOffset"]
    assert not [p for p in store.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    # The DLedger files are never written (design-14 D3).
    assert {str(p.relative_to(store)): p.read_bytes()
            for p in (store / "dledger-n0").rglob("*") if p.is_file()} == ledger
    # CQ dispatch on DLedger sets physicMsgTimestamp too (design-14 §1.6, §1.8).
    cp = read_checkpoint(store / "checkpoint")
    last = m["messages"][-1]["stored"]["storeTimestamp"]
    assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == last
    if name != "4.9.8/crash":  # (the crash store keeps its abort file)
        assert verify(store, config=cfg, deep=True).ok


def test_rebuild_index_restores_the_keys_a_4_9_dledger_crash_loses(tmp_path):
    """RocketMQ 4.9.8 deletes the newest index file after the crash and re-indexes nothing
    (design-14 §1.7); `rebuild --index` over the recovered state finds every key again."""
    src = FOLDERS["4.9.8/crash"]
    if not src.is_dir():
        pytest.skip(NO_DLEDGER)
    m = json.loads((src / "manifest.json").read_text())
    store = copy_store(src, tmp_path / "store")
    (store / "index" / "20261124073013983").unlink()  # what RocketMQ's recovery did
    from rmqstore.files.index_query import IndexReader

    def answers():
        with IndexReader(store / "index") as ix:
            return [ix.query(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"]).phy_offsets
                    for q in m["queriesBeforeCrash"]]

    want = [sorted(q["phyOffsets"]) for q in m["queriesBeforeCrash"]]
    # What RocketMQ answered after its recovery (same queries, in the same order).
    assert answers() == [sorted(q["phyOffsets"]) for q in m["recovery"]["queries"]] != want
    rebuild(store, consume_queue=False, index=True)
    assert answers() == want


def test_rebuild_from_an_offset_keeps_what_is_before(tmp_path):
    src = FOLDERS["5.3.3/basic"]
    if not src.is_dir():
        pytest.skip(NO_DLEDGER)
    m = json.loads((src / "manifest.json").read_text())
    store = copy_store(src, tmp_path / "store")
    r = rebuild(store, from_offset=200_000)
    assert r.messages == r.units == sum(x["stored"]["phyOffset"] >= 200_000 for x in m["messages"])
    assert _cq_files(store) == _cq_files(src)
    v = verify(store, deep=True)  # the last record of the kept index file is indexed again
    assert v.ok and {f.code for f in v.findings} == {"dledger-end", "index-duplicate"}
