"""The compiled segment pass (rmqstore.scan.segment_pass) gives exactly what the numpy
path gives: every SegmentDispatch field, dtype and order, on every fixture segment RocketMQ
wrote and on generated segments with the property, topic, host and damage edge cases; and
it is really used for a plain broker-written segment (not silently the numpy path)."""

from __future__ import annotations

import dataclasses
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import FIXTURES, NO_FIXTURES
from rmqstore.format import layout as L
from rmqstore.format.message import Host, Message
from rmqstore.format.record import pack_head, record_tail, topic_field
from rmqstore.scan import dispatch as D
from rmqstore.scan import segment_pass
from rmqstore.scan.dispatch import SegmentDispatch, segment_dispatch


def _segments():
    out = []
    for group in ("rocketmq-4.9.8", "rocketmq-5.3.3"):
        for p in sorted((FIXTURES / group).glob("*/commitlog/*")):
            out.append(p)
    seg4x = FIXTURES / "rocketmq-4.x-segment" / "00000000000000000000"
    if seg4x.exists():
        out.append(seg4x)
    return out or [pytest.param(None, marks=pytest.mark.skip(reason=NO_FIXTURES))]


SEGMENTS = _segments()


def both(fn, monkeypatch):
    """(numpy result, kernel result, whether the kernel ran) of ``fn()``."""
    monkeypatch.setenv("RMQSTORE_NO_JIT", "1")
    ref = fn()
    monkeypatch.delenv("RMQSTORE_NO_JIT")
    before = segment_pass.used["kernel"]
    got = fn()
    return ref, got, segment_pass.used["kernel"] > before


def assert_same(ref: SegmentDispatch, got: SegmentDispatch):
    for f in dataclasses.fields(SegmentDispatch):
        a, b = getattr(ref, f.name), getattr(got, f.name)
        if isinstance(a, np.ndarray):
            assert isinstance(b, np.ndarray), f.name
            assert a.dtype == b.dtype, (f.name, a.dtype, b.dtype)
            assert np.array_equal(a, b), f.name
        else:
            assert a == b, (f.name, a, b)


def test_numba_is_there():
    # A dependency (pyproject): without it the kernel tests below would compare numpy
    # with itself.
    assert segment_pass.enabled()


def _libz_crc32():
    import ctypes

    f = ctypes.CDLL("libz.so.1").crc32
    f.restype = ctypes.c_ulong
    f.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_uint]
    return f


@pytest.mark.parametrize("form", ["native", "zlib", "tables"],
                         ids=["ISA-L crc32 (every body)", "zlib crc32 (long bodies)", "own tables"])
def test_every_crc_form_equals_numpy(form, monkeypatch):
    # Bodies go to format/crc.native_crc32 (ISA-L: every length), to the C library's zlib
    # crc32 from 256 bytes where isal is absent, or to the kernel's tables where neither
    # loads: each gives numpy's verdicts, good and damaged bodies alike.
    loaded = segment_pass._load()
    if form == "native":
        assert loaded[-2].__name__ == "crc32_gzip_refl" and loaded[-1] == 1
    else:
        crc = (_libz_crc32(), 256) if form == "zlib" else (None, 0)
        monkeypatch.setattr(segment_pass, "_kernels", loaded[:-2] + crc)
    msg = Message(topic="t")
    recs = []
    for i, n in enumerate([0, 1, 7, 8, 9, 100, 255, 256, 257, 1000, 4099]):
        body = bytes((i * 7 + k) % 251 for k in range(n))
        props = b"TAGS\x01x"
        total = L.record_size(0, L.MAGIC_V1, n, 1, len(props))
        crc = zlib.crc32(body) & 0x7FFFFFFF if body else 0
        head = pack_head((False, False), total, L.MAGIC_V1, crc ^ (i % 2), 0, msg, i, i, i, n)
        recs.append(head + record_tail(body, topic_field(b"T", L.MAGIC_V1), props))
    data = b"".join(recs)
    ref, got, ran = both(lambda: segment_dispatch(data, 0, len(data)), monkeypatch)
    assert ran
    assert_same(ref, got)
    assert not ref.crc_ok[1::2][1:].any() and ref.crc_ok[::2].all()


