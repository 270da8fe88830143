"""A store whose writer died, reopened and closed cleanly by the library, is left as a
broker's abnormal recovery and clean shutdown leave it (spec §8.1, §10.3): the checkpoint
RocketMQ wrote in the fixtures' ``*-recovered`` copies, and a store `verify` finds clean."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import FIXTURES, copy_store
from rmqstore.engine.unfinished_append import clear_unfinished_append
from rmqstore.files.checkpoint import read_checkpoint
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig, load_config
from rmqstore.files.index import IndexFile, IndexGeometry
from rmqstore.format.hashing import index_hash
from rmqstore.reader import open_store
from rmqstore.files.segments import SegmentQueue
from rmqstore.engine.store import MessageStore
from rmqstore.recovery.verify import verify

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


# --- what an interrupted writer leaves ------------------------------------------------------

_CFG = dict(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
            max_hash_slot_num=64, max_index_num=256)


def _store_with_records(root, n: int = 20):
    cfg = StoreConfig(**_CFG)
    with MessageStore.open(root, cfg, create=True) as st:
        rs = [st.put(Message(topic="T", queue_id=i % 2, body=b"b" * (30 + i),
                             properties={"KEYS": f"k{i}"}), stamp=True) for i in range(n)]
    return cfg.with_values(store_path_root_dir=str(root)), rs[-1]


def _crashed(root) -> None:
    (root / "abort").write_bytes(b"")  # as a SIGKILLed writer leaves it (spec §8.2)


def test_an_interrupted_append_is_cleared_on_reopen(tmp_path):
    cfg, last = _store_with_records(tmp_path)
    seg = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    end = last.offset + last.size
    # The appender writes TOTALSIZE last: a record it died in has every byte but those 4.
    record = data[last.offset:end]
    data[end:end + len(record)] = b"\0\0\0\0" + record[4:]
    seg.write_bytes(bytes(data))
    _crashed(tmp_path)
    assert [f.code for f in verify(tmp_path, config=cfg).problems] == ["commitlog-tail",
                                                                        "abort-present"]

    MessageStore.open(tmp_path, cfg).close()

    after = seg.read_bytes()
    assert after[:end] == bytes(data[:end])  # valid data untouched
    assert after[end:] == bytes(len(after) - end)
    assert verify(tmp_path, config=cfg).ok


def test_clearing_reaches_the_last_non_zero_byte_of_a_large_segment(tmp_path):
    size = 4 << 20
    d = tmp_path / "commitlog"
    d.mkdir()
    with open(d / f"{0:020d}", "wb") as f:  # sparse, like a preallocated segment
        f.truncate(size)
        f.write(b"v" * 100)  # stands for valid data before the end at 100
        f.seek(104)
        f.write(b"g" * 96)  # TOTALSIZE (100..104) still zero
        f.seek(3_000_000)
        f.write(b"\7")  # in another MiB, after a hole
    with SegmentQueue([d], size, writable=True, kind="commitlog") as q:
        assert clear_unfinished_append(q, 100) == 3_000_001 - 100
    assert (d / f"{0:020d}").read_bytes() == b"v" * 100 + bytes(size - 100)


def test_a_torn_record_that_starts_with_its_size_is_left_as_the_broker_leaves_it(tmp_path):
    cfg, last = _store_with_records(tmp_path)
    seg = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    end = last.offset + last.size
    # A broker writes front to back: its torn record has TOTALSIZE and a cut body (§10.5).
    record = bytearray(data[last.offset:end])
    record[-8:] = bytes(8)
    data[end:end + len(record)] = record
    seg.write_bytes(bytes(data))
    _crashed(tmp_path)

    MessageStore.open(tmp_path, cfg).close()

    assert seg.read_bytes() == bytes(data)  # truncation does not zero (spec §10.4)


def test_an_index_file_that_was_never_sized_is_dropped_on_reopen(tmp_path):
    cfg, last = _store_with_records(tmp_path)
    index = tmp_path / "index"
    before = sorted(p.name for p in index.iterdir())
    (index / "99991231235959999").write_bytes(b"")  # created, killed before the ftruncate
    _crashed(tmp_path)

    with MessageStore.open(tmp_path, cfg) as st:  # used to refuse: "IndexFile is 0 bytes"
        st.put(Message(topic="T", body=b"x", properties={"KEYS": "later"}), stamp=True)

    assert sorted(p.name for p in index.iterdir())[:len(before)] == before
    assert all(p.stat().st_size == 5416 for p in index.iterdir())
    with open_store(tmp_path) as r:
        assert len(r.query_key("T", "later")) == 1
    assert verify(tmp_path, config=cfg).ok


def test_slot_heads_of_an_unfinished_index_put_are_rolled_back(tmp_path):
    cfg, last = _store_with_records(tmp_path)
    path = sorted((tmp_path / "index").iterdir())[-1]
    f = IndexFile(path, IndexGeometry(64, 256), writable=True)
    header = bytes(f._map[:40])
    keys = [f"n{i}" for i in range(10)]
    # A put killed after its entries and slot heads, before the header (spec §7.4 order).
    f.put_many(np.array([index_hash(f"T#{k}") for k in keys]), np.full(10, 999_999),
               np.full(10, 1))
    f._map[:40] = header
    f.close()
    _crashed(tmp_path)

    with MessageStore.open(tmp_path, cfg) as st:
        rs = [st.put(Message(topic="T", body=b"x", properties={"KEYS": k}), stamp=True)
              for k in keys]

    assert verify(tmp_path, config=cfg).ok  # was: index-chain, links forward
    with open_store(tmp_path) as r:
        assert [[m.commit_log_offset for m in r.query_key("T", k)] for k in keys] == \
            [[x.offset] for x in rs]


# --- writers killed with SIGKILL at random points -------------------------------------------

CHILD = textwrap.dedent("""
    import json, random, sys
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.store import MessageStore
    root, seed, kw, idle_after = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
    rnd = random.Random(seed)
    keyfrac, maxbody, batch = rnd.choice([0.0, 0.3, 1.0]), rnd.choice([50, 500, 5000]), rnd.choice([1, 1, 8])
    st = MessageStore.open(root, StoreConfig(**kw), create=True)
    print("ready", flush=True)
    seq = 0
    while True:
        if seq >= idle_after > 0:  # killed between puts, not during one
            st.wait_dispatched()
            print("idle", flush=True)
            sys.stdin.read()
        msgs = []
        for _ in range(rnd.randint(1, batch)):
            props = {"TAGS": f"t{seq % 5}"} if rnd.random() < 0.3 else {}
            if rnd.random() < keyfrac:  # some keys wait in the index write-behind (dispatch.py)
                props["KEYS"] = f"k{seed}-{seq}" + (" x y" if rnd.random() < 0.2 else "")
            msgs.append(Message(topic=f"T{seq % 2}", queue_id=seq % 3,
                                body=b"d" * rnd.randrange(1, maxbody), properties=props))
            seq += 1
        if len(msgs) == 1:
            st.put(msgs[0], stamp=True)
        else:
            st.put_batch(msgs, stamp=True)
