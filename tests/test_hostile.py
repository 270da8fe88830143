"""Hostile bytes and odd files (issue #11, items 2-4 and 7): a topic is never a path,
symbolic links are never followed, repair never drops valid records without
``allow_data_loss``, and repair converges (a second plan has no steps).

Every store is generated (tests/test_faults.py's ``make_store`` geometry) and damaged
one way; each test checks that no byte outside the store (and the backup) changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from rmqstore.engine.results import PutStatus
from rmqstore.files.checkpoint import abort_exists
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.errors import RefusedError, UnsafePathError
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.recovery.rebuild import rebuild
from rmqstore.engine.store import MessageStore
from rmqstore.recovery.verify import verify
from test_faults import CFG, SEG, make_store, records

runner = CliRunner()


def _cfg(store: Path) -> StoreConfig:
    return StoreConfig(**CFG, store_path_root_dir=str(store))


def snapshot(top: Path, *skip: Path) -> dict[str, str]:
    """Every path under ``top`` (links as their text, files as a hash), but ``skip``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for n in dirnames + filenames:
            p = d / n
            if p in skip:
                continue
            if p.is_symlink():
                out[str(p)] = "-> " + os.readlink(p)
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[str(p)] = "dir"
    return out


def with_topic(root: Path, topic: bytes, n: int = 40, at: int = 5) -> tuple[Path, int]:
    """A store of ``n`` messages whose record ``at`` carries ``topic`` (patched into the
    CommitLog: topic bytes are not covered by the CRC, spec §3.1). Returns (store, that
    record's CommitLog offset)."""
    placeholder = "Z" * len(topic)
    with MessageStore.open(root, StoreConfig(**CFG), create=True) as st:
        for i in range(n):
            r = st.put(Message(topic=placeholder if i == at else f"T{i % 2}", queue_id=i % 4,
                               properties={"KEYS": f"k{i}"}, body=b"x" * 100,
                               born_timestamp=1_700_000_000_000 + i), stamp=True)
            if i == at:
                off = r.offset
    seg = root / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    p = data.index(placeholder.encode(), off)
    data[p:p + len(topic)] = topic
    seg.write_bytes(bytes(data))
    shutil.rmtree(root / "consumequeue" / placeholder)
    return root, off


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("hostile") / "store", seed=11, count=300)


def _copy(base: Path, where: Path) -> Path:
    shutil.copytree(base, where, symlinks=True)
    return where


def _messages(store: Path) -> dict:
    return {r[0]: r for r in records(store)}


# --- 2. a topic is never a path ----------------------------------------------------------


