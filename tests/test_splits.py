"""Split reading without Spark: every record read exactly once, whatever the split size.

Golden data: the fixtures' manifest ``commitlogWalk`` (RocketMQ's own walk) and, for
generated CommitLogs, the offsets the generator wrote. Generated logs carry the traps a
resync must survive: BLANK padding with stale records behind it (spec §4, the
transient-pool case), bodies full of magic bytes and of embedded fake records whose
PHYSICALOFFSET matches their position, a torn record followed by stale well-formed
records (spec §10.5), an all-zero tail and a pre-allocated zero segment (spec §2).
"""

from __future__ import annotations

import base64
import random
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore import stats as STATS
from rmqstore.format import layout as L
from rmqstore.scan import splits as S
from rmqstore.scan import arrow as AV
from rmqstore.format.message import Host, Message
from rmqstore.format.record import decode_record, encode_record

from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, manifest

pa = pytest.importorskip("pyarrow")

SEG = 16384


def _walk_offsets(scenario: str) -> list[int]:
    m = manifest(scenario)
    walk = m["commitlogWalk"] if "commitlogWalk" in m else m["recovery"]["commitlogWalk"]
    return [e["offset"] for e in walk if e["type"] == "MESSAGE"]


def _offsets(splits, task=None):
    """Absolute offsets of the records the stitched splits own, in split order."""
    def default(s):
        with S.open_split(s) as sc:
            return sc.boundary, (sc.records.pos + sc.records.base).tolist()
    st_, payloads = S.run_local(splits, task or default)
    return st_, [o for sid in sorted(payloads) for o in payloads[sid]]


# --- generated CommitLogs -----------------------------------------------------------------


def _record(rng: random.Random, offset: int, qo: int, body: bytes) -> bytes:
    return encode_record(Message(
        topic=rng.choice(["GenA", "GenB", "G" * 40]), body=body,
        properties={"TAGS": rng.choice(["t1", "t2"]), "KEYS": f"k{qo} x{qo % 7}", "UNIQ_KEY": f"U{qo:08d}"},
        queue_id=qo % 3, queue_offset=qo, commit_log_offset=offset, store_timestamp=1700000000000 + qo,
        born_timestamp=1700000000000, born_host=Host(b"\x0a\x00\x00\x01", 40000 + qo % 5),
        store_host=Host(b"\x0a\x00\x00\x02", 10911)))


def _fake_run(rng: random.Random, at: int, count: int) -> bytes:
    """``count`` consecutive well-formed records whose PHYSICALOFFSET fields say they start
    at absolute ``at``: what would fool a resync that trusts chaining alone."""
    out = b""
    for i in range(count):
        out += _record(rng, at + len(out), 900000 + i, b"fake")
    return out


