"""A segment is never seen half made, and ``rmqstore append`` killed at any point leaves a
store the next writer takes over: every acknowledged message where it was acknowledged,
no file the broker's loader would trip on (spec §2: a queue directory holds only
20-digit segments), and `verify` clean after the reopen."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rmqstore.files import segments
from rmqstore.files.config import StoreConfig
from rmqstore.files.segments import SegmentQueue, create_segment_file, unfinished_name
from rmqstore.engine.store import MessageStore
from rmqstore.format.message import Message
from rmqstore.reader import open_store
from rmqstore.recovery.verify import verify

REPO = Path(__file__).resolve().parent.parent
SEG = 65536
CFG = dict(mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=1280,
           max_hash_slot_num=64, max_index_num=256)
GEOMETRY = ["--commitlog-size", str(SEG), "--cq-size", "1280", "--index-slots", "64",
            "--index-num", "256"]


def _odd_names(root: Path) -> list[str]:
    """Files under the store's queue folders that are not what the broker lists."""
    odd = []
    for d in [root / "commitlog", *sorted((root / "consumequeue").glob("*/*")), root / "index"]:
        if d.is_dir():
            odd += [str(p.relative_to(root)) for p in d.iterdir() if p.name.startswith(".")]
    return odd


# --- creating a segment ---------------------------------------------------------------------

@pytest.mark.parametrize("nameless", [True, False], ids=["nameless", "rename"])
def test_a_new_segment_appears_whole_and_leaves_no_other_name(nameless, tmp_path, monkeypatch):
    if not nameless:
        monkeypatch.setattr(segments, "_create_nameless", lambda path, size: False)
    path = tmp_path / f"{0:020d}"
    create_segment_file(path, SEG)
    assert path.stat().st_size == SEG
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert path.read_bytes() == bytes(SEG)


def test_a_crash_between_sizing_and_naming_is_cleared_by_the_next_writer(tmp_path):
    root = tmp_path / "s"
    cfg = StoreConfig(**CFG)
    with MessageStore.open(root, cfg, create=True) as st:
        put = st.put(Message(topic="T", queue_id=0, body=b"x" * 40), stamp=True)
    # What the rename fallback leaves when the writer dies between ftruncate and rename:
    # the next CommitLog segment, sized and still hidden (a sparse file of zeros).
    # (ConsumeQueue segments are created under their own name, sized in place.)
    left = root / "commitlog" / unfinished_name(f"{SEG:020d}")
    with open(left, "wb") as f:
        f.truncate(SEG)
    assert "stray-file" in {p.code for p in verify(root, config=cfg).problems}

    with MessageStore.open(root, cfg) as st:  # a writer reopens: the leftovers go
        st.put(Message(topic="T", queue_id=0, body=b"y" * 40), stamp=True)
    assert not left.exists()
    assert verify(root, config=cfg.with_values(store_path_root_dir=str(root))).problems == []
    with open_store(root) as s:
        assert s.read_at(put.offset, check_crc=True).body == b"x" * 40


def test_a_hidden_file_holding_data_is_not_removed_but_reported(tmp_path):
    root = tmp_path / "s"
    cfg = StoreConfig(**CFG)
    with MessageStore.open(root, cfg, create=True) as st:
        st.put(Message(topic="T", queue_id=0, body=b"x" * 40), stamp=True)
    keep = root / "commitlog" / unfinished_name(f"{SEG:020d}")
    keep.write_bytes(bytes(100) + b"somebody's bytes" + bytes(SEG - 116))
    zeros = root / "commitlog" / unfinished_name(f"{2 * SEG:020d}")
    zeros.write_bytes(bytes(SEG))  # written zeros, not a hole: still nothing to lose
    MessageStore.open(root, cfg).close()
    assert keep.read_bytes()[100:116] == b"somebody's bytes"
    assert not zeros.exists()
    q = SegmentQueue(root / "commitlog", SEG)
    assert [(p.code, Path(p.path).name) for p in q.problems] == [("stray-file", keep.name)]


def test_readers_never_remove_a_leftover(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, StoreConfig(**CFG), create=True) as st:
        st.put(Message(topic="T", queue_id=0, body=b"x" * 40), stamp=True)
    left = root / "commitlog" / unfinished_name(f"{SEG:020d}")
    left.write_bytes(bytes(SEG))
    SegmentQueue(root / "commitlog", SEG)  # read-only
    with open_store(root):
        pass
    assert left.exists()


# --- `rmqstore append` killed with SIGKILL --------------------------------------------------

def _line(rnd: random.Random, i: int) -> str:
    props = {"TAGS": f"t{i % 3}", "KEYS": f"k{i}" + (" a b" if rnd.random() < 0.2 else "")}
    return json.dumps({"topic": f"T{i % 2}", "queueId": i % 3, "properties": props,
                       "body": "b" * rnd.randrange(1, 3000), "bodyEncoding": "text"}) + "\n"


def _kill_append(root: Path, seed: int, create: bool) -> list[dict]:
    """Feed ``append --jsonl -`` lines until a seeded number are acknowledged, then
    SIGKILL it (with more lines queued, so it dies inside a put or between two).
    Returns the acknowledged rows."""
    rnd = random.Random(seed)
    stop_after = rnd.randint(1, 120)
    args = [sys.executable, "-m", "cli.main", "append", str(root), "--jsonl", "-", "-f", "jsonl"]
    if create:
        args += ["--create", *GEOMETRY]
    child = subprocess.Popen(args, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def feed():
        try:
            for i in range(100_000):
                child.stdin.write(_line(rnd, seed * 1000 + i))
        except (BrokenPipeError, OSError, ValueError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    acked = []
    for row in child.stdout:
        acked.append(json.loads(row))
        if len(acked) >= stop_after:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    feeder.join(5)
    child.stdout.close()
    return acked


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkilled_append_is_taken_over_by_the_next_writer(seed, tmp_path):
    root = tmp_path / "s"
    acked = []
    for run in range(2):
        acked += _kill_append(root, seed * 10 + run, create=run == 0)
        assert (root / "abort").exists()
    assert acked and all(r["status"] == "PUT_OK" for r in acked)
    # The next writer (an append of one message) recovers the store first.
    p = subprocess.run([sys.executable, "-m", "cli.main", "append", str(root), "-t", "T0",
                        "--body", "after", "-f", "jsonl"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert _odd_names(root) == []
    p = subprocess.run([sys.executable, "-m", "cli.main", "verify", str(root), "-f", "json"],
                       cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    with open_store(root) as s:
        for r in acked:
            m = s.read_at(r["commitLogOffset"], check_crc=True)
            assert (m.store_size, m.queue_offset) == (r["storeSize"], r["queueOffset"])


def test_library_calls_read_the_store_given_not_the_configs_root(tmp_path):
    # A StoreConfig made without storePathRootDir (its default root is elsewhere) used to
    # make verify() read that root's CommitLog beside this store's queues: it reported
    # every ConsumeQueue unit as beyond an empty CommitLog.
    root = tmp_path / "s"
    cfg = StoreConfig(**CFG)
    with MessageStore.open(root, cfg, create=True) as st:
        st.put(Message(topic="T", queue_id=0, body=b"x" * 40), stamp=True)
    assert cfg.root != root
    rep = verify(root, config=cfg)
    assert rep.problems == []
    assert rep.messages == 1
