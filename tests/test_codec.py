"""Codec: the spec's test vectors (§12), Hypothesis round trips, and Java's hashing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from rmqstore.format import layout as L
from rmqstore.format.message import (Host, Message, properties_need_text, decode_offset_msg_id,
                                     offset_msg_id, parse_properties, serialize_properties,
                                     split_keys)
from rmqstore.format.crc import body_crc
from rmqstore.format.record import decode_record, encode_record, set_head_field
from rmqstore.format.hashing import index_hash, index_hash_many, java_hash, java_hash_many
from rmqstore.format.rules import parse_delay_levels, tags_code
from rmqstore.errors import InputError, RecordError

PROPS_533 = ("MSG_REGION\x01DefaultRegion\x02UNIQ_KEY\x010A00000110922A9F1B6D496ED4000007\x02"
             "CLUSTER\x01DefaultCluster\x02TAGS\x01TagA\x02KEYS\x01OrderID188\x02WAIT\x01true\x02"
             "TRACE_ON\x01true\x02")
PROPS_498 = ("KEYS\x01OrderID188\x02UNIQ_KEY\x010A00000110922A9F1B6D496ED4000007\x02"
             "CLUSTER\x01DefaultCluster\x02TAGS\x01TagA")
VECTOR_123_HEX = (  # spec §12.3, the 5.3.3 record
    "000000fedaa320a769c865ed0000000300000000000000000000002a0000000000000800"
    "00000000000001 8bcfe56800c0a8000a0000d431000001 8bcfe5687bc0a800640000 2a9f"
    "000000000000000000000000 0000000e48656c6c6f20526f636b65744d510954 6f70696354657374008c")


def _vector_message(props: str) -> Message:
    return Message(topic="TopicTest", body=b"Hello RocketMQ", queue_id=3, queue_offset=42,
                   commit_log_offset=2048, born_timestamp=1700000000000,
                   born_host=Host.parse("192.168.0.10:54321"), store_timestamp=1700000000123,
                   store_host=Host.parse("192.168.0.100:10911"), properties_text=props)


def test_spec_record_vector_533():
    raw = encode_record(_vector_message(PROPS_533))
    assert len(raw) == 254
    assert raw.hex() == VECTOR_123_HEX.replace(" ", "") + PROPS_533.encode().hex()
    m = decode_record(raw)
    assert m.body_crc == 1774740973 and m.store_size == 254 and m.queue_offset == 42
    assert m.properties["KEYS"] == "OrderID188" and m.properties["TRACE_ON"] == "true"


def test_spec_record_vector_498():
    raw = encode_record(_vector_message(PROPS_498))
    assert len(raw) == 204 == int.from_bytes(raw[:4], "big")
    assert len(PROPS_498.encode()) == 90


def test_minimal_v2_record():
    m = Message(topic="T", magic=L.MAGIC_V2, born_timestamp=1700000000000,
                born_host=Host.parse("192.168.0.10:54321"), store_timestamp=1700000000123,
                store_host=Host.parse("192.168.0.100:10911"))
    raw = encode_record(m)
    assert len(raw) == 93 and raw[:8] == bytes.fromhex("0000005ddaa320ab")
    assert raw[-9:] == bytes.fromhex("00000000 0001 54 0000".replace(" ", ""))
    assert decode_record(raw).topic == "T"


def test_long_topic_gets_v2():
    m = Message(topic="%RETRY%" + "g" * 130)
    raw = encode_record(m)
    assert int.from_bytes(raw[4:8], "big", signed=True) == L.MAGIC_V2
    assert decode_record(raw).topic == m.topic


@pytest.mark.parametrize("topic,magic,tlen_width", [
    ("t" * 127, L.MAGIC_V1, 1), ("t" * 128, L.MAGIC_V2, 2),
    ("é" * 64, L.MAGIC_V1, 1),  # 128 UTF-8 bytes but 64 Java characters: v1 (spec §3.1)
    ("😀" * 64, L.MAGIC_V2, 2),  # 64 Python characters, 128 Java (UTF-16) characters: v2
])
def test_encoded_magic_follows_the_java_length_of_the_topic(topic, magic, tlen_width):
    raw = encode_record(Message(topic=topic))
    topic_b = topic.encode()
    assert int.from_bytes(raw[4:8], "big", signed=True) == magic
    # The topic length field sits before the topic, as wide as the magic says.
    at = raw.index(topic_b)
    assert int.from_bytes(raw[at - tlen_width:at], "big") == len(topic_b)
    assert raw[at - tlen_width - 4:at - tlen_width] == bytes(4)  # BODYLENGTH 0 before it


@pytest.mark.parametrize("v6", [False, True])
def test_set_head_field_is_encode_record_with_that_field(v6):
    """The vector field setter the bench generators use gives the bytes encode_record
    gives the message with those fields, for rows of one size and for starts in a blob."""
    import dataclasses
    import numpy as np
    host = Host.parse("[2001:db8::1]:10911" if v6 else "10.0.0.1:10911")
    msgs = [Message(topic="T", body=b"x" * k, properties={"KEYS": "k"}, store_host=host,
                    born_host=host) for k in (3, 3, 7)]
    vals = {"queue_offset": [5, 2**40, 7], "physical_offset": [0, 99, 2**50],
            "store_timestamp": [1, 2, 3], "flag": [-1, 0, 2**31 - 1]}
    want = [encode_record(dataclasses.replace(
        m, queue_offset=vals["queue_offset"][i], commit_log_offset=vals["physical_offset"][i],
        store_timestamp=vals["store_timestamp"][i], flag=vals["flag"][i]))
        for i, m in enumerate(msgs)]
    raw = [encode_record(m) for m in msgs]
    rows = np.frombuffer(b"".join(raw[:2]), np.uint8).reshape(2, -1).copy()
    blob = np.frombuffer(b"".join(raw), np.uint8).copy()
    starts = np.cumsum([0] + [len(r) for r in raw[:-1]])
    for name, v in vals.items():
        set_head_field(rows, name, np.array(v[:2]), key=(v6, v6))
        set_head_field(blob, name, np.array(v), starts, key=(v6, v6))
    assert rows.tobytes() == b"".join(want[:2])
    assert blob.tobytes() == b"".join(want)


def test_offset_msg_id_vectors():
    host = Host.parse("192.168.0.100:10911")
    assert offset_msg_id(host, 2048) == "C0A8006400002A9F0000000000000800"
    assert decode_offset_msg_id("C0A8006400002A9F0000000000000800") == (host, 2048)
    v6 = Host.parse("[2001:db8::1]:10911")
    mid = offset_msg_id(v6, 4294967296)
    assert mid == "20010DB800000000000000000000000100002A9F0000000100000000"
    assert decode_offset_msg_id(mid) == (v6, 4294967296)
    assert str(v6) == "[2001:db8:0:0:0:0:0:1]:10911"  # Java's text form
    with pytest.raises(InputError):
        decode_offset_msg_id("XYZ")


def test_ipv4_mapped_is_stored_as_ipv4():
    assert Host.parse("[::ffff:192.0.2.1]:5").address == bytes([192, 0, 2, 1])


def test_index_vectors():
    # spec §12.6
    assert index_hash("TopicTest#0A00000110922A9F1B6D496ED4000007") == 1435148114
    assert index_hash("TopicTest#OrderID188") == 1231271670
    assert index_hash("TopicTest#OrderID189") == 1231271669
    assert java_hash("polygenelubricants") == -(2**31)
    assert index_hash("polygenelubricants") == 0  # MIN_VALUE rule, spec §7.2


def test_tags_code_and_delay():
    assert tags_code("T", {"TAGS": "TagA"}, 0) == java_hash("TagA")
    assert tags_code("T", {}, 5) == 0
    # spec §12.7: DELAY=3 (10 s) stored at 1700000000123
    assert tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "3", "TAGS": "x"}, 1700000000123) == 1700000010123
    assert tags_code("SCHEDULE_TOPIC_XXXX", {"DELAY": "25"}, 0) == 2 * 3600 * 1000  # clamped to 18
    assert parse_delay_levels()[17] == 7_200_000


def test_properties_parsing_rules():
    assert parse_properties("a\x01b\x02c\x01d") == {"a": "b", "c": "d"}
    assert parse_properties("a\x01b\x02") == {"a": "b"}
    assert parse_properties("\x01x\x02k\x01\x02ab\x02k\x01v\x01w") == {"k": "v\x01w"}
    assert parse_properties("a\x011\x02a\x012") == {"a": "2"}  # later value wins
    assert serialize_properties({"a": "1", "b": None, "c": "3"}) == "a\x011\x02c\x013"
    assert serialize_properties({"a": "1"}, trailing=True) == "a\x011\x02"
    assert split_keys("a  b ") == ["a", "b"] and split_keys("   ") == []


@st.composite
def messages(draw):
    text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=12)
    props = draw(st.dictionaries(text, text, max_size=5))
    v6 = st.booleans()
    host = lambda six: Host(draw(st.binary(min_size=16, max_size=16)) if six else draw(st.binary(min_size=4, max_size=4)),
                            draw(st.integers(0, 65535)))
    return Message(
        topic=draw(st.text("abcXYZ_-%|0123456789", min_size=1, max_size=127)),
        body=draw(st.binary(max_size=500)), properties=props,
        queue_id=draw(st.integers(0, 2**31 - 1)), flag=draw(st.integers(-(2**31), 2**31 - 1)),
        sys_flag=draw(st.sampled_from([0, 1, 2, 4, 8, 12, 0x301])),
        born_timestamp=draw(st.integers(0, 2**62)), born_host=host(draw(v6)),
        store_timestamp=draw(st.integers(0, 2**62)), store_host=host(draw(v6)),
        reconsume_times=draw(st.integers(0, 100)), prepared_transaction_offset=draw(st.integers(0, 2**40)),
        queue_offset=draw(st.integers(0, 2**40)), commit_log_offset=draw(st.integers(0, 2**50)))


@settings(max_examples=150, deadline=None)
@given(msg=messages(), trailing=st.booleans())
def test_encode_decode_round_trip(msg, trailing):
    raw = encode_record(msg, trailing_separator=trailing)
    d = decode_record(raw)
    assert encode_record(d) == raw  # properties_text keeps the exact stored form
    assert (d.topic, d.body, d.properties, d.queue_id, d.flag, d.born_host, d.store_host,
            d.store_timestamp, d.queue_offset, d.commit_log_offset) == (
        msg.topic, msg.body, msg.properties, msg.queue_id, msg.flag, msg.born_host,
        msg.store_host, msg.store_timestamp, msg.queue_offset, msg.commit_log_offset)
    assert d.body_crc == body_crc(msg.body) and d.store_size == len(raw)
    parsed = L.CommitLogRecord.parse(raw)  # the construct reference agrees
    assert parsed.total_size == len(raw) and parsed.body == msg.body
    assert L.CommitLogRecord.build(parsed) == raw


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=40))
def test_java_hash_many_matches_scalar(strings):
    assert java_hash_many(strings).tolist() == [java_hash(s) for s in strings]
    assert index_hash_many(strings).tolist() == [index_hash(s) for s in strings]


def test_decode_rejects_damage():
    raw = bytearray(encode_record(_vector_message(PROPS_498)))
    with pytest.raises(RecordError, match="bad magic"):
        decode_record(bytes(raw[:4]) + b"\0\0\0\0" + bytes(raw[8:]))
    with pytest.raises(RecordError, match="does not fit"):
        decode_record(bytes(raw[:100]))
    raw[8] ^= 0xFF
    with pytest.raises(RecordError, match="CRC"):
        decode_record(bytes(raw), check_crc=True)
    assert decode_record(bytes(raw)).topic == "TopicTest"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "k", "\x01", "\x02", "é", "v"]), max_size=14).map("".join))
def test_properties_need_text_is_exact(text):
    props = parse_properties(text)
    plain = serialize_properties(props)
    reproducible = text in (plain, plain + "\x02" if plain else plain)
    assert properties_need_text(props, text) == (not reproducible)


#: spec §12.1: (string, topic#token split or None, hashCode, index keyHash, slot of 5,000,000).
SPEC_12_1 = [
    ("TagA", None, 2598919, 2598919, 2598919),
    ("OrderID188", None, -1566895736, 1566895736, 1895736),
    ("TopicTest#OrderID188", ("TopicTest", "OrderID188"), -1231271670, 1231271670, 1271670),
    ("订单-123", None, -596558504, 596558504, 1558504),
    ("TopicTest#订单-123", ("TopicTest", "订单-123"), -1725004326, 1725004326, 4326),
    ("TopicTest#key\U0001F600", ("TopicTest", "key\U0001F600"), 205860672, 205860672, 860672),
    ("polygenelubricants", None, -(2**31), 0, 0),  # Math.abs(MIN_VALUE) is negative: 0
    ("TopicTest#key-qqhdwuj", ("TopicTest", "key-qqhdwuj"), -(2**31), 0, 0),
]


def test_every_hash_form_gives_the_spec_12_1_values():
    """Each form of the one hash rule (rmqstore/format/hashing.py: scalar, per-string
    vector, matrix, per-topic token, byte span, from parts) against the spec's table,
    MIN_VALUE keys (H7, H8) included, not against one another."""
    import numpy as np

    from rmqstore.format.hashing import (index_abs, index_abs_many, index_hash_from, index_hashes,
                                         prefix_hash, span_hash, token_hash, token_hashes)

    strings = [row[0] for row in SPEC_12_1]
    codes = [row[2] for row in SPEC_12_1]
    keys = [row[3] for row in SPEC_12_1]
    assert [java_hash(x) for x in strings] == codes
    assert java_hash_many(strings).tolist() == codes
    assert [index_hash(x) for x in strings] == keys
    assert [index_hash(x) % 5_000_000 for x in strings] == [row[4] for row in SPEC_12_1]
    assert index_hash_many(strings).tolist() == keys
    assert index_hashes(strings).tolist() == keys
    assert [index_abs(c) for c in codes] == keys
    unsigned = np.array([c & 0xFFFFFFFF for c in codes], np.uint64)
    assert index_abs_many(unsigned).tolist() == keys
    assert index_abs_many(unsigned.astype(np.int64) - 2**32 * (unsigned >= 2**31)).tolist() == keys
    # Byte spans of a mapped buffer (UTF-8 on disk, hashed as UTF-16: H4, H6), padded so
    # the vectorised path takes every ASCII span.
    raw = [x.encode() for x in strings]
    buf = np.frombuffer(b"".join(raw) + bytes(256), np.uint8)
    pos = np.cumsum([0] + [len(r) for r in raw[:-1]])
    h, units = span_hash(buf, pos, np.array([len(r) for r in raw]))
    assert h.tolist() == [c & 0xFFFFFFFF for c in codes]
    assert units.tolist() == [len(x.encode("utf-16-be", "surrogatepass")) // 2 for x in strings]
    for (text, split, code, key, _slot) in SPEC_12_1:
        if split is None:
            continue
        topic, token = split
        assert token_hash(prefix_hash(topic), topic, token) == key, text
        ascii_only = token.isascii()
        vec = token_hashes(prefix_hash(topic), [token])
        assert (vec.tolist() == [key]) if ascii_only else vec is None, text
        many = token_hashes(np.array([prefix_hash(topic)] * 2, np.uint64), [token, token])
        assert (many.tolist() == [key] * 2) if ascii_only else many is None, text
        tb, kb = topic.encode(), token.encode()
        u8 = np.frombuffer(tb + kb + bytes(256), np.uint8)
        th, _ = span_hash(u8, np.array([0]), np.array([len(tb)]))
        kh, ku = span_hash(u8, np.array([len(tb)]), np.array([len(kb)]))
        assert index_hash_from(th, kh, ku).tolist() == [key], text