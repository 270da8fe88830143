"""A store whose writer died, reopened and closed cleanly by the library, is left as a
broker's abnormal recovery and clean shutdown leave it (spec §8.1, §10.3): the checkpoint
RocketMQ wrote in the fixtures' ``*-recovered`` copies, and a store `verify` finds clean."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, copy_store
from rmqstore.checkpoint import read_checkpoint
from rmqstore.config import load_config
from rmqstore.store import MessageStore
from rmqstore.verify import verify

# (RocketMQ version, crashed store); its "-recovered" copy is what the broker made of it.
CRASHED = [("4.9.8", "crash"), ("4.9.8", "crash-torn-tail"), ("5.3.3", "crash")]


@pytest.mark.parametrize("version,scenario", CRASHED)
def test_checkpoint_after_reopen_is_the_brokers(version, scenario, tmp_path):
    base = FIXTURES / f"rocketmq-{version}"
    if not base.is_dir():
        pytest.skip(f"no {base}")
    store = copy_store(base / scenario, tmp_path / "s")
    (store / "manifest.json").unlink()
    cfg = load_config(store).with_values(broker_version=version[0] if version[0] == "5" else "4.9")
    want = json.loads((base / f"{scenario}-recovered" / "manifest.json").read_text())
    want = want["recovery"]["checkpointAfterShutdown"]

    MessageStore.open(store, cfg).close()

    cp = read_checkpoint(store)
    # Recovery re-dispatched the tail (§10.3): logicsMsgTimestamp is the last record's time,
    # though every record already had its unit; nothing was flushed, so physic stays.
    assert cp.logics_msg_timestamp == want["logicsMsgTimestamp"]
    assert cp.physic_msg_timestamp == want["physicMsgTimestamp"]
    assert cp.index_msg_timestamp == want["indexMsgTimestamp"]
    if version.startswith("5"):  # recovery's confirm offset: the last valid record's start
        assert cp.confirm_phy_offset == want["confirmPhyOffset"]
        assert cp.master_flushed_offset == want["masterFlushedOffset"]
    assert not [f for f in verify(store, config=cfg).findings if f.code == "checkpoint"]
