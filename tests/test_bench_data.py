"""The benchmark's generated stores (rmqstore/bench_data.py, bench_shapes.py): the broker
shape holds what a RocketMQ 4.9.8 client and broker write (checked against the
RocketMQ-written fixtures), and a generated store is byte for byte the store
:class:`MessageStore` writes for the same messages."""

from __future__ import annotations

import collections
import filecmp
from pathlib import Path

import numpy as np
import pytest

from conftest import NO_FIXTURES, ROCKETMQ_498, manifest
from rmqstore import bench_data as D, bench_shapes as S
from rmqstore.engine.store import MessageStore
from rmqstore.files.config import StoreConfig
from rmqstore.reader import open_store

SEG = 64 * 1024


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def _same_tree(a: Path, b: Path) -> None:
    assert _files(a) == _files(b)
    differ = [str(p) for p in _files(a) if not filecmp.cmp(a / p, b / p, shallow=False)]
    assert not differ, differ


@pytest.mark.parametrize("shape", S.SHAPES)
def test_generated_store_equals_what_the_store_writes(tmp_path, shape):
    """CommitLog (several segments, BLANKs), ConsumeQueues and IndexFile of a generated
    store equal those MessageStore.put writes for the messages shape_messages describes
    (built one by one with Python strings, not the generator's numpy patches)."""
    g = D.make_store(tmp_path / "gen", 300_000, shape=shape, topics=3, queues=8,
                     segment_size=SEG, body_size=300)
    assert len(list((g.root / "commitlog").iterdir())) >= 4
    cfg = StoreConfig(mapped_file_size_commit_log=SEG)
    st = MessageStore.open(tmp_path / "ref", cfg, create=True, clock=lambda: S.BENCH_EPOCH_MS)
    for m in S.shape_messages(g.templates, g.messages):
        st.put(m)
    st.close()
    for sub in ("commitlog", "consumequeue", "index"):
        _same_tree(g.root / sub, tmp_path / "ref" / sub)


def test_reader_parses_the_generated_properties_back(tmp_path):
    g = D.make_store(tmp_path, 400_000, topics=2, segment_size=SEG, queues_and_index=False)
    with open_store(tmp_path) as r:
        got = list(r.messages())
    want = list(S.shape_messages(g.templates, g.messages))
    assert len(got) == len(want) == g.messages
    for m, w in zip(got, want):
        assert m.properties == w.properties
        assert list(m.properties) == list(w.properties)  # the stored order
        assert (m.topic, m.queue_id, m.body, m.store_timestamp) == \
            (w.topic, w.queue_id, w.body, w.store_timestamp)
    assert [m.commit_log_offset for m in got] == g.positions.tolist()


def _fixture_orders() -> dict[frozenset, tuple]:
    orders = {}
    for rec in manifest("basic")["messages"]:
        text = rec["stored"]["propertiesString"]
        names = tuple(kv.split("\x01")[0] for kv in text.split("\x02") if kv)
        orders[frozenset(names)] = names
    return orders


def test_broker_shape_properties_are_those_rocketmq_stores(tmp_path):
    """Every message: UNIQ_KEY, KEYS (1-3 tokens), TAGS, CLUSTER, in the order RocketMQ
    4.9.8 stored the same names in fixtures/rocketmq-4.9.8/basic (WAIT dropped by the
    broker); some with user properties."""
    if not ROCKETMQ_498.is_dir():
        pytest.skip(NO_FIXTURES)
    golden = _fixture_orders()
    tpl = S.templates("broker", topics=2, queues=8)
    msgs = list(S.shape_messages(tpl, 2000))
    seen = collections.Counter()
    for m in msgs:
        names = tuple(m.properties)
        assert golden[frozenset(names)] == names
        assert {"UNIQ_KEY", "KEYS", "TAGS", "CLUSTER"} <= set(names) and "WAIT" not in names
        assert m.properties["CLUSTER"] == "DefaultCluster"
        seen[(len(m.properties["KEYS"].split(" ")), "color" in names)] += 1
    assert {k for k, _ in seen} == {1, 2, 3} and any(user for _, user in seen)
    assert len({m.uniq_key for m in msgs}) == len(msgs)
    assert len({m.topic for m in msgs}) == 2 and len({m.queue_id for m in msgs}) == 8