@pytest.mark.parametrize("path", SEGMENTS, ids=lambda p: "/".join(p.parts[-4:]) if p else "none")
def test_every_fixture_segment_equals_numpy(path: Path, monkeypatch):
    data = path.read_bytes()
    start = int(path.name)
    for crc in (True, False):
        for keys in (True, False):
            ref, got, _ = both(lambda: segment_dispatch(data, start, len(data), check_crc=crc,
                                                        keys=keys), monkeypatch)
            assert_same(ref, got)
    # a range of it, as a split worker walks one: from a record start to mid-segment
    ref = segment_dispatch(data, start, len(data))
    if len(ref) > 3:
        first, end = int(ref.offset[2] - start), len(data) // 2
        ref, got, _ = both(lambda: D._walk_fill(data, first, end, len(data), start, True,
                                                None, True), monkeypatch)
        assert_same(ref, got)


def test_a_plain_broker_segment_takes_the_kernel(monkeypatch):
    path = FIXTURES / "rocketmq-4.9.8" / "basic" / "commitlog" / "00000000000000000000"
    data = path.read_bytes()
    ref, got, ran = both(lambda: segment_dispatch(data, 0, len(data)), monkeypatch)
    assert ran, dict(segment_pass.used)
    assert len(got) > 50 and len(got.key_hash) > len(got)  # UNIQ_KEY + KEYS on each
    assert_same(ref, got)


def test_the_switch_forces_numpy(monkeypatch):
    data = (FIXTURES / "rocketmq-4.9.8" / "basic" / "commitlog" / "00000000000000000000").read_bytes()
    monkeypatch.setenv("RMQSTORE_NO_JIT", "1")
    before = segment_pass.used["kernel"]
    segment_dispatch(data, 0, len(data))
    assert segment_pass.used["kernel"] == before


def test_split_workers_take_the_kernel(monkeypatch):
    # rebuild's and verify's per-range task (split_dispatch) goes through the same switch
    from rmqstore.scan.split_plan import plan_splits

    root = FIXTURES / "rocketmq-4.9.8" / "basic"
    before = segment_pass.used["kernel"]
    splits = plan_splits([str(root)], 16 * 1024)
    for sp in splits[:3]:
        D.split_dispatch(sp, True, None, True, lambda p: p)
    assert segment_pass.used["kernel"] > before


# --- generated segments ------------------------------------------------------------------

_name = st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY"] * 3
                        + [b"TAG", b"TAGSX", b"KEY", b"UNIQ", b"KEYS ", b"DELAY", b"DELAY", b"a", b""])
_vbytes = st.one_of(
    st.binary(max_size=12).map(lambda b: b.replace(b"\x02", b"")),
    st.sampled_from([b"", b" ", b"a b", b"a  b", b" a ", b"k1 k2 k3", b"\xc3\xa9t\xc3\xa9",
                     b"\xff\xfe bad", b"\xe2\x82", b"x\x01y", b"\xf0\x9f\x98\x80 emoji",
                     b"A" * 120, b"tok " * 40, b"3", b"18", b"-1", b"99", b"x"]),
)
_prop = st.tuples(_name, _vbytes).map(lambda nv: nv[0] + b"\x01" + nv[1])
_props = st.lists(st.one_of(_prop, _prop, _prop, st.binary(max_size=6)), max_size=8).flatmap(
    lambda ps: st.sampled_from([b"\x02".join(ps), b"\x02".join(ps) + b"\x02"]))
_topic = st.sampled_from([b"T", b"TopicA", b"TopicB", b"TopicA", b"TopicB", b"t\xc3\xa9",
                          b"bad\xff", b"x" * 130, b""] * 2 + [b"SCHEDULE_TOPIC_XXXX"] * 2)
_host4 = Host(b"\x0a\x00\x00\x01", 1234)
_host6 = Host(bytes(range(16)), 4321)


@st.composite
def _record(draw):
    topic = draw(_topic)
    magic = L.MAGIC_V2 if draw(st.booleans()) or len(topic) > 127 else L.MAGIC_V1
    born, store = draw(st.sampled_from([_host4, _host6])), draw(st.sampled_from([_host4, _host6]))
    tx = draw(st.sampled_from([L.TRANSACTION_NOT_TYPE, L.TRANSACTION_PREPARED,
                               L.TRANSACTION_COMMIT, L.TRANSACTION_ROLLBACK]))
    sys_flag = tx | (L.SYSFLAG_BORNHOST_V6 if born.is_v6 else 0) | (
        L.SYSFLAG_STOREHOST_V6 if store.is_v6 else 0)
    body = draw(st.one_of(st.binary(max_size=40), st.binary(min_size=250, max_size=300)))
    props = draw(_props)
    msg = Message(topic="t", queue_id=draw(st.integers(0, 7)), born_host=born, store_host=store,
                  sys_flag=sys_flag)
    total = L.record_size(sys_flag, magic, len(body), len(topic), len(props))
    key = (born.is_v6, store.is_v6)
    crc = zlib.crc32(body) & 0x7FFFFFFF if body else 0
    head = pack_head(key, total, magic, crc, sys_flag, msg, draw(st.integers(0, 1 << 40)),
                     draw(st.integers(0, 1 << 40)), draw(st.integers(0, 1 << 41)), len(body))
    return bytearray(head + record_tail(body, topic_field(topic, magic), props))