""")


def _kill_reopen_verify(root, flush: str, seed: int, *, index: bool | None = None,
                        idle: bool | None = None):
    """1-3 writers on one store, each SIGKILLed (while writing, after a seeded delay, or
    idle after a seeded number of puts); then the library reopens and closes the store.
    Returns verify's problems and the checkpoint."""
    rnd = random.Random(seed)
    kw = dict(_CFG, flush_disk_type=flush, broker_version=rnd.choice(["4.9", "5"]),
              message_index_enable=rnd.random() < 0.7 if index is None else index)
    runs = rnd.randint(1, 3)
    for run in range(runs):
        last = run == runs - 1
        idle_after = rnd.randint(1, 3000) if (rnd.random() < 0.3 if idle is None else idle and last) else 0
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(seed * 10 + run),
                                  json.dumps(kw), str(idle_after)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready", "the writer did not reopen the store"
        if idle_after:
            assert child.stdout.readline().strip() == "idle"
        else:
            time.sleep(rnd.uniform(0.02, 0.4))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert (root / "abort").exists()
    cfg = StoreConfig(**kw).with_values(store_path_root_dir=str(root))
    MessageStore.open(root, cfg).close()
    return verify(root, config=cfg).problems


# A quick set: for each flush type, an idle writer without index (no key waited, so the
# reopen had nothing to re-dispatch: the stale-checkpoint case), one idle with keys
# indexed, and writers killed while writing.
QUICK = [(0, False, True), (1, True, True), (2, None, False), (3, None, False)]


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
@pytest.mark.parametrize("seed,index,idle", QUICK)
def test_sigkilled_writer_reopened_and_closed_verifies_clean(flush, seed, index, idle, tmp_path):
    problems = _kill_reopen_verify(tmp_path / "s", flush, seed, index=index, idle=idle)
    assert [(p.code, p.explanation) for p in problems] == []


@pytest.mark.stress  # collected only with RMQSTORE_STRESS=1 (see conftest.py)
@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
@pytest.mark.parametrize("seed", range(100, 200))
def test_sigkilled_writer_reopened_and_closed_verifies_clean_stress(flush, seed, tmp_path):
    problems = _kill_reopen_verify(tmp_path / "s", flush, seed)
    assert [(p.code, p.explanation) for p in problems] == []
