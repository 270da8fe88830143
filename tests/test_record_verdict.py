"""Is this a whole record: one rule (spec §3.9's framing and size rule), written once in
``rmqstore.format.record.record_fits``, and every form of it answers alike on the same
golden headers: the scalar rule, the broker-faithful check (``files.commitlog``), the
resync check of the split walk (``scan.splits``) and the vector form (a chain walk, then
``scan.records.consistent``).

The golden record is the spec's §12.3 (254 bytes, v1, IPv4 hosts, PHYSICALOFFSET 2048)
and its minimal v2 record (93 bytes); each variant changes one field by hand, and its
verdict is worked out from the spec, not from the code.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rmqstore.files.commitlog import Check, check_record
from rmqstore.format.record import FIT_VERDICTS, record_fits
from rmqstore.scan import splits
from rmqstore.scan.records import scan_buffer
from test_codec import PROPS_533, VECTOR_123_HEX

SPEC = bytes.fromhex(VECTOR_123_HEX.replace(" ", "")) + PROPS_533.encode()
V1, V2, BLANK = 0xDAA320A7, 0xDAA320AB, 0xCBD43194
PHYS = 2048  # the §12.3 record's PHYSICALOFFSET


def put(raw: bytes, at: int, value: int, width: int) -> bytes:
    return raw[:at] + value.to_bytes(width, "big", signed=value < 0) + raw[at + width:]


# §12.3's minimal v2 record: topic "T", no body, no properties, the same hosts and
# timestamps, every other field 0: 88 fixed bytes + 2-byte topic length + 1 + 2 = 93.
_V2 = put(put(put(put(put(SPEC[:0x58], 0, 93, 4), 4, V2, 4), 8, 0, 4), 12, 0, 4), 0x14, 0, 8)
_V2 = put(put(_V2, 0x1C, PHYS, 8), 0x54, 0, 4) + b"\x00\x01T\x00\x00"
assert len(_V2) == 93 and len(SPEC) == 254

#: (name, bytes, bytes of data from 0, verdict by the spec)
CASES = [
    ("the 12.3 record", SPEC, 254, 254),
    ("followed by more data", SPEC + bytes(300), 554, 254),
    ("the minimal v2 record", _V2, 93, 93),
    # A negative body or properties length means none: the broker reads nothing and its
    # calMsgLength counts max(length, 0) (spec §3.9, layout.record_size).
    ("a negative body length, no body", put(_V2, 0x54, -1, 4), 93, 93),
    ("a negative properties length, no properties", put(_V2, 91, -1, 2), 93, 93),
    ("a v1 magic on the v2 record", put(_V2, 4, V1, 4), 93, "half record"),  # 1-byte topic length 0
    ("TOTALSIZE one past the data", SPEC, 253, "bad size"),
    ("TOTALSIZE below the smallest record", put(SPEC, 0, 90, 4), 254, "bad size"),
    ("TOTALSIZE one more than the fields", put(SPEC, 0, 255, 4) + b"\x00", 255, "half record"),
    ("topic length one more", put(SPEC, 0x66, 10, 1), 254, "half record"),
    ("topic length negative", put(SPEC, 0x66, -1, 1), 254, "half record"),
    ("properties length one less", put(SPEC, 0x70, 139, 2), 254, "half record"),
    ("properties length negative", put(SPEC, 0x70, -140, 2), 254, "half record"),
    ("body length negative", put(SPEC, 0x54, -14, 4), 254, "half record"),
    ("body length past the data", put(SPEC, 0x54, 1 << 20, 4), 254, "half record"),
    ("an IPv6 born host bit on IPv4 bytes", put(SPEC, 0x24, 0x10, 4), 254, "half record"),
    ("a bad magic", put(SPEC, 4, 0x12345678, 4), 254, "bad magic"),
    ("zeros", bytes(300), 300, "zeros"),
    ("a BLANK", put(bytes(8), 4, BLANK - (1 << 32), 4), 8, "blank"),
    ("no data", SPEC, 0, "end"),
    ("a partial header", SPEC, 7, "short"),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name, raw, left, verdict", CASES, ids=IDS)
def test_the_rule(name, raw, left, verdict):
    assert verdict in FIT_VERDICTS or verdict == int.from_bytes(raw[:4], "big")
    buf = b"\xee" * 3 + raw  # read at an offset: nothing before it matters
    assert record_fits(buf, 3, left) == verdict


@pytest.mark.parametrize("name, raw, left, verdict", CASES, ids=IDS)
def test_the_vector_form_agrees(name, raw, left, verdict):
    got = scan_buffer(raw, PHYS, left)
    if isinstance(verdict, int):
        assert got.records.pos[:1].tolist() == [0] and got.records.size[:1].tolist() == [verdict]
    else:
        assert (len(got.records), got.end, got.stop) == (0, PHYS, verdict)


@pytest.mark.parametrize("name, raw, left, verdict", CASES, ids=IDS)
def test_the_broker_check_agrees(name, raw, left, verdict):
    c = check_record(raw, 0, left, check_crc=False)
    if isinstance(verdict, int):
        assert (c.status, c.size) == (Check.OK, verdict)
    elif verdict == "blank":
        assert c.status is Check.END_OF_SEGMENT
    else:
        assert c.status in (Check.FAIL, Check.FAIL_WITH_SIZE)


@pytest.mark.parametrize("name, raw, left, verdict", CASES, ids=IDS)
def test_resync_agrees(name, raw, left, verdict):
    split = SimpleNamespace(segment_size=1 << 20)
    w = SimpleNamespace(buf=raw, lo=0, hi=left, size=left, split=split, need=lambda upto: None)
    want = verdict if isinstance(verdict, int) else 0
    assert splits._record_ok(w, 0, PHYS, 1 << 20) == want
    # resync's own rules on top: PHYSICALOFFSET must be the position, the size at most
    # maxMessageSize + 64 KiB
    assert splits._record_ok(w, 0, PHYS + 1, 1 << 20) == 0
    if want:
        assert splits._record_ok(w, 0, PHYS, want - 1) == 0


def test_a_4_9_check_refuses_v2():
    assert record_fits(_V2, 0, 93, (V1 - (1 << 32),)) == "bad magic"
    assert check_record(_V2, 0, 93, magics=(V1 - (1 << 32),)).status is Check.FAIL


def test_the_broker_check_keeps_its_reasons():
    """The texts ``verify`` shows after "a torn record (header says N bytes; …)" and
    ``follow`` matches: the check's reasons did not change with the shared rule."""
    def why(raw, left=None, **kw):
        return check_record(raw, 0, len(raw) if left is None else left, **kw).reason
    # topic length 10: the properties length is read from 8c 4d, negative, so it counts
    # as none: 88 + 14 + 1 + 10 + 2 = 115
    assert why(put(SPEC, 0x66, 10, 1)) == "size field says 254, fields add up to 115"
    assert why(put(SPEC, 0x70, 300, 2)) == "record fields run past the end of the data"
    assert why(put(SPEC, 0x58, 0, 1)) == "body CRC mismatch"
    # the broker checks the body before it reads the topic length (spec §3.9)
    assert why(put(put(SPEC, 0x58, 0, 1), 0x66, 10, 1)) == "body CRC mismatch"
    assert why(bytes(300)) == "zeros"
    assert why(put(SPEC, 4, 0x12345678, 4)) == "bad magic 0x12345678"
    assert why(SPEC, 253) == "size 254 runs past the 253 bytes left"
    assert why(put(SPEC, 0, 40, 4)) == "size 40 is too small"
    assert why(SPEC, 4) == "no room for a record"
    assert why(SPEC) == ""
