"""Where a walk along the TOTALSIZE chain stops, and why (spec §3.9, §4): one rule,
``rmqstore.format.record.chain_step``, used by the segment walk (scan.records) and the
split walk (scan.splits). Golden values are the spec's: magics 0xDAA320A7 (v1),
0xDAA320AB (v2), 0xCBD43194 (BLANK); the smallest record is 91 bytes (IPv4 hosts, no
body, 1-byte topic length, empty topic, no properties: fixtures README)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rmqstore.format import layout as L
from rmqstore.format.record import CHAIN_VERDICTS, chain_step
from rmqstore.scan import records, splits

V1, V2, BLANK = 0xDAA320A7, 0xDAA320AB, 0xCBD43194


def head(total: int, magic: int) -> bytes:
    return total.to_bytes(4, "big", signed=True) + magic.to_bytes(4, "big")


#: (bytes from the position on, verdict)
CASES = [
    (b"", "end"),
    (b"\x00\x00\x00", "short"),
    (head(8, BLANK), "blank"),
    (head(1000, BLANK), "blank"),  # a BLANK's size is never checked
    (bytes(16), "zeros"),
    (head(91, 0x12345678) + bytes(83), "bad magic"),
    (head(0, V1), "bad size"),
    (head(90, V1) + bytes(82), "bad size"),  # one byte under the smallest record
    (head(200, V1) + bytes(92), "bad size"),  # runs past the data
    (head(91, V1) + bytes(83), "record"),
    (head(100, V2) + bytes(92), "record"),
]


def test_the_smallest_record_is_91_bytes():
    assert L.MIN_RECORD_SIZE == 91


@pytest.mark.parametrize("data, verdict", CASES)
def test_chain_step(data, verdict):
    assert verdict in CHAIN_VERDICTS
    buf = b"\xff" * 5 + data  # read at an offset: nothing before ``at`` matters
    assert chain_step(buf, 5, len(data)) == verdict


def _walks(data: bytes):
    """(starts, stop position, why) of both walkers over one 91-byte record + ``data``."""
    buf = head(91, V1) + bytes(83) + data
    vec = records.walk_range(buf, 0, len(buf), len(buf))
    w = SimpleNamespace(buf=buf, lo=0, hi=len(buf), size=len(buf), need=lambda upto: None)
    py = splits._walk(w, 0, len(buf))
    return [(list(map(int, s)), p, why) for s, p, why in (vec, py)]


@pytest.mark.parametrize("data, verdict", [c for c in CASES if c[1] != "record"])
def test_both_walkers_stop_for_the_same_reason(data, verdict):
    for starts, pos, why in _walks(data):
        assert (starts, pos, why) == ([0], 91, verdict)


def test_a_record_past_the_range_end_is_where_the_range_stops():
    buf = head(91, V1) + bytes(83) + head(91, V1) + bytes(83)
    assert records.walk_range(buf, 0, 91, len(buf))[1:] == (91, "range")
    w = SimpleNamespace(buf=buf, lo=0, hi=len(buf), size=len(buf), need=lambda upto: None)
    starts, pos, why = splits._walk(w, 0, 91)
    assert (list(starts), pos, why) == ([0], 91, "range")
    # and a broken header there is reported, not "range"
    bad = head(91, V1) + bytes(83) + head(5, V1) + bytes(83)
    assert records.walk_range(bad, 0, 91, len(bad))[1:] == (91, "bad size")
