"""The compiled IndexFile bulk put (files/index_jit) writes the bytes of the numpy form and
of putKey one entry at a time (spec §7.4), on generated puts and on the RocketMQ fixtures."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, copy_store, scenario_params
from rmqstore.files import index as I
from rmqstore.files.config import load_config
from rmqstore.files.index import IndexGeometry
from rmqstore.files.index_service import IndexService
from rmqstore.format import layout as L
from rmqstore.format.hashing import index_hash, java_hash
from rmqstore.recovery.rebuild import rebuild

INT32_MAX = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)
# Its Java hash is Integer.MIN_VALUE (test_codec pins it): Math.abs leaves it negative and
# the broker indexes it as 0 (spec §7.2).
MIN_VALUE_KEY = "TopicTest#key-qqhdwuj"
T0 = 1_700_000_000_000


@contextlib.contextmanager
def _path(kind: str):
    """Puts in the block take ``kind``: "numpy" (RMQSTORE_NO_JIT=1) or "kernel" (every
    batch, however small, to the compiled put)."""
    old_env, old_min = os.environ.pop("RMQSTORE_NO_JIT", None), I.JIT_MIN_ENTRIES
    if kind == "numpy":
        os.environ["RMQSTORE_NO_JIT"] = "1"
    I.JIT_MIN_ENTRIES = 1
    try:
        yield
    finally:
        os.environ.pop("RMQSTORE_NO_JIT", None)
        if old_env is not None:
            os.environ["RMQSTORE_NO_JIT"] = old_env
        I.JIT_MIN_ENTRIES = old_min


def _build(root: Path, geometry: IndexGeometry, batches, how: str, garbage, reopen):
    """The IndexFiles ``batches`` make, as (name, bytes): ``how`` is "put" (putKey per
    entry, the definition), "numpy" or "kernel" (``put_hashes`` per batch). ``garbage``
    seeds the first file's slots (heads a put must judge); ``reopen[i]`` closes and
    reopens the service before batch ``i``."""
    names = iter(range(T0, T0 + 10**9, 1000))
    clock = lambda: next(names)  # noqa: E731
    ctx = _path(how) if how != "put" else contextlib.nullcontext()
    svc = IndexService(root, geometry, clock=clock, flush_full_files=False)
    try:
        with ctx:
            if garbage is not None:
                f = svc.current_file()
                slots = f.slots
                slots[:] = garbage
                del slots
            for i, batch in enumerate(batches):
                if reopen[i]:
                    svc.close()
                    svc = IndexService(root, geometry, clock=clock, flush_full_files=False)
                h, phy, ts = (np.array(c, np.int64).reshape(-1) for c in zip(*batch)) \
                    if batch else (np.zeros(0, np.int64),) * 3
                if how == "put":
                    for x in batch:
                        svc.put_hash(*x)
                else:
                    svc.put_hashes(h, phy, ts)
    finally:
        svc.close()
    return [(p.name, p.read_bytes()) for p in sorted(root.iterdir())]


def _all_three(geometry, batches, garbage=None, reopen=None):
    reopen = reopen or [False] * len(batches)
    out = {}
    with tempfile.TemporaryDirectory(prefix="indexjit-") as d:
        for how in ("put", "numpy", "kernel"):
            before = I.used["kernel"]
            out[how] = _build(Path(d) / how, geometry, batches, how, garbage, reopen)
            if how == "kernel" and any(batches):
                assert I.used["kernel"] > before, dict(I.used)  # the kernel did run
    return out


def _assert_same(out):
    assert out["numpy"] == out["put"]
    assert out["kernel"] == out["put"]


def test_numba_is_there():
    # A dependency (pyproject): without it the tests below would compare numpy with itself.
    assert I._kernel() is not None


@st.composite
def _plans(draw):
    slots = draw(st.integers(1, 7))
    entries = draw(st.integers(2, 12))
    # A few distinct hashes, so keys collide in their slots and repeat; 0 is where a
    # MIN_VALUE key goes, INT32_MAX the largest index hash.
    pool = draw(st.lists(st.one_of(st.sampled_from([0, 1, slots, INT32_MAX]),
                                   st.integers(0, INT32_MAX)), min_size=1, max_size=6))
    base = draw(st.sampled_from([T0, 0, -5, 1, 999, 2**62]))
    stamp = st.one_of(st.integers(-3_000, 10**7).map(lambda d: base + d),  # before begin too
                      st.integers(*INT64), st.sampled_from([0, -1, 2**63 - 1, -(2**63)]))
    put = st.tuples(st.sampled_from(pool), st.integers(*INT64), stamp)
    batches = draw(st.lists(st.lists(put, max_size=3 * entries), min_size=1, max_size=4))
    garbage = draw(st.none() | st.lists(st.integers(-3, entries + 3), min_size=slots,
                                        max_size=slots))
    reopen = draw(st.lists(st.booleans(), min_size=len(batches), max_size=len(batches)))
    return IndexGeometry(slots, entries), batches, garbage, reopen


@settings(max_examples=300, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=_plans())
@example(plan=(IndexGeometry(3, 6), [[(7, 100 * i, T0 + i) for i in range(5)]], None, [False]))
@example(plan=(IndexGeometry(3, 6), [[(7, 100 * i, T0 - 1000 * i) for i in range(11)]], None,
               [False]))
def test_generated_puts_write_the_same_bytes(plan):
    geometry, batches, garbage, reopen = plan
    _assert_same(_all_three(geometry, batches, garbage, reopen))


def test_a_file_filled_exactly_then_the_next():
    # maxIndexNum 6 holds entries 1..5: five puts fill a file to the last entry, the next
    # batch opens the second file, which starts from the first's end (spec §7.4).
    g = IndexGeometry(2, 6)
    fill = [[(k % 3, 1000 + k, T0 + 1000 * k) for k in range(5)]]
    out = _all_three(g, fill + [[(9, 2000, T0 + 9000)]])
    _assert_same(out)
    assert len(out["kernel"]) == 2
    first = L.INDEX_HEADER_STRUCT.unpack(out["kernel"][0][1][:L.INDEX_HEADER_SIZE])
    assert first[5] == 6 and first[3] == 1004  # indexCount full, endPhyOffset the last put
    # one batch running over: 5 entries in the first file, 6 in the next
    out = _all_three(g, [[(k, 10 * k, T0 + k) for k in range(11)]])
    _assert_same(out)
    counts = [L.INDEX_HEADER_STRUCT.unpack(b[:L.INDEX_HEADER_SIZE])[5] for _, b in out["kernel"]]
    assert counts == [6, 6, 2]


def test_min_value_keys_and_late_timestamps():
    assert java_hash(MIN_VALUE_KEY) == -(2**31) and index_hash(MIN_VALUE_KEY) == 0
    h = [index_hash(MIN_VALUE_KEY), index_hash("TopicTest#a"), 0, index_hash(MIN_VALUE_KEY)]
    ts = [T0 + 5000, T0, T0 - 10**9, T0 + 2**31 * 1000 + 10**6]  # before begin, past int32
    out = _all_three(IndexGeometry(4, 16), [list(zip(h, [1, 2, 3, 4], ts))] * 2)
    _assert_same(out)
    b = out["kernel"][0][1]
    start = L.index_entry_position(4, 0)
    td = np.frombuffer(b, L.INDEX_ENTRY_DTYPE, offset=start)["time_diff"][1:9]
    assert td.tolist() == [0, 0, 0, INT32_MAX] * 2  # second batch: begin is T0 + 5000


def test_the_switch_forces_numpy(tmp_path, monkeypatch):
    monkeypatch.setattr(I, "JIT_MIN_ENTRIES", 1)
    monkeypatch.setenv("RMQSTORE_NO_JIT", "1")
    before = I.used["kernel"]
    with IndexService(tmp_path, IndexGeometry(4, 16), clock=lambda: T0) as svc:
        svc.put_hashes([1, 2, 3], [10, 20, 30], [T0, T0, T0])
    assert I.used["kernel"] == before


def test_small_batches_stay_numpy_by_default(tmp_path):
    # numba is imported by bulk work only: a put of a few keys never loads it
    before = I.used["kernel"]
    with IndexService(tmp_path, IndexGeometry(4, 16), clock=lambda: T0) as svc:
        svc.put_hashes([1, 2, 3], [10, 20, 30], [T0, T0, T0])
    assert I.used["kernel"] == before and 3 < I.JIT_MIN_ENTRIES


def _index_contents(root):
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


@pytest.mark.parametrize("scenario", scenario_params(MESSAGE_SCENARIOS))
def test_rebuild_index_with_the_kernel_equals_rocketmq(scenario, tmp_path, monkeypatch):
    # The stores RocketMQ 4.9.8 wrote (maxIndexNum 256: most have several files, each
    # filled to its last entry before the next key opens the next): rebuilt with every bulk put compiled.
    monkeypatch.setattr(I, "JIT_MIN_ENTRIES", 1)
    monkeypatch.delenv("RMQSTORE_NO_JIT", raising=False)
    src = ROCKETMQ_498 / scenario
    store = copy_store(src, tmp_path / scenario)
    cfg = load_config(src).with_values(store_path_root_dir=str(store))
    shutil.rmtree(store / "index")
    before = I.used["kernel"]
    rebuild(store, config=cfg, consume_queue=False, index=True, clock=lambda: 1_700_000_000_000)
    assert I.used["kernel"] > before
    if scenario == "basic":
        assert len(_index_contents(src)) == 5  # four files filled, the fifth began by a put
    assert _index_contents(store) == _index_contents(src)  # names differ, bytes do not
