"""IndexFile read, query and write (spec §7) against RocketMQ-written stores and §12.6."""

from __future__ import annotations

import itertools
import shutil
from datetime import timezone
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import MESSAGE_SCENARIOS, SCENARIOS, scenario_params, store_expectations, tree_hashes
from rmqstore.format.hashing import index_hash_many
from rmqstore.format.message import split_keys
from rmqstore.errors import ConfigError
from rmqstore.files.index import IndexFile, IndexGeometry, infer_index_geometry
from rmqstore.files.index_query import IndexReader
from rmqstore.files.index_service import IndexService, build_index, index_file_name

FIXTURE_GEOMETRY = IndexGeometry(64, 256)
TINY = IndexGeometry(4, 6)

# spec §12.6, byte for byte
TINY_FILE = bytes.fromhex(
    "0000018bcfe5687b" "0000018bcfe57f6f" "0000000000000800" "00000000000008fe" "00000003" "00000005"
    "00000000" "00000004" "00000002" "00000003"
    + "00" * 20
    + "558a9f52" "0000000000000800" "00000000" "00000000"
    + "4963b6f6" "0000000000000800" "00000000" "00000001"
    + "558a9f53" "00000000000008fe" "00000005" "00000000"
    + "4963b6f5" "00000000000008fe" "00000005" "00000000"
    + "00" * 20)
TINY_PUTS = [
    ("TopicTest#0A00000110922A9F1B6D496ED4000007", 2048, 1700000000123),
    ("TopicTest#OrderID188", 2048, 1700000000123),
    ("TopicTest#0A00000110922A9F1B6D496ED4000008", 2302, 1700000005999),
    ("TopicTest#OrderID189", 2302, 1700000005999),
]


def _clock(start=1_700_000_000_000, step=1):
    it = itertools.count(start, step)
    return lambda: next(it)


def test_spec_tiny_index_file(tmp_path):
    assert len(TINY_FILE) == TINY.file_size == 176
    with IndexService(tmp_path, TINY, clock=_clock(), tz=timezone.utc) as svc:
        for key, phy, ts in TINY_PUTS:
            svc.put_key(key, phy, ts)
        assert [f.path.name for f in svc.files] == ["20231114221320000"]
        assert svc.query("TopicTest", "OrderID188").phy_offsets == [2048]
    assert (tmp_path / "20231114221320000").read_bytes() == TINY_FILE
    with IndexReader(tmp_path, TINY) as r:
        assert r.query("TopicTest", "OrderID188", 64, 0, 2**63 - 1).phy_offsets == [2048]
        # Entry 4 reads back as 1700000000123 + 5 s = 1700000005123.
        assert r.query("TopicTest", "OrderID189", begin=1700000001000).phy_offsets == [2302]
        assert r.query("TopicTest", "OrderID189", begin=1700000005124).phy_offsets == []
        assert r.query("TopicTest", "OrderID189", end=1700000005122).phy_offsets == []
        f = r.files[0]
        assert f.header.index_count == 5 and f.header.hash_slot_count == 3
        assert f.slots.tolist() == [0, 4, 2, 3]
        assert f.used_entries["prev_index"].tolist() == [0, 1, 0, 0]


def test_bulk_writes_the_spec_tiny_file(tmp_path):
    keys = [k for k, _, _ in TINY_PUTS]
    paths = build_index(tmp_path, TINY, index_hash_many(keys), [p for _, p, _ in TINY_PUTS],
                        [t for _, _, t in TINY_PUTS], clock=_clock())
    assert [p.read_bytes() for p in paths] == [TINY_FILE]


def test_min_value_hash_goes_to_slot_zero(tmp_path):
    """§12.1 H8: hashCode -2^31, so keyHash 0 and slot 0."""
    with IndexService(tmp_path, TINY, clock=_clock()) as svc:
        svc.put_key("TopicTest#key-qqhdwuj", 77, 1_000)
        f = svc.files[0]
        assert f.slots.tolist() == [1, 0, 0, 0]
        assert f.used_entries["key_hash"].tolist() == [0]
        assert svc.query("TopicTest", "key-qqhdwuj").phy_offsets == [77]


