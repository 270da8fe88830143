"""Opening a damaged store for writing (``MessageStore.open``, ``rmqstore append``) changes
only what a broker's start changes (spec §8, §10.4); a store that needs more is refused
with nothing changed (no byte, no file created or deleted, no mtime) and the advice to run
``rmqstore repair``.

Stores are generated with the small geometry of tests/test_faults.py and damaged by hand.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.errors import RefusedError
from rmqstore.engine.store import MessageStore
from rmqstore.recovery.verify import verify
from test_faults import CFG, SEG, make_store, records


def state(top: Path) -> dict[str, tuple]:
    """Every path under ``top``: (size, mtime_ns, bytes) of files, "dir" for directories;
    the store's ``lock`` by its bytes only (taking it writes them, as the broker does)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames:
            out[os.path.join(dirpath, n)] = "dir"
        for n in filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            with open(p, "rb") as f:
                out[p] = (st.st_size, None if n == "lock" else st.st_mtime_ns, f.read())
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("reopen") / "store", seed=5, count=300)


def _copy(base: Path, where: Path) -> Path:
    shutil.copytree(base, where)
    return where


def _cfg(store: Path) -> StoreConfig:
    return StoreConfig(**CFG, store_path_root_dir=str(store))


def _zero_size_of(store: Path, off: int) -> None:
    """Zero a record's TOTALSIZE: the record chain ends there (spec §10.1)."""
    seg = store / "commitlog" / f"{off - off % SEG:020d}"
    with open(seg, "r+b") as f:
        f.seek(off % SEG)
        f.write(bytes(4))


def _append_cli(store: Path):
    return subprocess.run([sys.executable, "-m", "cli.main", "append", str(store), "--topic",
                           "T0", "--body", "x", "--config", str(store.parent / "broker.conf")],
                          capture_output=True, text=True, timeout=120)


def _conf(store: Path) -> None:
    (store.parent / "broker.conf").write_text(
        "mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=1280\n"
        "maxHashSlotNum=64\nmaxIndexNum=256\n")


@pytest.mark.parametrize("crashed", [True, False])
def test_units_past_the_end_are_refused_before_any_change(base, tmp_path, crashed):
    """The chain breaks in the second segment while the queues point into the fifth: the
    open used to delete segments 3-5 (and create abort, and the missing checkpoint) before
    refusing."""
    store = _copy(base, tmp_path / "store")
    recs = records(store)
    assert len({r[0] // SEG for r in recs}) >= 4
    crashed_at = next(r[0] for r in recs if r[0] >= SEG + 100) if crashed else \
        next(r[0] for r in recs if r[0] >= recs[-1][0] - recs[-1][0] % SEG)
    _zero_size_of(store, crashed_at)
    if crashed:
        (store / "abort").write_bytes(b"")  # full recovery: from the first segment (§10.3)
    (store / "checkpoint").unlink()
    _conf(store)
    before = state(tmp_path)
    with pytest.raises(RefusedError, match="rmqstore repair") as e:
        MessageStore.open(store, _cfg(store))
    assert "nothing was changed" in str(e.value)
    assert state(tmp_path) == before
    res = _append_cli(store)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "rmqstore repair" in res.stderr and "Traceback" not in res.stderr
    assert state(tmp_path) == before


@pytest.mark.parametrize("how", ["flip", "zeros"])
def test_valid_records_after_the_end_without_units_are_refused(tmp_path, how):
    """Records nobody dispatched yet (dispatch off) lie after a break in the chain: the
    open used to delete their later segments and go on writing over the rest of the
    segment holding the end. A TOTALSIZE of 4 zeros there is what our own interrupted
    append leaves (cleared after a crash); the records in later segments are never ours."""
    store = tmp_path / "store"
    cfg = StoreConfig(**CFG)
    with MessageStore.open(store, cfg, create=True) as st:
        for i in range(20):
            st.put(Message(topic="T", queue_id=0, body=b"a" * 500), stamp=True)
    with MessageStore.open(store, cfg, dispatch="off") as st:
        later = [st.put(Message(topic="T", queue_id=0, body=b"b" * 1500), stamp=True)
                 for _ in range(150)]
    assert later[-1].offset >= 2 * SEG
    at = later[0].offset
    if how == "zeros":
        _zero_size_of(store, at)
        first = next(r.offset for r in later if r.offset >= SEG)
    else:  # one flipped bit: a size no writer of ours leaves
        seg = store / "commitlog" / f"{0:020d}"
        with open(seg, "r+b") as f:
            f.seek(at)
            size = struct.unpack(">i", f.read(4))[0]
            f.seek(at)
            f.write(struct.pack(">i", size ^ (1 << 20)))
        first = later[1].offset
    (store / "abort").write_bytes(b"")
    _conf(store)
    before = state(tmp_path)
    with pytest.raises(RefusedError, match="CRC-valid record") as e:
        MessageStore.open(store, _cfg(store))
    assert f"first at CommitLog offset {first})" in str(e.value)
    assert state(tmp_path) == before
    res = _append_cli(store)
    assert res.returncode == 2 and "rmqstore repair" in res.stderr, res.stderr
    assert state(tmp_path) == before


def test_an_interrupted_batch_is_still_cleared_after_a_crash(tmp_path):
    """A batch append writes its first TOTALSIZE last: killed before it, the batch's later
    records are whole (CRC-valid) after the end. They were never acknowledged: the reopen
    clears them as an interrupted append of ours, like a single record's."""
    store = tmp_path / "store"
    cfg = StoreConfig(**CFG)
    with MessageStore.open(store, cfg, create=True) as st:
        st.put(Message(topic="T", queue_id=0, body=b"a" * 100), stamp=True)
        rs = st.put_batch([Message(topic="T", queue_id=0, body=b"b" * 100) for _ in range(4)])
    end = rs[0].offset
    _zero_size_of(store, end)  # as the writer left it when killed before the first TOTALSIZE
    (store / "abort").write_bytes(b"")
    # the queue's units of the batch were never written either
    q = store / "consumequeue" / "T" / "0" / f"{0:020d}"
    data = bytearray(q.read_bytes())
    data[20:] = bytes(len(data) - 20)
    q.write_bytes(bytes(data))
    with MessageStore.open(store, _cfg(store)) as st:
        assert st.appender.end == end
    seg = (store / "commitlog" / f"{0:020d}").read_bytes()
    assert not any(seg[end:]) and verify(store, config=_cfg(store)).ok


def test_a_healthy_reopen_deletes_only_the_empty_preallocated_segment(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    last = records(store)[-1]
    nxt = store / "commitlog" / f"{last[0] - last[0] % SEG + SEG:020d}"
    with open(nxt, "wb") as f:  # what a broker preallocates (spec §2)
        f.truncate(SEG)
    (store / "abort").write_bytes(b"")
    keep = {p.name: p.read_bytes() for p in (store / "commitlog").iterdir() if p != nxt}
    MessageStore.open(store, _cfg(store)).close()
    assert {p.name: p.read_bytes() for p in (store / "commitlog").iterdir()} == keep
    assert len(records(store)) == 300
