"""Journaled, resumable, undoable repair (issue 11): a repair cut short anywhere (at every
call that changes a file, and just after every journal record) is finished by the next
`repair` (ending where an uninterrupted repair ends) or undone by `restore` (the original
bytes, nothing else left); backups copy sparse files sparsely; the space is checked
before anything changes; ENOSPC/EIO give one line naming the file and a resumable store;
`repair -f json` prints one document.

``RMQSTORE_STRESS=1`` sweeps every crash point of every generated fault too.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import test_faults as TF
from conftest import REPO, ROCKETMQ_498, copy_store, scenario_params
from crashpoints import CLOCK, Crash, Dies, snapshot
from rmqstore.recovery import journal as J
from rmqstore.recovery import journal_state as JS
from rmqstore.recovery import undo as U
from rmqstore.files.checkpoint import hold_lock
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.errors import RefusedError, StoreLockedError
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.files.sparse import copy_file, copy_tree
from rmqstore.engine.store import MessageStore
from rmqstore.recovery.verify import verify

runner = CliRunner()
STRESS = os.environ.get("RMQSTORE_STRESS") == "1"


# --- damaged stores --------------------------------------------------------------------


def fixture_store(name):
    def make(dst: Path) -> Path:
        return copy_store(ROCKETMQ_498 / name, dst)
    make.config = lambda store: None
    return make


def cq_lag(store, recs, rng):
    """The last units of a queue never written (a crash before the CQ flush)."""
    q = sorted(store.glob("consumequeue/T1/*"))[0]
    seg = sorted(q.iterdir())[-1]
    data = bytearray(seg.read_bytes())
    n = next(i for i in range(0, len(data), 20) if not any(data[i:i + 20])) // 20
    data[(n - 2) * 20:n * 20] = bytes(40)
    seg.write_bytes(bytes(data))


def cq_wrong_unit(store, recs, rng):
    """A unit in the middle of a queue whose size disagrees with its record."""
    seg = sorted((store / "consumequeue/T2/1").iterdir())[0]
    data = bytearray(seg.read_bytes())
    data[5 * 20 + 8:5 * 20 + 12] = (12345).to_bytes(4, "big")
    seg.write_bytes(bytes(data))


GENERATED = {f.__name__: f for f in [TF.torn_last, TF.zeroed_tail, TF.bit_flip_in_body,
                                     TF.truncated_segment, TF.missing_middle_segment,
                                     TF.deleted_index_file, TF.stray_files, TF.garbage_tail,
                                     cq_lag, cq_wrong_unit]}


@pytest.fixture(scope="module")
def base_store(tmp_path_factory) -> Path:
    return TF.make_store(tmp_path_factory.mktemp("base") / "store", seed=7, count=250)


def generated_store(base: Path, fault):
    def make(dst: Path) -> Path:
        shutil.copytree(base, dst)
        fault(dst, TF.records(dst), random.Random(1))
        return dst
    make.config = lambda store: StoreConfig(**TF.CFG, store_path_root_dir=str(store))
    return make


def _repair(make, store: Path, backup: Path | None, **kw):
    # The plan guard (missing_middle_segment drops valid records) is not what is tested.
    return repair(store, backup_dir=backup, backup=backup is not None, clock=CLOCK,
                  config=make.config(store), allow_data_loss=True, **kw)


# --- the interrupt sweep ---------------------------------------------------------------


def _points(calls: int, records: int, ops: int | None, boundaries: int | None, seed: int):
    """Crash points: after journal records (step boundaries) and at file-changing calls;
    all of them, or a seeded sample of each."""
    rng = random.Random(seed)

    def some(n, k):
        return list(range(1, n + 1)) if k is None or k >= n else sorted(rng.sample(range(1, n + 1), k))
    return ([("after_record", r) for r in some(records, boundaries)]
            + [("at", n) for n in some(calls, ops)])


@pytest.fixture
def no_fsync(monkeypatch):
    """A killed process's writes stay in the page cache: without fsync the sweeps see the
    same files, many times faster."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def check_interrupts(make, tmp: Path, ops: int | None = None, boundaries: int | None = None,
                     seed: int = 0) -> int:
    """Kill a repair of ``make``'s store at each point (every journal record, i.e. step
    boundary, and every call that changes a file, or a sample of them); the next repair
    must end where an uninterrupted one ends (byte for byte), and restore must give the
    original back. Returns the number of points tried."""
    original = snapshot(make(tmp / "orig"))
    ref = make(tmp / "ref")
    with Dies() as count:
        _repair(make, ref, tmp / "ref.backup")
    want = snapshot(ref)
    assert want != original and count.records > 3
    cfg = make.config(ref)
    assert plan_repair(ref, config=cfg).steps == []  # converged (crash-torn-tail keeps a
    # cq-tags-mismatch warning, as RocketMQ's recovery does: test_repair.py)
    points = _points(count.calls, count.records, ops, boundaries, seed)
    for kind, n in points:
        store, backup = make(tmp / "s"), tmp / "s.backup"
        with Dies(**{kind: n}):
            with pytest.raises(Crash):
                _repair(make, store, backup)
        where = (kind, n)
        marker = (store / J.MARKER).exists()
        # A second copy of both, as if moved elsewhere, to be undone by restore.
        other, other_backup = tmp / "r", tmp / "r.backup"
        shutil.copytree(store, other, symlinks=True)
        if backup.exists():
            shutil.copytree(backup, other_backup, symlinks=True)
        if marker:
            doc = json.loads((other / J.MARKER).read_text())
            (other / J.MARKER).write_text(json.dumps(dict(doc, journal=str(other_backup))))
        r = _repair(make, store, tmp / "s.backup2")
        assert (r.resumed is not None) == marker, where
        assert snapshot(store) == want, where
        try:
            U.restore(other_backup, store=other)
        except RefusedError as e:
            # Only a repair that stopped before its manifest was whole has no backup to
            # speak of; it had changed nothing.
            assert not marker and "manifest" in str(e), (where, e)
        assert snapshot(other) == original, where
        for p in (store, backup, tmp / "s.backup2", other, other_backup):
            shutil.rmtree(p, ignore_errors=True)
    return len(points)


