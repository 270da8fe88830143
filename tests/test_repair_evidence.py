"""What repair removes needs evidence (issue #11): without a backup, a step never deletes a
file holding CRC-valid records unless ``--allow-data-loss``; a queue with no valid record
of its own is truncated, never deleted, as a broker's recovery truncates one (§10.4).

Stores are generated with the small geometry of tests/test_faults.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.errors import RefusedError
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.engine.store import MessageStore
from rmqstore.recovery.undo import restore
from rmqstore.recovery.verify import verify
from test_faults import CFG, SEG, make_store, records
from test_hostile import snapshot


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("evidence") / "store", seed=7, count=300)


def _copy(base: Path, where: Path) -> Path:
    shutil.copytree(base, where)
    return where


def _cfg(store: Path) -> StoreConfig:
    return StoreConfig(**CFG, store_path_root_dir=str(store))


def _conf(tmp_path: Path) -> Path:
    p = tmp_path / "broker.conf"
    p.write_text("mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=1280\n"
                 "maxHashSlotNum=64\nmaxIndexNum=256\n")
    return p


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


# --- 2. --no-backup never deletes CRC-valid records without the override -----------------

STRAYS = {
    "renamed": "commitlog/00000000000000000000.bak",  # a segment under a non-segment name
    "index": "index/00000000000000000000",  # segment-named, in the wrong directory
    "queue-dir": "consumequeue/T0/00000000000000000000",  # a file where a queue dir goes
    "in-a-dir": "consumequeue/Tx/odd/00000000000000065536",  # inside a stray directory
}


@pytest.mark.parametrize("kind", sorted(STRAYS))
def test_no_backup_refuses_to_delete_a_stray_holding_valid_records(base, tmp_path, kind):
    store = _copy(base, tmp_path / "store")
    rel = STRAYS[kind]
    src = store / "commitlog" / f"{(SEG if kind == 'in-a-dir' else 0):020d}"
    (store / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, store / rel)
    cfg = _cfg(store)
    conf = _conf(tmp_path)
    moved = {s.path for s in plan_repair(store, config=cfg).steps if s.action == "move-stray"}
    assert moved and all(rel.startswith(m) for m in moved)
    assert plan_repair(store, config=cfg).refused == []  # with a backup it is kept there
    plan = plan_repair(store, config=cfg, backup=False)
    assert [(s.action, s.path) for s, _ in plan.refused] == [("move-stray", m) for m in sorted(moved)]
    assert "holds CRC-valid records" in plan.refused[0][1]
    before = snapshot(tmp_path)
    with pytest.raises(RefusedError, match="--allow-data-loss"):
        repair(store, config=cfg, backup=False)
    assert snapshot(tmp_path) == before
    res = _cli("repair", store, "--yes", "--no-backup", "--config", conf)
    assert res.returncode == 2 and "--allow-data-loss" in res.stderr.splitlines()[-1], res.stderr
    assert "Traceback" not in res.stderr
    assert snapshot(tmp_path) == before
    # The override deletes it; the records the store reads are all still there.
    valid = records(store)
    repair(store, config=cfg, backup=False, allow_data_loss=True)
    assert not (store / rel).exists() and records(store) == valid
    assert plan_repair(store, config=cfg, backup=False).steps == []


def test_no_backup_still_removes_strays_without_records(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    (store / "commitlog" / "notes.txt").write_text("not a record\n" * 100)
    (store / "index" / "garbage").write_bytes(bytes(range(256)) * 64)
    cfg = _cfg(store)
    plan = plan_repair(store, config=cfg, backup=False)
    assert plan.refused == [] and {s.path for s in plan.steps if s.action == "move-stray"} == {
        "commitlog/notes.txt", "index/garbage"}
    repair(store, config=cfg, backup=False)
    assert not (store / "commitlog" / "notes.txt").exists()
    assert not (store / "index" / "garbage").exists()


def test_no_backup_refuses_to_delete_a_segment_copy_after_the_end(base, tmp_path):
    """Segment 0's records, 8 bytes on, under the name of the segment after the last: they
    do not stand at their own offsets (so the chain guard passes the move), but without a
    backup deleting the file loses them."""
    store = _copy(base, tmp_path / "store")
    last = max(int(p.name) for p in (store / "commitlog").iterdir())
    dup = store / "commitlog" / f"{last + SEG:020d}"
    dup.write_bytes(bytes(8) + (store / "commitlog" / f"{0:020d}").read_bytes()[:SEG - 8])
    cfg = _cfg(store)
    assert plan_repair(store, config=cfg).refused == []
    plan = plan_repair(store, config=cfg, backup=False)
    assert [(s.action, s.path) for s, _ in plan.refused] == [("move-segment", f"commitlog/{dup.name}")]
    before = snapshot(tmp_path)
    with pytest.raises(RefusedError):
        repair(store, config=cfg, backup=False)
    assert snapshot(tmp_path) == before
    kept = dup.read_bytes()
    repair(store, config=cfg, backup_dir=tmp_path / "backup")
    assert (tmp_path / "backup" / "commitlog" / dup.name).read_bytes() == kept


# --- 3. a queue with no valid record is truncated, its directory kept --------------------


def _late_topic_store(root: Path) -> tuple[Path, int]:
    """T0 messages, then 30 of L (queue 0) at the end; returns (store, L's first offset)."""
    with MessageStore.open(root, StoreConfig(**CFG), create=True) as st:
        for i in range(100):
            st.put(Message(topic="T0", queue_id=i % 2, body=b"a" * 300), stamp=True)
        first = st.put(Message(topic="L", queue_id=0, body=b"b" * 300), stamp=True).offset
        for _ in range(29):
            st.put(Message(topic="L", queue_id=0, body=b"b" * 300), stamp=True)
    return root, first


def _zero_from(store: Path, off: int) -> None:
    """The CommitLog loses everything from ``off`` on (zeros: no record survives)."""
    for p in sorted((store / "commitlog").iterdir()):
        start = int(p.name)
        if start + SEG <= off:
            continue
        data = bytearray(p.read_bytes())
        cut = max(0, off - start)
        data[cut:] = bytes(len(data) - cut)
        p.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["cut", "rebuild"])
