"""What dispatch writes, as ``scan.per_queue`` computes it (spec §6.1, §7.3, §9): the
ConsumeQueue units per queue and the index puts of the valid records from a start offset.

One rule (``pack_grouped`` + ``join_groups``), two ways in: rebuild's ranges grouped by
each worker (``grouped_dispatch``) and verify's whole-segment scan (``dispatched``). Both
are held to what RocketMQ 4.9.8 wrote (the fixtures' ConsumeQueue units and IndexFile
entries, and its CommitLog walk), from offset 0 and from inside the log, with ranges
that cut records. On damaged stores, where there is nothing RocketMQ wrote to compare
with, the range cut must not change the answer: rebuild's ranges and verify's segments
find the same end of valid data and the same units and puts.
"""

from __future__ import annotations

import functools
import random
import shutil

import numpy as np
import pytest

import test_faults as faults
from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, manifest, scenario_params, store_expectations
from rmqstore.files.config import load_config
from rmqstore.format import layout as L
from rmqstore.scan.per_queue import dispatched, grouped_dispatch, grouped_split
from rmqstore.scan.runner import scan_chains, scan_commitlog, scan_dispatched, store_timestamp_at

# Stores where RocketMQ dispatched each record exactly once (the recovered ones index the
# last record twice, spec §14.7, so their IndexFiles are not one put per key).
ONCE = MESSAGE_SCENARIOS + ["crash"]


def _grouped(cfg, from_offset: int, index_from: int, split_size: int, join: bool = True):
    task = functools.partial(grouped_split, delay_millis=cfg.delay_millis)
    chains = scan_chains(cfg, task, processes=1, split_size=split_size)
    return grouped_dispatch(chains, cfg.mapped_file_size_commit_log, from_offset, index_from,
                            store_timestamp_at=store_timestamp_at(cfg), join=join)


# --- what RocketMQ wrote -------------------------------------------------------------------


def _rocketmq_units(scenario: str, from_offset: int) -> dict:
    """(topic, queueId) -> (queue offsets, PHYSICALOFFSETs, sizes, tagsCodes) of the units
    RocketMQ wrote for records at or after ``from_offset``."""
    out = {}
    for q in store_expectations(scenario)["queues"]:
        e = [u for u in q["cqEntries"] if u[1] >= from_offset]
        if e:
            out[q["topic"], q["queueId"]] = tuple(np.array(c, np.int64) for c in zip(*e))
    return out


def _rocketmq_puts(scenario: str, index_from: int):
    """(key hashes, PHYSICALOFFSETs, timeDiffs, the file's beginTimestamp) of the entries of
    RocketMQ's IndexFiles (spec §7.1), in put order, for records at or after ``index_from``."""
    sc = manifest(scenario)["storeConfig"]
    slots, num = sc["maxHashSlotNum"], sc["maxIndexNum"]
    cols = []
    for p in sorted((ROCKETMQ_498 / scenario / "index").iterdir()):
        data = p.read_bytes()
        begin, _, _, _, _, count = L.INDEX_HEADER_STRUCT.unpack_from(data, 0)
        e = np.frombuffer(data, L.INDEX_ENTRY_DTYPE, count=num,
                          offset=L.INDEX_HEADER_SIZE + slots * 4)[1:count]
        cols.append((e["key_hash"].astype(np.int64), e["phy_offset"].astype(np.int64),
                     e["time_diff"].astype(np.int64), np.full(len(e), begin, np.int64)))
    h, phy, diff, begin = (np.concatenate(c) for c in zip(*cols))
    sel = phy >= index_from
    return h[sel], phy[sel], diff[sel], begin[sel]


def _rocketmq_records(scenario: str, from_offset: int, units: dict):
    """(messages, bytes, STORETIMESTAMP of the last record given a unit) from RocketMQ's
    CommitLog walk, for records at or after ``from_offset``."""
    walk = [w for w in store_expectations(scenario)["walk"]
            if w["type"] == "MESSAGE" and w["offset"] >= from_offset]
    last = max((int(u[1][-1]) for u in units.values()), default=None)
    ts = {w["offset"]: w["storeTimestamp"] for w in walk}
    return len(walk), sum(w["size"] for w in walk), ts[last] if last is not None else 0