def test_fixture_repair_killed_anywhere_is_finished_or_undone(fixtures_root, tmp_path, no_fsync):
    """crash-torn: 7 steps (zero a torn tail, move a segment, cut a queue, move an
    IndexFile, re-index, checkpoint, abort), killed after each of its 16 journal records
    and at 30 of its ~110 file-changing calls (every one under stress)."""
    assert check_interrupts(fixture_store("crash-torn"), tmp_path,
                            ops=None if STRESS else 30, seed=11) >= 46


@pytest.mark.parametrize("fault", sorted(GENERATED))
def test_generated_repair_killed_at_sampled_points(fault, base_store, tmp_path, no_fsync):
    """4 seeded step boundaries and 3 points inside steps (all of them under stress)."""
    make = generated_store(base_store, GENERATED[fault])
    check_interrupts(make, tmp_path, ops=None if STRESS else 3,
                     boundaries=None if STRESS else 4, seed=len(fault))


def test_moves_across_filesystems_copy_then_remove(fixtures_root, tmp_path, monkeypatch, no_fsync):
    """A backup on another filesystem (rename gives EXDEV): moved paths are copied to the
    backup, then removed; undone by copying back. Killed anywhere, still finished or undone."""
    real = os.rename

    def rename(src, dst, *a, **k):
        if (".backup" in str(dst)) != (".backup" in str(src)):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", rename)
    assert check_interrupts(fixture_store("crash-torn"), tmp_path, ops=12, boundaries=6,
                            seed=3) == 18


def _run_cli(*args, check_one_line=False):
    p = subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr
    return p


def _without_index_names(snap: dict) -> dict:
    """IndexFile names come from the clock; compare their contents in name order."""
    idx = sorted(k for k in snap if k.startswith("index/"))
    out = {k: v for k, v in snap.items() if not k.startswith("index/")}
    out.update({f"index/#{i}": snap[k] for i, k in enumerate(idx)})
    return out