def generate(tmp: Path, seed: int, *, torn: bool = True) -> list[int]:
    """Write a CommitLog under ``tmp/commitlog``; return the offsets a sequential walk
    must see. Fake and stale records are never among them."""
    rng = random.Random(seed)
    (tmp / "commitlog").mkdir(parents=True)
    files: list[bytearray] = [bytearray(SEG)]
    pos, qo, expected = 0, 0, []
    magic = struct.pack(">i", L.MAGIC_V1)
    for _ in range(rng.randint(40, 90)):
        kind = rng.random()
        base = (len(files) - 1) * SEG
        if kind < 0.2:
            body = (magic + bytes(rng.randrange(256) for _ in range(4))) * rng.randint(1, 60)
        elif kind < 0.35:
            # a body holding a run of fake records whose offsets match where they sit
            head = rng.randint(0, 9)
            fake_at = base + pos + L.RECORD_FIXED_SIZE[False, False] + head
            body = bytes(head) + _fake_run(rng, fake_at, rng.randint(4, 6)) + b"tail"
        else:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 900)))
        rec = _record(rng, base + pos, qo, body)
        if len(rec) + 8 > SEG - pos:  # spec §4: BLANK, then the next segment
            cur = files[-1]
            cur[pos:pos + 8] = struct.pack(">ii", SEG - pos, L.MAGIC_BLANK)
            stale = _record(rng, base + pos + 8, 777, b"stale")  # stale but self-consistent
            if rng.random() < 0.7 and pos + 8 + len(stale) <= SEG:
                cur[pos + 8:pos + 8 + len(stale)] = stale
            files.append(bytearray(SEG))
            pos, base = 0, base + SEG
            rec = _record(rng, base, qo, body if len(body) < 2000 else b"x")
        files[-1][pos:pos + len(rec)] = rec
        expected.append(base + pos)
        pos += len(rec)
        qo += 1
    if torn:
        # spec §10.5: a torn record, then stale records with correct PHYSICALOFFSETs
        base = (len(files) - 1) * SEG
        rec = _record(rng, base + pos, qo, b"torn" * 20)
        if pos + len(rec) + 600 < SEG:
            t = bytearray(rec)
            t[len(t) // 2:] = bytes(len(t) - len(t) // 2)
            files[-1][pos:pos + len(t)] = t
            p2 = pos + len(t)
            stale = _fake_run(rng, base + p2, 3)
            files[-1][p2:p2 + len(stale)] = stale
    files.append(bytearray(SEG))  # pre-allocated, all zero
    for i, f in enumerate(files):
        (tmp / "commitlog" / f"{i * SEG:020d}").write_bytes(bytes(f))
    return expected


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = {}
    for seed in range(4):
        d = tmp_path_factory.mktemp(f"gen{seed}")
        out[seed] = (str(d), generate(d, seed))
    return out


def test_generated_log_is_what_the_reference_walk_sees(generated):
    """The generator's expectation agrees with the codec reading the file sequentially."""
    from rmqstore.files.commitlog import CommitLog
    from rmqstore.files.config import load_config

    for root, expected in generated.values():
        with CommitLog(load_config(root)) as cl:
            assert [m.commit_log_offset for m in cl.messages()] == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 3), split_size=st.one_of(st.integers(24, 300), st.integers(300, 20000)))
def test_generated_every_record_exactly_once(generated, seed, split_size):
    root, expected = generated[seed]
    splits = S.plan_splits([root], split_size)
    st_, got = _offsets(splits)
    assert got == expected
    assert st_.records == len(expected)
    assert st_.ends[root].reason == "half record"


def test_embedded_fake_records_fool_resync_and_stitching_repairs_it(generated):
    """A split starting inside a body that holds fake records with matching offsets
    resyncs onto them (rules 1-5 cannot tell); the driver's chain check re-reads it."""
    fooled = 0
    for root, expected in generated.values():
        exp = set(expected)
        for size in (37, 101, 263):
            splits = S.plan_splits([root], size)
            for s in splits:
                if s.begin == 0:
                    continue
                b = S.split_boundary(s)
                if b.first is not None and s.file_start + b.first not in exp and b.records:
                    fooled += 1
            _, got = _offsets(splits)
            assert got == expected
    assert fooled > 0


def test_split_inside_blank_padding_owns_nothing(generated):
    root, expected = generated[0]
    files = sorted((Path(root) / "commitlog").iterdir())
    data = files[0].read_bytes()
    # the BLANK of the first segment: the first position after the last record there
    last = max(o for o in expected if o < SEG)
    blank_at = last + decode_record(data, last).store_size
    assert struct.unpack_from(">i", data, blank_at + 4)[0] == L.MAGIC_BLANK
    sp = S.plan_splits([root], SEG)[0]
    for begin in (blank_at + 1, blank_at + 8, min(blank_at + 20, SEG - 1)):
        s = S.Split(0, root, sp.path, 0, 0, SEG, SEG, begin, SEG, sp.max_record)
        b = S.split_boundary(s)
        assert b.records == 0 or b.first > blank_at  # stale record: caught by stitching
    _, got = _offsets(S.plan_splits([root], SEG - blank_at + 3))
    assert got == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 3), split_size=st.integers(24, 3000), lo=st.integers(0, 3 * SEG),
       span=st.integers(1, 2 * SEG))