def test_dispatch_rules(tmp_path):
    """§7.3: UNIQ_KEY then KEYS split on single spaces, empty tokens dropped; ROLLBACK
    skipped, PREPARED indexed; a record below endPhyOffset skipped, the last one again."""
    with IndexService(tmp_path, IndexGeometry(8, 32), clock=_clock()) as svc:
        assert svc.build_index("T", "U1", "a  b a", 100, 5_000) == 4
        assert svc.build_index("T", None, "c", 200, 6_000, sys_flag=0xC) == 0
        assert svc.build_index("T", None, "d", 300, 6_000, sys_flag=0x4) == 1
        assert svc.build_index("T", None, "e", 250, 6_000) == 0
        assert svc.build_index("T", None, "f", 300, 6_000) == 1
        q = svc.query
        assert q("T", "U1").phy_offsets == [100] and q("T", "a").phy_offsets == [100, 100]
        assert q("T", "b").phy_offsets == [100] and q("T", "").phy_offsets == []
        assert q("T", "c").phy_offsets == [] and q("T", "d").phy_offsets == [300]
        assert q("T", "e").phy_offsets == [] and q("T", "f").phy_offsets == [300]
        assert svc.files[0].header.index_count == 7


def test_geometry_inference():
    assert infer_index_geometry(5416) == IndexGeometry(64, 256)
    assert infer_index_geometry(420_000_040) == IndexGeometry(5_000_000, 20_000_000)
    assert infer_index_geometry(176, hash_slot_num=4) == TINY
    assert infer_index_geometry(176, index_num=6) == TINY
    for bad in (5417, 176, 39):
        with pytest.raises(ConfigError):
            infer_index_geometry(bad)
    with pytest.raises(ConfigError):
        infer_index_geometry(176, hash_slot_num=5)


def test_wrong_geometry_names_the_file(fixtures_root):
    f = next((fixtures_root / "basic" / "index").iterdir())
    with pytest.raises(ConfigError) as e:
        IndexFile(f, IndexGeometry(64, 255))
    assert f.name in str(e.value)


def _index_puts(exp: dict, start: int = 0, stop: int | None = None):
    """(key, phy, storeTimestamp) in dispatch order from the manifest (spec §7.3, §9)."""
    stored = {m["stored"]["phyOffset"]: m["stored"] for m in exp["messages"]}
    for w in exp["walk"]:
        if w["type"] != "MESSAGE" or w["offset"] < start or (stop is not None and w["offset"] >= stop):
            continue
        s = stored[w["offset"]]
        assert s["topic"] == w["topic"] and s["sysFlag"] == w["sysFlag"]
        yield s, w


def _entries(exp, **kw):
    keys, phys, tss = [], [], []
    for s, w in _index_puts(exp, **kw):
        if w["sysFlag"] & 0xC == 0xC:  # ROLLBACK is not indexed
            continue
        p = s["properties"]
        for k in ([p["UNIQ_KEY"]] if "UNIQ_KEY" in p else []) + split_keys(p.get("KEYS")):
            keys.append(f"{s['topic']}#{k}")
            phys.append(w["offset"])
            tss.append(w["storeTimestamp"])
    return keys, phys, tss


