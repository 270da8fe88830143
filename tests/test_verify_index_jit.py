"""verify's IndexFile check compiled (files/index_jit.check_chains, check_pointers) reports
what its numpy definition (recovery/verify_index.file_facts) reports: the same facts for
every file and the same findings (codes, files, offsets, wording), on the RocketMQ fixture
stores and on seeded damage to their IndexFiles (a wrong slot, a broken or merged chain, a
self-linked entry, a key no chain reaches, a wrong offset, a wrong indexCount, a truncated
file, random words), also with the chains checked beside the scan; and a kernel that gets
one count wrong is caught."""

from __future__ import annotations

import random
import shutil
import struct
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from conftest import copy_store
from rmqstore.files import index_jit
from rmqstore.files.config import config_for
from rmqstore.files.index import IndexFile, IndexGeometry
from rmqstore.format import layout as L
from rmqstore.recovery import verify_index as VI
from rmqstore.recovery.verify import verify

BASES = ["basic", "crash-torn", "special"]
DAMAGES = ["wrong-slot", "broken-chain", "self-link", "missing-key", "wrong-offset",
           "index-count", "truncated", "noise"]
_FIELDS = L.INDEX_ENTRY_DTYPE.fields


def _words(p: Path, at: int, fmt: str, *values) -> None:
    with open(p, "r+b") as f:
        f.seek(at)
        f.write(struct.pack(fmt, *values))


def _read(p: Path, at: int, fmt: str):
    with open(p, "rb") as f:
        f.seek(at)
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _damage(root: Path, kind: str, rng: random.Random, geometry=None) -> str:
    """Damage one IndexFile of the store at ``root`` as ``kind`` says (``geometry``:
    (slots, entries), by default what the store's files give); what was done."""
    if geometry is None:
        cfg = config_for(root, None)
        geometry = cfg.max_hash_slot_num, cfg.max_index_num
    slots, num = geometry
    p = rng.choice(sorted((root / "index").iterdir()))
    ic = min(max(_read(p, 36, ">i"), 1), num)  # as verify reads it
    slot_at = L.index_slot_position
    entry_at = lambda e, name: L.index_entry_position(slots, e) + _FIELDS[name][1]  # noqa: E731
    heads = [s for s in range(slots) if 0 < _read(p, slot_at(s), ">i") < ic]
    linked = [e for e in range(1, ic) if _read(p, entry_at(e, "prev_index"), ">i") > 0]
    if kind == "wrong-slot" and heads:  # a head moved to another slot
        s = rng.choice(heads)
        to = (s + rng.randrange(1, slots)) % slots
        _words(p, slot_at(to), ">i", _read(p, slot_at(s), ">i"))
        if rng.random() < 0.5:
            _words(p, slot_at(s), ">i", 0)
        return f"{p.name}: slot {s} head put in slot {to}"
    if kind == "self-link" and ic > 1:  # an entry its own predecessor
        e = rng.randrange(1, ic)
        _words(p, entry_at(e, "prev_index"), ">i", e)
        return f"{p.name}: entry {e} prev -> itself"
    if kind == "broken-chain" and len(linked) > 1 and rng.random() < 0.4:  # chains merge
        a, b = sorted(rng.sample(linked, 2))
        _words(p, entry_at(b, "prev_index"), ">i", _read(p, entry_at(a, "prev_index"), ">i"))
        return f"{p.name}: entry {b} takes entry {a}'s predecessor"
    if kind == "broken-chain" and ic > 2:  # a link forward, to itself, across slots, negative
        e = rng.choice(linked or range(1, ic))
        to = rng.choice([e, min(e + 1 + rng.randrange(5), ic + 3), rng.randrange(1, ic), -1,
                         rng.randrange(-5, 0)])
        _words(p, entry_at(e, "prev_index"), ">i", to)
        return f"{p.name}: entry {e} prev -> {to}"
    if kind == "missing-key" and heads:  # a slot head skipped: its key is in no chain
        s = rng.choice(heads)
        h = _read(p, slot_at(s), ">i")
        _words(p, slot_at(s), ">i", _read(p, entry_at(h, "prev_index"), ">i"))
        return f"{p.name}: slot {s} skips entry {h}"
    if kind == "wrong-offset" and ic > 1:  # inside a record, past the end, before the log
        e = rng.randrange(1, ic)
        phy = _read(p, entry_at(e, "phy_offset"), ">q")
        to = rng.choice([phy + rng.randrange(1, 50), phy + (1 << 30), -rng.randrange(1, 9),
                         rng.randrange(0, 1 << 20)])
        _words(p, entry_at(e, "phy_offset"), ">q", to)
        if rng.random() < 0.3:
            _words(p, entry_at(e, "key_hash"), ">i", -rng.randrange(1, 1 << 31))
        if rng.random() < 0.3:
            _words(p, entry_at(e, "time_diff"), ">i", -1)
        return f"{p.name}: entry {e} phy {phy} -> {to}"
    if kind == "index-count":  # more than the file holds, fewer than it has, or zero
        to = rng.choice([num + rng.randrange(1, 9), rng.randrange(0, max(ic, 1)), 0, num])
        _words(p, 36, ">i", to)
        return f"{p.name}: indexCount {ic} -> {to}"
    if kind == "truncated":
        size = p.stat().st_size
        with open(p, "r+b") as f:
            f.truncate(rng.randrange(0, size))
        return f"{p.name} truncated"
    # noise: random words over the slots and entries
    end = L.index_entry_position(slots, min(max(ic, 2) + 2, num))
    for _ in range(rng.randrange(1, 6)):
        at = rng.randrange(L.INDEX_HEADER_SIZE, end - 4) & ~3
        _words(p, at, ">I", rng.getrandbits(32) if rng.random() < 0.5 else rng.randrange(ic + 3))
    return f"{p.name}: noise"


