"""Rebuild's grouped scan gives exactly what the full scan and ``dispatched`` give: the
same end of valid data, the same units per queue, the same index puts, on RocketMQ's
stores and on generated stores damaged every way the fault suite knows."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

import test_faults as faults
from conftest import ROCKETMQ_498, SCENARIOS, scenario_params
from rmqstore.files.config import load_config
from rmqstore.scan.per_queue import grouped_dispatch, grouped_split
from rmqstore.scan.per_queue import dispatched
from rmqstore.scan.runner import scan_chains, scan_commitlog, store_timestamp_at


def _both(cfg, from_offset: int, index_from: int, split_size: int):
    full = scan_commitlog(cfg, processes=1, split_size=split_size)
    task = functools.partial(grouped_split, delay_millis=cfg.delay_millis)
    chains = scan_chains(cfg, task, processes=1, split_size=split_size)
    got = grouped_dispatch(chains, cfg.mapped_file_size_commit_log, from_offset, index_from,
                           store_timestamp_at=store_timestamp_at(cfg))
    return full, got


def _same(cfg, from_offset=0, index_from=None, split_size=4096):
    index_from = from_offset if index_from is None else index_from
    full, (scan, cq, ix) = _both(cfg, from_offset, index_from, split_size)
    assert (scan.end, scan.end_segment, scan.reason) == (full.end, full.end_segment, full.reason)
    assert scan.kept == full.kept and scan.damaged == full.damaged
    want_cq, want_ix = dispatched(full, from_offset), dispatched(full, index_from)
    assert (cq.messages, cq.bytes, cq.last_cq_timestamp) == \
        (want_cq.messages, want_cq.bytes, want_cq.last_cq_timestamp)
    assert sorted(cq.units) == sorted(want_cq.units)
    for key, arrays in want_cq.units.items():
        for a, b in zip(cq.units[key], arrays):
            assert np.array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64)), key
    for name in ("key_hash", "key_offset", "key_timestamp"):
        assert np.array_equal(getattr(ix, name), getattr(want_ix, name)), name
    assert (cq.unit_count, ix.key_count) == (want_cq.unit_count, want_ix.key_count)
    # counting only (the live build's check) gives the same counts and scan
    task = functools.partial(grouped_split, delay_millis=cfg.delay_millis)
    chains = scan_chains(cfg, task, processes=1, split_size=split_size)
    s2, c2, i2 = grouped_dispatch(chains, cfg.mapped_file_size_commit_log, from_offset,
                                  index_from, store_timestamp_at=store_timestamp_at(cfg),
                                  join=False)
    assert (c2.unit_count, i2.key_count, c2.messages, c2.bytes, c2.last_cq_timestamp) == \
        (want_cq.unit_count, want_ix.key_count, want_cq.messages, want_cq.bytes,
         want_cq.last_cq_timestamp)
    assert not c2.units and not len(i2.key_hash) and s2.kept == scan.kept
    return scan


@pytest.mark.parametrize("scenario", scenario_params(SCENARIOS))
def test_fixture_stores(scenario):
    cfg = load_config(ROCKETMQ_498 / scenario)
    scan = _same(cfg)
    if scan.end > 4096:
        _same(cfg, from_offset=scan.end // 2)
        _same(cfg, from_offset=scan.end // 2, index_from=scan.end // 3, split_size=1 << 20)


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
    import shutil

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
