"""The 5.2+ property CRC (spec §3.8): the ``__CRC32#`` entry a writer with
``enabledAppendPropCRC`` ends every record with, pinned to the spec's vectors (§12.7) and to
every record RocketMQ 5.3.3 wrote in the ``prop-crc`` fixture."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import FIXTURES
from test_store import SPEC_12_3
from rmqstore.format.record import decode_record
from rmqstore.format.crc import (ends_in_prop_crc, prop_crc_entry, prop_crc_ok, prop_crc_tails,
                                 prop_crc_value, record_prop_crc)

PROP_CRC = FIXTURES / "rocketmq-5.3.3" / "prop-crc"


def test_spec_vector_entry_for_123456789():  # spec §12.7
    entry = bytes.fromhex("5F5F435243333223 01 39383736353433323130 02".replace(" ", ""))
    assert prop_crc_entry(123456789) == entry
    assert prop_crc_value(entry) == 123456789


def _spec_12_3_with_crc() -> bytes:
    """§12.7: §12.3's record written with enabledAppendPropCRC: properties 160 bytes,
    TOTALSIZE 274, the entry over bytes [0, 254)."""
    rec = bytearray(SPEC_12_3)
    rec[0:4] = (274).to_bytes(4, "big")
    props_len_at = len(SPEC_12_3) - 140 - 2
    assert int.from_bytes(rec[props_len_at:props_len_at + 2], "big") == 140
    rec[props_len_at:props_len_at + 2] = (160).to_bytes(2, "big")
    return bytes(rec)


def test_spec_vector_record_with_crc():  # spec §12.7 on §12.3's record
    head = _spec_12_3_with_crc()
    crc = record_prop_crc(head + bytes(20))
    assert crc == 1756456797
    tail = bytes.fromhex("5f 5f 43 52 43 33 32 23 01 37 39 37 36 35 34 36 35 37 31 02".replace(" ", ""))
    assert prop_crc_entry(crc) == tail
    rec = head + tail
    assert prop_crc_ok(rec) is True and ends_in_prop_crc(rec)
    assert prop_crc_ok(SPEC_12_3) is None and not ends_in_prop_crc(SPEC_12_3)
    bad = rec[:-2] + b"9\x02"  # the most significant digit changed
    assert ends_in_prop_crc(bad) and prop_crc_ok(bad) is False


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_digits_round_trip(crc):
    entry = prop_crc_entry(crc)
    assert len(entry) == 20 and prop_crc_value(entry) == crc


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=30), st.booleans(), st.integers(0, 2**31 - 1)),
                max_size=12), st.integers(0, 25))
def test_vector_form_is_the_scalar_rule(parts, cut):
    # Records laid end to end, some ending in an entry, a few with a damaged entry.
    buf, ends = b"", []
    for body, with_entry, crc in parts:
        rec = body + (prop_crc_entry(crc) if with_entry else b"")
        if with_entry and body[:1] == b"\x00":
            rec = rec[:-3] + b"x" + rec[-2:]  # not a digit
        buf += rec
        ends.append(len(buf))
    ends.append(max(len(buf) - cut, 0))  # an end that cuts a record short
    u8 = np.frombuffer(buf, dtype=np.uint8)
    # The vector rule looks at the 20 bytes before each end, whatever the record's start.
    want = [ends_in_prop_crc(buf[max(e - 20, 0):e]) for e in ends]
    assert prop_crc_tails(u8, np.array(ends, dtype=np.int64)).tolist() == want


def _fixture_records():
    if not PROP_CRC.is_dir():
        pytest.skip(f"no RocketMQ-written fixture at {PROP_CRC}")
    man = json.loads((PROP_CRC / "manifest.json").read_text())
    size = man["storeConfig"]["mappedFileSizeCommitLog"]
    segs = {}
    out = []
    for m in man["messages"]:
        s = m["stored"]
        start = s["phyOffset"] - s["phyOffset"] % size
        if start not in segs:
            segs[start] = (PROP_CRC / "commitlog" / f"{start:020d}").read_bytes()
        at = s["phyOffset"] - start
        out.append((s, segs[start], at))
    return out


def test_every_record_rocketmq_wrote_carries_a_matching_crc():
    recs = _fixture_records()
    assert len(recs) == 27
    for s, seg, at in recs:
        rec = seg[at:at + s["storeSize"]]
        assert prop_crc_ok(rec) is True, s["phyOffset"]
        assert s["propertiesString"].endswith(
            "__CRC32#\x01" + prop_crc_entry(record_prop_crc(rec))[9:19].decode() + "\x02")
    s, seg, at = recs[0]
    assert seg[at + s["storeSize"] - 11:at + s["storeSize"] - 1] == b"3126499600"  # README
    # the vector form over one segment's records
    seg0 = [(s, at) for s, seg, at in recs if s["phyOffset"] < 65536]
    u8 = np.frombuffer(recs[0][1], dtype=np.uint8)
    ends = np.array([at + s["storeSize"] for s, at in seg0], dtype=np.int64)
    assert prop_crc_tails(u8, ends).all()
    assert not prop_crc_tails(u8, ends - 1).any()


# --- verify and repair (spec §3.8: checked by the broker only with forceVerifyPropCRC) -----

def _copy(tmp_path):
    from conftest import copy_store

    if not PROP_CRC.is_dir():
        pytest.skip(f"no RocketMQ-written fixture at {PROP_CRC}")
    root = copy_store(PROP_CRC, tmp_path / "s")
    (root / "manifest.json").unlink()
    return root


def _forced(root, tmp_path):
    from rmqstore.files.config import load_config

    conf = tmp_path / "broker.conf"
    conf.write_text("enabledAppendPropCRC=true\nforceVerifyPropCRC=true\n")
    return load_config(root, conf)


def _flip(path, at: int, value: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(value)


def test_verify_checks_every_records_crc(tmp_path):
    from rmqstore.recovery.verify import verify

    root = _copy(tmp_path)
    rep = verify(root)
    assert rep.problems == [] and rep.messages == 27
    assert not [f for f in rep.findings if f.code == "store-feature"]
    rec = next(s for s, _, _ in _fixture_records() if s["phyOffset"] == 53891)
    seg = root / "commitlog" / f"{0:020d}"
    digit_at = 53891 + rec["storeSize"] - 11  # the most significant digit
    _flip(seg, digit_at, b"9" if seg.read_bytes()[digit_at:digit_at + 1] != b"9" else b"8")
    rep = verify(root)
    assert [(f.code, f.severity, f.data["commitLogOffset"]) for f in rep.problems] == [
        ("prop-crc-mismatch", "warning", 53891)]
    rep = verify(root, config=_forced(root, tmp_path))
    assert [(f.code, f.severity) for f in rep.problems] == [("prop-crc-mismatch", "error")]


def test_repair_rewrites_the_digits_only_when_the_broker_would_cut(tmp_path):
    from rmqstore.recovery.repair import repair
    from rmqstore.recovery.repair_plan import plan_repair
    from rmqstore.recovery.undo import restore
    from rmqstore.recovery.verify import verify

    root = _copy(tmp_path)
    seg = root / "commitlog" / f"{0:020d}"
    at = 53891 + seg.read_bytes()[53891:54830].index(b"OracleCluster")
    _flip(seg, at, b"o")  # a property value: only the property CRC covers it
    before = seg.read_bytes()
    assert plan_repair(root).steps == []  # a warning: the broker does not check it
    cfg = _forced(root, tmp_path)
    plan = plan_repair(root, config=cfg)
    assert [s.action for s in plan.steps][:1] == ["fix-prop-crc"]
    res = repair(root, config=cfg, backup_dir=tmp_path / "bk")
    assert verify(root, config=cfg).problems == []
    after = seg.read_bytes()
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed and all(at < i < 54830 for i in changed)  # only that record's digits
    restore(res.backup_dir)
    assert seg.read_bytes() == before


def test_fixing_a_bodycrc_renews_the_property_crc(tmp_path):
    # BODYCRC lies inside what the property CRC covers: rewriting one alone would leave a
    # record a broker with forceVerifyPropCRC cuts the log at.
    from rmqstore.recovery.repair import repair
    from rmqstore.recovery.verify import verify

    root = _copy(tmp_path)
    s = next(s for s, seg, at in _fixture_records()
             if 0 < s["phyOffset"] < 50000 and s["bodyCRC"] != 0)
    seg = root / "commitlog" / f"{0:020d}"
    raw = seg.read_bytes()
    rec = raw[s["phyOffset"]:s["phyOffset"] + s["storeSize"]]
    m = decode_record(rec, 0)
    body_at = s["phyOffset"] + rec.index(m.body)
    _flip(seg, body_at, bytes([rec[rec.index(m.body)] ^ 0x20]))
    cfg = _forced(root, tmp_path)
    codes = {f.code for f in verify(root, config=cfg).problems}
    assert "record-body-crc" in codes and "prop-crc-mismatch" in codes
    # A repair for a broker that checks BODYCRC (no forceVerifyPropCRC) fixes BODYCRC, and
    # the record still passes a broker that checks the property CRC instead.
    res = repair(root, backup_dir=tmp_path / "bk")
    assert [s.action for s in res.plan.steps][:1] == ["fix-body-crc"]
    assert "fix-prop-crc" not in [s.action for s in res.plan.steps]
    assert verify(root, config=cfg).problems == []
