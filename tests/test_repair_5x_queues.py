"""Issue #14 WP G: `repair` of RocketMQ 5.x BatchConsumeQueues and LMQ queues, on damaged
copies of ``rocketmq-5.3.3/batch-cq`` and ``rocketmq-5.3.3/lmq`` (design-14 §4.2, §5.2).

After the repair every queue holds what RocketMQ served (the manifest's ``queues[].cqEntries``)
for the records that survive the damage, verify is clean, a second plan is empty, and
``restore`` gives back the damaged store byte for byte. The healthy fixtures are left as
they are. Damage is chosen by seeded randomness: where the CommitLog is cut, which BCQ
file is cut short, which unit byte flips, which LMQ queue goes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.files.batchconsumequeue import open_batch_consume_queue
from rmqstore.files.consumequeue import list_queues, open_consume_queue
from rmqstore.recovery.repair import repair
from rmqstore.recovery.repair_plan import plan_repair
from rmqstore.recovery.undo import restore
from rmqstore.recovery.verify import verify

runner = CliRunner()
F533 = FIXTURES / "rocketmq-5.3.3"
pytestmark = pytest.mark.skipif(not (F533 / "batch-cq").is_dir(),
                                reason=f"no 5.3.3 fixtures under {FIXTURES}")
BCQ_FILE, CQ_FILE = 736, 1280  # the fixtures' storeConfig (mapperFileSize*)
UNIT = 46  # a BatchConsumeQueue unit (design-14 §4.1)
V1 = -626843481  # MESSAGE_MAGIC_CODE v1 (spec §3.1)


def manifest(name: str) -> dict:
    return json.loads((F533 / name / "manifest.json").read_text())


def damaged_copy(name: str, tmp_path: Path) -> Path:
    store = copy_store(F533 / name, tmp_path / name)
    (store / "manifest.json").unlink()
    return store


def state(root: Path) -> tuple:
    """Every file's bytes (hashed) and every directory: what restore must give back."""
    return tree_hashes(root), sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir())


def served(store: Path, q: dict) -> list[list[int]]:
    """The queue's units as the library reads them, in the manifest's form."""
    if q.get("cqType") == "BatchCQ":
        try:
            with open_batch_consume_queue(store, q["topic"], q["queueId"]) as bcq:
                return [[u.base_offset, u.commit_log_offset, u.size, u.tags_code, u.batch_num,
                         u.compacted_offset] for u in bcq]
        except Exception:  # noqa: BLE001 - a queue directory the repair left empty or absent
            return []
    if not (store / "consumequeue" / q["topic"] / str(q["queueId"])).is_dir():
        return []
    with open_consume_queue(store, q["topic"], q["queueId"], CQ_FILE) as cq:
        return [list(u) for u in cq]


def files(root: Path, part: str) -> dict[str, bytes]:
    base = root / part
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def repaired(store: Path, tmp_path: Path):
    """Repair with a backup; verify is clean after it and a second plan has nothing to do."""
    before = state(store)
    assert not verify(store).ok  # the damage is seen
    res = repair(store, backup_dir=tmp_path / "backup")
    assert res.executed and not res.plan.refused, res.plan.refused
    r = verify(store, deep=True)
    assert r.ok, [(f.code, f.file, f.explanation) for f in r.problems]
    assert plan_repair(store).steps == []
    return res, before


def undone(res, store: Path, before) -> None:
    restore(res.backup_dir)
    assert state(store) == before  # the damaged bytes, exactly


def cut_inside(store: Path, stored: dict, rng: random.Random, segment_size: int) -> int:
    """Zero the CommitLog from a random byte inside ``stored``'s fixed part or body to the
    end of its segment (a torn write). A record with IPv4 hosts and magic v1 has its body
    at 88 (spec §3.1), so the cut breaks the size rule or the body CRC (§3.9): the record
    is lost and every one before it survives. Returns the record's offset."""
    assert stored["magic"] == V1 and stored["bornHost"].count(":") == 1
    rec = stored["phyOffset"]
    at = rng.randrange(rec + 1, rec + 88 + stored["bodyLength"])
    seg = rec - rec % segment_size
    p = store / "commitlog" / f"{seg:020d}"
    data = bytearray(p.read_bytes())
    data[at - seg:] = bytes(len(data) - (at - seg))
    p.write_bytes(bytes(data))
    return rec