def _same_contents(got: list[Path], want: list[Path]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        a = IndexFile(g, FIXTURE_GEOMETRY)
        b = IndexFile(w, FIXTURE_GEOMETRY)
        assert a.header == b.header, w.name
        assert np.array_equal(a.slots, b.slots), w.name
        assert a.entries.tobytes() == b.entries.tobytes(), w.name
        a.close(), b.close()
        assert g.read_bytes() == w.read_bytes()


@pytest.mark.parametrize("scenario", scenario_params(MESSAGE_SCENARIOS))
def test_rebuild_reproduces_rocketmq_index(fixtures_root, scenario, tmp_path):
    exp = store_expectations(scenario)
    want = sorted((fixtures_root / scenario / "index").iterdir())
    keys, phys, tss = _entries(exp)
    got = build_index(tmp_path / "bulk", FIXTURE_GEOMETRY, index_hash_many(keys), phys, tss,
                      clock=_clock())
    _same_contents(got, want)
    with IndexService(tmp_path / "putkey", FIXTURE_GEOMETRY, clock=_clock()) as svc:
        for k, p, t in zip(keys, phys, tss):
            svc.put_key(k, p, t)
        _same_contents([f.path for f in svc.files], want)
    with IndexService(tmp_path / "dispatch", FIXTURE_GEOMETRY, clock=_clock()) as svc:
        for s, w in _index_puts(exp):
            p = s["properties"]
            svc.build_index(s["topic"], p.get("UNIQ_KEY"), split_keys(p.get("KEYS")),
                            w["offset"], w["storeTimestamp"], w["sysFlag"])
        _same_contents([f.path for f in svc.files], want)


@pytest.mark.parametrize("scenario", scenario_params(
    [s for s in SCENARIOS if s in ("crash-recovered", "crash-torn-recovered")]))
def test_recovery_redispatch_reproduces_rebuilt_file(fixtures_root, scenario, tmp_path):
    """Recovery re-dispatched from CommitLog 131072 into a follow-on of the last full file:
    the skip rule (offset < endPhyOffset, §7.3) and the quirk (§7.4) give its new file."""
    exp = store_expectations(scenario)
    want = sorted((fixtures_root / scenario / "index").iterdir())
    for mode in ("dispatch", "bulk"):
        d = tmp_path / mode
        d.mkdir()
        for p in want[:-1]:
            shutil.copy(p, d / p.name)
            (d / p.name).chmod(0o644)
        with IndexService(d, FIXTURE_GEOMETRY, clock=_clock(2_000_000_000_000)) as svc:
            if mode == "dispatch":
                for s, w in _index_puts(exp, start=131072):
                    p = s["properties"]
                    svc.build_index(s["topic"], p.get("UNIQ_KEY"), split_keys(p.get("KEYS")),
                                    w["offset"], w["storeTimestamp"], w["sysFlag"])
            else:
                keys, phys, tss = _entries(exp, start=131072)
                svc.put_hashes(index_hash_many(keys), phys, tss, skip_stale=True)
            got = [f.path for f in svc.files]
        _same_contents(got, want)


@pytest.mark.parametrize("scenario", scenario_params())
def test_queries_match_rocketmq(fixtures_root, scenario):
    exp = store_expectations(scenario)
    root = fixtures_root / scenario
    before = tree_hashes(root / "index")
    with IndexReader(root / "index") as r:
        assert r.geometry == FIXTURE_GEOMETRY
        nonempty = 0
        for q in exp["queries"]:
            res = r.query(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
            assert res.phy_offsets == sorted(q["phyOffsets"]), q
            if q["phyOffsets"]:  # the store reports these only with results
                nonempty += 1
                assert res.index_last_update_phyoffset == q["indexLastUpdatePhyoffset"]
                assert res.index_last_update_timestamp == q["indexLastUpdateTimestamp"]
        assert nonempty > len(exp["queries"]) // 2
    assert tree_hashes(root / "index") == before


def test_recovered_duplicate_is_returned_twice(fixtures_root):
    """README: the message at the old file's endPhyOffset was indexed again."""
    exp = store_expectations("crash-recovered")
    with IndexReader(fixtures_root / "crash-recovered" / "index") as r:
        dups = [q for q in exp["queries"] if q["phyOffsets"] == [352309, 352309]]
        assert dups
        for q in dups:
            assert r.query(q["topic"], q["key"]).phy_offsets == [352309, 352309]


def test_query_walks_files_newest_first_with_early_stops(tmp_path):
    """Capacity 3 per file; 7 puts of one key 10 s apart (spec §7.4-§7.6)."""
    g = IndexGeometry(4, 4)
    t0 = 1_700_000_000_000
    ts = [t0 + 10_000 * i for i in range(7)]
    with IndexService(tmp_path, g, clock=_clock()) as svc:
        for i, t in enumerate(ts):
            svc.put_key("T#k", 100 + i, t)
        assert len(svc.files) == 3
        second = svc.files[1]
        # Its first entry's timeDiff is against the previous file's end (the quirk)...
        assert second.used_entries["time_diff"].tolist() == [10, 10, 20]
    with IndexReader(tmp_path, g, max_msgs_num_batch=64) as r:
        assert r.query("T", "k").phy_offsets == list(range(100, 107))
        assert r.query("T", "k", max_num=2).phy_offsets == [105, 106]
        # ...so entry 3 reads back as t3 + 10 s = t4 and matches a query from t4.
        assert r.query("T", "k", begin=ts[4]).phy_offsets == [103, 104, 105, 106]
        assert r.query("T", "k", begin=ts[1], end=ts[1]).phy_offsets == [101]
        assert r.query("T", "x").phy_offsets == []
    with IndexReader(tmp_path, g, max_msgs_num_batch=3) as r:
        assert r.query("T", "k", max_num=10).phy_offsets == [104, 105, 106]


def test_new_files_get_distinct_increasing_names(tmp_path):
    with IndexService(tmp_path, IndexGeometry(1, 2), clock=lambda: 1_700_000_000_000,
                      tz=timezone.utc) as svc:
        for i in range(3):
            svc.put_key("T#k", i, 1)
        assert [f.path.name for f in svc.files] == [
            "20231114221320000", "20231114221320001", "20231114221320002"]
    assert index_file_name(1_700_000_000_123, timezone.utc) == "20231114221320123"


def test_fresh_follow_on_file_header(tmp_path):
    """A file created after a full one shows the previous end; counters 0 on disk (§7.4)."""
    g = IndexGeometry(2, 2)
    with IndexService(tmp_path, g, clock=_clock()) as svc:
        svc.put_key("T#a", 500, 9_000)
        svc.build_index("T", None, None, 600, 9_500)  # the last file is full: a new one
        assert len(svc.files) == 2 and svc.index_msg_timestamp == 9_000
    with pytest.raises(ValueError):
        IndexService(tmp_path, g).put_hashes([-5], [1], [1])
    data = sorted(tmp_path.iterdir())[1].read_bytes()
    assert data[:40] == bytes.fromhex("0000000000002328" * 2 + "00000000000001f4" * 2 + "00" * 8)


@st.composite
def _puts(draw):
    pool = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=6))
    n = draw(st.integers(0, 40))
    hashes = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    phys = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    base = draw(st.sampled_from([0, 1, 1_700_000_000_000]))
    ts = [base + d for d in draw(st.lists(
        st.one_of(st.integers(-5_000, 50_000), st.integers(2**40, 2**45)), min_size=n, max_size=n))]
    return hashes, phys, ts


