"""The fast put paths (single put_message, vectorised batch.put_messages, dispatch_record,
the bulk dispatch_columns) write exactly the bytes of the general path (prepare + append /
append_batch + dispatch), which the fixture tests tie to RocketMQ."""

from __future__ import annotations

import hashlib
import random

import pytest

from rmqstore.format import layout as L
from rmqstore.engine import batch
from rmqstore.engine.append import CommitLogAppender
from rmqstore.format.rules import SCHEDULE_TOPIC
from rmqstore.format.message import Host, Message
from rmqstore.format.hashing import index_hash, java_hash
from rmqstore.files.config import StoreConfig
from rmqstore.format.hashing import prefix_hash, token_hash, token_hashes
from rmqstore.engine.store import MessageStore

V4, V6 = Host.parse("10.0.0.1:1234"), Host.parse("[2001:db8::1]:10911")


def _tree(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in ("lock", "checkpoint"):
            rel = p.relative_to(root)
            key = str(rel.parent / "IDX") + str(len(out)) if rel.parts[0] == "index" else str(rel)
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _messages(seed: int, n: int):
    rnd = random.Random(seed)
    for i in range(n):
        props = {"TAGS": rnd.choice(["A", "B", "订单", None, ""]),
                 "KEYS": rnd.choice([f"k{i}", f"k{i} x{i}", " ", f"ключ{i}", None, f"k{i}  y"])}
        if rnd.random() < 0.3:
            props["UNIQ_KEY"] = f"{i:032X}"
        topic = rnd.choice(["T", "U", "%RETRY%g", SCHEDULE_TOPIC])
        if topic == SCHEDULE_TOPIC:
            props["DELAY"] = str(rnd.randrange(1, 20))
        sys_flag = rnd.choice([0, 0, 0, L.TRANSACTION_PREPARED, L.TRANSACTION_ROLLBACK,
                               L.TRANSACTION_COMMIT])
        m = Message(topic=topic, body=bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 700))),
                    properties=props, queue_id=rnd.randrange(3), sys_flag=sys_flag,
                    flag=rnd.randrange(3), born_timestamp=1700000000000 + i,
                    store_timestamp=1700000000000 + 1000 * i,
                    born_host=rnd.choice([V4, V4, V6]), store_host=rnd.choice([V4, V4, V6]),
                    reconsume_times=rnd.randrange(2))
        if rnd.random() < 0.2:
            m.properties_text = "\x02".join(f"{k}\x01{v}" for k, v in props.items() if v is not None)
        yield m


def _write(root, cfg, groups, slow: bool, monkeypatch):
    with monkeypatch.context() as mp:
        if slow:
            mp.setattr(CommitLogAppender, "put_message", lambda self, *a, **k: None)
            mp.setattr(batch, "put_messages", lambda *a, **k: None)
        out = []
        with MessageStore.open(root, cfg, create=True, clock=lambda: 1700000000000) as st:
            for g in groups:
                res = st.put_batch(g) if len(g) > 1 else [st.put(g[0])]
                out.append([(r.status, r.offset, r.size, r.queue_offset, r.msg_id) for r in res])
        return out


@pytest.mark.parametrize("version", ["4.9", "5"])
@pytest.mark.parametrize("uniform", [False, True])
def test_fast_paths_write_the_general_paths_bytes(tmp_path, monkeypatch, version, uniform):
    cfg = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=400,
                      max_hash_slot_num=16, max_index_num=64, broker_version=version)
    msgs = list(_messages(7 if uniform else 3, 700))
    if uniform:  # batches as a broker makes them: one topic, v4 hosts, no text
        for m in msgs:
            m.topic, m.born_host, m.store_host, m.properties_text = "T", V4, V4, None
            m.properties = {k: v for k, v in m.properties.items() if v is not None}
    rnd = random.Random(1)
    groups, i = [], 0
    while i < len(msgs):
        k = rnd.choice([1, 1, 2, 5, 20, 40])
        g = msgs[i:i + k]
        for m in g:  # host widths mixed within a batch take the general path; keep them even
            m.born_host, m.store_host = g[0].born_host, g[0].store_host
        groups.append(g)
        i += k
    fast = _write(tmp_path / "fast", cfg, groups, False, monkeypatch)
    slow = _write(tmp_path / "slow", cfg, groups, True, monkeypatch)
    assert fast == slow
    assert _tree(tmp_path / "fast") == _tree(tmp_path / "slow")