def test_uniq_keys_are_client_ids_of_the_born_host_and_time():
    from rmqstore.uniqkey import uniq_key_info

    tpl = S.templates("broker", topics=1, queues=8)
    for m in S.shape_messages(tpl, 70_000):
        if m.born_timestamp % 9973 and m.born_timestamp - S.BENCH_EPOCH_MS < 69_990:
            continue  # a sample, and the ends (the counter wraps at 65536)
        info = uniq_key_info(m.uniq_key, m.store_timestamp, "UTC")
        assert len(m.uniq_key) == 32
        assert info["ip"] == ".".join(map(str, m.born_host.address))
        assert info["time"] == m.born_timestamp
        assert info["counter"] == (m.born_timestamp - S.BENCH_EPOCH_MS) & 0xFFFF


def test_broker_shape_mixes_body_sizes_around_body_size(tmp_path):
    g = D.make_store(tmp_path, 2_000_000, body_size=200, segment_size=1 << 20,
                     queues_and_index=False)
    sizes = np.array([len(g.templates.items[j].body) for j in g.ids])
    assert sorted(set(sizes.tolist())) == [100, 150, 200, 250, 300]
    assert abs(sizes.mean() - 200) < 5
    assert abs(g.bytes - 2_000_000) < 2_000_000 * 0.02  # about the size asked for


def test_easy_shape_is_the_old_one(tmp_path):
    """One TAGS and one KEYS token ``bk`` + ten digits of the message number, no UNIQ_KEY,
    every record the same size, round-robin over topics x queues."""
    g = D.make_store(tmp_path, 200_000, shape="easy", body_size=50, topics=3, queues=2,
                     segment_size=SEG, queues_and_index=False)
    with open_store(tmp_path) as r:
        msgs = list(r.messages())
    assert len(msgs) == g.messages and len({m.store_size for m in msgs}) == 1
    for i in (0, 1, g.messages // 2, g.messages - 1):
        m = msgs[i]
        assert m.properties_text == f"TAGS\x01Tag{i % 2 % 4}\x02KEYS\x01bk{i:010d}"
        assert m.topic == f"BenchTopic{(i % 6) // 2:02d}" and m.queue_id == i % 2
        assert m.queue_offset == i // 6 and m.uniq_key is None
        assert g.keys(i) == (m.topic, [f"bk{i:010d}"])


def test_keys_name_what_the_index_holds(tmp_path):
    g = D.make_store(tmp_path, 300_000, topics=2, segment_size=SEG)
    with open_store(tmp_path) as r:
        for i in (0, 7, g.messages - 1):
            topic, tokens = g.keys(i)
            m = r.read_at(int(g.positions[i]))
            assert tokens == [m.uniq_key, *m.keys]
            for t in tokens:
                assert int(g.positions[i]) in [x.commit_log_offset for x in r.query_key(topic, t)]


@pytest.mark.parametrize("mode", [{}, {"batch": 500}, {"batch": 500, "columns": True}])
def test_append_benchmark_puts_the_broker_shaped_messages(tmp_path, mode):
    """The append benchmark's three put paths store the shape's messages: same topics,
    queues, bodies and properties in the stored order."""
    from rmqstore.bench_append import run_append

    r = run_append(tmp_path / "s", 1200, body_size=80, segment_size=1 << 20, shape="broker",
                   topics=2, queues=8, **mode)
    assert r["messages"] == 1200
    want = list(S.shape_messages(S.templates("broker", topics=2, queues=8, body_size=80), 1200))
    with open_store(tmp_path / "s") as store:
        got = list(store.messages())
    assert [(m.topic, m.queue_id, m.body, m.properties_text) for m in got] == \
        [(w.topic, w.queue_id, w.body, "\x02".join(f"{k}\x01{v}" for k, v in w.properties.items()))
         for w in want]