def _held_to_rocketmq(scenario: str, cq, ix, from_offset: int, index_from: int) -> None:
    want = _rocketmq_units(scenario, from_offset)
    assert sorted(cq.units) == sorted(want)
    for key, arrays in want.items():
        for name, got, exp in zip(("queue offset", "offset", "size", "tagsCode"), cq.units[key], arrays):
            assert np.array_equal(np.asarray(got, np.int64), exp), (key, name)
    h, phy, diff, begin = _rocketmq_puts(scenario, index_from)
    assert np.array_equal(ix.key_hash, h)
    assert np.array_equal(ix.key_offset, phy)
    assert np.array_equal((np.asarray(ix.key_timestamp) - begin) // 1000, diff)  # §7.4 timeDiff
    messages, size, last_ts = _rocketmq_records(scenario, from_offset, want)
    assert (cq.messages, cq.bytes, cq.last_cq_timestamp) == (messages, size, last_ts)
    assert (cq.unit_count, ix.key_count) == (sum(len(u[0]) for u in want.values()), len(h))


def _starts(scenario: str):
    """(from_offset, index_from) pairs: the whole log, from a record's first byte (it is
    included) and from inside records."""
    walk = [w["offset"] for w in store_expectations(scenario)["walk"] if w["type"] == "MESSAGE"]
    end = manifest(scenario)["maxPhyOffset"]
    return [(0, 0), (walk[len(walk) // 2], walk[len(walk) // 3]), (end // 2 + 1, end // 3 + 1)]


@pytest.mark.parametrize("scenario", scenario_params(ONCE))
def test_rebuilds_ranges_give_what_rocketmq_wrote(scenario):
    cfg = load_config(ROCKETMQ_498 / scenario)
    for from_offset, index_from in _starts(scenario):
        for split_size in (4096, 1 << 20):  # ranges inside a segment, cutting records; whole
            _, cq, ix = _grouped(cfg, from_offset, index_from, split_size)
            _held_to_rocketmq(scenario, cq, ix, from_offset, index_from)
        # counting only (the live build's check): the same counts, nothing gathered
        _, c2, i2 = _grouped(cfg, from_offset, index_from, 4096, join=False)
        assert (c2.unit_count, i2.key_count, c2.messages, c2.bytes, c2.last_cq_timestamp) == \
            (cq.unit_count, ix.key_count, cq.messages, cq.bytes, cq.last_cq_timestamp)
        assert not c2.units and not len(i2.key_hash)


@pytest.mark.parametrize("scenario", scenario_params(ONCE))
def test_verifys_scan_gives_what_rocketmq_wrote(scenario):
    cfg = load_config(ROCKETMQ_498 / scenario)
    full = scan_commitlog(cfg, processes=1, split_size=4096)
    for from_offset, _ in _starts(scenario):
        d = dispatched(full, from_offset)
        _held_to_rocketmq(scenario, d, d, from_offset, from_offset)
        assert all(a.dtype == np.int64 for u in d.units.values() for a in u)
    scan, d = scan_dispatched(cfg, processes=1, split_size=4096)  # what verify runs
    assert scan.valid_end == full.valid_end
    _held_to_rocketmq(scenario, d, d, 0, 0)
    assert all(a.dtype == np.int64 for u in d.units.values() for a in u)


# --- damaged stores: the range cut does not change the answer ------------------------------


def _same(cfg, from_offset=0, index_from=None, split_size=4096):
    index_from = from_offset if index_from is None else index_from
    full = scan_commitlog(cfg, processes=1, split_size=split_size)
    scan, cq, ix = _grouped(cfg, from_offset, index_from, split_size)
    assert (scan.end, scan.end_segment, scan.reason) == (full.end, full.end_segment, full.reason)
    assert scan.kept == full.kept and scan.damaged == full.damaged
    want_cq, want_ix = dispatched(full, from_offset), dispatched(full, index_from)
    assert (cq.messages, cq.bytes, cq.last_cq_timestamp) == \
        (want_cq.messages, want_cq.bytes, want_cq.last_cq_timestamp)
    assert sorted(cq.units) == sorted(want_cq.units)
    for key, arrays in want_cq.units.items():
        for a, b in zip(cq.units[key], arrays):
            assert np.array_equal(np.asarray(a, np.int64), b), key
    for name in ("key_hash", "key_offset", "key_timestamp"):
        assert np.array_equal(getattr(ix, name), getattr(want_ix, name)), name
    assert (cq.unit_count, ix.key_count) == (want_cq.unit_count, want_ix.key_count)
    if from_offset == index_from == 0:  # verify's way: its workers group their ranges too
        vscan, vd = scan_dispatched(cfg, processes=1, split_size=split_size)
        assert (vscan.valid_end, vscan.kept, vscan.damaged) == \
            (full.valid_end, full.kept, full.damaged)
        assert (vd.messages, vd.bytes, vd.last_cq_timestamp, vd.unit_count, vd.key_count) == \
            (want_cq.messages, want_cq.bytes, want_cq.last_cq_timestamp, want_cq.unit_count,
             want_ix.key_count)
        assert sorted(vd.units) == sorted(want_cq.units)
        for key, arrays in want_cq.units.items():
            for a, b in zip(vd.units[key], arrays):
                assert a.dtype == b.dtype and np.array_equal(a, b), key
        for name in ("key_hash", "key_offset", "key_timestamp"):
            a, b = getattr(vd, name), getattr(want_ix, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    return scan


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    return faults.make_store(tmp_path_factory.mktemp("grouped") / "base", seed=11)


def crc_torn_tail(store, recs, rng):
    """Bodies of the last few records damaged, their lengths intact: recovery cuts the
    whole run (spec §10.5), in the middle of a range that holds units after the cut."""
    for off, *_ in recs[-3:] + [recs[len(recs) // 2]]:
        faults.bit_flip_in_body(store, [(off, 0)] * 11, rng)


def queue_offsets_off(store, recs, rng):
    """QUEUEOFFSET fields that jump ahead and repeat (not covered by the body CRC): the
    groups' queue offsets stop counting up by one."""
    for off, _size, _topic, _qid, qo in (recs[len(recs) // 3], recs[len(recs) // 2]):
        f, pos = faults.seg_of(off)
        faults._patch(store / f, pos + 20, (qo + 5).to_bytes(8, "big"))
    off = recs[-7][0]
    f, pos = faults.seg_of(off)
    faults._patch(store / f, pos + 20, (0).to_bytes(8, "big"))


def stored_fields_off(store, recs, rng):
    """A PHYSICALOFFSET that is not the record's position and a STORETIMESTAMP 40 days
    later (neither is covered by the body CRC): the hand-over's compact forms (offsets
    from sizes, 32-bit time deltas) must give way to the stored values."""
    off = recs[len(recs) // 2][0]
    f, pos = faults.seg_of(off)
    faults._patch(store / f, pos + 28, (off + 4096).to_bytes(8, "big"))
    off = recs[len(recs) // 3][0]
    f, pos = faults.seg_of(off)
    data = (store / f).read_bytes()
    ts = int.from_bytes(data[pos + 56:pos + 64], "big") + 40 * 86_400_000  # IPv4 hosts: @56
    faults._patch(store / f, pos + 56, ts.to_bytes(8, "big"))


@pytest.mark.parametrize("fault", faults.FAULTS + [crc_torn_tail, queue_offsets_off,
                                                   stored_fields_off],
                         ids=lambda f: f.__name__)
def test_damaged_stores(fault, base_store, tmp_path):
    store = tmp_path / "s"
    shutil.copytree(base_store, store)
    recs = faults.records(store)
    try:
        fault(store, recs, random.Random(5))
    except faults.NotApplicable:
        pytest.fail(f"{fault.__name__} could not be applied to the base store")
    cfg = load_config(store)
    for split_size in (1000, 4096, 1 << 20):  # many ranges, some inside one record
        scan = _same(cfg, split_size=split_size)
    if scan.end:
        _same(cfg, from_offset=scan.end // 3)


@pytest.mark.parametrize("fault", [crc_torn_tail, stored_fields_off], ids=lambda f: f.__name__)
def test_verify_workers_through_shared_memory(fault, base_store, tmp_path, monkeypatch):
    """verify's scan in forked workers, parts back through the arena (small slots: some
    arrays travel pickled), gives what one process gives: report, units and puts."""
    from dataclasses import asdict

    from rmqstore.recovery.verify import verify
    from rmqstore.scan import runner

    store = tmp_path / "s"
    shutil.copytree(base_store, store)
    fault(store, faults.records(store), random.Random(5))
    cfg = load_config(store)
    one, d1 = scan_dispatched(cfg, processes=1, split_size=1 << 15)
    monkeypatch.setattr(runner, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(runner, "VERIFY_SHARE", 0.05)
    many, d2 = scan_dispatched(cfg, processes=2, split_size=1 << 15)
    assert len(many.parts[0].offset) and (many.valid_end, many.kept) == (one.valid_end, one.kept)
    for name in ("key_hash", "key_offset", "key_timestamp"):
        assert np.array_equal(getattr(d1, name), getattr(d2, name)), name
    assert sorted(d1.units) == sorted(d2.units)
    for key, arrays in d1.units.items():
        for a, b in zip(d2.units[key], arrays):
            assert np.array_equal(a, b), key
    assert [asdict(f) for f in verify(store, processes=2).findings] == \
        [asdict(f) for f in verify(store, processes=1).findings]