# --- BatchConsumeQueue ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cut_commitlog_tail_cuts_bcq_and_cq_units_past_the_end(seed, tmp_path):
    """truncateDirtyLogicFiles: units whose record starts at or past the end go, those
    before stay (design-14 §4.2: a BCQ compares the record *start*)."""
    m = manifest("batch-cq")
    rng = random.Random(seed)
    stored = rng.choice([e["stored"] for e in m["messages"] if e["stored"]["phyOffset"] >= 9000])
    store = damaged_copy("batch-cq", tmp_path)
    end = cut_inside(store, stored, rng, m["storeConfig"]["mappedFileSizeCommitLog"])
    res, before = repaired(store, tmp_path)
    past = any(u[1] >= end for q in m["queues"] if q.get("cqType") == "BatchCQ"
               for u in q["cqEntries"])
    assert ("cut-bcq" in {s.action for s in res.plan.steps}) == past
    for q in m["queues"]:
        assert served(store, q) == [u for u in q["cqEntries"] if u[1] < end], (q["topic"], end)
    undone(res, store, before)


@pytest.mark.parametrize("damage", ["cut-short", "delete-file", "delete-queue", "zero-unit"])
def test_a_missing_or_short_bcq_tail_is_dispatched_again(damage, tmp_path):
    """A BCQ file cut short (the broker refuses its size), the last file or a whole queue
    gone, a unit the broker's recover stops at: the queue is written again from the
    records, byte-identical to RocketMQ's files."""
    rng = random.Random(damage)
    store = damaged_copy("batch-cq", tmp_path)
    q0 = store / "batchconsumequeue" / "TopicBCQ" / "0"
    if damage == "cut-short":
        f = q0 / f"{BCQ_FILE:020d}"
        os.truncate(f, rng.randrange(1, BCQ_FILE))
    elif damage == "delete-file":
        (q0 / f"{BCQ_FILE:020d}").unlink()
    elif damage == "delete-queue":
        shutil.rmtree(store / "batchconsumequeue" / "TopicBCQ" / rng.choice("01"))
    else:  # batchNum 0: recovery ends the queue there (design-14 §4.2)
        f = q0 / f"{0:020d}"
        data = bytearray(f.read_bytes())
        k = rng.randrange(1, BCQ_FILE // UNIT)
        data[k * UNIT + 36:k * UNIT + 38] = b"\0\0"
        f.write_bytes(bytes(data))
    res, before = repaired(store, tmp_path)
    assert files(store, "batchconsumequeue") == files(F533 / "batch-cq", "batchconsumequeue")
    for q in manifest("batch-cq")["queues"]:
        assert served(store, q) == q["cqEntries"]
    undone(res, store, before)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_corrupt_bcq_unit_is_rebuilt_from_the_records(seed, tmp_path):
    """One byte of one unit flipped (size, tagsCode, store time, base, batchNum or the low
    bytes of the CommitLog offset): the queue equals RocketMQ's files again."""
    rng = random.Random(seed)
    store = damaged_copy("batch-cq", tmp_path)
    q = rng.choice(["0", "1"])
    f = rng.choice(sorted((store / "batchconsumequeue" / "TopicBCQ" / q).iterdir()))
    data = bytearray(f.read_bytes())
    used = len(data.rstrip(b"\0")) // UNIT or 1
    at = rng.randrange(used) * UNIT + rng.randrange(6, 38)
    data[at] ^= rng.randrange(1, 256)
    f.write_bytes(bytes(data))
    res, before = repaired(store, tmp_path)
    assert files(store, "batchconsumequeue") == files(F533 / "batch-cq", "batchconsumequeue")
    undone(res, store, before)


def test_a_topic_only_its_records_call_batchcq_gets_no_queue(tmp_path):
    """batchconsumequeue/ and config/topics.json gone: only the inner-batch records say
    TopicBCQ is BatchCQ (design-14 D5); repair writes no BatchConsumeQueue from a guess
    and says why (as rebuild refuses)."""
    store = damaged_copy("batch-cq", tmp_path)
    shutil.rmtree(store / "batchconsumequeue")
    (store / "config" / "topics.json").unlink()
    plan = plan_repair(store)
    assert plan.steps == []
    why = {(f.code, w) for f, w in plan.unfixed}
    assert len(why) == 1 and "restore config/topics.json" in next(iter(why))[1]


# --- LMQ --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_a_deleted_lmq_queue_is_dispatched_again(seed, tmp_path):
    """``consumequeue/%LMQ%…/0`` gone: its units come back from the records by design-14
    §5.2, byte-identical to RocketMQ's ConsumeQueue files."""
    store = damaged_copy("lmq", tmp_path)
    lmq = sorted(r.path for r in list_queues(store).queues if r.topic.startswith("%LMQ%"))
    assert len(lmq) == 4
    gone = random.Random(seed).choice(lmq)
    shutil.rmtree(gone if seed % 2 else gone.parent)  # the queue, or its whole topic
    res, before = repaired(store, tmp_path)
    assert [s.action for s in res.plan.steps][:1] == ["dispatch-queue"]
    assert files(store, "consumequeue") == files(F533 / "lmq", "consumequeue")
    undone(res, store, before)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cut_commitlog_tail_cuts_lmq_units_past_the_end(seed, tmp_path):
    """A torn write in the last segment holding data, the segment after it never written:
    LMQ units of the lost records are cut like any ConsumeQueue's."""
    m = manifest("lmq")
    size = m["storeConfig"]["mappedFileSizeCommitLog"]
    rng = random.Random(seed)
    last = max(e["stored"]["phyOffset"] for e in m["messages"])
    torn = [e["stored"] for e in m["messages"]
            if last - last % size - size <= e["stored"]["phyOffset"] < last - last % size
            and "INNER_MULTI_QUEUE_OFFSET" in e["stored"]["properties"]]
    stored = rng.choice(torn)
    store = damaged_copy("lmq", tmp_path)
    end = cut_inside(store, stored, rng, size)
    p = store / "commitlog" / f"{last - last % size:020d}"
    p.write_bytes(bytes(p.stat().st_size))  # never written
    res, before = repaired(store, tmp_path)
    assert any(s.action == "cut-queue" and "%LMQ%" in s.path for s in res.plan.steps)
    for q in m["queues"]:
        assert served(store, q) == [u for u in q["cqEntries"] if u[1] < end], (q["topic"], end)
    undone(res, store, before)


def test_lmq_queues_all_gone_need_enable_multi_dispatch_from_broker_conf(tmp_path):
    """consumequeue/ deleted: whether the broker wrote LMQ queues is known only from
    broker.conf (design-14 D6); without it repair refuses, naming the key, and changes
    nothing; with it every queue comes back byte-identical."""
    store = damaged_copy("lmq", tmp_path)
    shutil.rmtree(store / "consumequeue")
    before = state(store)
    conf = tmp_path / "broker.conf"
    conf.write_text(f"mappedFileSizeConsumeQueue={CQ_FILE}\n")
    r = runner.invoke(app, ["repair", str(store), "--yes", "-c", str(conf)])
    assert r.exit_code == 2 and "enableMultiDispatch" in r.stderr, r.stderr
    assert state(store) == before
    conf.write_text(f"mappedFileSizeConsumeQueue={CQ_FILE}\nenableLmq=true\nenableMultiDispatch=true\n")
    r = runner.invoke(app, ["repair", str(store), "--yes", "-c", str(conf)])
    assert r.exit_code == 0, r.stderr
    assert files(store, "consumequeue") == files(F533 / "lmq", "consumequeue")


# --- healthy stores, the command ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["batch-cq", "lmq"])
def test_repair_changes_nothing_on_the_healthy_fixtures(name, tmp_path):
    store = copy_store(F533 / name, tmp_path / name)
    before = state(store)
    assert plan_repair(store).steps == []
    assert not repair(store, backup_dir=tmp_path / "backup").executed
    r = runner.invoke(app, ["repair", str(store), "--yes"])
    assert r.exit_code == 0, r.stderr
    assert state(store) == before and not (tmp_path / "backup").exists()


def test_the_command_repairs_a_bcq_store_and_restore_undoes_it(tmp_path):
    store = damaged_copy("batch-cq", tmp_path)
    (store / "batchconsumequeue" / "TopicBCQ" / "0" / f"{BCQ_FILE:020d}").unlink()
    before = state(store)
    r = runner.invoke(app, ["repair", str(store), "--yes", "--backup", str(tmp_path / "bk")])
    assert r.exit_code == 0, r.stderr
    assert "dispatch-bcq" in r.stdout
    assert runner.invoke(app, ["verify", str(store)]).exit_code == 0
    r = runner.invoke(app, ["restore", str(tmp_path / "bk"), "--yes"])
    assert r.exit_code == 0, r.stderr
    assert state(store) == before
