"""Where valid data ends: one answer type (``files.ends.ValidEnd``), one vocabulary
(``files.ends.REASONS``), and the spellings users see kept as they were (issue #13).

Each case damages a copy of the RocketMQ 4.9.8 ``basic`` fixture (7 segments of 64 KiB,
500 records; offsets from its manifest) and asks every walk: verify (``StoreScan``: its
``endReason`` and ``commitlog-end`` line), the split walk behind ``stats`` and the Spark
jobs (``StoreEnd``) and the broker-faithful walk (``CommitLog.find_end``, ``ScanEnd``).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ROCKETMQ_498, copy_store, manifest
from rmqstore.files.commitlog import CommitLog
from rmqstore.files.config import load_config
from rmqstore.files.ends import REASONS, VERIFY_SPELLING, ValidEnd
from rmqstore.format.rules import broker_end, rmqstore_end
from rmqstore.recovery.verify import verify
from rmqstore.scan.records import scan_buffer
from rmqstore.stats import commitlog_stats

SEG = 65536


def _records():
    stored = sorted((m["stored"] for m in manifest("basic")["messages"]), key=lambda s: s["phyOffset"])
    return [(s["phyOffset"], s["storeSize"]) for s in stored]


def _patch(root, offset: int, at: int, data: bytes) -> None:
    p = root / "commitlog" / f"{offset - offset % SEG:020d}"
    b = bytearray(p.read_bytes())
    pos = offset % SEG + at
    b[pos:pos + len(data)] = data
    p.write_bytes(bytes(b))


def _damage(kind: str, root) -> None:
    recs = _records()
    last, size = recs[-1]
    if kind == "half record":  # TOTALSIZE one more than the fields add up to
        _patch(root, last, 0, (size + 1).to_bytes(4, "big"))
    elif kind == "crc at the tail":  # the last record's first body byte
        _patch(root, last, 88, b"\x00")
    elif kind == "crc before the last records":  # in the last segment: no BLANK after it
        _patch(root, recs[-3][0], 88, b"\x00")
    elif kind == "missing segment":
        (root / "commitlog" / f"{3 * SEG:020d}").unlink()
    elif kind == "short file":
        p = root / "commitlog" / f"{last - last % SEG:020d}"
        p.write_bytes(p.read_bytes()[:last % SEG + size + 100])


def _at(offset: int) -> int:
    """Records before ``offset``."""
    return sum(o < offset for o, _ in _records())


# (damage, verify's endReason and end, the split walk's (stats, Spark) reason and end,
#  find_end's reason and end, records before each end). The split walk reads no CRC;
#  find_end stops at the first CRC failure as the broker does (rules.broker_end); verify
#  cuts only a trailing run of them (rules.rmqstore_end).
CASES = [
    ("none", "zeros", "zeros", "zeros"),
    ("half record", "torn", "half record", "half record"),
    ("crc at the tail", "torn", "zeros", "crc"),
    ("crc before the last records", "zeros", "zeros", "crc"),
    ("missing segment", "gap", "missing segment", "missing segment"),
    ("short file", "short file", "zeros", "zeros"),
]


def _ends(kind):
    recs = _records()
    end = recs[-1][0] + recs[-1][1]
    return {"none": (end, end, end), "half record": (recs[-1][0],) * 3,
            "crc at the tail": (recs[-1][0], end, recs[-1][0]),
            "crc before the last records": (end, end, recs[-3][0]),
            "missing segment": (3 * SEG,) * 3, "short file": (end, end, end)}[kind]


@pytest.mark.parametrize("kind, verify_says, splits_say, broker_says", CASES)
def test_every_walk_gives_a_valid_end_with_the_old_spellings(tmp_path, kind, verify_says,
                                                              splits_say, broker_says):
    if not ROCKETMQ_498.is_dir():
        pytest.skip("fixtures")
    root = copy_store(ROCKETMQ_498 / "basic", tmp_path / "s")
    _damage(kind, root)
    v_end, s_end, b_end = _ends(kind)

    r = verify(root)
    assert (r.end, r.end_reason) == (v_end, verify_says)
    line = next(f.explanation for f in r.findings if f.code == "commitlog-end")
    assert line.endswith(f"; stops: {verify_says}")
    ve = r.scan.valid_end
    assert isinstance(ve, ValidEnd) and ve.offset == v_end and ve.records == _at(v_end)
    assert VERIFY_SPELLING.get(ve.reason, ve.reason) == verify_says

    _, st = commitlog_stats(str(root), processes=1)
    assert isinstance(st, ValidEnd)
    assert (st.end_offset, st.offset, st.reason, st.min_offset) == (s_end, s_end, splits_say, 0)
    assert st.records == _at(s_end)

    with CommitLog(load_config(root)) as cl:
        fe = cl.find_end()
    assert isinstance(fe, ValidEnd)
    assert (fe.offset, fe.reason, fe.records) == (b_end, broker_says, _at(b_end))
    assert fe.last_record == _records()[_at(b_end) - 1][0]

    for reason in (ve.reason, st.reason, fe.reason):
        assert reason in REASONS


def test_the_segment_scan_carries_one():
    if not ROCKETMQ_498.is_dir():
        pytest.skip("fixtures")
    last, size = _records()[-1]
    seg = last - last % SEG
    data = (ROCKETMQ_498 / "basic" / "commitlog" / f"{seg:020d}").read_bytes()
    got = scan_buffer(data, seg, len(data))
    assert got.valid_end == ValidEnd(last + size, "zeros", _at(last + size) - _at(seg))
    assert (got.end, got.stop) == (last + size, "zeros")


def test_the_verify_spellings_name_reasons():
    assert set(VERIFY_SPELLING) <= set(REASONS)


# --- the two rules for bodies failing their CRC (format.rules), stated once each --------

T, F = True, False


@pytest.mark.parametrize("crc_ok, kept", [
    ([], 0), ([T, T, T], 3), ([F, T, T], 0), ([T, F, T], 1), ([T, T, F], 2), ([F, F], 0),
])
def test_the_broker_stops_at_the_first_crc_failure(crc_ok, kept):
    assert broker_end(crc_ok) == kept
    assert broker_end(np.array(crc_ok, bool)) == kept


@pytest.mark.parametrize("crc_ok, finished, kept", [
    ([], False, 0), ([T, T, T], False, 3),
    ([T, F, T], False, 3),  # damage in place: a record that passes follows
    ([T, T, F], False, 2), ([T, F, F], False, 1), ([F, F], False, 0),  # torn tails
    ([F, T, F, T], False, 4),
    ([T, T, F], True, 3),  # a segment finished at its BLANK has no torn tail
])
def test_rmqstore_cuts_only_a_torn_tail(crc_ok, finished, kept):
    assert rmqstore_end(crc_ok, finished) == kept
    assert rmqstore_end(np.array(crc_ok, bool), finished) == kept