_DAMAGE = ("none",) * 4 + ("crc", "size", "props length", "torn", "zeros", "blank", "magic")


@st.composite
def _segment(draw):
    recs = draw(st.lists(_record(), min_size=1, max_size=12))
    damage = draw(st.sampled_from(_DAMAGE))
    at = draw(st.integers(0, len(recs) - 1))
    r = recs[at]
    if damage == "crc":
        r[-1 - len(r) // 3] ^= 0x55  # may hit the body, or not
        r[8] ^= 1
    elif damage == "size":
        r[0:4] = (int.from_bytes(r[0:4], "big") + draw(st.sampled_from([-1, 1, 7, 1 << 20]))) \
            .to_bytes(4, "big", signed=True)
    elif damage == "props length":
        plen_at = len(r) - 2 - _props_len(r)
        r[plen_at:plen_at + 2] = ((_props_len(r) + 1) % 65536).to_bytes(2, "big")
    elif damage == "magic":
        r[4] ^= 0x10
    data = b"".join(recs)
    if damage == "zeros":
        data += bytes(draw(st.integers(1, 200)))
    elif damage == "blank":
        data += (1000).to_bytes(4, "big") + (L.MAGIC_BLANK & 0xFFFFFFFF).to_bytes(4, "big") \
            + bytes(draw(st.integers(0, 50)))
    elif damage == "torn":
        data = data[:draw(st.integers(0, len(data)))]
    return data


def _props_len(r: bytearray) -> int:
    # walk the record's own fields: the last two-byte length before the properties text
    at = L.OFFSET_OF["sys_flag"]
    sf = int.from_bytes(r[at:at + 4], "big")
    key = (bool(sf & L.SYSFLAG_BORNHOST_V6), bool(sf & L.SYSFLAG_STOREHOST_V6))
    fixed = L.RECORD_FIXED_SIZE[key]
    blen = int.from_bytes(r[fixed - 4:fixed], "big")
    magic = int.from_bytes(r[4:8], "big", signed=True)
    w = L.TOPIC_LENGTH_SIZE[magic]
    p = fixed + blen
    tlen = int.from_bytes(r[p:p + w], "big")
    p += w + tlen
    return int.from_bytes(r[p:p + 2], "big")


@settings(max_examples=400, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=_segment(), crc=st.booleans(), keys=st.booleans(), split=st.integers(0, 3))
def test_generated_segments_equal_numpy(data, crc, keys, split):
    old = os.environ.pop("RMQSTORE_NO_JIT", None)
    try:
        end = len(data) if split == 0 else len(data) * split // 4
        run = lambda: D._walk_fill(data, 0, end, len(data), 1 << 30, crc, None, keys)  # noqa: E731
        os.environ["RMQSTORE_NO_JIT"] = "1"
        ref = run()
        del os.environ["RMQSTORE_NO_JIT"]
        assert_same(ref, run())
    finally:
        os.environ.pop("RMQSTORE_NO_JIT", None)
        if old is not None:
            os.environ["RMQSTORE_NO_JIT"] = old


# The rules' edge cases, one record each (also in a segment of their own, so a fallback
# elsewhere cannot hide them): later value wins, empty values are absent, a name counts only
# at a segment start, KEYS split on single spaces, non-ASCII and invalid UTF-8 hashed as
# Python's 'replace' decoding reads them, as UTF-16 units.
EDGE_PROPS = [
    b"TAGS\x01a\x02TAGS\x01b", b"TAGS\x01a\x02TAGS\x01", b"TAGS\x01\x02KEYS\x01k",
    b"XTAGS\x01a\x02KEYS\x01k1 k2", b"KEYS\x01a  b \x02UNIQ_KEY\x01U1",
    b"UNIQ_KEY\x01U1\x02KEYS\x01 \x02UNIQ_KEY\x01U2", b"KEYS\x01   ", b"TAGS\x01x\x01y",
    b"TAGS\x01\xc3\xa9\x02KEYS\x01\xe2\x82 \xff ok\x02UNIQ_KEY\x01\xf0\x9f\x98\x80",
    b"KEYS\x01" + b"long" * 50 + b" " + b"\xc3\xa9" * 60, b"TAGS\x01" + b"t" * 300,
    b"KEYS\x01" + b"k " * 50, b"DELAY\x013\x02TAGS\x01t", b"DELAY\x01x\x02TAGS\x01t",
    b"DELAY\x0199", b"DELAY\x01-2", b"TAGS\x01t\x02DELAY\x01", b"DELAY\x011\x02DELAY\x0118",
    b"KEYS\x01a\x02", b"\x02\x02TAGS\x01z\x02\x02", b"TAGS\x01a\x02KEYS\x01b\x02TAGS\x01c",
]


@pytest.mark.parametrize("topic", [b"T", b"t\xc3\xa9\xff", b"SCHEDULE_TOPIC_XXXX"],
                         ids=["ascii", "non-ascii", "delay topic"])
def test_property_edge_cases_equal_numpy(topic, monkeypatch):
    msg = Message(topic="t")
    recs = []
    for i, props in enumerate(EDGE_PROPS):
        tx = L.TRANSACTION_ROLLBACK if i == 5 else L.TRANSACTION_NOT_TYPE
        total = L.record_size(tx, L.MAGIC_V1, 1, len(topic), len(props))
        head = pack_head((False, False), total, L.MAGIC_V1, zlib.crc32(b"x") & 0x7FFFFFFF,
                         tx, msg, i, i, 1_700_000_000_000 + i, 1)
        recs.append(head + record_tail(b"x", topic_field(topic, L.MAGIC_V1), props))
    for data in [b"".join(recs)] + recs:
        ref, got, ran = both(lambda: segment_dispatch(data, 0, len(data)), monkeypatch)
        assert ran
        assert_same(ref, got)


def test_a_field_the_pass_does_not_make_sends_it_to_numpy(monkeypatch):
    # SegmentDispatch may grow (BatchConsumeQueue, LMQ, DLedger): until the compiled pass
    # makes a new field, numpy fills the range, never the pass with the field left default.
    assert D._FILLED == segment_pass.FIELDS  # today's fields: the pass makes every one
    data = (FIXTURES / "rocketmq-4.9.8" / "basic" / "commitlog" / "00000000000000000000").read_bytes()
    monkeypatch.setattr(D, "_FILLED", D._FILLED | {"lmq_queues"})
    before = dict(segment_pass.used)
    segment_dispatch(data, 0, len(data))
    assert segment_pass.used["kernel"] == before.get("kernel", 0)
    assert segment_pass.used["fallback: lmq_queues"] == 0
    assert segment_pass.used["fallback: fields lmq_queues"] == before.get("fallback: fields lmq_queues", 0) + 1


def _dledger_folders():
    out = sorted(p.parent.parent for p in FIXTURES.glob("rocketmq-*-dledger/*/dledger-*/data"))
    return out or [pytest.param(None, marks=pytest.mark.skip(reason=NO_FIXTURES))]


def _dledger_scan(root: Path):
    from rmqstore.files.config import load_config
    from rmqstore.files.dledger import ledger_for
    from rmqstore.scan.dledger_scan import dledger_scan

    return dledger_scan(ledger_for(load_config(root)))


@pytest.mark.parametrize("damage", [False, True], ids=["as written", "damaged"])
@pytest.mark.parametrize("root", _dledger_folders(),
                         ids=lambda p: "/".join(p.parts[-2:]) if p else "none")
def test_dledger_records_through_the_pass_equal_numpy(root: Path, damage: bool, tmp_path,
                                                      monkeypatch):
    # DLedger's entries give the record starts (scan/dledger_scan); the compiled pass then
    # does what numpy does for them: every field equal, per data file, good and bad alike.
    if damage:
        from conftest import copy_store

        root = copy_store(root, tmp_path / "s")
        data = sorted(root.glob("dledger-*/data/*"))[0]
        b = bytearray(data.read_bytes())
        b[48 + 300] ^= 0xFF          # a byte of the first record's body or properties
        first_size = int.from_bytes(b[48:52], "big")
        second = 48 + first_size + 48  # the second record: entry header, then its TOTALSIZE
        b[second + 2] ^= 0x01          # fails its frame (TOTALSIZE != entry body size)
        data.write_bytes(bytes(b))
    ref, got, ran = both(lambda: _dledger_scan(root), monkeypatch)
    assert ran
    assert len(ref.parts) == len(got.parts) and sum(map(len, ref.parts)) > 0
    for a, b in zip(ref.parts, got.parts):
        assert_same(a, b)
    assert [(x.offset, x.why) for x in ref.bad] == [(x.offset, x.why) for x in got.bad]
    assert ref.damaged == got.damaged
    if damage:
        assert len(got.bad) == 1 and len(got.damaged) + len(got.bad) >= 1
