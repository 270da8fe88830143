"""verify on a DLedger store checks its BatchConsumeQueues and LMQ queues (issue #14,
design-14 §1, §4, §5): no RocketMQ fixture has both, so the stores here are composed from
RocketMQ's own bytes. Each record of ``rocketmq-5.3.3/batch-cq`` and ``/lmq`` is wrapped in
a DLedger entry as DLedger writes one (design-14 §1.1: 48-byte header, PHYSICALOFFSET =
entry pos + 48, the rest of a file a blank when an entry does not fit), with the entry
index DLedger keeps (§1.2); every ConsumeQueue, BatchConsumeQueue and IndexFile of the
fixture keeps its bytes but for the CommitLog offsets, moved to the records' new places.

Such a store verifies clean, and damage to a BCQ unit, a BCQ queue or an LMQ queue is
reported as on the plain store (before, verify checked a DLedger log's queues as if it had
neither: BCQ topics expected in ``consumequeue/``, LMQ units unknown); repair writes them
back (never under ``dledger-*/``) and restore undoes it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.recovery.undo import restore
from rmqstore.recovery.verify import verify

F533 = FIXTURES / "rocketmq-5.3.3"
pytestmark = pytest.mark.skipif(not (F533 / "batch-cq").is_dir(),
                                reason=f"no 5.3.3 fixtures under {FIXTURES}")
DATA_FILE, INDEX_FILE = 65536, 8192  # as in rocketmq-5.3.3-dledger/basic
ENTRY = struct.Struct(">iiqqqiiii")  # magic, size, index, term, pos, channel, chainCrc, bodyCrc, bodySize
INDEX_UNIT = struct.Struct(">iqiqq")  # magic, pos, size, index, term
Q = struct.Struct(">q")


def manifest(name: str) -> dict:
    return json.loads((F533 / name / "manifest.json").read_text())


def _patch(path: Path, at: int, moved: dict[int, int]) -> None:
    """The CommitLog offset (i64) at ``at`` moved to its record's new place."""
    data = bytearray(path.read_bytes())
    old = Q.unpack_from(data, at)[0]
    Q.pack_into(data, at, moved[old])
    path.write_bytes(bytes(data))


def compose(name: str, dst: Path) -> dict[int, int]:
    """``rocketmq-5.3.3/<name>`` as a DLedger store at ``dst``; returns old -> new offsets."""
    src, m = F533 / name, manifest(name)
    conf = m["storeConfig"]
    store = copy_store(src, dst)
    (store / "manifest.json").unlink()
    shutil.rmtree(store / "commitlog")
    seg = conf["mappedFileSizeCommitLog"]
    data: dict[int, bytearray] = {}
    units, moved, pos = [], {}, 0
    stored = sorted((e["stored"] for e in m["messages"]), key=lambda s: s["phyOffset"])
    for i, s in enumerate(stored):
        off, size = s["phyOffset"], s["storeSize"]
        rec = bytearray((src / "commitlog" / f"{off - off % seg:020d}").read_bytes()
                        [off % seg:off % seg + size])
        entry = ENTRY.size + size
        room = DATA_FILE - pos % DATA_FILE
        if entry + 8 > room:  # MmapFileList#preAppend: -1, the bytes left, zeros
            f = data.setdefault(pos - pos % DATA_FILE, bytearray(DATA_FILE))
            struct.pack_into(">ii", f, pos % DATA_FILE, -1, room)
            pos += room
        Q.pack_into(rec, 28, pos + ENTRY.size)  # PHYSICALOFFSET (spec §3.1)
        f = data.setdefault(pos - pos % DATA_FILE, bytearray(DATA_FILE))
        f[pos % DATA_FILE:pos % DATA_FILE + entry] = ENTRY.pack(1, entry, i, 0, pos, 0, 0, 0, size) + rec
        units.append(INDEX_UNIT.pack(1, pos, entry, i, 0))
        moved[off] = pos + ENTRY.size
        pos += entry
    ledger = store / "dledger-n0"
    (ledger / "data").mkdir(parents=True)
    (ledger / "index").mkdir()
    for start, f in data.items():
        (ledger / "data" / f"{start:020d}").write_bytes(bytes(f))
    raw = b"".join(units)
    for k in range(0, len(raw), INDEX_FILE):
        (ledger / "index" / f"{k:020d}").write_bytes(raw[k:k + INDEX_FILE].ljust(INDEX_FILE, b"\0"))
    n = len(stored) - 1
    (ledger / "checkpoint").write_text(f"committedIndex={n}\nendIndex={n}\n")
    (ledger / "currterm").write_text("voteLeader=n0\ncurrTerm=0\n")
    # Queue units (spec §6.1: phy @0 of 20 bytes; design-14 §4.1: phy @0 of 46 bytes).
    for folder, unit in (("consumequeue", 20), ("batchconsumequeue", 46)):
        for p in sorted((store / folder).rglob("*")) if (store / folder).is_dir() else []:
            if p.is_file():
                for at in range(0, p.stat().st_size - unit + 1, unit):
                    if p.read_bytes()[at:at + unit] != bytes(unit):
                        _patch(p, at, moved)
    # IndexFiles (spec §7.1: begin/endPhyOffset @16/@24, indexCount @36; entries after the
    # slots, phyOffset at +4 of each 20 bytes, entry 0 unused).
    slots = conf["maxHashSlotNum"]
    for p in sorted((store / "index").iterdir()):
        count = struct.unpack_from(">i", p.read_bytes(), 36)[0]
        for at in [16, 24] + [40 + slots * 4 + k * 20 + 4 for k in range(1, count)]:
            _patch(p, at, moved)
    return moved