def test_a_range_reads_only_its_splits_and_proves_where_it_starts(generated, seed, split_size, lo, span):
    """Exactly the splits that can hold a record starting in [lo, hi) are kept; the first
    one kept in a segment, when it starts mid-segment, walks the chain from the segment's
    start (the fake records in bodies cannot fool it) and returns exactly the records a
    sequential walk sees in its own range; stitched, the range is what the walk sees."""
    root, expected = generated[seed]
    hi = lo + span
    whole = S.plan_splits([root], split_size)
    splits = S.in_range(whole, lo, hi)
    assert [s.split_id for s in splits] == [
        s.split_id for s in whole if s.file_start + s.end > lo and s.file_start + s.begin < hi]
    firsts: dict[int, S.Split] = {}
    for s in splits:
        firsts.setdefault(s.file_index, s)
    assert all(s.start == 0 for s in firsts.values() if s.begin > 0)
    for s in splits:
        with S.open_split(s) as sc:
            got = sc.records.offset.tolist()
        assert all(o >= s.file_start + s.begin for o in got)
        if s.start is not None:  # read alone from mid-segment
            assert s.start == 0 < s.begin
            assert got == [o for o in expected
                           if s.file_start + s.begin <= o < s.file_start + s.end]
    _, got = _offsets(splits)
    assert [o for o in got if lo <= o < hi] == [o for o in expected if lo <= o < hi]


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
def test_a_missing_segment_before_the_range_ends_the_data(tmp_path):
    """spec §2: data ends at a missing segment, also when the range starts after it (as
    a sequential reader from lo sees it: it checks the segments before lo are contiguous)."""
    import shutil

    root = tmp_path / "basic"
    shutil.copytree(ROCKETMQ_498 / "basic", root)
    (root / "commitlog" / f"{2 * 65536:020d}").unlink()
    lo = 4 * 65536 + 100
    splits = S.in_range(S.plan_splits([str(root)], 20000), lo, None)
    st_, got = _offsets(splits)
    assert got == [] and st_.ends[str(root)].reason == "missing segment"
    _, whole = _offsets(S.plan_splits([str(root)], 20000))
    assert whole and max(whole) < 2 * 65536


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
@pytest.mark.parametrize("cut", [29471, 29571])  # at a record's end (README walk), inside one
def test_a_short_segment_holding_the_range_start_is_still_walked(tmp_path, cut):
    """A segment file shorter than the segment size holds lo up to its logical end: as
    dump's sequential scan (the golden data), the range's reading walks it from its start,
    so a torn record before lo ends the data and a clean file end does not."""
    import shutil

    from rmqstore.reader import open_store
    from rmqstore.selection import MessageFilter

    root = tmp_path / "basic"
    shutil.copytree(ROCKETMQ_498 / "basic", root)
    seg = root / "commitlog" / f"{2 * 65536:020d}"
    seg.chmod(0o644)
    with open(seg, "r+b") as f:
        f.truncate(cut)
    lo = 2 * 65536 + 40000
    with open_store(root) as reader:
        want = [m.commit_log_offset for m in reader.scan(MessageFilter(from_offset=lo)).messages()]
    assert bool(want) == (cut == 29471)
    _, got = _offsets(S.in_range(S.plan_splits([str(root)], 20000), lo, None))
    assert [o for o in got if o >= lo] == want


# --- fixture stores --------------------------------------------------------------------------


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
@settings(max_examples=30, deadline=None)
@given(scenario=st.sampled_from(MESSAGE_SCENARIOS or ["basic"]),
       split_size=st.one_of(st.integers(300, 2000), st.integers(2000, 70000)))