def test_a_queue_whose_records_are_all_gone_keeps_its_directory(tmp_path, how):
    """Every unit of L/0 points past the new end. With only that, repair cuts the queue
    (truncateDirtyLogicFiles); with a hole in it too, repair rebuilds it, and the rebuild
    used to delete the directory. Both leave what the broker leaves: the directory,
    empty, every file in the backup."""
    store, first = _late_topic_store(tmp_path / "store")
    q = store / "consumequeue" / "L" / "0"
    files = {p.name: p.read_bytes() for p in q.iterdir()}
    _zero_from(store, first)
    if how == "rebuild":
        seg = q / f"{0:020d}"
        data = bytearray(seg.read_bytes())
        data[100:120] = bytes(20)  # unit 5: a hole
        seg.write_bytes(bytes(data))
        files[seg.name] = bytes(data)
    cfg = _cfg(store)
    plan = plan_repair(store, config=cfg)
    step = next(s for s in plan.steps if s.path == "consumequeue/L/0")
    assert step.action == ("cut-queue" if how == "cut" else "rebuild-queue")
    assert plan.refused == []
    before = snapshot(tmp_path)
    repair(store, config=cfg, backup_dir=tmp_path / "backup")
    assert q.is_dir() and list(q.iterdir()) == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "backup" / "consumequeue" / "L" / "0").iterdir()} == files
    assert verify(store, config=cfg).ok and plan_repair(store, config=cfg).steps == []
    restore(tmp_path / "backup")
    assert {k: v for k, v in snapshot(tmp_path).items() if "backup" not in k} == before


def test_a_queue_pointing_only_at_other_queues_records_is_emptied_not_deleted(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    shutil.copytree(store / "consumequeue" / "T0" / "0", store / "consumequeue" / "T9" / "0")
    cfg = _cfg(store)
    plan = plan_repair(store, config=cfg)
    step = next(s for s in plan.steps if s.path == "consumequeue/T9/0")
    assert step.action == "rebuild-queue" and "directory stays" in step.explanation
    repair(store, config=cfg, backup=False)
    assert (store / "consumequeue" / "T9" / "0").is_dir()
    assert list((store / "consumequeue" / "T9" / "0").iterdir()) == []
    assert plan_repair(store, config=cfg).steps == []