@settings(max_examples=200, deadline=None)
@given(_puts(), _puts(), st.integers(1, 5), st.integers(2, 9))
def test_bulk_equals_put_key(tmp_path_factory, first, second, slots, index_num):
    """Any inputs, including a second batch continuing a partly filled file."""
    g = IndexGeometry(slots, index_num)
    a, b = tmp_path_factory.mktemp("put"), tmp_path_factory.mktemp("bulk")
    for batch in (first, second):
        with IndexService(a, g, clock=_clock(), flush_full_files=False) as svc:
            for h, p, t in zip(*batch):
                svc.put_hash(h, p, t)
        with IndexService(b, g, clock=_clock(), flush_full_files=False) as svc:
            svc.put_hashes(*batch)
    assert tree_hashes(a) == tree_hashes(b)


@settings(max_examples=100, deadline=None)
@given(_puts(), st.integers(0, 2**40))
def test_bulk_skip_stale_equals_dispatch_rule(tmp_path_factory, puts, end0):
    g = IndexGeometry(3, 5)
    a, b = tmp_path_factory.mktemp("put"), tmp_path_factory.mktemp("bulk")
    for d in (a, b):
        with IndexService(d, g, clock=_clock(), flush_full_files=False) as svc:
            svc.put_hash(1, end0, 1)
    hashes, phys, ts = puts
    with IndexService(a, g, clock=_clock(), flush_full_files=False) as svc:
        for h, p, t in zip(hashes, phys, ts):
            if p >= svc.files[-1].header.end_phy_offset:
                svc.put_hash(h, p, t)
    with IndexService(b, g, clock=_clock(), flush_full_files=False) as svc:
        svc.put_hashes(hashes, phys, ts, skip_stale=True)
    assert tree_hashes(a) == tree_hashes(b)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([IndexGeometry(4, 9), IndexGeometry(64, 40), IndexGeometry(5000, 300)]),
       st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=250),
       st.lists(st.integers(1, 6) | st.integers(1, 80), min_size=1, max_size=12), st.data())
def test_put_hashes_in_any_chunks_equals_one_by_one(tmp_path_factory, geometry, hashes, cuts,
                                                    data):
    """Vectorised puts (the no-collision path of small batches, the sorted path, calls
    that fill a file and spill into the next) write the bytes put_hash writes one by one."""
    n = len(hashes)
    phy = np.cumsum(data.draw(st.lists(st.integers(1, 500), min_size=n, max_size=n)))
    ts = 1_700_000_000_000 + np.cumsum(
        data.draw(st.lists(st.integers(0, 90_000), min_size=n, max_size=n)))
    base = tmp_path_factory.mktemp("ix")
    with IndexService(base / "one", geometry, clock=lambda: 1_700_000_000_000) as svc:
        for h, p, t in zip(hashes, phy.tolist(), ts.tolist()):
            svc.put_hash(h, p, t)
    with IndexService(base / "bulk", geometry, clock=lambda: 1_700_000_000_000) as svc:
        i = 0
        for c in itertools.cycle(cuts):
            if i >= n:
                break
            svc.put_hashes(np.array(hashes[i:i + c]), phy[i:i + c], ts[i:i + c])
            i += c
    assert tree_hashes(base / "one") == tree_hashes(base / "bulk")