def test_an_undo_killed_anywhere_is_finished_by_running_it_again(fixtures_root, tmp_path,
                                                                  no_fsync):
    """The undo itself cut short: in the next repair (undo, then the new plan) and in a
    restore, at every file-changing call of the undo; run again, each finishes the job."""
    make = fixture_store("crash-torn")
    original = snapshot(make(tmp_path / "orig"))
    ref = make(tmp_path / "ref")
    _repair(make, ref, tmp_path / "ref.b")
    want = snapshot(ref)

    def half_done(name):
        store, backup = make(tmp_path / name), tmp_path / f"{name}.b"
        with Dies(after_record=12), pytest.raises(Crash):  # in step 6 of 7
            _repair(make, store, backup)
        return store, backup

    store, backup = half_done("count")
    with Dies() as count:
        U.restore(backup)
    assert snapshot(store) == original and count.calls > 20
    for n in range(1, count.calls + 1):
        store, backup = half_done("s")
        with Dies(at=n), pytest.raises(Crash):
            U.restore(backup)
        U.restore(backup)
        assert snapshot(store) == original, n
        for p in (store, backup, tmp_path / "s.b2"):
            shutil.rmtree(p, ignore_errors=True)
        store, backup = half_done("s")
        with Dies(at=n), pytest.raises(Crash):
            _repair(make, store, tmp_path / "s.b2")
        marker = (store / J.MARKER).exists()
        r = _repair(make, store, tmp_path / "s.b3")
        assert snapshot(store) == want, n
        assert (r.resumed is not None) == marker, n
        for p in (store, backup, tmp_path / "s.b2", tmp_path / "s.b3"):
            shutil.rmtree(p, ignore_errors=True)


KILLS = [("after_record", 4, "repair"), ("at", 60, "restore")]
if STRESS:
    KILLS += [(k, n, then) for k in ("after_record",) for n in range(2, 16)
              for then in ("repair", "restore")]