def test_fixture_every_record_exactly_once(scenario, split_size):
    root = str(ROCKETMQ_498 / scenario)
    _, got = _offsets(S.plan_splits([root], split_size))
    assert got == _walk_offsets(scenario)


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
@pytest.mark.parametrize("scenario", ["basic", "special", "async-transient", "crash"])
def test_fixture_resync_needs_no_reread(scenario):
    """On real stores resync alone lands on the chain: the driver re-reads nothing, also
    for ranges that start in BLANK padding (stale bytes in async-transient)."""
    root = str(ROCKETMQ_498 / scenario)
    for size in (97, 1000, 5000, 65536):
        sp = S.plan_splits([root], size)
        assert not S.stitch(sp, {s.split_id: S.split_boundary(s) for s in sp}).rerun


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
def test_torn_store_ends_where_recovery_truncated():
    # crash-torn: RocketMQ's recovery truncated to 464829 (fixtures README)
    for split_size in (1000, 65536):
        st_, got = _offsets(S.plan_splits([str(ROCKETMQ_498 / "crash-torn")], split_size))
        assert got == _walk_offsets("crash-torn-recovered")
        assert st_.ends[str(ROCKETMQ_498 / "crash-torn")].end_offset == 464829


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
@pytest.mark.parametrize("scenario", MESSAGE_SCENARIOS)
def test_arrow_rows_equal_manifest(scenario):
    """Decoded columns against what RocketMQ itself read back (manifest ``stored``)."""
    root = str(ROCKETMQ_498 / scenario)

    def task(s):
        with S.open_split(s) as sc:
            return sc.boundary, AV.decode_arrow(sc.records, root).to_pylist()

    _, payloads = S.run_local(S.plan_splits([root], 3001), task)
    rows = [r for sid in sorted(payloads) for r in payloads[sid]]
    stored = [m["stored"] for m in manifest(scenario)["messages"]]
    stored.sort(key=lambda m: m["phyOffset"])
    assert len(rows) == len(stored)
    for r, m in zip(rows, stored):
        assert r["store"] == root
        assert r["commitLogOffset"] == m["phyOffset"] and r["storeSize"] == m["storeSize"]
        assert (r["topic"], r["queueId"], r["queueOffset"]) == (m["topic"], m["queueId"], m["queueOffset"])
        assert (r["flag"], r["sysFlag"], r["bodyCRC"]) == (m["flag"], m["sysFlag"], m["bodyCRC"])
        assert r["bornTimestamp"] == m["bornTimestamp"] and r["storeTimestamp"] == m["storeTimestamp"]
        assert (r["bornHost"], r["storeHost"]) == (m["bornHost"], m["storeHost"])
        assert r["offsetMsgId"] == m["msgId"]
        assert r["body"] == base64.b64decode(m["bodyBase64"])
        assert r["tags"] == m["tags"] and r["uniqKey"] == m["uniqKey"]
        text = r["propertiesText"]
        if text is None:
            text = "\x02".join(f"{k}\x01{v}" for k, v in r["properties"])
        assert text == m["propertiesString"]
        assert r["crcOk"] is True


def test_properties_parsing_matches_codec():
    """Vectorised parsing against codec.parse_properties on awkward texts (spec §3.4)."""
    from rmqstore.format.message import parse_properties, properties_need_text, serialize_properties

    texts = ["", "\x02", "a\x01b", "a\x01b\x02", "a\x01b\x02\x02", "\x01b\x02c\x01d", "a\x01\x02b\x01c",
             "a\x01b\x01c\x02a\x01z", "k\x01v\x02k\x01w\x02k\x01x\x02", "é\x01😀\x02x\x01y", "abc", "a\x01b\x02c"]
    p = AV.parse_properties_many(pa.array(texts, pa.string()))
    m = p.map_array().to_pylist()
    for i, t in enumerate(texts):
        ref = parse_properties(t)
        assert m[i] == list(ref.items()), t
        assert bool(p.need_text[i]) == properties_need_text(ref, t), t
    assert serialize_properties({"a": "b"}) == "a\x01b"


