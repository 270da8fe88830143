"""The columnar put's fast forms on broker-shaped columns (issue 15): optional properties
(a column holding None), constant columns, several topics and several KEYS tokens per
message take the template encoding and the bulk index hashing, pinned to the rules' one
definitions: ``format.message.serialize_properties`` (the text), ``format.message.split_keys``
(the tokens), ``format.hashing.index_hash`` (the key hash), and ``put_batch`` (the bytes)."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqstore.bench_append import bench_columns
from rmqstore.engine.batch_properties import encode_properties
from rmqstore.engine.message_batch import MessageBatch
from rmqstore.engine.store import MessageStore
from rmqstore.files.config import StoreConfig
from rmqstore.format import layout as L
from rmqstore.format.hashing import (index_hash, joined_spans, key_token_spans, prefix_hash,
                                     token_hashes)
from rmqstore.format.message import serialize_properties, split_keys

TBLOCK = b"\x01T"  # a topic field; the test reads what follows it


def _texts(props: dict, n: int, trailing: bool) -> list[bytes]:
    """Each record's properties bytes (PROPERTIESLENGTH and text) as the columnar
    encoding lays them out, and whether the template way ran."""
    batch = MessageBatch(topic="T", bodies=[b""] * n, queue_ids=0, properties=props)
    pieces, plens, named, _texts = encode_properties(batch, n, trailing, [TBLOCK], None)
    out = [b"".join(p[i] for p in pieces) for i in range(n)]
    assert all(o.startswith(TBLOCK) for o in out)
    return [o[len(TBLOCK):] for o in out], plens, named


def _want(props: dict, n: int, trailing: bool) -> list[bytes]:
    rows = [{k: (v if isinstance(v, str) else v[i]) for k, v in props.items()} for i in range(n)]
    texts = [serialize_properties(r, trailing).encode() for r in rows]
    return [L.RECORD_PROPERTIES_LENGTH_STRUCT.pack(len(t)) + t for t in texts]


@pytest.mark.parametrize("trailing", [False, True])
def test_optional_first_and_last_columns_take_the_template(trailing):
    """The broker shape's order: an optional categorical column first (color), an
    optional free column last (seq), constants and columns between."""
    rnd = random.Random(3)
    n = 300
    props = {
        "color": [rnd.choice([None, None, None, "red", "blue"]) for _ in range(n)],
        "KEYS": [f"order-{i} user-{i % 7}" for i in range(n)],
        "UNIQ_KEY": [f"{i:032X}" for i in range(n)],
        "CLUSTER": ["DefaultCluster"] * n,  # the same everywhere: folded into a constant
        "WAIT": "true",
        "TAGS": [rnd.choice(["TagA", "TagB"]) for _ in range(n)],
        "seq": [None if rnd.random() < 0.9 else str(i) for i in range(n)],
    }
    got, plens, named = _texts(props, n, trailing)
    want = _want(props, n, trailing)
    assert got == want
    assert plens.tolist() == [len(w) - 2 for w in want]
    # the template way ran: the columns dispatch reads are there, the optional ones not
    assert {"KEYS", "UNIQ_KEY", "TAGS"} <= set(named) and "color" not in named


def test_a_record_whose_first_pair_is_late_takes_the_generic_way():
    """Every column optional: a record with only the last property has its first
    separator outside the lead piece, and one with none has an empty text."""
    props = {"A": [None, "1", None, None] * 5, "B": ["x", None, None, "y"] * 5,
             "C": [None, None, None, "z"] * 5}
    got, _plens, named = _texts(props, 20, True)
    assert got == _want(props, 20, True)
    assert named == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=" ab\x00c\x02", max_size=7), min_size=1, max_size=8),
       st.sampled_from(["", "\x02X\x01", "zz\x00"]))
def test_key_token_spans_are_split_keys(values, gap):
    """The bulk token split is split_keys, for values joined end to end or with the
    template's constants between them (none holding a space)."""
    text = gap.join(values) + gap
    buf = np.frombuffer(text.encode(), np.uint8)
    lens = np.array([len(v.encode()) for v in values], dtype=np.int64)
    ends = np.cumsum(lens + len(gap)) - len(gap)
    rec, tend, tlen = key_token_spans(buf, ends, lens)
    got = [(int(r), bytes(buf[e - n:e]).decode()) for r, e, n in zip(rec, tend, tlen)]
    assert got == [(i, t) for i, v in enumerate(values) for t in split_keys(v)]


def test_token_hashes_of_several_topics_are_index_hash():
    rnd = random.Random(11)
    topics = ["T", "BenchTopic03", "%RETRY%g", "订单"]
    toks = ["".join(rnd.choice("abc-_0 9\x7f") for _ in range(rnd.randrange(0, 40)))
            for _ in range(500)]
    of = [rnd.choice(topics) for _ in toks]
    got = token_hashes(np.array([prefix_hash(t) for t in of], np.uint64), toks)
    assert got.tolist() == [index_hash(f"{t}#{k}") for t, k in zip(of, toks)]
    for vals in (toks, ["a\x00b", "", "c"]):  # a NUL inside a value: measured one by one
        buf, ends, lens = joined_spans(vals)
        assert [bytes(buf[e - n:e]).decode() for e, n in zip(ends, lens)] == vals


def _tree(root):
    """Every file's digest; IndexFiles (named by their creation time) in order."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "lock":
            name = str(p.relative_to(root))
            if p.parent.name == "index":
                name = f"index #{sum(1 for k in out if k.startswith('index #'))}"
            out[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _slice(v, i, j):
    if isinstance(v, dict):
        return {k: _slice(c, i, j) for k, c in v.items()}
    return v[i:j] if isinstance(v, (list, np.ndarray)) else v


@pytest.mark.parametrize("version", ["4.9", "5"])
def test_broker_shape_columns_write_put_batch_bytes(tmp_path, version):
    """The benchmark's broker-shaped columns (4 topics x 8 queues, UNIQ_KEY, 1-3 KEYS
    tokens, optional user properties) through put_columns write what put_batch writes
    with the equivalent messages: CommitLog, ConsumeQueues, IndexFiles, results."""
    n = 3000
    cols = bench_columns(n, shape="broker")
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, max_hash_slot_num=97,
                      max_index_num=2000, broker_version=version)
    out = {}
    for how in ("columns", "messages"):
        res = []
        with MessageStore.open(tmp_path / how, cfg, create=True) as s:
            for i in range(0, n, 700):
                b = MessageBatch(**_slice(cols, i, min(i + 700, n)))
                rr = s.put_columns(b) if how == "columns" else s.put_batch(b.messages())
                res.append([(r.status, r.offset, r.size, r.queue_offset, r.msg_id) for r in rr])
        out[how] = res, _tree(tmp_path / how)
    assert out["columns"] == out["messages"]
