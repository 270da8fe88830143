"""checkpoint, abort and lock files (spec §8) against RocketMQ-written stores."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, manifest, scenario_params, store_expectations, tree_hashes
from rmqstore.files.checkpoint import (Checkpoint, StoreLock, abort_exists, create_abort, hold_lock,
                                 is_locked, read_checkpoint, remove_abort, write_checkpoint)
from rmqstore.errors import RecordError, StoreLockedError


@pytest.mark.parametrize("scenario", scenario_params())
def test_checkpoint_matches_manifest(fixtures_root, scenario):
    want = store_expectations(scenario)["checkpoint"]
    root = fixtures_root / scenario
    assert (root / "checkpoint").stat().st_size == want["fileSize"] == 4096
    cp = read_checkpoint(root)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
        want["physicMsgTimestamp"], want["logicsMsgTimestamp"], want["indexMsgTimestamp"])
    assert want["bytesAfter24AllZero"]
    assert cp.master_flushed_offset == 0 and cp.confirm_phy_offset == 0  # 4.9 file (§8.1)
    assert read_checkpoint(root / "checkpoint") == cp


@pytest.mark.parametrize("scenario", scenario_params())
def test_abort_flag_matches_manifest(fixtures_root, scenario):
    m = manifest(scenario)
    expected = "abort" in {f["path"] for f in m["files"]}
    assert m.get("abortFileExists", expected) is expected
    assert expected is (scenario in ("crash", "crash-torn", "crash-torn-tail"))
    assert abort_exists(fixtures_root / scenario) is expected


def test_recovery_thresholds_of_the_crash_checkpoint(fixtures_root):
    """§8.1: min(physic, logics) - 3 s, and its min with indexMsgTimestamp."""
    cp = read_checkpoint(fixtures_root / "crash")
    assert cp.min_timestamp == 1795321566988 - 3000
    assert cp.min_timestamp_index == min(1795321566988 - 3000, 1795321571132)


def test_write_and_read_back(tmp_path):
    cp = Checkpoint(0x0102030405060708, 2, 3, 4, 5)
    write_checkpoint(tmp_path, cp)
    data = (tmp_path / "checkpoint").read_bytes()
    assert data == bytes.fromhex("0102030405060708" "0000000000000002" "0000000000000003") + bytes(4072)
    assert read_checkpoint(tmp_path) == Checkpoint(0x0102030405060708, 2, 3, 0, 0)
    write_checkpoint(tmp_path, cp, version="5.x")
    data = (tmp_path / "checkpoint").read_bytes()
    assert data[24:40] == bytes.fromhex("0000000000000004" "0000000000000005")
    assert len(data) == 4096 and data[40:] == bytes(4056)
    assert read_checkpoint(tmp_path) == cp
    with pytest.raises(ValueError):
        write_checkpoint(tmp_path, cp, version="6")


def test_short_checkpoint_is_a_typed_error(tmp_path):
    (tmp_path / "checkpoint").write_bytes(bytes(10))
    with pytest.raises(RecordError) as e:
        read_checkpoint(tmp_path)
    assert "checkpoint" in str(e.value) and e.value.offset == 10
    with pytest.raises(RecordError):
        read_checkpoint(tmp_path / "missing")


def test_abort_create_and_remove(tmp_path):
    assert not abort_exists(tmp_path)
    create_abort(tmp_path, b"4242")
    assert abort_exists(tmp_path) and (tmp_path / "abort").read_bytes() == b"4242"
    remove_abort(tmp_path)
    remove_abort(tmp_path)
    assert not abort_exists(tmp_path)


_HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from rmqstore.files.checkpoint import StoreLock
    with StoreLock(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.readline()
""")

_PROBE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from rmqstore.files.checkpoint import is_locked
    print(is_locked(sys.argv[1]))
""")


def _probe(root: Path) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(root), str(REPO)],
                         capture_output=True, text=True, check=True).stdout
    return {"True\n": True, "False\n": False}[out]


def test_lock_refused_while_another_process_holds_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path), str(REPO)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert (tmp_path / "lock").read_bytes() == b"lock"
        assert is_locked(tmp_path)
        with pytest.raises(StoreLockedError) as e:
            StoreLock(tmp_path).acquire()
        assert "locked by another process" in str(e.value) and str(tmp_path / "lock") in str(e.value)
        assert is_locked(tmp_path)  # the refused attempt did not disturb the holder
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(10)
    assert not is_locked(tmp_path)
    with hold_lock(tmp_path) as lock:
        assert lock.held and _probe(tmp_path)
    assert not lock.held and not _probe(tmp_path)


def test_second_acquire_in_process_is_refused_and_keeps_the_lock(tmp_path):
    with StoreLock(tmp_path):
        with pytest.raises(StoreLockedError):
            StoreLock(tmp_path).acquire()
        assert is_locked(tmp_path)
        # POSIX locks die with any descriptor of the file: prove from outside it survived.
        assert _probe(tmp_path)
    assert not _probe(tmp_path)


def test_lock_matches_the_broker_byte_range(tmp_path):
    """Another process's lockf on bytes [1, 2) must not conflict; on [0, 1) it must."""
    code = textwrap.dedent("""
        import fcntl, os, sys
        fd = os.open(sys.argv[1], os.O_RDWR)
        for start in (1, 0):
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, start)
                print(start, "free")
            except OSError:
                print(start, "taken")
    """)
    with StoreLock(tmp_path):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lock")],
                             capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["1 free", "0 taken"]


def test_is_locked_changes_nothing(fixtures_root, tmp_path):
    root = fixtures_root / "basic"
    before = tree_hashes(root)
    mtime = os.stat(root / "lock").st_mtime_ns
    assert is_locked(root) is False
    assert tree_hashes(root) == before and os.stat(root / "lock").st_mtime_ns == mtime
    assert is_locked(tmp_path) is False
    assert not (tmp_path / "lock").exists()
