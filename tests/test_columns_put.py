"""put_columns (the columnar batch) writes exactly what put_batch writes for the
equivalent Message list: CommitLog (incl. BLANKs and segment rolls), ConsumeQueues,
IndexFiles, checkpoint, and the same PutResults; put_batch is tied to RocketMQ by the
fixture tests and tests/test_append_fast.py."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore.format import layout as L
from rmqstore.format.rules import SCHEDULE_TOPIC
from rmqstore.format.message import Host
from rmqstore.format.hashing import index_hash
from rmqstore.engine.batch_dispatch import put_index_hashes
from rmqstore.format.hashing import prefix_hash, token_hashes
from rmqstore.engine.message_batch import MessageBatch
from rmqstore.files.config import StoreConfig
from rmqstore.files.index import IndexGeometry
from rmqstore.files.index_service import IndexService
from rmqstore.engine.store import MessageStore

V4, V6 = Host.parse("10.0.0.1:1234"), Host.parse("[2001:db8::1]:10911")
CLOCK = 1700000000000


def _tree(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "lock":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _cfg(version, **kw):
    base = dict(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=400,
                max_hash_slot_num=16, max_index_num=64, broker_version=version)
    base.update(kw)
    return StoreConfig(**base)


def _results(rr):
    return [(r.status, r.offset, r.size, r.queue_offset, r.store_timestamp, r.msg_id) for r in rr]


def _write(root, cfg, batches, columns: bool, dispatch="sync", stamp=False):
    out = []
    with MessageStore.open(root, cfg, create=True, clock=lambda: CLOCK, dispatch=dispatch) as s:
        for b in batches:
            rr = s.put_columns(b, stamp=stamp) if columns else s.put_batch(b.messages(), stamp=stamp)
            out.append(_results(rr))
        qo = s.queue_offsets
    return out, qo


def _same(tmp_path, cfg, batches, **kw):
    a, qa = _write(tmp_path / "cols", cfg, batches, True, **kw)
    b, qb = _write(tmp_path / "msgs", cfg, batches, False, **kw)
    assert a == b
    assert qa == qb
    ta, tb = _tree(tmp_path / "cols"), _tree(tmp_path / "msgs")
    assert ta.keys() == tb.keys()
    assert ta == tb


def _random_batch(rnd: random.Random, n: int, seq: int, *, uniform: bool) -> MessageBatch:
    """A batch exercising the fast forms (uniform) or anything put_batch accepts."""
    tag_pool = ["A", "B", "Tag1"] if uniform else ["A", "B", "订单", "", None, "x y"]
    props = {}
    if rnd.random() < 0.9:
        props["TAGS"] = rnd.choice(tag_pool[:3]) if rnd.random() < 0.2 else \
            [rnd.choice(tag_pool) for _ in range(n)]
    if rnd.random() < 0.4:
        props["WAIT"] = "true"
    if rnd.random() < 0.8:
        kinds = ["one"] if uniform else ["one", "one", "two", "space", "none", "utf", "empty"]
        keys = []
        for i in range(n):
            kind = rnd.choice(kinds)
            keys.append({"one": f"k{seq}_{i}", "two": f"k{i} j{i}", "space": f"k{i}  y",
                         "none": None, "utf": f"ключ{i}", "empty": ""}[kind])
        if rnd.random() < 0.2:
            keys = [rnd.choice(["a", "b"]) for _ in range(n)]  # few distinct values
        props["KEYS"] = keys
    if rnd.random() < 0.4:
        props["UNIQ_KEY"] = [f"{seq:08X}{i:024X}" for i in range(n)] if uniform or rnd.random() < 0.5 \
            else [rnd.choice([None, f"u{i}", "", "ü"]) for i in range(n)]
    if rnd.random() < 0.3:
        props = dict(reversed(list(props.items())))  # order matters for the text
    if not uniform and rnd.random() < 0.1:
        props["NUL"] = [rnd.choice(["a\x00b", "c"]) for _ in range(n)]
    topics = ["T", "U", "%RETRY%g"]
    if not uniform:
        topics += [SCHEDULE_TOPIC, "L" * 130]  # the general way: delay / refused or magic v2
    topic = rnd.choice(topics[:1] if uniform else topics) if rnd.random() < 0.8 \
        else [rnd.choice(topics[:3]) for _ in range(n)]
    if not isinstance(topic, str) or topic == SCHEDULE_TOPIC:
        if rnd.random() < 0.5:
            props["DELAY"] = [str(rnd.randrange(1, 5)) for _ in range(n)]
    sys_choices = [0, 0, 0, L.TRANSACTION_PREPARED, L.TRANSACTION_ROLLBACK, L.TRANSACTION_COMMIT]
    sys_flag = rnd.choice([0, L.TRANSACTION_COMMIT]) if uniform or rnd.random() < 0.5 \
        else [rnd.choice(sys_choices) for _ in range(n)]
    qids = rnd.randrange(3) if rnd.random() < 0.3 else np.array([rnd.randrange(4) for _ in range(n)])
    ts = CLOCK + 1000 * seq if rnd.random() < 0.5 else [CLOCK + 1000 * seq + 7 * i for i in range(n)]
    big = not uniform and rnd.random() < 0.05
    bodies = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 300))) for _ in range(n)]
    if big:
        bodies[0] = b"z" * 5000  # over maxMessageSize below: refused as a whole
    return MessageBatch(topic=topic, bodies=bodies, queue_ids=qids, properties=props,
                        flag=rnd.choice([0, [rnd.randrange(3) for _ in range(n)]]),
                        sys_flag=sys_flag, born_timestamp=CLOCK - seq, store_timestamp=ts,
                        reconsume_times=rnd.choice([0, 1]),
                        born_host=rnd.choice([V4, V6]) if not uniform else V4,
                        store_host=rnd.choice([V4, V4, V6]) if not uniform else V4)


@pytest.mark.parametrize("version", ["4.9", "5"])
@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("seed", [1, 2])
def test_put_columns_writes_put_batch_bytes(tmp_path, version, uniform, seed):
    rnd = random.Random(seed * 10 + uniform)
    cfg = _cfg(version, max_message_size=4096)
    batches = [_random_batch(rnd, rnd.choice([1, 2, 5, 16, 17, 40, 120]), i, uniform=uniform)
               for i in range(40)]
    _same(tmp_path, cfg, batches)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), version=st.sampled_from(["4.9", "5"]),
       uniform=st.booleans(), sizes=st.lists(st.integers(1, 90), min_size=1, max_size=12))
def test_put_columns_random(tmp_path_factory, seed, version, uniform, sizes):
    rnd = random.Random(seed)
    batches = [_random_batch(rnd, n, i, uniform=uniform) for i, n in enumerate(sizes)]
    _same(tmp_path_factory.mktemp("c"), _cfg(version, max_message_size=4096), batches)


@pytest.mark.parametrize("dispatch", ["background", "off"])
def test_other_dispatch_modes(tmp_path, dispatch):
    rnd = random.Random(5)
    batches = [_random_batch(rnd, 30, i, uniform=i % 2 == 0) for i in range(20)]
    _same(tmp_path, _cfg("5", max_message_size=4096), batches, dispatch=dispatch)


def test_stamp(tmp_path):
    # STORETIMESTAMP from the clock: compare everything but the clock-dependent bytes.
    b = MessageBatch(topic="T", bodies=[b"a"] * 20, queue_ids=np.arange(20) % 2,
                     properties={"TAGS": "t", "KEYS": [f"k{i}" for i in range(20)]})
    with MessageStore.open(tmp_path / "s", _cfg("5"), create=True) as s:
        rr = s.put_columns(b, stamp=True)
        assert len({r.store_timestamp for r in rr}) == 1 and rr[0].store_timestamp > CLOCK
        assert [r.queue_offset for r in rr] == [i // 2 for i in range(20)]
        assert s.appender.last_store_timestamp == rr[0].store_timestamp


def test_bodies_blob_and_keywords(tmp_path):
    bodies = [bytes([i]) * i for i in range(30)]
    offs = np.r_[0, np.cumsum([len(x) for x in bodies])]
    kw = dict(topic="T", queue_ids=3, properties={"KEYS": [f"k{i}" for i in range(30)]},
              store_timestamp=CLOCK)
    blob = MessageBatch(bodies=b"".join(bodies), body_offsets=offs, **kw)
    assert [m.body for m in blob.messages()] == bodies
    with MessageStore.open(tmp_path / "a", _cfg("5"), create=True, clock=lambda: CLOCK) as s:
        ra = _results(s.put_columns(blob))
    with MessageStore.open(tmp_path / "b", _cfg("5"), create=True, clock=lambda: CLOCK) as s:
        rb = _results(s.put_columns(bodies=bodies, **kw))
    assert ra == rb and _tree(tmp_path / "a") == _tree(tmp_path / "b")


def test_properties_texts(tmp_path):
    rnd = random.Random(3)
    texts = [rnd.choice(["TAGS\x01a\x02KEYS\x01k1 k2", "KEYS\x01x\x02", "", "UNIQ_KEY\x01u\x02TAGS\x01b",
                         "bad", "TAGS\x01c\x02\x02"]) for _ in range(200)]
    batches = [MessageBatch(topic="T", bodies=[b"b"] * 50, queue_ids=np.arange(50) % 3,
                            properties_texts=texts[i:i + 50], store_timestamp=CLOCK)
               for i in range(0, 200, 50)]
    _same(tmp_path, _cfg("4.9"), batches)


def test_segment_rolls_and_refusals(tmp_path):
    cfg = _cfg("5", max_message_size=2048)
    batches = []
    for i in range(30):  # ~ 20 KiB a batch: a BLANK and a new segment every few batches
        n = 90
        batches.append(MessageBatch(topic="T", bodies=[b"q" * 200] * n, queue_ids=np.arange(n) % 5,
                                    properties={"TAGS": [f"t{j % 3}" for j in range(n)],
                                                "KEYS": [f"key{i}-{j}" for j in range(n)]},
                                    store_timestamp=CLOCK + i))
    batches.append(MessageBatch(topic="T", bodies=[b"q" * 200] * 400))  # > a segment: refused
    batches.append(MessageBatch(topic="T", bodies=[b"q" * 3000, b"r"]))  # body too long
    _same(tmp_path, cfg, batches)
    a, _ = _write(tmp_path / "again", cfg, batches[-2:], True)
    assert {r[0].value for r in a[0]} == {"MESSAGE_ILLEGAL"}


def test_token_hashes_match_index_hash():
    rnd = random.Random(9)
    alphabet = "abcXYZ09_-#%! ~\x7f"
    tokens = ["".join(rnd.choice(alphabet) for _ in range(rnd.choice([0, 1, 2, 7, 31, 64, 256])))
              for _ in range(3000)]
    topics = ("T", "BenchTopic", "%RETRY%group")
    for topic in topics:
        got = token_hashes(prefix_hash(topic), tokens)
        assert got.tolist() == [index_hash(f"{topic}#{t}") for t in tokens]
    # tokens of several topics: one prefix hash per token
    of = [topics[i % 3] for i in range(len(tokens))]
    got = token_hashes(np.array([prefix_hash(t) for t in of], np.uint64), tokens)
    assert got.tolist() == [index_hash(f"{t}#{k}") for t, k in zip(of, tokens)]
    T = prefix_hash("T")
    assert token_hashes(T, ["é"]) is None
    assert token_hashes(T, ["a\x00"]).tolist() == [index_hash("T#a\x00")]
    assert token_hashes(T, ["a" * 257]) is None


@pytest.mark.parametrize("slots", [7, 100_003])  # chains inside batches / mostly none
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_put_index_hashes_equals_put_hashes(tmp_path, seed, slots):
    rng = np.random.default_rng(seed)
    g = IndexGeometry(slots, 50)
    a = IndexService(tmp_path / "a", g, clock=lambda: CLOCK)
    b = IndexService(tmp_path / "b", g, clock=lambda: CLOCK)
    phy = 0
    for batch in range(12):
        m = int(rng.integers(1, 40))
        h = rng.integers(0, 2**31, m)
        if batch % 3 == 0:
            h[: m // 2] = h[0]  # chains inside one batch
        p = phy + np.repeat(np.arange((m + 1) // 2) * 100, 2)[:m]
        phy = int(p[-1]) + 100
        ts = CLOCK + rng.integers(-5000, 5000_000, m) if batch % 2 else np.full(m, CLOCK + batch)
        for svc in (a, b):
            if not svc.files:
                svc.current_file()
        put_index_hashes(a, h, p, ts)
        b.put_hashes(h, p, ts, skip_stale=True)
    a.close(), b.close()
    ta, tb = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert len(ta) > 1 and sorted(ta.values()) == sorted(tb.values())


@pytest.mark.parametrize("version", ["4.9", "5"])
def test_template_edge_values(tmp_path, version):
    """Fast template with values the index and text rules treat specially: KEYS with
    spaces, empty KEYS, constants with spaces after KEYS, categorical KEYS, empty TAGS,
    non-ASCII values, UNIQ_KEY with spaces."""
    n = 40
    cases = [
        {"KEYS": [f"k{i} j{i}" if i % 3 == 0 else f"k{i}" for i in range(n)], "X": "a b"},
        {"KEYS": ["" if i % 5 == 0 else f"k{i}" for i in range(n)]},
        {"KEYS": [f"k{i}" for i in range(n)], "Y": "c d e", "TAGS": ["", "A"] * (n // 2)},
        {"TAGS": ["t1", "t2"] * (n // 2), "KEYS": ["a b", "c"] * (n // 2)},
        {"TAGS": ["订单", "t"] * (n // 2), "KEYS": [f"ключ{i}" for i in range(n)]},
        {"UNIQ_KEY": [f"u {i}" for i in range(n)], "KEYS": [f"k{i}" for i in range(n)]},
        {"UNIQ_KEY": [""] * n, "KEYS": "one"},
        {"KEYS": "two tokens", "TAGS": "T"},
        {"KEYS": ["x" * 300] + [f"k{i}" for i in range(n - 1)]},
        {},
    ]
    batches = [MessageBatch(topic="T", bodies=[b"b%d" % i for i in range(n)],
                            queue_ids=np.arange(n) % 3, properties=p,
                            store_timestamp=CLOCK + j) for j, p in enumerate(cases)]
    _same(tmp_path, _cfg(version, max_index_num=400), batches)