@pytest.mark.parametrize("kind,n,then", KILLS)
def test_sigkilled_repair_then_the_cli(kind, n, then, fixtures_root, tmp_path):
    """A real SIGKILL (in a step: after the journal's 4th record, at the 60th call that
    changes a file), then the command a user would run next."""
    src = fixtures_root / "crash-torn"
    original = snapshot(copy_store(src, tmp_path / "orig"))
    ref = copy_store(src, tmp_path / "ref")
    assert _run_cli("repair", ref, "--yes", "--backup", tmp_path / "ref.b").returncode == 0
    store, backup = copy_store(src, tmp_path / "s"), tmp_path / "s.b"
    killed = subprocess.run([sys.executable, str(REPO / "tests" / "crashpoints.py"), store, backup,
                             kind, str(n)], cwd=REPO, capture_output=True, timeout=300)
    assert killed.returncode == -9, killed.stderr  # SIGKILL
    assert (store / J.MARKER).exists()
    assert _run_cli("verify", store).returncode == 1  # repair-interrupted, and the damage
    if then == "repair":
        p = _run_cli("repair", store, "--yes", "-f", "json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)  # exactly one document
        assert doc["result"]["resumed"]["outcome"] == "undone"
        assert "interrupted rmqstore repair" in p.stderr and str(backup) in p.stderr
        assert _without_index_names(snapshot(store)) == _without_index_names(snapshot(ref))
        assert _run_cli("verify", store).returncode == 0
    else:
        p = _run_cli("restore", backup, "--yes")
        assert p.returncode == 0, p.stderr
        assert snapshot(store) == original


# --- restore -----------------------------------------------------------------------------


def test_restore_puts_back_the_original_once(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    original = snapshot(store)
    mtimes = {p: p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()}
    r = repair(store, backup_dir=tmp_path / "b")
    assert r.backup_dir == str(tmp_path / "b") and snapshot(store) != original
    res = U.restore(tmp_path / "b")
    assert res.steps == len(r.steps) and snapshot(store) == original
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file() and p.name != "lock"} \
        == {p: m for p, m in mtimes.items() if p.name != "lock"}
    assert U.restore(tmp_path / "b").steps == 0  # again: nothing left to do
    assert snapshot(store) == original
    repair(store, backup_dir=tmp_path / "b2")  # the store changes again
    after = snapshot(store)
    with pytest.raises(RefusedError, match="undone already.*changed since"):
        U.restore(tmp_path / "b")
    assert snapshot(store) == after


def test_restore_refuses_a_store_changed_since(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    repair(store, backup_dir=tmp_path / "b")
    with open(store / "checkpoint", "r+b") as f:  # a broker ran and flushed its checkpoint
        f.write(b"\x00\x00\x01")
    after = snapshot(store)
    with pytest.raises(RefusedError, match="checkpoint.*changed since the repair"):
        U.restore(tmp_path / "b")
    assert snapshot(store) == after
    with hold_lock(store):  # a running broker
        with pytest.raises(StoreLockedError):
            U.restore(tmp_path / "b")


def test_restores_go_newest_first(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    original = snapshot(store)
    repair(store, backup_dir=tmp_path / "b1")
    middle = snapshot(store)
    (store / "index" / "notes.txt").write_text("a stray file")
    repair(store, backup_dir=tmp_path / "b2")
    with pytest.raises(RefusedError, match="changed since"):
        U.restore(tmp_path / "b1")  # the newer repair rewrote the checkpoint
    U.restore(tmp_path / "b2")
    assert snapshot(store) == dict(middle, **{"index/notes.txt": snapshot(store)["index/notes.txt"]})
    (store / "index" / "notes.txt").unlink()
    U.restore(tmp_path / "b1")
    assert snapshot(store) == original


def test_restore_refuses_while_another_repair_is_unfinished(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    repair(store, backup_dir=tmp_path / "b1")
    (store / "index" / "notes.txt").write_text("x")
    with Dies(after_record=3), pytest.raises(Crash):
        repair(store, backup_dir=tmp_path / "b2")
    with pytest.raises(RefusedError, match="did not finish.*b2"):
        U.restore(tmp_path / "b1")
    rows = runner.invoke(_app(), ["verify", str(store), "-f", "jsonl"]).stdout.splitlines()
    codes = {json.loads(r)["code"] for r in rows}
    assert "repair-interrupted" in codes


def _app():
    from cli.main import app
    return app


def test_backup_directory_is_checked_before_anything_changes(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    before = snapshot(store)
    with pytest.raises(RefusedError, match="outside the store"):
        repair(store, backup_dir=store / "backup")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("someone's files")
    with pytest.raises(RefusedError, match="not empty"):
        repair(store, backup_dir=tmp_path / "full")
    assert snapshot(store) == before and not (store / "backup").exists()


# --- no backup ---------------------------------------------------------------------------


def test_interrupted_repair_without_backup_is_replanned(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    ref = copy_store(fixtures_root / "crash-torn", tmp_path / "ref")
    repair(ref, backup=False, clock=CLOCK)
    with Dies(after_record=6), pytest.raises(Crash):  # inside step 3 (cut-queue)
        repair(store, backup=False, clock=CLOCK)
    journal = store / J.INTERNAL / J.JOURNAL
    assert (store / J.MARKER).exists() and journal.exists()
    found = JS.find_interrupted(store)
    assert found.backup is None and found.done == [1, 2] and found.interrupted == 3
    assert "no backup" in found.describe() and "step 3 (cut-queue" in found.describe()
    r = repair(store, backup=False, clock=CLOCK)
    assert r.resumed.outcome == "replanned"
    assert snapshot(store) == snapshot(ref)  # no marker, no journal left either
    assert verify(store).ok


# --- sparse copies and space -------------------------------------------------------------


def test_sparse_copy_keeps_holes(tmp_path):
    src = tmp_path / "sparse"
    with open(src, "wb") as f:
        f.truncate(64 << 20)
        for at in (0, 5 << 20, (64 << 20) - 10):
            f.seek(at)
            f.write(b"data" * 2)
    copy_file(src, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()
    assert os.stat(tmp_path / "copy").st_blocks <= os.stat(src).st_blocks
    assert os.stat(tmp_path / "copy").st_blocks * 512 < 1 << 20


@pytest.fixture(scope="module")
def big_index_store(tmp_path_factory) -> Path:
    """Default IndexFile geometry (5M slots, 20M entries: a 420 MB sparse file), with the
    last records never indexed, so repair re-dispatches into that file."""
    root = tmp_path_factory.mktemp("bigidx") / "store"
    small = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=6000)
    for n, index in ((60, True), (20, False)):
        with MessageStore.open(root, StoreConfig(**small, message_index_enable=index),
                               create=True) as st:
            for i in range(n):
                st.put(Message(topic="T", queue_id=0, properties={"KEYS": f"k{index}{i}"},
                               body=b"x" * 100, born_timestamp=1_700_000_000_000 + i), stamp=True)
    return root


def test_backup_of_a_sparse_index_file_takes_its_blocks(big_index_store, tmp_path):
    store = tmp_path / "s"
    copy_tree(big_index_store, store)  # shutil.copytree would fill the holes
    original = snapshot(store)
    [idx] = sorted((store / "index").iterdir())
    size, blocks = idx.stat().st_size, idx.stat().st_blocks
    assert size > 400 << 20 and blocks * 512 < 8 << 20
    r = repair(store, backup_dir=tmp_path / "b", clock=CLOCK)
    assert "reindex" in [s.action for s in r.steps]
    saved = tmp_path / "b" / "index" / idx.name
    assert saved.stat().st_size == size and saved.stat().st_blocks <= blocks
    U.restore(tmp_path / "b")
    assert snapshot(store) == original


class _Vfs:
    def __init__(self, real, free):
        self.f_bavail, self.f_frsize, self.f_bsize = free // 4096, 4096, 4096
        self.f_blocks = real.f_blocks


def test_preflight_refuses_without_the_space_and_counts_blocks(big_index_store, tmp_path,
                                                               monkeypatch):
    store = tmp_path / "s"
    copy_tree(big_index_store, store)
    before = snapshot(store)
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: _Vfs(real(p), 64 << 10))
    with pytest.raises(RefusedError, match=r"not enough free space.*MiB.*free") as e:
        repair(store, backup_dir=tmp_path / "b", clock=CLOCK)
    assert "\n" not in str(e.value)
    assert snapshot(store) == before and not (tmp_path / "b").exists()
    res = runner.invoke(_app(), ["repair", str(store), "--yes", "--backup", str(tmp_path / "b")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "not enough free space" in res.stderr
    assert snapshot(store) == before
    # 64 MiB is plenty for what the 420 MB IndexFile really holds (a few hundred KiB).
    monkeypatch.setattr(os, "statvfs", lambda p: _Vfs(real(p), 64 << 20))
    assert repair(store, backup_dir=tmp_path / "b", clock=CLOCK).executed


# --- ENOSPC and EIO ----------------------------------------------------------------------


def _failing(call: str, at: int, err: int):
    real = getattr(os, call)
    seen = [0]

    def f(*a, **k):
        seen[0] += 1
        if seen[0] == at:
            raise OSError(err, os.strerror(err))
        return real(*a, **k)
    return f


@pytest.mark.parametrize("call,err", [("pwrite", errno.ENOSPC), ("write", errno.ENOSPC),
                                      ("ftruncate", errno.EIO), ("rename", errno.EIO)])
def test_disk_errors_give_one_line_and_a_resumable_store(call, err, fixtures_root, tmp_path,
                                                         monkeypatch, no_fsync):
    src = fixtures_root / "crash-torn"
    original = snapshot(copy_store(src, tmp_path / "orig"))
    ref = copy_store(src, tmp_path / "ref")
    repair(ref, backup_dir=tmp_path / "ref.b", clock=CLOCK)
    want = snapshot(ref)
    real = getattr(os, call)
    counted = [0]  # how many such calls a repair makes

    def counting(*a, **k):
        counted[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(os, call, counting)
    repair(copy_store(src, tmp_path / "c"), backup_dir=tmp_path / "c.b", clock=CLOCK)
    assert counted[0] > 1
    for at in sorted({1, 2, counted[0] // 2, counted[0]}):
        for then in ("repair", "restore"):
            store, backup = copy_store(src, tmp_path / "s"), tmp_path / "s.b"
            monkeypatch.setattr(os, call, _failing(call, at, err))
            res = runner.invoke(_app(), ["repair", str(store), "--yes", "--backup", str(backup)])
            monkeypatch.setattr(os, call, real)
            assert res.exit_code == 2, (call, at, res.stdout, res.stderr)
            line = res.stderr.strip()
            assert "\n" not in line and os.strerror(err) in line, line
            assert str(store) in line or str(backup) in line, line
            marker = (store / J.MARKER).exists()
            if then == "repair":
                r = repair(store, backup_dir=tmp_path / "s.b2", clock=CLOCK)
                assert snapshot(store) == want, (call, at)
                assert (r.resumed is not None) == marker
            else:
                try:
                    U.restore(backup)
                except RefusedError as e:
                    assert not marker and "manifest" in str(e), e
                assert snapshot(store) == original, (call, at)
            for p in (store, backup, tmp_path / "s.b2"):
                shutil.rmtree(p, ignore_errors=True)


# --- output ------------------------------------------------------------------------------


def test_repair_json_is_one_document_and_jsonl_one_row_a_step(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    dry = runner.invoke(_app(), ["repair", str(store), "--dry-run", "-f", "json"])
    assert dry.exit_code == 1 and [s["action"] for s in json.loads(dry.stdout)["steps"]][0] == "zero-tail"
    res = runner.invoke(_app(), ["repair", str(store), "--yes", "-f", "json", "--backup",
                                 str(tmp_path / "b")])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)  # one document: a second would not parse
    assert doc["steps"] and doc["result"]["executed"] and doc["result"]["backup"] == str(tmp_path / "b")
    store2 = copy_store(fixtures_root / "crash-torn", tmp_path / "s2")
    res = runner.invoke(_app(), ["repair", str(store2), "--yes", "-f", "jsonl", "--backup",
                                 str(tmp_path / "b2")])
    rows = [json.loads(line) for line in res.stdout.splitlines()]  # one per step (items)
    assert all("action" in r for r in rows) and len(rows) == len(doc["steps"])
    table = runner.invoke(_app(), ["repair", str(copy_store(fixtures_root / "crash-torn",
                                                            tmp_path / "s3")), "--yes", "-f", "table"])
    used = table.stderr.rsplit("backup in ", 1)[1].strip()
    assert (Path(used) / "manifest.json").exists()  # the path printed is the one used


def test_progress_sees_every_step(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    seen = []
    r = repair(store, backup_dir=tmp_path / "b", progress=lambda d, t: seen.append((d, t)))
    assert seen == [(k, len(r.steps)) for k in range(1, len(r.steps) + 1)]


def test_journal_says_what_ran(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    with Dies(after_record=8), pytest.raises(Crash):  # 1 begin, then start/done pairs
        repair(store, backup_dir=tmp_path / "b")
    found = JS.find_interrupted(store)
    assert found.done == [1, 2, 3] and found.interrupted == 4
    state = JS.read_backup(tmp_path / "b")
    assert [s["action"] for s in state.steps][:2] == ["zero-tail", "move-segment"]
    assert state.steps[-1]["action"] == "remove-abort" and state.manifest["config"]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["store"] == str(store.resolve()) and manifest["rmqstore"]
    dry = runner.invoke(_app(), ["repair", str(store), "--dry-run"])
    assert dry.exit_code == 1 and "interrupted rmqstore repair" in dry.stderr


def test_marker_of_a_missing_journal_is_refused(fixtures_root, tmp_path):
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    with Dies(after_record=5), pytest.raises(Crash):
        repair(store, backup_dir=tmp_path / "b")
    shutil.move(tmp_path / "b", tmp_path / "elsewhere")
    before = snapshot(store)
    with pytest.raises(RefusedError, match="journal .* is missing"):
        repair(store)
    assert snapshot(store) == before
    shutil.move(tmp_path / "elsewhere", tmp_path / "b")
    assert repair(store, backup_dir=tmp_path / "b2").resumed.outcome == "undone"
    assert verify(store).ok


def test_dispatch_and_rebuild_queue_steps_are_covered(base_store):
    acts = {}
    for name in ("cq_lag", "cq_wrong_unit"):
        make = generated_store(base_store, GENERATED[name])
        store = make(base_store.parent / f"plan-{name}")
        acts[name] = {s.action for s in plan_repair(store, config=make.config(store)).steps}
        shutil.rmtree(store)
    assert "dispatch-queue" in acts["cq_lag"] and "rebuild-queue" in acts["cq_wrong_unit"]


@pytest.mark.stress  # collected only with RMQSTORE_STRESS=1 (see conftest.py)
@pytest.mark.parametrize("scenario", scenario_params(["crash", "crash-torn-tail"]))
def test_stress_fixture_sweep(scenario, tmp_path, no_fsync):
    check_interrupts(fixture_store(scenario), tmp_path)


def test_other_writers_refuse_a_half_repaired_store(fixtures_root, tmp_path):
    from rmqstore.recovery.rebuild import rebuild

    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    with Dies(after_record=5), pytest.raises(Crash):
        repair(store, backup_dir=tmp_path / "b")
    before = snapshot(store)
    with pytest.raises(RefusedError, match="did not finish.*rebuild would"):
        rebuild(store)
    with pytest.raises(RefusedError, match="did not finish"):
        MessageStore.open(store)
    assert snapshot(store) == before


def test_next_repair_refuses_to_undo_over_other_writes(fixtures_root, tmp_path):
    """A broker started on a half-repaired store and wrote: the undo would mix the two."""
    store = copy_store(fixtures_root / "crash-torn", tmp_path / "s")
    with Dies(after_record=7), pytest.raises(Crash):  # steps 1-3 done
        repair(store, backup_dir=tmp_path / "b")
    seg = store / "commitlog" / "00000000000000458752"  # step 1 zeroed its tail
    with open(seg, "r+b") as f:
        f.seek(6100)
        f.write(b"new record")
    before = snapshot(store)
    with pytest.raises(RefusedError, match=r"00458752: changed since the repair.*remove .*\.rmqstore-repair"):
        repair(store, backup_dir=tmp_path / "b2")
    assert snapshot(store) == before


def test_a_linked_top_level_directory_is_restored_where_it_leads(fixtures_root, tmp_path):
    """consumequeue/ on another disk (a top-level link, docs/playbook.md): the queue cut
    inside it is saved, undone there, and the link stays a link."""
    def make(dst: Path) -> Path:
        store = copy_store(fixtures_root / "crash-torn", dst)
        shutil.move(str(store / "consumequeue"), f"{dst}-cq")
        os.symlink(f"{dst}-cq", store / "consumequeue")
        return store

    def both(store):
        return snapshot(store), snapshot(Path(f"{store}-cq"))

    store = make(tmp_path / "s")
    original = both(store)
    r = repair(store, backup_dir=tmp_path / "b", clock=CLOCK)
    assert "cut-queue" in [s.action for s in r.steps] and both(store) != original
    U.restore(tmp_path / "b")
    assert both(store) == original and (store / "consumequeue").is_symlink()
    ref = make(tmp_path / "ref")
    repair(ref, backup_dir=tmp_path / "ref.b", clock=CLOCK)
    killed = make(tmp_path / "k")
    with Dies(after_record=6), pytest.raises(Crash):  # in the cut
        repair(killed, backup_dir=tmp_path / "k.b", clock=CLOCK)
    repair(killed, backup_dir=tmp_path / "k.b2", clock=CLOCK)
    assert both(killed)[1] == both(ref)[1] and (killed / "consumequeue").is_symlink()


@pytest.mark.parametrize("manifest", [None, b"", b'{\n  "format": "rmqstore-repair-journal/1",\n  "rmq'])
def test_a_backup_folder_left_before_the_marker_is_used_again(tmp_path, manifest):
    """A repair killed while it created its journal (before the store's marker, so before
    any change) left the folder the operator named with --backup: the same command must
    work again (it refused: "already exists and is not empty")."""
    from rmqstore.recovery.journal import JOURNAL, MANIFEST, abandoned_begin

    store, backup = tmp_path / "store", tmp_path / "backup"
    store.mkdir()
    backup.mkdir()
    if manifest is not None:
        (backup / MANIFEST).write_bytes(manifest)
    (backup / JOURNAL).write_bytes(b'{"event":"begin"}\n' if manifest else b"")
    assert abandoned_begin(backup, store)
    # Not ours, or further along: never taken.
    (backup / JOURNAL).write_bytes(b'{"event":"start","step":1}\n')
    assert not abandoned_begin(backup, store)
    (backup / JOURNAL).write_bytes(b"")
    (backup / "notes.txt").write_text("mine")
    assert not abandoned_begin(backup, store)
    (backup / "notes.txt").unlink()
    (backup / MANIFEST).write_text('{"store": "/elsewhere"}')
    assert not abandoned_begin(backup, store)
    (backup / MANIFEST).write_text("my own manifest")
    assert not abandoned_begin(backup, store)
