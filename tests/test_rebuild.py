"""rebuild: ConsumeQueues byte-identical to RocketMQ's and IndexFiles with identical
contents, recreated from the CommitLog alone (spec §6.1, §7, §9)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, copy_store, scenario_params, store_expectations
from rmqstore.files.config import load_config
from rmqstore.recovery.rebuild import SCRATCH_PREFIX, rebuild
from rmqstore.recovery.verify import verify

# Stores where RocketMQ dispatched each record exactly once (the recovered ones carry the
# §14.7 duplicate entry, so they are compared through queries in test_repair instead).
ONCE = [s for s in MESSAGE_SCENARIOS] + ["crash"]


def _cq_files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in (root / "consumequeue").rglob("*") if p.is_file()}


def _not_live(self, segment, part):
    """Live.__call__ that takes nothing in: rebuild then always uses the bulk build."""
    self.units = self.puts = -1


def _index_contents(root):
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


@pytest.mark.parametrize("scenario", scenario_params(ONCE))
def test_rebuild_from_commitlog_alone(scenario, tmp_path):
    src = ROCKETMQ_498 / scenario
    store = copy_store(src, tmp_path / scenario)
    cfg = load_config(src).with_values(store_path_root_dir=str(store))  # geometry from RocketMQ's files
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    r = rebuild(store, config=cfg, clock=lambda: 1_700_000_000_000)
    assert _cq_files(store) == _cq_files(src)
    assert _index_contents(store) == _index_contents(src)  # names differ, bytes do not
    exp = store_expectations(scenario)
    assert r.units == sum(len(q["cqEntries"]) for q in exp["queues"])
    assert r.messages == sum(w["type"] == "MESSAGE" for w in exp["walk"])
    assert not [p for p in store.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    if scenario != "crash":
        assert verify(store, config=cfg, deep=True).ok


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
@pytest.mark.parametrize("which", ["consumequeue", "index"])
def test_rebuild_one_kind_over_existing_files(scenario, which, tmp_path):
    src = ROCKETMQ_498 / scenario
    store = copy_store(src, tmp_path / scenario)
    rebuild(store, consume_queue=which == "consumequeue", index=which == "index")
    assert _cq_files(store) == _cq_files(src)
    assert _index_contents(store) == _index_contents(src)


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_rebuild_from_offset_keeps_what_is_before(scenario, tmp_path):
    src = ROCKETMQ_498 / scenario
    store = copy_store(src, tmp_path / scenario)
    rebuild(store, from_offset=200_000)  # new index files are named by the wall clock
    assert _cq_files(store) == _cq_files(src)
    r = verify(store, deep=True)
    # Index files reaching 200000 were re-made from the end of the last one kept; the last
    # record of that file is indexed again, exactly as a broker's re-dispatch does (§14.7).
    assert r.ok and {f.code for f in r.findings} <= {"commitlog-end", "index-duplicate"}


def test_rebuild_refuses_a_locked_store(fixtures_root, tmp_path):
    from rmqstore.files.checkpoint import hold_lock
    from rmqstore.errors import StoreLockedError

    store = copy_store(fixtures_root / "basic", tmp_path / "s")
    with hold_lock(store):
        with pytest.raises(StoreLockedError):
            rebuild(store)


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_index_built_in_a_child_is_the_same(scenario, tmp_path, monkeypatch):
    import rmqstore.recovery.rebuild as rb

    monkeypatch.setattr(rb, "PARALLEL_MIN_KEYS", 0)  # fork even for a small store
    monkeypatch.setattr(rb.Live, "__call__", _not_live)
    src = ROCKETMQ_498 / scenario
    store = copy_store(src, tmp_path / scenario)
    shutil.rmtree(store / "consumequeue")
    shutil.rmtree(store / "index")
    r = rebuild(store, config=load_config(src).with_values(store_path_root_dir=str(store)),
                clock=lambda: 1_700_000_000_000)
    assert _cq_files(store) == _cq_files(src)
    assert _index_contents(store) == _index_contents(src)
    assert r.index_entries > 0 and r.index_files


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_child_failure_leaves_the_store_as_it_was(scenario, tmp_path, monkeypatch):
    import rmqstore.recovery.rebuild as rb
    from conftest import tree_hashes

    def broken(*a, **k):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(rb, "PARALLEL_MIN_KEYS", 0)
    monkeypatch.setattr(rb.Live, "__call__", _not_live)
    monkeypatch.setattr(rb, "_build_index", broken)
    store = copy_store(ROCKETMQ_498 / scenario, tmp_path / scenario)
    before = tree_hashes(store / "index")
    from rmqstore.errors import StoreIOError

    with pytest.raises(StoreIOError, match="injected"):  # one typed line, exit 2 in the CLI
        rebuild(store)
    assert tree_hashes(store / "index") == before  # the old index files stay in place
    assert not [p for p in store.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_index_thread_failure_leaves_the_store_as_it_was(scenario, tmp_path, monkeypatch):
    """The live IndexFile puts run on a thread of their own: a put that fails there is
    raised by the rebuild (one typed line), which leaves the old files and no scratch."""
    import rmqstore.recovery.rebuild_writers as live
    from conftest import tree_hashes
    from rmqstore.errors import StoreIOError

    calls = []

    def broken(self, *a, **k):
        calls.append(len(a[0]))
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(live.IndexService, "put_hashes", broken)
    store = copy_store(ROCKETMQ_498 / scenario, tmp_path / scenario)
    before = tree_hashes(store)
    with pytest.raises(StoreIOError, match="injected"):
        rebuild(store)
    assert calls  # the thread's put ran and failed
    assert tree_hashes(store) == before
    assert not [p for p in store.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


def test_files_built_during_the_scan_are_kept_only_when_exact(tmp_path, monkeypatch):
    """ConsumeQueues and IndexFiles built while ranges arrive are used when their units
    and puts are exactly the valid records' (a clean store), and thrown away for the bulk
    build when recovery cuts records they saw (a CRC-torn tail): both ways give the same
    files as the bulk build."""
    import random

    import rmqstore.recovery.rebuild as rb
    import test_faults as faults
    from test_grouped import crc_torn_tail

    kept = []
    real_finish = rb.Live.finish

    def spy(self, d, d_index, fsync):
        out = real_finish(self, d, d_index, fsync)
        kept.append(tuple(x is not None for x in out))
        return out

    monkeypatch.setattr(rb.Live, "finish", spy)
    for damage in (None, crc_torn_tail):
        base = faults.make_store(tmp_path / f"base-{damage is None}", seed=3)  # wall-clock times
        if damage:
            damage(base, faults.records(base), random.Random(1))
        stores = []
        for live in (True, False):
            store = tmp_path / f"{damage is None}-{live}"
            shutil.copytree(base, store)
            with monkeypatch.context() as m:
                if not live:
                    m.setattr(rb.Live, "__call__", _not_live)
                rebuild(store, clock=lambda: 1_700_000_000_000, processes=1)
            stores.append(store)
        assert _index_contents(stores[0]) == _index_contents(stores[1])
        assert _cq_files(stores[0]) == _cq_files(stores[1])
    # clean: both kept; torn tail: both thrown away (and so are the disabled ones)
    assert kept == [(True, True), (False, False), (False, False), (False, False)]


@pytest.mark.parametrize("limit", ["MAX_GROUPS", "MAX_QUEUES"])
def test_many_queues_fall_back_to_the_bulk_build(limit, tmp_path, monkeypatch):
    """Past the live builder's queue limits (descriptors, per-range cost) the queues are
    written in bulk at the end; the files are the same either way."""
    import rmqstore.recovery.rebuild_writers as live
    import test_faults as faults

    base = faults.make_store(tmp_path / "base", seed=4)  # 12 queues
    files, dropped = [], []
    for cap in (None, 2):
        store = tmp_path / f"s{cap}"
        shutil.copytree(base, store)
        with monkeypatch.context() as m:
            if cap is not None:
                m.setattr(live, limit, cap)
            m.setattr(live.Live, "_drop_queues", _counting(live.Live._drop_queues, dropped))
            rebuild(store, clock=lambda: 1_700_000_000_000, processes=1)
        files.append(_cq_files(store))
        dropped.append("|")
    assert files[0] == files[1] and dropped == ["|", "dropped", "|"]


def _counting(fn, log):
    def wrapped(self):
        log.append("dropped")
        return fn(self)
    return wrapped


def test_parts_through_shared_memory_equal_parts_through_pipes(tmp_path, monkeypatch):
    """Workers that leave their parts' arrays in the shared arena give the parent the
    same parts as workers that pickle them."""
    import functools

    import numpy as np

    import rmqstore.scan.parallel as par
    import rmqstore.scan.runner as runner
    import test_faults as faults
    from rmqstore.scan.per_queue import grouped_split

    store = faults.make_store(tmp_path / "s", seed=6, count=900)
    cfg = load_config(store)
    monkeypatch.setattr(runner, "PARALLEL_MIN_BYTES", 0)
    task = functools.partial(grouped_split, delay_millis=cfg.delay_millis)
    piped = runner.scan_chains(cfg, task, processes=2, split_size=1 << 15)
    monkeypatch.setattr(par.Arena, "MIN_BYTES", 1)
    shared = runner.scan_chains(cfg, task, processes=2, split_size=1 << 15, shared=0.2)
    assert len(piped) == len(shared) > 1
    in_arena = 0
    for a_chain, b_chain in zip(piped, shared):
        assert len(a_chain) == len(b_chain)
        for a, b in zip(a_chain, b_chain):
            assert a.keys() == b.keys()
            for k in a:
                if isinstance(a[k], np.ndarray):
                    assert np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype, k
                    in_arena += _in_mmap(b[k])
                else:
                    assert a[k] == b[k], k
    assert in_arena > 10


def _in_mmap(a) -> bool:
    """Is ``a`` a view of a memory map (numpy keeps a memoryview of it as the base)?"""
    import mmap

    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, memoryview) and isinstance(a.obj, mmap.mmap)


def test_arena_keeps_what_does_not_fit_as_arrays():
    import numpy as np

    from rmqstore.scan.parallel import Arena, _Ref

    with Arena(2, 4096) as a:
        d = {"small": np.arange(3), "fits": np.arange(400, dtype=np.int32),
             "big": np.arange(5000, dtype=np.int64), "flags": np.ones(2000, bool), "n": 7}
        put = a.put(1, d)
        assert isinstance(put["fits"], _Ref) and isinstance(put["flags"], _Ref)
        assert put["big"] is d["big"] and put["small"] is d["small"] and put["n"] == 7
        got = a.get(put)
        for k in ("fits", "flags"):
            assert np.array_equal(got[k], d[k]) and got[k].dtype == d[k].dtype
            assert _in_mmap(got[k])
