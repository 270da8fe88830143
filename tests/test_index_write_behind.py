"""The synchronous dispatcher's write-behind of index keys: the keys of the usual records
wait (at most ``DEFER_MAX`` of them, from at most ``DEFER_BYTES`` back) and are hashed and
put together. Same bytes as putting each at once; written by ``wait_dispatched`` and
close; and after a crash the reopen re-indexes whatever was still waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.engine.dispatch import DEFER_BYTES, DEFER_MAX
from rmqstore.reader import open_store
from rmqstore.engine.store import MessageStore

SMALL = dict(mapped_file_size_commit_log=1 << 22, max_hash_slot_num=64, max_index_num=300)


def _files(root):
    # Index file names are wall-clock times: compare them by position.
    return {(p.parent.relative_to(root), i if p.parent.name == "index" else p.name): p.read_bytes()
            for i, p in enumerate(sorted(root.rglob("*"))) if p.is_file() and "checkpoint" not in p.name}


def _write(root, msgs, *, at_once: bool, **cfg):
    st = MessageStore.open(root, StoreConfig(**{**SMALL, **cfg}), create=True)
    if at_once:  # every key put as its record is dispatched (the general path)
        st._record = st.dispatcher._dispatch_record
    for m in msgs:
        st.put(m)
    st.close()
    return _files(root)


_props = st.sampled_from([
    {"KEYS": "k"}, {"KEYS": "k", "TAGS": "t"}, {}, {"TAGS": "t"}, {"UNIQ_KEY": "u"},
    {"UNIQ_KEY": "u", "KEYS": "k"}, {"UNIQ_KEY": ""}, {"UNIQ_KEY": "é", "KEYS": "k"},
    {"KEYS": "a b"}, {"KEYS": "é"}, {"KEYS": ""}, {"KEYS": "x" * 300},
    {"UNIQ_KEY": "u", "KEYS": "a  b c d e f g h i j k l m n o p q r s t"}, {"KEYS": " "}])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_props, st.integers(0, 2), st.sampled_from([1, 2000, 300_000])),
                min_size=1, max_size=900))
def test_same_bytes_as_putting_each_key_at_once(tmp_path_factory, shape):
    """Mixed records (several topics, UNIQ_KEY, multi-token and non-ASCII KEYS, no keys,
    bodies large enough to cross the byte window) roll small index files mid-wait."""
    msgs = []
    for i, (props, topic, body) in enumerate(shape):
        p = {k: (v + str(i) if k in ("KEYS", "UNIQ_KEY") and v else v) for k, v in props.items()}
        msgs.append(Message(topic=f"T{topic}", body=b"b" * body, queue_id=i % 3,
                            properties=p, born_timestamp=1, store_timestamp=1000 + i))
    a = _write(tmp_path_factory.mktemp("a"), msgs, at_once=False)
    b = _write(tmp_path_factory.mktemp("b"), msgs, at_once=True)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k], k


def test_many_plain_keys_same_bytes(tmp_path):
    """Thousands of one-token records: several full waits and index files."""
    msgs = [Message(topic="T", body=b"x" * 100, queue_id=i % 4,
                    properties={"TAGS": "t", "KEYS": f"key{i}"}, born_timestamp=1,
                    store_timestamp=1000 + i) for i in range(3 * DEFER_MAX + 17)]
    a = _write(tmp_path / "a", msgs, at_once=False, max_index_num=2000)
    b = _write(tmp_path / "b", msgs, at_once=True, max_index_num=2000)
    assert len([k for k in a if str(k[0]) == "index"]) == 2
    assert a == b


def test_wait_dispatched_writes_waiting_keys(tmp_path):
    st = MessageStore.open(tmp_path, StoreConfig(), create=True)
    try:
        for i in range(10):
            st.put(Message(topic="T", body=b"b", properties={"KEYS": f"k{i}"}))
        st.wait_dispatched()
        with open_store(tmp_path) as r:  # another reader of the files, as a script would be
            for i in range(10):
                assert [m.keys for m in r.query_key("T", f"k{i}")] == [[f"k{i}"]]
    finally:
        st.close()


def test_waiting_keys_reach_the_files_within_a_flush_interval(tmp_path):
    st = MessageStore.open(tmp_path, StoreConfig(flush_interval_commit_log=100), create=True)
    try:
        for i in range(2):  # the first record's key goes at once, the second's waits
            st.put(Message(topic="T", body=b"b", properties={"KEYS": f"k{i}"}))
        assert st.dispatcher.keys_waiting == 1
        deadline = time.monotonic() + 10
        while st.dispatcher.keys_waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        with open_store(tmp_path) as r:
            assert [m.keys for m in r.query_key("T", "k1")] == [["k1"]]
    finally:
        st.close()


CHILD = textwrap.dedent("""
    import sys
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.store import MessageStore
    root, keyed, plain, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    # No flush tick before the kill: keys still wait when it comes.
    st = MessageStore.open(root, StoreConfig(flush_interval_commit_log=600_000), create=True)
    for i in range(keyed):
        st.put(Message(topic="C", body=b"b" * body, queue_id=i % 2, properties={"KEYS": f"k{i}"}))
    for i in range(plain):
        st.put(Message(topic="C", body=b"b" * body, queue_id=i % 2))
    print("done", flush=True)
    sys.stdin.read()
