"""The broker's dispatch rules, each defined once in rmqstore/format/rules.py, in their
scalar and numpy forms (spec §3.2, §6.1, §7.3). Expectations come from the spec's table
of transaction types, not from the code."""

from __future__ import annotations

import numpy as np
import pytest

from rmqstore.format import layout as L, rules as R

# (SYSFLAG transaction bits, name, gets a ConsumeQueue unit and a queue offset, puts keys)
SPEC = [(0x0, "NOT_TYPE", True, True), (0x4, "PREPARED", False, True),
        (0x8, "COMMIT", True, True), (0xC, "ROLLBACK", False, False)]
#: Other SYSFLAG bits (compressed, multi-tags, born/store host v6, inner batch): no effect.
OTHER_BITS = [0, 0x1, 0x2, 0x10 | 0x20, 0x80, 0x1 | 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x700]


@pytest.mark.parametrize("tx,name,unit,keys", SPEC)
def test_transaction_rules_scalar(tx, name, unit, keys):
    for other in OTHER_BITS:
        flag = tx | other
        assert R.gets_cq_unit(flag) is unit, (name, hex(flag))
        assert R.advances_queue_offset(flag) is unit, (name, hex(flag))
        assert R.gets_index_keys(flag) is keys, (name, hex(flag))
        assert bool(flag & R.NO_QUEUE_OFFSET_BIT) is not unit  # the single-put inline form


def test_transaction_rules_numpy_match_the_table():
    flags = np.array([tx | other for tx, *_ in SPEC for other in OTHER_BITS], np.int32)
    unit = np.array([u for _, _, u, _ in SPEC for _ in OTHER_BITS])
    keys = np.array([k for *_, k in SPEC for _ in OTHER_BITS])
    for dtype in (np.int32, np.int64):
        f = flags.astype(dtype)
        assert (R.gets_cq_unit(f) == unit).all()
        assert (R.advances_queue_offset(f) == unit).all()
        assert (R.gets_index_keys(f) == keys).all()


def test_index_keys_order_and_rollback():
    """``topic#UNIQ_KEY`` first, then each KEYS token split on single spaces, empty tokens
    dropped (spec §7.3); none at all for ROLLBACK."""
    assert R.index_keys("T", "U1", "a  b c ") == ["T#U1", "T#a", "T#b", "T#c"]
    assert R.index_keys("T", None, ["x", "", "y"]) == ["T#x", "T#y"]
    assert R.index_keys("T", "", None) == ["T#"]  # an empty UNIQ_KEY is still a key
    assert R.index_keys("T", "U1", "a", 0x8) == ["T#U1", "T#a"]
    assert R.index_keys("T", "U1", "a", 0x4) == ["T#U1", "T#a"]
    assert R.index_keys("T", "U1", "a", 0xC) == []


def test_tags_code_is_the_tags_hash_or_the_delivery_time():
    """spec §6.1: the Java hash of TAGS (0 without), or for SCHEDULE_TOPIC_XXXX with a
    DELAY level the store time plus that level's delay (level 3 = 10 s by default)."""
    assert R.tags_hash(None) == 0 and R.tags_hash("") == 0
    assert R.tags_hash("polygenelubricants") == -(2**31)  # a known Java hashCode
    assert R.tags_code("T", {"TAGS": "polygenelubricants"}, 5) == -(2**31)
    assert R.tags_code("T", {"DELAY": "3"}, 1000) == 0
    assert R.tags_code(R.SCHEDULE_TOPIC, {"DELAY": "3", "TAGS": "x"}, 1000) == 11_000


# --- magic (spec §3.1; RocketMQ 5.x CommitLog#asyncPutMessage: topic String.length() > 127) ---

@pytest.mark.parametrize("topic,java_len", [
    ("t" * 127, 127), ("t" * 128, 128),
    ("é" * 100, 100),  # 200 UTF-8 bytes, 100 Java chars
    ("😀" * 64, 128),  # 64 Python chars, 256 UTF-8 bytes, 128 UTF-16 code units
    ("😀" * 63 + "a", 127),
])
def test_java_length_counts_utf16_code_units(topic, java_len):
    assert R.java_length(topic) == java_len


def test_magic_v2_exactly_above_127_java_characters():
    assert R.magic_for("t" * 127) == L.MAGIC_V1
    assert R.magic_for("t" * 128) == L.MAGIC_V2
    # UTF-8 length 200 > 127, Java length 100: v1 (the UTF-8 rule would say v2).
    assert R.magic_for("é" * 100) == L.MAGIC_V1
    # Java length 128 from 64 astral characters: v2 (a Python-len rule would say v1).
    assert R.magic_for("😀" * 64) == L.MAGIC_V2
    assert R.magic_for("😀" * 63 + "a") == L.MAGIC_V1


def test_magic_asked_for_or_rule_off():
    assert R.magic_for("T", L.MAGIC_V2) == L.MAGIC_V2  # the message asks for v2
    assert R.magic_for("t" * 200, auto=False) == L.MAGIC_V1  # 4.9: no auto rule
    assert R.magic_for("t" * 200, L.MAGIC_V2, auto=False) == L.MAGIC_V2