def test_queue_stats_merge_equals_whole():
    root = str(ROCKETMQ_498 / "basic")
    whole, end = STATS.commitlog_stats(root, split_size=1 << 30)
    parts, _ = STATS.commitlog_stats(root, split_size=999)
    assert whole == parts
    ref = {}
    for m in manifest("basic")["messages"]:
        s = m["stored"]
        k = (s["topic"], s["queueId"])
        c = ref.setdefault(k, [0, 0, [], []])
        c[0] += 1
        c[1] += s["storeSize"]
        c[2].append(s["queueOffset"])
        c[3].append(s["storeTimestamp"])
    assert {(q.topic, q.queue_id): [q.count, q.bytes, q.min_queue_offset, q.max_queue_offset,
                                   q.first_store_timestamp, q.last_store_timestamp] for q in whole} == {
        k: [c, b, min(qo), max(qo), min(ts), max(ts)] for k, (c, b, qo, ts) in ref.items()}
    assert end.end_offset == manifest("basic")["maxPhyOffset"]


@pytest.mark.skipif(not ROCKETMQ_498.is_dir(), reason="fixtures absent")
def test_implied_units_equal_manifest_cq():
    """tagsCode rules incl. delay topic and PREPARED/ROLLBACK (spec §6.1) vs RocketMQ's CQ."""
    for scenario in ("special", "unicode", "basic"):
        root = str(ROCKETMQ_498 / scenario)

        def task(s):
            with S.open_split(s) as sc:
                return sc.boundary, AV.implied_units(sc.records).to_pylist()

        _, payloads = S.run_local(S.plan_splits([root], 5000), task)
        got = {}
        for sid in sorted(payloads):
            for u in payloads[sid]:
                got.setdefault((u["topic"], u["queueId"]), []).append(
                    [u["queueOffset"], u["commitLogOffset"], u["size"], u["tagsCode"]])
        ref = {(q["topic"], q["queueId"]): q["cqEntries"] for q in manifest(scenario)["queues"] if q["cqEntries"]}
        assert got == ref


def test_resync_skips_a_sparse_stretch_and_finds_what_a_full_search_finds(tmp_path):
    # A preallocated segment is mostly a hole: zeros hold no record, so resync jumps to the
    # next data (SEEK_DATA) instead of searching them; where data follows, it still finds
    # the first record start a plain search finds.
    import os

    from rmqstore.engine.store import MessageStore
    from rmqstore.files.config import StoreConfig
    from rmqstore.format.message import Message
    from rmqstore.scan.split_plan import Split
    from rmqstore.scan.splits import Window, resync

    size = 4 << 20
    cfg = StoreConfig(mapped_file_size_commit_log=size, mapped_file_size_consume_queue=6000)
    with MessageStore.open(tmp_path / "s", cfg, create=True) as st:
        rs = [st.put(Message(topic="T", body=b"x" * 300)) for _ in range(50)]
    seg = tmp_path / "s" / "commitlog" / f"{0:020d}"
    end_of_data = rs[-1].offset + rs[-1].size

    def window(begin, end):
        return Window(Split(0, str(tmp_path / "s"), str(seg), 0, 0, size, size, begin, end, 1 << 22))

    w = window(0, size)
    try:
        if w.next_data(end_of_data + 8192) == end_of_data + 8192:
            pytest.skip("this file system does not report holes (SEEK_DATA)")
        assert w.next_data(1 << 20) == size  # only holes after the data

        class Searched:  # the bytes resync searches
            def __init__(self, buf):
                self.buf, self.bytes = buf, 0

            def find(self, sub, a, b):
                self.bytes += b - a
                return self.buf.find(sub, a, b)

            def __getitem__(self, k):
                return self.buf[k]

        w.buf = spy = Searched(w.buf)
        assert resync(w, 1 << 20, 2 << 20) is None
        assert spy.bytes == 0  # the hole was not searched (it was 1 MiB before)
        w.buf = spy.buf
        assert resync(w, 7, 1 << 20) == rs[1].offset  # data ahead: found as before
        assert resync(w, 0, 1 << 20) == 0
    finally:
        w.close()
    assert os.path.getsize(seg) == size
