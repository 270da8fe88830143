"""`dump --follow` in the library: a follower reads a store another process is writing
(holding the lock), across segment rolls, read-only, and gives every message once, in
order, with the bytes that process put."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.reader import open_store
from rmqstore.engine.store import MessageStore

GEOMETRY = dict(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                max_hash_slot_num=64, max_index_num=256)
REPO = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.store import MessageStore
    root, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with MessageStore.open(root, StoreConfig(**{geometry!r})) as s:
        print("locked", flush=True)
        sys.stdin.readline()  # the test says go
        for i in range(first, first + count):
            r = s.put(Message(topic="TopicF" if i % 3 else "Other", body=(b"%05d" % i) * 600,
                              properties={{"KEYS": "k%d" % i}}), stamp=True)
            assert r.status.value == "PUT_OK", r.status
            time.sleep(0.003)
""")


def _body(i: int) -> bytes:
    return (b"%05d" % i) * 600  # 3000 bytes: about 21 records a 64 KiB segment


def _seed(root: Path, count: int) -> None:
    with MessageStore.open(root, StoreConfig(**GEOMETRY), create=True) as s:
        for i in range(count):
            s.put(Message(topic="TopicF" if i % 3 else "Other", body=_body(i),
                          properties={"KEYS": f"k{i}"}), stamp=True)


def _writable_fds_under(root: Path) -> list[str]:
    """Files under ``root`` this process holds open for writing (Linux /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if target.startswith(str(root)) and flags & os.O_ACCMODE != os.O_RDONLY:
            out.append(target)
    return out


def _writer(root: Path, first: int, count: int) -> subprocess.Popen:
    code = WRITER.format(repo=str(REPO), geometry=GEOMETRY)
    p = subprocess.Popen([sys.executable, "-c", code, str(root), str(first), str(count)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"  # it holds the store lock from here on
    return p


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("history", [True, False], ids=["from-offset-0", "from-now"])
def test_follow_a_store_being_written_by_another_process(tmp_path, history):
    root = tmp_path / "store"
    _seed(root, 10)
    new = 70  # about three segment rolls
    with open_store(root, max_hash_slot_num=64, max_index_num=256) as reader:
        segments_before = len(reader.commitlog.segments)
        writer = _writer(root, 10, new)
        try:
            filters = dict(from_offset=0) if history else {}
            want = list(range(10 + new)) if history else list(range(10, 10 + new))
            follower = reader.follow(limit=len(want), idle_timeout=120, poll=0.01, **filters)
            writer.stdin.write("go\n")
            writer.stdin.flush()
            got, concurrent = [], False
            for msg in follower:
                got.append(msg)
                concurrent |= writer.poll() is None
                assert _writable_fds_under(root) == []
        finally:
            writer.stdin.close()
            assert writer.wait(60) == 0
    assert [m.body for m in got] == [_body(i) for i in want]
    assert [m.keys for m in got] == [[f"k{i}"] for i in want]
    offsets = [m.commit_log_offset for m in got]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert concurrent, "the follower should have read while the writer was writing"
    with open_store(root, max_hash_slot_num=64, max_index_num=256) as after:
        assert len(after.commitlog.segments) >= segments_before + 3  # it crossed segment rolls


def test_follow_filters_and_stops(tmp_path):
    root = tmp_path / "store"
    _seed(root, 30)
    with open_store(root, max_hash_slot_num=64, max_index_num=256) as reader:
        got = list(reader.follow(topic="TopicF", from_offset=0, idle_timeout=0.2, poll=0.01))
        assert [m.body for m in got] == [_body(i) for i in range(30) if i % 3]
        # nothing new and no history: the idle timeout ends it
        assert list(reader.follow(idle_timeout=0.1, poll=0.01)) == []
        calls = []
        assert list(reader.follow(stop=lambda: calls.append(1) or len(calls) > 2, poll=0.01)) == []
        assert len(calls) == 3
