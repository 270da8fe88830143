"""ConsumeQueue read and write (spec §6.1) against RocketMQ-written stores and spec vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import manifest, scenario_params, store_expectations, tree_hashes
from rmqstore.files.consumequeue import ConsumeQueue, effective_file_size, list_queues, open_consume_queue
from rmqstore.files.consumequeue_writer import ConsumeQueueWriter, build_consume_queue
from rmqstore.errors import OffsetError, SegmentError

PLACEHOLDER = bytes.fromhex("0000000000000000 7FFFFFFF 0000000000000000".replace(" ", ""))  # §12.7


def _cq_size(scenario: str) -> int:
    return manifest(scenario)["storeConfig"]["mappedFileSizeConsumeQueue"]


def _queue_dir(root: Path, q: dict) -> Path:
    return root / "consumequeue" / q["topic"] / str(q["queueId"])


@pytest.mark.parametrize("scenario", scenario_params())
def test_units_and_offsets_match_rocketmq(fixtures_root, scenario):
    exp = store_expectations(scenario)
    root = fixtures_root / scenario
    listed = {(q.topic, q.queue_id) for q in list_queues(root).queues}
    assert list_queues(root).problems == []
    checked = 0
    for q in exp["queues"]:
        d = _queue_dir(root, q)
        if not d.is_dir():  # the schedule service creates some queues only in memory
            assert q["cqEntries"] == [] and q["maxOffset"] == 0
            assert (q["topic"], q["queueId"]) not in listed
            continue
        assert (q["topic"], q["queueId"]) in listed
        with ConsumeQueue(d, _cq_size(scenario), truncate_at=exp["truncate_at"]) as cq:
            assert [list(u) for u in cq] == q["cqEntries"]
            assert cq.max_offset == q["maxOffset"]
            assert cq.min_offset(exp["min_phy_offset"]) == q["minOffset"]
            assert cq.max_physic_offset == q["maxPhysicOffset"]
            assert cq.problems == []
            for e in q["cqEntries"][:: max(1, len(q["cqEntries"]) // 7)]:
                assert list(cq.unit_at(e[0])) == e
            units = cq.units
            assert units.dtype.names == ("commit_log_offset", "size", "tags_code")
            assert units["commit_log_offset"].tolist() == [e[1] for e in q["cqEntries"]]
        checked += 1
    assert checked == len(listed)


def test_recovery_leaves_the_dropped_unit_on_disk(fixtures_root):
    """crash-torn recovery cut TopicHot/0 from 160 to 159 units but kept the bytes (§10.4)."""
    root = fixtures_root / "crash-torn-recovered"
    before = next(q for q in manifest("crash")["queuesBeforeCrash"]
                  if q["topic"] == "TopicHot" and q["queueId"] == 0)
    with open_consume_queue(root, "TopicHot", 0, _cq_size("crash")) as raw:
        assert raw.max_offset == 160
        assert list(raw.unit_at(159)) == before["cqEntries"][159]
    with open_consume_queue(root, "TopicHot", 0, _cq_size("crash"), truncate_at=464829) as cut:
        assert cut.max_offset == 159
        with pytest.raises(OffsetError):
            cut.unit_at(159)


@pytest.mark.parametrize("scenario", scenario_params())
def test_writers_reproduce_rocketmq_files(fixtures_root, scenario, tmp_path):
    exp = store_expectations(scenario)
    root, size = fixtures_root / scenario, _cq_size(scenario)
    for q in exp["queues"]:
        if not q["cqEntries"]:
            continue
        cols = np.array(q["cqEntries"], dtype=np.int64).T
        bulk = tmp_path / "bulk" / q["topic"] / str(q["queueId"])
        assert build_consume_queue(bulk, cols[0], cols[1], cols[2], cols[3], size) == len(cols[0])
        inc = tmp_path / "inc" / q["topic"] / str(q["queueId"])
        with ConsumeQueueWriter(inc, size) as w:
            assert all(w.put(*map(int, e)) for e in q["cqEntries"])
        want = {p.name: p.read_bytes() for p in _queue_dir(root, q).iterdir()}
        end = q["maxOffset"] * 20
        for d in (bulk, inc):
            got = {p.name: p.read_bytes() for p in d.iterdir()}
            assert got.keys() == want.keys()
            for name, data in got.items():
                assert len(data) == size
                if exp["truncate_at"] is None:
                    assert data == want[name]
                else:  # recovery keeps cut units' bytes after the end (§10.4)
                    n = max(0, min(size, end - int(name)))
                    assert data[:n] == want[name][:n] and data[n:] == bytes(size - n)


def test_spec_unit_and_placeholders(tmp_path):
    """§12.3: TopicTest/3 unit 42 at position 840; §6.1 placeholders fill 0..41 (§12.7)."""
    d = tmp_path / "TopicTest" / "3"
    with ConsumeQueueWriter(d) as w:
        assert w.put(42, 2048, 254, 0x27A807)
    f = d / "00000000000000000000"
    assert f.stat().st_size == 6_000_000
    data = f.read_bytes()
    assert data[:840] == PLACEHOLDER * 42
    assert data[840:860] == bytes.fromhex("0000000000000800000000FE000000000027A807")
    assert data[860:] == bytes(6_000_000 - 860)
    with ConsumeQueue(d) as cq:
        assert (cq.base_offset, cq.max_offset) == (0, 43)
        assert cq.unit_at(0).is_placeholder and not cq.unit_at(42).is_placeholder
        assert int(cq.placeholder_mask().sum()) == 42
        assert [tuple(u) for u in cq] == [(42, 2048, 254, 0x27A807)]
        assert len(list(cq.iter_units(placeholders=True))) == 43
        # Placeholders have offset 0: they count as >= a CommitLog min of 0 (4.9 rule).
        assert cq.min_offset(0) == 0 and cq.min_offset(1) == 42
        assert cq.min_offset(1, rule="5.x") == 42 and cq.min_offset(3000, rule="5.x") == 43


def test_first_segment_created_past_zero(tmp_path):
    """First unit n=7 with 5-unit segments: file 100 created, units 5 and 6 placeholders."""
    with ConsumeQueueWriter(tmp_path, 100) as w:
        assert w.put(7, 1000, 10, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["00000000000000000100"]
    data = (tmp_path / "00000000000000000100").read_bytes()
    assert data[:40] == PLACEHOLDER * 2 and data[40:48] == (1000).to_bytes(8, "big")
    with ConsumeQueue(tmp_path, 100) as cq:
        assert (cq.base_offset, cq.max_offset, cq.max_physic_offset) == (5, 8, 1010)
        assert cq.min_offset(0) == 5 and cq.min_offset(1) == 7


def test_write_rules(tmp_path):
    w = ConsumeQueueWriter(tmp_path, 60)
    assert w.put(0, 100, 10, 0) and w.put(1, 110, 10, 0)
    assert not w.put(1, 110, 10, 0)  # offset+size <= maxPhysicOffset: a repeat
    assert not w.put(0, 500, 10, 0)  # n*20 below the write position: already built
    assert w.put(9, 120, 10, 0)  # beyond: logged by the broker, still dense
    assert w.put(3, 130, 10, 0)  # fills the first 60-byte segment; next goes to a new one
    assert w.put(4, 140, 10, 0)
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000000",
                                                         "00000000000000000060"]
    with ConsumeQueue(tmp_path, 60) as cq:
        assert [u.commit_log_offset for u in cq] == [100, 110, 120, 130, 140]
        assert cq.max_offset == 5
    with ConsumeQueueWriter(tmp_path, 60) as w:  # reopening recovers the write state
        assert not w.put(4, 140, 10, 0) and w.put(5, 150, 10, 0)


def test_recover_scans_only_the_last_three_segments(tmp_path):
    """§6.1: the scan starts at the third-to-last segment; earlier ones are trusted."""
    with ConsumeQueueWriter(tmp_path, 40) as w:  # 2 units per segment
        for n in range(9):
            w.put(n, 100 * n + 1, 5, 0)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 5
    _zero_unit(tmp_path / names[0], 1)  # not scanned: still counted
    with ConsumeQueue(tmp_path, 40) as cq:
        assert cq.max_offset == 9 and cq.max_physic_offset == 806
        assert cq.unit_at(1).size == 0
    _zero_unit(tmp_path / names[2], 1)  # scanned: data ends at unit 5
    with ConsumeQueue(tmp_path, 40) as cq:
        assert (cq.max_offset, cq.max_physic_offset) == (5, 406)
        assert [p.code for p in cq.problems] == ["beyond-end", "beyond-end"]
    before = tree_hashes(tmp_path)
    with ConsumeQueue(tmp_path, 40):
        pass
    assert tree_hashes(tmp_path) == before
    with ConsumeQueueWriter(tmp_path, 40) as w:  # a writer load deletes them, as the broker
        assert w.put(5, 1000, 5, 0)
    assert len(list(tmp_path.iterdir())) == 3


def _zero_unit(path: Path, i: int) -> None:
    data = bytearray(path.read_bytes())
    data[i * 20:(i + 1) * 20] = bytes(20)
    path.write_bytes(bytes(data))


def test_list_queues_reports_oddities(tmp_path):
    cq = tmp_path / "consumequeue"
    (cq / "T" / "0").mkdir(parents=True)
    (cq / "T" / "12").mkdir()
    (cq / "T" / "x1").mkdir()
    (cq / "T" / "notes.txt").write_text("x")
    (cq / "stray").write_text("x")
    (cq / "U" / "3").mkdir(parents=True)
    (cq / "T" / "0" / "junk").write_text("x")
    (cq / "T" / "0" / "00000000000000000000").write_bytes(bytes(30))
    listing = list_queues(tmp_path)
    assert [(q.topic, q.queue_id) for q in listing.queues] == [("T", 0), ("T", 12), ("U", 3)]
    assert sorted(p.code for p in listing.problems) == ["bad-queue-dir", "stray-file", "stray-file"]
    with ConsumeQueue(cq / "T" / "0", 60) as q:
        assert sorted(p.code for p in q.problems) == ["stray-file", "wrong-size"]
        assert q.max_offset == 0
    with pytest.raises(SegmentError) as e:
        ConsumeQueue(cq / "T" / "99", 60)
    assert "T/99" in str(e.value)
    assert list_queues(tmp_path / "nothing-here").queues == []


def test_effective_file_size_rounds_up():
    assert effective_file_size(6_000_000) == 6_000_000 and effective_file_size(1281) == 1300


def _sequence(draw):
    n0 = draw(st.integers(0, 12))
    units, q, phy = [], n0, draw(st.integers(0, 50))
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["next"] * 6 + ["repeat", "back", "jump", "low-end"]))
        size = draw(st.integers(1, 40))
        if kind == "repeat" and units:
            units.append(units[-1])
            continue
        if kind == "back":
            units.append((max(0, q - draw(st.integers(1, 3))), phy + 1000, size, 7))
            continue
        if kind == "jump":
            q += draw(st.integers(1, 4))
        phy += draw(st.integers(0, 60)) if kind != "low-end" else -draw(st.integers(0, 30))
        units.append((q, max(phy, 0), size, draw(st.integers(-2**63, 2**63 - 1))))
        q += 1
    return units


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([20, 40, 60, 100, 130]))
def test_bulk_equals_incremental(tmp_path_factory, data, file_size):
    units = _sequence(data.draw)
    split = data.draw(st.integers(0, len(units)))
    inc, bulk = tmp_path_factory.mktemp("inc"), tmp_path_factory.mktemp("bulk")
    with ConsumeQueueWriter(inc, file_size) as w:
        n_inc = sum(w.put(*u) for u in units)
    cols = np.array(units, dtype=object).T
    n_bulk = 0
    for part in (slice(0, split), slice(split, None)):  # two sessions: reopen mid-way
        with ConsumeQueueWriter(bulk, file_size) as w:
            c = [np.array(list(x[part]), dtype=np.int64) for x in cols]
            n_bulk += w.put_many(*c)
    assert n_bulk == n_inc
    assert tree_hashes(bulk) == tree_hashes(inc)


def test_iteration_from_an_offset_and_across_segments(tmp_path):
    with ConsumeQueueWriter(tmp_path, 40) as w:
        w.put_many(range(3, 10), range(0, 70, 10), [5] * 7, range(7))
    with ConsumeQueue(tmp_path, 40) as cq:
        assert cq.base_offset == 2 and cq.unit_at(2).is_placeholder
        assert [u.queue_offset for u in cq.iter_units(5)] == [5, 6, 7, 8, 9]
        assert [u.tags_code for u in cq.iter_units(8)] == [5, 6]
        assert [u.queue_offset for u in cq.iter_units(0, placeholders=True)] == list(range(2, 10))
        assert list(cq.iter_units(10)) == []