""")


def _crash(root, keyed: int, plain: int, body: int) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(keyed), str(plain),
                              str(body)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "done"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert (root / "abort").exists()


def _indexed(root, keyed: int) -> dict[str, list[int]]:
    with open_store(root) as r, r.index() as idx:
        return {f"k{i}": idx.query("C", f"k{i}", 64).phy_offsets for i in range(keyed)}


def test_reopen_after_crash_indexes_waiting_keys(tmp_path):
    keyed = DEFER_MAX + DEFER_MAX // 2  # the last half batch is still waiting at the kill
    _crash(tmp_path, keyed, 50, 100)
    before = _indexed(tmp_path, keyed)
    missing = sum(1 for v in before.values() if not v)
    assert DEFER_MAX // 4 < missing < DEFER_MAX  # keys were waiting: the case under test
    MessageStore.open(tmp_path, StoreConfig()).close()
    after = _indexed(tmp_path, keyed)
    with open_store(tmp_path) as r:
        offsets = {m.keys[0]: m.commit_log_offset for m in r.messages() if m.keys}
    assert after == {k: [offsets[k]] for k in offsets}  # each key once, at its record


def test_a_long_keyless_tail_bounds_the_wait(tmp_path):
    """Keys never wait behind more than DEFER_BYTES of later records."""
    body = 10_000
    _crash(tmp_path, 10, DEFER_BYTES // body + 5, body)
    assert all(_indexed(tmp_path, 10).values())  # written before the kill
    MessageStore.open(tmp_path, StoreConfig()).close()
    assert all(len(v) == 1 for v in _indexed(tmp_path, 10).values())


DIE_IN_DRAIN = textwrap.dedent("""
    import os, sys
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.dispatch import Dispatcher
    from rmqstore.engine.store import MessageStore
    root = sys.argv[1]
    st = MessageStore.open(root, StoreConfig(flush_interval_commit_log=600_000), create=True)
    st.put(Message(topic="C", body=b"b" * 100))  # no keys: it opens the write-behind window
    Dispatcher._drain = lambda self: os._exit(9) if self._pending else None
    for i in range(500):  # 10 KB records: the window's end comes after about 100 keys
        st.put(Message(topic="C", body=b"b" * 10_000, properties={"KEYS": f"k{i}"}))
""")


def test_a_writer_killed_in_the_drain_at_the_windows_end_loses_no_key(tmp_path):
    """The record that ends past the window drains the waiting keys; a writer that dies
    in that drain must not have written that record's ConsumeQueue unit yet, or the
    reopen's re-index (DEFER_BYTES back from the queues' end) misses the first keys."""
    child = subprocess.run([sys.executable, "-c", DIE_IN_DRAIN, str(tmp_path)])
    assert child.returncode == 9 and (tmp_path / "abort").exists()
    MessageStore.open(tmp_path, StoreConfig()).close()
    with open_store(tmp_path) as r:
        offsets = {m.keys[0]: m.commit_log_offset for m in r.messages() if m.keys}
        with r.index() as idx:
            indexed = {k: idx.query("C", k, 64).phy_offsets for k in offsets}
    assert len(offsets) > 90
    assert indexed == {k: [off] for k, off in offsets.items()}