def _findings(root: Path, monkeypatch, *, jit: bool) -> list[dict]:
    if jit:
        monkeypatch.delenv("RMQSTORE_NO_JIT", raising=False)
    else:
        monkeypatch.setenv("RMQSTORE_NO_JIT", "1")
    return [asdict(f) for f in verify(root).findings]


def _both(root: Path, monkeypatch) -> tuple[list[dict], list[dict]]:
    """(numpy findings, compiled findings) of ``root``; the compiled check must run on
    every whole IndexFile (with the geometry verify finds)."""
    ref = _findings(root, monkeypatch, jit=False)
    before = VI.used["kernel"]
    got = _findings(root, monkeypatch, jit=True)
    cfg = config_for(root, None)
    size = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num).file_size
    whole = [p for p in (root / "index").iterdir() if p.stat().st_size == size]
    assert VI.used["kernel"] - before == len(whole)
    return ref, got


def _facts_both(root: Path, monkeypatch) -> list[tuple]:
    """(numpy facts, compiled facts) of each whole IndexFile of ``root`` against its
    records, and against a few other ends, start offsets and stored offsets."""
    monkeypatch.delenv("RMQSTORE_NO_JIT", raising=False)
    r = verify(root)
    pos = r.scan.records("offset")
    cfg = config_for(root, None)
    g = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
    out = []
    for p in sorted((root / "index").iterdir()):
        if p.stat().st_size != g.file_size:
            continue
        f = IndexFile(p, g)
        try:
            mid = int(pos[len(pos) // 6 * 3]) if len(pos) else 0  # one of those missing
            # the records, or every third one missing (entries pointing at those and at
            # the start offset itself point nowhere), at other ends and start offsets
            for valid, end, lo, odd in ((pos, r.end, 0, None),
                                        (pos, r.end // 2, 0, pos[1::3].copy()),
                                        (np.delete(pos, slice(None, None, 3)), r.end, mid, None)):
                out.append((VI.file_facts(f, valid, end, lo, odd),
                            VI.compiled_facts(f, valid, end, lo, odd)))
        finally:
            f.close()
    return out


@pytest.fixture
def store(tmp_path, fixtures_root):
    """A copy of a RocketMQ 4.9.8 fixture store (skipped with the fixtures' reason where
    ../shared/fixtures is absent)."""
    def make(base: str) -> Path:
        return copy_store(fixtures_root / base, tmp_path / base)
    return make


@pytest.mark.parametrize("base", BASES)
def test_fixture_stores_same_facts_and_findings(base, store, monkeypatch):
    root = store(base)
    facts = _facts_both(root, monkeypatch)
    assert facts
    for ref, got in facts:
        assert got == ref
    ref, got = _both(root, monkeypatch)
    assert got == ref


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("seed", range(4))
def test_each_damage_same_findings(kind, seed, store, monkeypatch):
    rng = random.Random(f"{kind}/{seed}")
    root = store(rng.choice(BASES))
    what = _damage(root, kind, rng)
    ref, got = _both(root, monkeypatch)
    assert got == ref, what
    if kind != "truncated":
        for a, b in _facts_both(root, monkeypatch):
            assert b == a, what


def test_damage_is_found(store, monkeypatch):
    """The seeded damage reaches every finding the file check makes (so the comparisons
    above compare something)."""
    codes = set()
    for kind in DAMAGES:
        for seed in range(4):
            rng = random.Random(f"{kind}/{seed}")
            root = store(rng.choice(BASES))
            _damage(root, kind, rng)
            codes |= {f["code"] for f in _findings(root, monkeypatch, jit=True)}
            shutil.rmtree(root)
    assert {"index-chain", "index-orphan", "index-header", "index-bad-pointer",
            "index-beyond-end", "index-file"} <= codes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), kinds=st.lists(st.sampled_from(DAMAGES[:-2] + ["noise"]),
                                                       min_size=1, max_size=3))
@example(seed=7, kinds=["noise", "wrong-slot"])
def test_combined_damage_same_facts(fixtures_root, seed, kinds):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        root = copy_store(fixtures_root / rng.choice(BASES), Path(d) / "s")
        cfg = config_for(root, None)
        for kind in kinds:  # the geometry of the undamaged files: damage can hide it
            _damage(root, kind, rng, (cfg.max_hash_slot_num, cfg.max_index_num))
        for a, b in _facts_both(root, mp):
            assert b == a, kinds
        ref, got = _both(root, mp)
        assert got == ref, kinds


def test_python_modulo_on_negative_hashes():
    """The kernel's multiply-and-correct modulo is Python's %, signs and all."""
    ends = [-(2**31), -(2**31) + 1, -7, -1, 0, 1, 6, 7, 2**31 - 1]
    for n in (1, 2, 7, 49, 64, 5_000_000, 4_999_999, 2**31 - 1):
        # multiples (49 / 49.0 * ... rounds below 1: the quotient comes out one short)
        near = [k * n + d for k in range(-60, 60) for d in (-1, 0, 1)]
        vals = [v for v in ends + near if -(2**31) <= v < 2**31]
        got = [index_jit._mod(v, n, 1.0 / n) for v in vals]  # noqa: SLF001
        assert got == [v % n for v in vals], n


@pytest.mark.parametrize("count", [index_jit.C_WRONG_SLOT, index_jit.C_BAD, index_jit.C_ORPHANS,
                                   index_jit.C_NOWHERE_FIRST])
def test_a_wrong_kernel_is_caught(count, store, monkeypatch):
    """A kernel that gets one number wrong makes the comparisons above fail."""
    name = "check_chains" if count <= index_jit.C_ORPHAN_FIRST else "check_pointers"
    real = getattr(index_jit, name)

    def wrong(*args):
        real(*args)
        out = args[-1]
        out[count] = out[count] + 1

    monkeypatch.setattr(index_jit, name, wrong)
    caught = 0
    for kind in ("wrong-slot", "broken-chain", "missing-key", "wrong-offset"):
        rng = random.Random(f"{kind}/0")
        root = store(rng.choice(BASES))
        _damage(root, kind, rng)
        caught += any(a != b for a, b in _facts_both(root, monkeypatch))
        ref, got = (_findings(root, monkeypatch, jit=j) for j in (False, True))
        caught += ref != got
        shutil.rmtree(root)
    assert caught


@pytest.mark.parametrize("kind", ["wrong-slot", "broken-chain", "missing-key", "noise"])
def test_chains_checked_beside_the_scan(kind, store, monkeypatch):
    """The slot and chain part run in a child beside the CommitLog scan gives the same
    findings, and is used for every file whose indexCount it saw."""
    rng = random.Random(f"{kind}/1")
    root = store(rng.choice(BASES))
    what = _damage(root, kind, rng)
    ref = _findings(root, monkeypatch, jit=False)
    monkeypatch.setattr(VI, "CHAINS_BESIDE_MIN", 0)
    before = VI.used["beside"]
    got = _findings(root, monkeypatch, jit=True)
    assert got == ref, what
    assert VI.used["beside"] - before == len(list((root / "index").iterdir()))