def problems(r) -> list[tuple]:
    return [(f.code, f.file, f.offset) for f in r.problems]


@pytest.mark.parametrize("name", ["batch-cq", "lmq"])
def test_a_composed_dledger_store_with_5x_queues_verifies_clean(name, tmp_path):
    store = tmp_path / name
    compose(name, store)
    before = tree_hashes(store)
    r = verify(store, deep=True)
    assert r.ok, problems(r)
    assert r.scan.chain is not None  # read as a DLedger log
    assert r.messages == len(manifest(name)["messages"])
    assert r.variants is not None  # the 5.x queues were checked
    if name == "batch-cq":
        assert sum(len(u) for u in r.variants.bcq.values()) == 30
    else:
        assert r.variants.lmq_units == 61
    assert tree_hashes(store) == before


def test_damaged_bcq_units_and_queues_of_a_dledger_store_are_reported(tmp_path):
    store = tmp_path / "s"
    moved = compose("batch-cq", store)
    f = store / "batchconsumequeue" / "TopicBCQ" / "0" / "00000000000000000736"
    data = bytearray(f.read_bytes())
    at = 3 * 46 + 28  # unit 16+3's msgBaseOffset (design-14 §4.1)
    data[at:at + 8] = (999).to_bytes(8, "big")
    f.write_bytes(bytes(data))
    shutil.rmtree(store / "batchconsumequeue" / "TopicBCQ" / "1")
    r = verify(store)
    mism = [x for x in r.findings if x.code == "bcq-mismatch"]
    assert [(x.file, x.offset) for x in mism] == [
        ("batchconsumequeue/TopicBCQ/0/00000000000000000736", 3 * 46)]
    assert "msg_base_offset 999" in mism[0].explanation
    tail = [x for x in r.findings if x.code == "bcq-missing-tail"]
    first = manifest("batch-cq")["queues"][1]["cqEntries"][0]  # TopicBCQ/1
    assert len(tail) == 1 and f"TopicBCQ/1: 4 record(s) from CommitLog {moved[first[1]]}" \
        in tail[0].explanation


def test_a_deleted_lmq_queue_of_a_dledger_store_is_reported(tmp_path):
    store = tmp_path / "s"
    compose("lmq", store)
    shutil.rmtree(store / "consumequeue" / "%LMQ%room3")
    r = verify(store)
    got = [(x.code, x.file, x.data.get("count")) for x in r.problems]
    assert got == [("cq-missing-tail", "consumequeue/%LMQ%room3/0/00000000000000000000", 11)]


def test_repair_writes_a_dledger_stores_bcq_and_lmq_queues_back(tmp_path):
    for name, gone in (("batch-cq", "batchconsumequeue/TopicBCQ/0/00000000000000000736"),
                       ("lmq", "consumequeue/%LMQ%room3")):
        store = tmp_path / name
        compose(name, store)
        want = tree_hashes(store)
        p = store / gone
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        before = tree_hashes(store)
        res = repair(store, backup_dir=tmp_path / f"{name}.bk")
        assert res.executed and not res.plan.refused, res.plan.refused
        after = tree_hashes(store)
        assert {k: v for k, v in after.items() if k != "checkpoint"} == \
            {k: v for k, v in want.items() if k != "checkpoint"}  # dledger-n0/ untouched too
        assert verify(store).ok and plan_repair(store).steps == []
        restore(res.backup_dir)
        assert tree_hashes(store) == before