def test_stamped_batches_and_refusals_match(tmp_path, monkeypatch):
    cfg = StoreConfig(mapped_file_size_commit_log=65536, max_message_size=1000,
                      mapped_file_size_consume_queue=400, max_hash_slot_num=16, max_index_num=64)
    big = [Message(topic="T", body=b"b" * 2000) for _ in range(3)]
    with MessageStore.open(tmp_path / "s", cfg, create=True) as st:
        assert {r.status.value for r in st.put_batch(big)} == {"MESSAGE_ILLEGAL"}
        assert st.put(big[0]).status.value == "MESSAGE_ILLEGAL"
        res = st.put_batch([Message(topic="T", body=b"x") for _ in range(30)], stamp=True)
        assert len({r.store_timestamp for r in res}) == 1 and res[0].store_timestamp > 0
        assert [r.queue_offset for r in res] == list(range(30))
        assert res == list(res) and len(res) == 30


def test_prefix_index_hash_equals_java():
    rnd = random.Random(5)
    alphabet = "abcXYZ019#%_-订\U0001F600"
    for _ in range(3000):
        topic = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 12)))
        token = "".join(rnd.choice(alphabet[:-2]) for _ in range(rnd.randrange(0, 300)))
        ph = prefix_hash(topic)
        assert ph == java_hash(topic + "#") & 0xFFFFFFFF
        assert token_hash(ph, topic, token) == index_hash(f"{topic}#{token}")


def test_token_hashes_equal_java():
    """The vectorised form, ASCII tokens of every length up to the fast limit and past it."""
    rnd = random.Random(6)
    for topic in ("T", "订单", "BenchTopic"):
        tokens = ["".join(chr(rnd.randrange(128)) for _ in range(rnd.randrange(0, 260)))
                  for _ in range(400)]
        got = token_hashes(prefix_hash(topic), tokens)
        if max(map(len, tokens)) > 256:
            assert got is None
            tokens = [t for t in tokens if len(t) <= 256]
            got = token_hashes(prefix_hash(topic), tokens)
        assert got.tolist() == [index_hash(f"{topic}#{t}") for t in tokens]
    assert token_hashes(prefix_hash("T"), ["ok", "é"]) is None


@pytest.mark.parametrize("columns", [False, True])
def test_big_batches_written_with_pwrite_equal_single_puts(tmp_path, columns):
    """A batch bigger than 64 KiB is written into the segment file with pwrite (not
    through the mapping); its bytes equal the same messages put one at a time."""
    import numpy as np

    from rmqstore.engine import append as A

    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20)
    topic = "BigBatch"
    msgs = [Message(topic=topic, body=(b"body-%06d" % i) * 30, queue_id=i % 3,
                    properties={"TAGS": f"t{i % 4}", "KEYS": f"k{i}"},
                    born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_000 + i)
            for i in range(700)]
    assert sum(len(m.body) for m in msgs) > 3 * A._PWRITE_MIN
    roots = []
    for mode in ("single", "batch"):
        root = tmp_path / mode
        with MessageStore.open(root, cfg, create=True, clock=lambda: 1_700_000_000_000) as st:
            if mode == "single":
                for m in msgs:
                    st.put(m)
            elif columns:
                st.put_columns(topic=topic, bodies=[m.body for m in msgs],
                               queue_ids=np.array([m.queue_id for m in msgs]),
                               properties={"TAGS": [m.properties["TAGS"] for m in msgs],
                                           "KEYS": [m.properties["KEYS"] for m in msgs]},
                               born_timestamp=np.array([m.born_timestamp for m in msgs]),
                               store_timestamp=np.array([m.store_timestamp for m in msgs]))
            else:
                st.put_batch(msgs)
        roots.append(root)
    for sub in ("commitlog", "consumequeue"):
        a = {p.relative_to(roots[0]): p.read_bytes() for p in (roots[0] / sub).rglob("*") if p.is_file()}
        b = {p.relative_to(roots[1]): p.read_bytes() for p in (roots[1] / sub).rglob("*") if p.is_file()}
        assert a == b, sub