@pytest.mark.parametrize("topic,escape", [(b"../../../../x", "x"), (b"../..", "3")])
def test_rebuild_refuses_a_topic_that_leaves_the_store(tmp_path, topic, escape):
    store, off = with_topic(tmp_path / "a" / "b" / "store", topic, at=3)  # queue id 3
    conf = _conf(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(UnsafePathError) as e:
        rebuild(store, config=_cfg(store))
    assert f"CommitLog offset {off}" in str(e.value) and repr(topic.decode()) in str(e.value)
    assert snapshot(tmp_path) == before  # nothing written, inside or outside the store
    assert not (tmp_path / "a" / escape).exists() and not (store / "3").exists()
    res = runner.invoke(app, ["rebuild", str(store), "--config", str(conf)])
    assert res.exit_code == 2 and f"CommitLog offset {off}" in res.output
    assert snapshot(tmp_path) == before


def test_unsafe_topic_is_a_finding_and_repair_leaves_it(tmp_path):
    store, off = with_topic(tmp_path / "store", b"ab\0cd")
    cfg = _cfg(store)
    found = [f for f in verify(store, config=cfg).findings if f.code == "record-topic-unsafe"]
    assert [(f.data["commitLogOffset"], f.file, f.offset) for f in found] == [
        (off, "commitlog/00000000000000000000", off)]
    before = snapshot(tmp_path)
    valid = _messages(store)
    repair(store, backup_dir=tmp_path / "backup", config=cfg)  # used to stop halfway (NUL)
    assert not abort_exists(store)
    assert _messages(store) == valid
    plan = plan_repair(store, config=cfg)
    assert plan.steps == [] and {f.code for f, _ in plan.unfixed} == {"record-topic-unsafe"}
    outside = {k: v for k, v in snapshot(tmp_path, store, tmp_path / "backup").items()}
    assert outside == {k: v for k, v in before.items() if not k.startswith(str(store))}


def test_append_refuses_a_topic_that_is_not_one_directory_name(tmp_path):
    store = tmp_path / "a" / "store"
    with MessageStore.open(store, StoreConfig(**CFG), create=True) as st:
        before = snapshot(tmp_path)
        for topic in ("../x", "..", "a/b", "x\0y", "", "t" * 256):
            r = st.put(Message(topic=topic, queue_id=0, body=b"b"))
            assert r.status is PutStatus.MESSAGE_ILLEGAL, topic
        ok = st.put(Message(topic="ok", queue_id=0, body=b"b"))
        assert ok.status is PutStatus.PUT_OK
    assert not (tmp_path / "x").exists() and not (tmp_path / "a" / "x").exists()
    cq = store / "consumequeue"
    assert sorted(k for k in snapshot(tmp_path) if k not in before and k.startswith(str(cq))) == [
        str(cq), str(cq / "ok"), str(cq / "ok" / "0"), str(cq / "ok" / "0" / f"{0:020d}")]


# --- 3. symbolic links and odd files ----------------------------------------------------


def test_symlink_loop_in_consumequeue_moves_nothing(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    os.symlink("..", store / "consumequeue" / "Loop")
    valid = _messages(store)
    before = snapshot(tmp_path)
    cfg = _cfg(store)
    assert "symlink" in {f.code for f in verify(store, config=cfg).problems}
    r = repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert not r.executed  # the link is reported, never moved; nothing else is wrong
    assert snapshot(tmp_path) == before
    assert _messages(store) == valid and len(valid) == 300
    plan = plan_repair(store, config=cfg)
    assert plan.steps == [] and [f.code for f, _ in plan.unfixed] == ["symlink"]


def test_self_referencing_symlink_segment_converges(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    name = f"{10 * SEG:020d}"
    os.symlink(name, store / "commitlog" / name)
    (tmp_path / "outside").write_text("keep me")
    os.symlink(tmp_path / "outside", store / "index" / "99999999999999999")
    before = snapshot(tmp_path)
    cfg = _cfg(store)
    for _ in range(2):
        plan = plan_repair(store, config=cfg)
        assert plan.steps == []
        assert sorted(f.file for f, _ in plan.unfixed) == [f"commitlog/{name}",
                                                           "index/99999999999999999"]
        repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert snapshot(tmp_path) == before


def test_directory_where_a_queue_file_should_be(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    q = store / "consumequeue" / "T0" / "0"
    seg = sorted(q.iterdir())[-1]
    seg.unlink()
    seg.mkdir()
    (seg / "inside").write_text("x")
    valid = _messages(store)
    cfg = _cfg(store)
    repair(store, backup_dir=tmp_path / "backup", config=cfg)  # used to stop halfway
    assert not abort_exists(store) and verify(store, config=cfg).ok
    assert _messages(store) == valid
    assert (tmp_path / "backup" / "consumequeue" / "T0" / "0" / seg.name / "inside").exists()
    assert plan_repair(store, config=cfg).steps == []


def test_short_middle_segment_refuses_to_move_valid_segments(base, tmp_path):
    """A 53-byte file where the second segment should be: the chain breaks, but every
    later segment holds CRC-valid records. Moving them needs --allow-data-loss."""
    store = _copy(base, tmp_path / "store")
    mid = store / "commitlog" / f"{SEG:020d}"
    mid.write_bytes(mid.read_bytes()[:53])
    later = [p.name for p in sorted((store / "commitlog").iterdir())][2:]
    assert later
    cfg = _cfg(store)
    conf = _conf(tmp_path)
    before = snapshot(tmp_path)
    plan = plan_repair(store, config=cfg)
    assert {s.path for s, _ in plan.refused if s.action == "move-segment"} == {
        f"commitlog/{n}" for n in later}
    assert any(s.action == "cut-queue" for s, _ in plan.refused)
    with pytest.raises(RefusedError, match="--allow-data-loss"):
        repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert snapshot(tmp_path) == before and not (tmp_path / "backup").exists()
    res = runner.invoke(app, ["repair", str(store), "--yes", "--config", str(conf)])
    assert res.exit_code == 2 and "--allow-data-loss" in res.output and "Traceback" not in res.output
    with pytest.raises(RefusedError):
        rebuild(store, config=cfg)  # its queues would drop the units of those records
    assert snapshot(tmp_path) == before
    # With the override: the broker's cut, the later segments kept in the backup.
    kept = {o: m for o, m in _messages(base).items() if o < SEG}
    repair(store, backup_dir=tmp_path / "backup", config=cfg, allow_data_loss=True)
    assert _messages(store) == kept
    assert all((tmp_path / "backup" / "commitlog" / n).exists() for n in later)
    assert plan_repair(store, config=cfg).steps == []


def _conf(tmp_path: Path) -> Path:
    p = tmp_path / "broker.conf"
    p.write_text("mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=1280\n"
                 "maxHashSlotNum=64\nmaxIndexNum=256\n")
    return p


@pytest.mark.parametrize("how", ["empty", "missing"])
def test_no_commitlog_never_empties_the_queues(base, tmp_path, how):
    store = _copy(base, tmp_path / "store")
    if how == "empty":
        for p in (store / "commitlog").iterdir():
            p.unlink()
    else:
        shutil.rmtree(store / "commitlog")
    cfg = _cfg(store)
    before = snapshot(tmp_path)
    plan = plan_repair(store, config=cfg)
    assert plan.refused and all(s.action == "cut-queue" for s, _ in plan.refused)
    with pytest.raises(RefusedError, match="no segment"):
        repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert snapshot(tmp_path) == before


def test_segment_name_past_a_java_long(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    # A copy of a real segment under a name no Java long holds (was: OverflowError).
    shutil.copy(store / "commitlog" / f"{0:020d}", store / "commitlog" / "99999999999999999999")
    cfg = _cfg(store)
    rep = verify(store, config=cfg, deep=True)
    assert [f.file for f in rep.problems if f.code == "stray-file"] == [
        "commitlog/99999999999999999999"]
    assert rep.messages == 300
    for args in (["verify", str(store)], ["dump", str(store), "-f", "jsonl"],
                 ["stats", str(store), "-f", "json"]):
        res = runner.invoke(app, args)
        assert res.exit_code in (0, 1) and "internal error" not in res.output, args
    repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert (tmp_path / "backup" / "commitlog" / "99999999999999999999").exists()
    assert plan_repair(store, config=cfg).steps == [] and len(records(store)) == 300


# --- 4. repair converges ----------------------------------------------------------------


def _flip(store: Path, off: int, at: int, bit: int) -> None:
    seg = store / "commitlog" / f"{off - off % SEG:020d}"
    data = bytearray(seg.read_bytes())
    data[off % SEG + at] ^= 1 << bit
    seg.write_bytes(bytes(data))


@pytest.mark.parametrize("field,at,bit", [
    ("QUEUEID", 15, 1), ("QUEUEID", 12, 7), ("QUEUEOFFSET", 27, 3),
    ("QUEUEOFFSET", 22, 0), ("PHYSICALOFFSET", 33, 2), ("PHYSICALOFFSET", 29, 5)])
def test_header_bit_flip_repair_converges(base, tmp_path, field, at, bit):
    store = _copy(base, tmp_path / "store")
    recs = records(store)
    off = recs[len(recs) // 2][0]
    _flip(store, off, at, bit)
    (store / "checkpoint").unlink()  # as in the reproducer
    cfg = _cfg(store)
    valid = _messages(store)
    before = snapshot(tmp_path, store)
    repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert set(_messages(store)) == set(valid)  # every record stays
    again = plan_repair(store, config=cfg)
    assert again.steps == [], [(s.action, s.path) for s in again.steps]
    assert all(why for _, why in again.unfixed)
    assert snapshot(tmp_path, store, tmp_path / "backup") == before


def test_records_that_disagree_on_queue_offsets_are_unfixed_with_a_reason(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    recs = records(store)
    off, _, topic, qid, qo = recs[100]
    _flip(store, off, 27, 4)  # QUEUEOFFSET + 16
    cfg = _cfg(store)
    plan = plan_repair(store, config=cfg)
    q = f"consumequeue/{topic}/{qid}"
    assert q not in {s.path for s in plan.steps}
    why = [w for f, w in plan.unfixed if f.file and f.file.startswith(q + "/")]
    assert why and "disagree on queue offsets" in why[0]


def test_stray_file_inside_a_queue_goes_with_its_rebuild(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    (store / "consumequeue" / "T1" / "2" / "x.tmp").write_text("hello")
    cfg = _cfg(store)
    units = {p.name: p.read_bytes() for p in (store / "consumequeue" / "T1" / "2").iterdir()
             if p.name != "x.tmp"}
    repair(store, backup_dir=tmp_path / "backup", config=cfg)
    after = {p.name: p.read_bytes() for p in (store / "consumequeue" / "T1" / "2").iterdir()}
    assert after == units and (tmp_path / "backup" / "consumequeue/T1/2/x.tmp").exists()
    assert plan_repair(store, config=cfg).steps == []


# --- top-level directories on other disks -------------------------------------------------


def test_top_level_links_are_read_through_and_written_in_place(base, tmp_path):
    store = _copy(base, tmp_path / "store")
    other = tmp_path / "disk2"
    other.mkdir()
    shutil.move(str(store / "consumequeue"), other / "cq")
    os.symlink(other / "cq", store / "consumequeue")
    cfg = _cfg(store)
    assert verify(store, config=cfg).ok
    # A unit past the end: repair cuts it inside the linked directory.
    seg = sorted((other / "cq" / "T0" / "0").iterdir())[-1]
    data = bytearray(seg.read_bytes())
    n = next(i for i in range(0, len(data), 20) if data[i:i + 20] == bytes(20))
    last = records(store)[-1]
    data[n:n + 20] = struct.pack(">qiq", last[0] + last[1] + 100, 200, 0)  # inside the segment
    seg.write_bytes(bytes(data))
    repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert (store / "consumequeue").is_symlink() and verify(store, config=cfg).ok
    assert plan_repair(store, config=cfg).steps == []
    before = snapshot(tmp_path)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        rebuild(store, config=cfg)  # a swap would replace the link
    assert snapshot(tmp_path) == before


def test_a_linked_topic_directory_is_never_written_through(base, tmp_path):
    """``consumequeue/T1`` is a link to a copy elsewhere, and T1's records have no unit
    inside the store: repair must not dispatch them through the link."""
    store = _copy(base, tmp_path / "store")
    shutil.move(str(store / "consumequeue" / "T1"), tmp_path / "elsewhere")
    for q in (tmp_path / "elsewhere").iterdir():
        shutil.rmtree(q)  # an empty topic directory out there: dispatch would fill it
    os.symlink(tmp_path / "elsewhere", store / "consumequeue" / "T1")
    cfg = _cfg(store)
    before = snapshot(tmp_path, store)
    plan = plan_repair(store, config=cfg)
    assert not [s for s in plan.steps if s.path.startswith("consumequeue/T1")]
    assert {f.code for f, _ in plan.unfixed} >= {"symlink", "cq-missing-tail"}
    repair(store, backup_dir=tmp_path / "backup", config=cfg)
    assert snapshot(tmp_path, store, tmp_path / "backup") == before
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert plan_repair(store, config=cfg).steps == []


def test_index_header_claiming_more_entries_than_the_file_holds(base, tmp_path):
    """A garbage IndexFile header (indexCount past maxIndexNum) and slots pointing past the
    file: a query walks only entries the file holds (was: struct.error, "internal error")."""
    from rmqstore.reader import open_store

    store = _copy(base, tmp_path / "store")
    idx = sorted((store / "index").iterdir())[0]
    data = bytearray(idx.read_bytes())
    struct.pack_into(">i", data, 36, 2**31 - 1)  # indexCount (spec §7.1)
    for slot in range(CFG["max_hash_slot_num"]):
        struct.pack_into(">i", data, 40 + 4 * slot, 2**30)
    idx.write_bytes(bytes(data))
    with open_store(store, _conf(tmp_path)) as r:
        assert isinstance(r.query_key("T1", "shared3"), list)
    res = runner.invoke(app, ["query-key", str(store), "--topic", "T1", "--key", "shared3",
                              "--config", str(_conf(tmp_path))])
    assert res.exit_code in (0, 1) and "internal error" not in res.output, res.output


@pytest.mark.parametrize("name", ["checkpoint", "lock"])
def test_store_files_that_are_links_are_never_written_through(base, tmp_path, name):
    store = _copy(base, tmp_path / "store")
    target = tmp_path / "outside"
    target.write_bytes(b"keep")
    (store / name).unlink(missing_ok=True)
    os.symlink(target, store / name)
    if name == "lock":
        (store / "checkpoint").unlink()  # something to write: repair rewrites it
    with pytest.raises(UnsafePathError, match="symbolic link"):
        repair(store, backup_dir=tmp_path / "backup", config=_cfg(store))
    assert target.read_bytes() == b"keep"


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_a_file_name_that_is_not_utf8_is_output_exactly(base, tmp_path, fmt):
    """A queue directory named by bytes that are not UTF-8 (the fuzz campaign's
    queue-dir-odd): verify and repair --dry-run in JSON said "internal error:
    UnicodeEncodeError". JSON escapes such bytes (\\udcXX, valid UTF-8, the name exact
    through surrogateescape); CSV writes the bytes as they are."""
    store = tmp_path / "s"
    shutil.copytree(base, store)
    odd = os.fsdecode(b"\xff\xfe")
    topic = sorted((store / "consumequeue").iterdir())[0]
    os.rename(topic, store / "consumequeue" / odd)
    for cmd in (["verify"], ["repair", "--dry-run"]):
        p = subprocess.run([sys.executable, "-m", "cli.main", *cmd, str(store), "-f", fmt],
                           capture_output=True, timeout=120)
        assert p.returncode in (0, 1), p.stderr
        assert b"internal error" not in p.stderr
        if fmt == "csv":
            assert b"consumequeue/\xff\xfe" in p.stdout
            continue
        p.stdout.decode("utf-8")  # valid UTF-8
        docs = [json.loads(line) for line in p.stdout.splitlines()] if fmt == "jsonl" \
            else [json.loads(p.stdout)]
        assert f"consumequeue/{odd}" in json.dumps(docs, ensure_ascii=False), p.stdout[:300]


@pytest.mark.parametrize("where", ["index/99999999999999995", "checkpoint", "abort"])
def test_a_named_pipe_in_the_store_never_blocks_repair(base, tmp_path, where):
    """A FIFO named like a store file: repair's final fsync of what it touched opened it
    and blocked forever (fuzz campaign, `fifo: index/...`); the checkpoint read blocked
    verify. Repair finishes, the FIFO stays (or goes to the backup where a state file must
    be written), and restore gives it back."""
    store = tmp_path / "s"
    shutil.copytree(base, store)
    (store / where).unlink(missing_ok=True)
    os.mkfifo(store / where)
    if where.startswith("index/"):  # and a reason to write in index/: a cut IndexFile
        last = sorted(p for p in (store / "index").iterdir() if p.name != "99999999999999995")[-1]
        os.truncate(last, 100)
    backup = tmp_path / "b"
    p = subprocess.run([sys.executable, "-m", "cli.main", "repair", "--yes", "--backup",
                        str(backup), str(store), "-f", "json"], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "cli.main", "restore", str(backup), "--yes"],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(store / where).st_mode)
