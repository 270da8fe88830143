"""The construct schemas are the reference; the derived struct and numpy forms must agree
with them byte for byte, and the schemas must match the spec's fixed sizes and vectors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rmqstore.format import layout as L

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
i16 = st.integers(-(2**15), 2**15 - 1)


def _values_for(con):
    """A Hypothesis strategy of flat value tuples for a fixed schema."""
    fields = L._flatten(con)
    strategies = []
    for name, code in fields:
        if not name:
            continue
        kind = code[-1]
        if kind == "s":
            strategies.append(st.binary(min_size=int(code[:-1]), max_size=int(code[:-1])))
        else:
            strategies.append({"b": st.integers(-128, 127), "h": i16, "l": i32, "i": i32, "q": i64}[kind])
    return st.tuples(*strategies)


def _nest(con, values):
    """Flat values -> the nested dict construct builds from."""
    it = iter(values)

    def build(c):
        out = {}
        for sub in c.subcons:
            inner = sub.subcon
            while type(inner).__name__ in ("Rebuild", "Const", "Renamed"):
                inner = inner.subcon
            if type(inner).__name__ == "Struct":
                out[sub.name] = build(inner)
            elif sub.name:
                out[sub.name] = next(it)
        return out

    return build(con)


FIXED = {
    "cq_unit": L.ConsumeQueueUnit,
    "bcq_unit": L.BatchConsumeQueueUnit,
    "index_header": L.IndexHeader,
    "index_entry": L.IndexEntry,
    **{f"record_fixed_{b}{s}": L.RECORD_FIXED[b, s] for b in (0, 1) for s in (0, 1)},
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_sizes_agree(name):
    con = FIXED[name]
    assert L.derive_struct(con).size == con.sizeof() == L.derive_dtype(con).itemsize


def test_sizes_match_the_spec():
    assert L.CQ_UNIT_SIZE == 20
    assert L.BCQ_UNIT_SIZE == 46
    assert L.INDEX_HEADER_SIZE == 40 and L.INDEX_ENTRY_SIZE == 20 and L.INDEX_SLOT_SIZE == 4
    assert L.RECORD_FIXED_SIZE[False, False] == 88  # spec §3.1: IPv4 fixed part
    assert L.RECORD_FIXED_SIZE[True, True] == 112
    assert L.index_file_size(5_000_000, 20_000_000) == 420_000_040
    assert L.index_entry_position(5_000_000, 0) == 20_000_040
    assert L.CheckpointV4.sizeof() == L.CheckpointV5.sizeof() == 4096
    assert L.OFFSET_OF == {"total_size": 0, "magic": 4, "body_crc": 8, "queue_id": 12, "flag": 16,
                           "queue_offset": 20, "physical_offset": 28, "sys_flag": 36,
                           "born_timestamp": 40}


@pytest.mark.parametrize("name", sorted(FIXED))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_struct_and_dtype_encode_like_construct(name, data):
    con = FIXED[name]
    values = data.draw(_values_for(con))
    built = con.build(_nest(con, values))
    assert L.derive_struct(con).pack(*values) == built
    assert L.derive_struct(con).unpack(built) == values
    row = np.frombuffer(built, dtype=L.derive_dtype(con))[0]
    flat = []
    for field_name in L.derive_fields(con):
        v = row[field_name]
        flat.append(bytes(v) if isinstance(v, np.ndarray) else int(v))
    assert tuple(flat) == values


@settings(max_examples=80, deadline=None)
@given(
    sys_flag=st.integers(0, 0x7FF), magic=st.sampled_from(L.MESSAGE_MAGICS),
    body=st.binary(max_size=300), topic=st.binary(min_size=1, max_size=127),
    props=st.binary(max_size=200), nums=st.tuples(i32, i32, i32, i64, i64, i64, i64, i32, i64),
)
def test_record_schema_round_trips_and_fixed_prefix_matches(sys_flag, magic, body, topic, props, nums):
    crc, qid, flag, qoff, phys, born, store, recon, prep = nums
    b6, s6 = bool(sys_flag & 0x10), bool(sys_flag & 0x20)
    host = lambda v6: {"address": (b"\x20" * 16 if v6 else b"\x0a\x00\x00\x01"), "port": 10911}
    obj = dict(magic=magic, body_crc=crc, queue_id=qid, flag=flag, queue_offset=qoff,
               physical_offset=phys, sys_flag=sys_flag, born_timestamp=born, born_host=host(b6),
               store_timestamp=store, store_host=host(s6), reconsume_times=recon,
               prepared_transaction_offset=prep, body=body, topic=topic, properties=props)
    raw = L.CommitLogRecord.build(obj)
    assert len(raw) == L.record_size(sys_flag, magic, len(body), len(topic), len(props))
    parsed = L.CommitLogRecord.parse(raw)
    assert parsed.total_size == len(raw) and parsed.body == body and parsed.topic == topic
    fixed = L.RECORD_FIXED_STRUCT[b6, s6].unpack_from(raw)
    names = L.RECORD_FIXED_FIELDS[b6, s6]
    by_name = dict(zip(names, fixed))
    assert by_name["total_size"] == len(raw)
    assert by_name["queue_offset"] == qoff and by_name["store_timestamp"] == store
    assert by_name["body_length"] == len(body)


def test_blank_record_vector():
    # spec §12.7: BLANK at position 1073741000 of a 1 GiB segment
    assert L.BlankRecord.build({"total_size": 1073741824 - 1073741000}) == bytes.fromhex("00000338CBD43194")


def test_cq_placeholder_vector():
    # spec §12.7
    raw = L.ConsumeQueueUnit.build(dict(commit_log_offset=0, size=L.CQ_PLACEHOLDER_SIZE, tags_code=0))
    assert raw == bytes.fromhex("0000000000000000 7FFFFFFF 0000000000000000".replace(" ", ""))
    assert L.CQ_UNIT_STRUCT.pack(0, L.CQ_PLACEHOLDER_SIZE, 0) == raw


def test_checkpoint_layouts():
    v4 = L.CheckpointV4.build(dict(physic_msg_timestamp=1, logics_msg_timestamp=2, index_msg_timestamp=3))
    assert v4[:24] == L.CHECKPOINT_V4_STRUCT.pack(1, 2, 3) and v4[24:] == bytes(4072)
    v5 = L.CheckpointV5.build(dict(physic_msg_timestamp=1, logics_msg_timestamp=2, index_msg_timestamp=3,
                                   master_flushed_offset=4, confirm_phy_offset=5))
    assert v5[:40] == L.CHECKPOINT_V5_STRUCT.pack(1, 2, 3, 4, 5) and len(v5) == 4096


def test_ints_at_reads_the_big_endian_fields():
    """The one vectorised field gather (scan's record columns, a DLedger entry's record
    check) reads what the ``>b``/``>h``/``>i``/``>q`` structs read; a position with too
    few bytes left reads without raising (callers mask it)."""
    import random
    import struct

    rnd = random.Random(5)
    raw = bytes(rnd.randrange(256) for _ in range(300))
    u8 = np.frombuffer(raw, dtype=np.uint8)
    for width, code in ((1, ">b"), (2, ">h"), (4, ">i"), (8, ">q")):
        pos = np.array([0, 1, 7, 150, len(raw) - width], dtype=np.int64)
        assert L.ints_at(u8, pos, width).tolist() == \
            [struct.unpack_from(code, raw, p)[0] for p in pos.tolist()]
        assert len(L.ints_at(u8, np.array([len(raw) - width + 1, len(raw) + 9]), width)) == 2
    assert L.ints_at(u8[:3], np.array([0]), 4).tolist() == [0]
    assert L.ints_at(u8, np.zeros(0, dtype=np.int64), 4).dtype == np.int64
