"""Issue #14 WP E: BatchConsumeQueue and inner batches read against what RocketMQ 5.3.3 stored
and served in ``rocketmq-5.3.3/batch-cq`` (design-14 §4, §10 T1, T2).

Every BCQ unit equals ``queues[].cqEntries`` (``[base, phy, size, tags, num, compacted]``),
with RocketMQ's min/max offsets and maxPhysicOffset (the last record's start); ``dump``
gives one row per message (91), ``dump --records`` one per record (39), equal to the
stored records; ``get --queue-offset`` reaches the inner message; nothing is written."""

from __future__ import annotations

import base64
import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, tree_hashes
from rmqstore.files.batchconsumequeue import (BatchConsumeQueue, bcq_units, list_batch_queues,
                                              open_batch_consume_queue)
from rmqstore.files.consumequeue import open_consume_queue
from rmqstore.format import layout as L
from rmqstore.format.message import split_keys
from rmqstore.format.record import inner_messages
from rmqstore.format.rules import bcq_base_and_num, bcq_base_and_num_many, tags_hash
from rmqstore.reader import open_store
from test_dledger_read import same_message

runner = CliRunner()
STORE = FIXTURES / "rocketmq-5.3.3" / "batch-cq"
pytestmark = pytest.mark.skipif(not STORE.is_dir(), reason=f"no 5.3.3 fixtures under {FIXTURES}")


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def rows(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.strip()]


_m: dict = {}


def manifest() -> dict:
    if not _m:
        _m.update(json.loads((STORE / "manifest.json").read_text()))
    return _m


def served_queues(kind):
    return [q for q in manifest()["queues"] if (q.get("cqType") == "BatchCQ") == (kind == "bcq")]


# --- T2: every unit RocketMQ served -------------------------------------------------------------


def test_every_batch_consume_queue_unit_is_what_rocketmq_served():
    want = served_queues("bcq")
    assert [(r.topic, r.queue_id) for r in list_batch_queues(STORE).queues] == \
        [(q["topic"], q["queueId"]) for q in want] == [("TopicBCQ", 0), ("TopicBCQ", 1)]
    total = 0
    for q in want:
        with open_batch_consume_queue(STORE, q["topic"], q["queueId"]) as bcq:
            got = [[u.base_offset, u.commit_log_offset, u.size, u.tags_code, u.batch_num,
                    u.compacted_offset] for u in bcq]
            assert got == q["cqEntries"]
            assert (bcq.min_offset(0), bcq.max_offset) == (q["minOffset"], q["maxOffset"])
            assert bcq.max_physic_offset == q["maxPhysicOffset"]  # the last record's start
            assert (bcq.units["reserved"] == 0).all()
            # A pull's records, concatenated, are the units in order.
            pulled = [p for g in q["getMessage"] for p in g["phyOffsets"]]
            assert pulled == [u[1] for u in got]
            total += len(got)
    assert total == 30
    # Each unit's store time is its record's (design-14 §4.1).
    stored = {e["stored"]["phyOffset"]: e["stored"] for e in manifest()["messages"]}
    with open_batch_consume_queue(STORE, "TopicBCQ", 0) as bcq:
        assert all(u.store_timestamp == stored[u.commit_log_offset]["storeTimestamp"] for u in bcq)
        assert len(bcq.segments) == 2 and bcq.file_size == 736  # 16 units, not rounded


def test_consume_queue_units_of_the_normal_topic_are_what_rocketmq_served():
    for q in served_queues("cq"):
        with open_consume_queue(STORE, q["topic"], q["queueId"], 1280) as cq:
            assert [list(u) for u in cq] == q["cqEntries"]
            assert (cq.min_offset(0), cq.max_offset) == (q["minOffset"], q["maxOffset"])


def test_unit_lookup_finds_the_unit_holding_a_queue_offset():
    with open_batch_consume_queue(STORE, "TopicBCQ", 0) as bcq:
        for q in served_queues("bcq")[:1]:
            for base, phy, _, _, num, _ in q["cqEntries"]:
                for n in range(base, base + num):
                    u = bcq.unit_at(n)
                    assert (u.base_offset, u.commit_log_offset) == (base, phy)
        with pytest.raises(Exception, match="queue offset 75"):
            bcq.unit_at(75)


def test_recovery_stops_at_the_first_invalid_unit(tmp_path):
    src = STORE / "batchconsumequeue" / "TopicBCQ" / "0"
    dst = tmp_path / "0"
    dst.mkdir()
    for p in src.iterdir():
        data = bytearray(p.read_bytes())
        if p.name.endswith("736"):
            # unit 5 of the second file gets batchNum 0: recovery ends the queue before it
            at = 5 * L.BCQ_UNIT_SIZE + 36
            data[at:at + 2] = b"\0\0"
        (dst / p.name).write_bytes(bytes(data))
    with BatchConsumeQueue(dst) as bcq:
        assert len(bcq) == 16 + 5
        last = served_queues("bcq")[0]["cqEntries"][20]
        assert bcq.max_offset == last[0] + last[4] and bcq.max_physic_offset == last[1]
    with BatchConsumeQueue(src, truncate_at=12073) as bcq:  # truncateDirtyLogicFiles(phy)
        assert bcq.max_physic_offset == 11822 and len(bcq) == 16 and bcq.max_offset == 51
        assert len(bcq.segments) == 1  # the second file starts at 12073: dropped whole


def test_bcq_rule_scalar_and_vector_forms_agree():
    cases = [({"INNER_NUM": "3", "INNER_BASE": "6"}, 6, (6, 3)),
             ({"INNER_NUM": "3"}, 9, (9, 1)),  # both or neither (setBatchSizeIfNeeded)
             ({}, 4, (4, 1)),
             ({"INNER_NUM": "x", "INNER_BASE": "1"}, 1, (-1, -1)),
             ({"INNER_NUM": "40000", "INNER_BASE": "1"}, 1, (-1, -1))]  # not a Java short
    for props, qo, want in cases:
        assert bcq_base_and_num(props, qo) == want
    base = [6, -1, -1, 1, 1]
    num = [3, 3, -1, -2, -2]
    b, n = bcq_base_and_num_many([6, 9, 4, 1, 1], base, num)
    assert list(zip(b.tolist(), n.tolist())) == [(6, 3), (9, 1), (4, 1), (-1, -1), (-1, -1)]


def test_bcq_units_rebuilt_from_the_records_equal_the_files():
    stored = [e["stored"] for e in manifest()["messages"] if e["stored"]["topic"] == "TopicBCQ"]
    for qid in (0, 1):
        recs = [s for s in stored if s["queueId"] == qid]
        bn = [bcq_base_and_num(s["properties"], s["queueOffset"]) for s in recs]
        units = bcq_units([s["phyOffset"] for s in recs], [s["storeSize"] for s in recs],
                          [tags_hash(s["tags"]) for s in recs], [s["storeTimestamp"] for s in recs],
                          [b for b, _ in bn], [n for _, n in bn])
        with open_batch_consume_queue(STORE, "TopicBCQ", qid) as bcq:
            assert units.tobytes() == bcq.units.tobytes()


# --- T1: every message, every field ---------------------------------------------------------------


def test_dump_records_gives_every_stored_record():
    before = tree_hashes(STORE)
    code, out, err = cli("dump", STORE, "-f", "jsonl", "--records")
    assert code == 0, err
    got = rows(out)
    stored = [e["stored"] for e in manifest()["messages"]]
    assert len(got) == len(stored) == 39
    for row, s in zip(got, stored):
        same_message(row, s)
        assert "innerBatch" not in row
    assert tree_hashes(STORE) == before


def _expected_messages():
    """(stored record, i or None, request.batch[i]) per message, in CommitLog order."""
    for e in manifest()["messages"]:
        s, r = e["stored"], e["request"]
        if s["sysFlag"] & 0xC0 == 0xC0:
            assert len(r["batch"]) == int(s["properties"]["INNER_NUM"])
            for i, b in enumerate(r["batch"]):
                yield s, i, b
        else:
            yield s, None, None


def check_message(row: dict, s: dict, i, b) -> None:
    if i is None:
        same_message(row, s)
        assert "innerBatch" not in row
        return
    for k, v in (("commitLogOffset", "phyOffset"), ("storeSize", "storeSize"), ("topic", "topic"),
                 ("queueId", "queueId"), ("sysFlag", "sysFlag"), ("bodyCRC", "bodyCRC"),
                 ("bornTimestamp", "bornTimestamp"), ("bornHost", "bornHost"),
                 ("storeTimestamp", "storeTimestamp"), ("storeHost", "storeHost"),
                 ("offsetMsgId", "msgId")):
        assert row[k] == s[v], (k, s["phyOffset"], i)
    assert row["queueOffset"] == s["queueOffset"] + i
    assert row["tags"] == b["tags"] and row["keys"] == split_keys(b["keys"])
    assert len(base64.b64decode(row["body"])) == b["bodyLength"]
    assert row["crcOk"] is True and row["uniqKey"] is not None
    assert row["innerBatch"]["index"] == i
    assert row["innerBatch"]["count"] == int(s["properties"]["INNER_NUM"])


def test_dump_unwraps_inner_batches_into_their_messages():
    code, out, err = cli("dump", STORE, "-f", "jsonl")
    assert code == 0, err
    got = rows(out)
    want = list(_expected_messages())
    assert len(got) == len(want) == 91
    for row, (s, i, b) in zip(got, want):
        check_message(row, s, i, b)
    per_queue: dict = {}
    for r in got:
        per_queue.setdefault((r["topic"], r["queueId"]), []).append(r["queueOffset"])
    assert {k: sorted(v) for k, v in per_queue.items()} == {
        ("TopicBCQ", 0): list(range(75)), ("TopicBCQ", 1): list(range(7)),
        ("TopicSimple", 0): [0, 1, 2], ("TopicSimple", 1): [0, 1, 2], ("TopicSimple", 2): [0, 1, 2]}
    # The filters match the inner messages' own properties; --limit counts messages.
    code, out, _ = cli("dump", STORE, "-f", "jsonl", "--key", "bcq-11-1")
    assert [(r["commitLogOffset"], r["queueOffset"]) for r in rows(out)] == [(7833, 40)]
    code, out, _ = cli("dump", STORE, "-f", "jsonl", "--tag", "bt1", "--topic", "TopicBCQ")
    assert len(rows(out)) == sum(1 for s, i, b in want if s["topic"] == "TopicBCQ" and
                                 (b["tags"] if b else s["tags"]) == "bt1") == 27
    code, out, _ = cli("dump", STORE, "-f", "jsonl", "--limit", 5)
    assert [r["queueOffset"] for r in rows(out)] == [0, 1, 2, 3, 4]


def test_get_by_queue_offset_gives_the_inner_message_for_every_offset():
    before = tree_hashes(STORE)
    want = {(s["topic"], s["queueId"], s["queueOffset"] + (i or 0)): (s, i, b)
            for s, i, b in _expected_messages()}
    from rmqstore.view import message_dict

    with open_store(STORE) as store:
        for (topic, qid, qo), (s, i, b) in want.items():
            check_message(message_dict(store.get_by_queue_offset(topic, qid, qo)), s, i, b)
    code, out, err = cli("get", STORE, "-t", "TopicBCQ", "-q", 0, "--queue-offset", 40, "-f", "json")
    assert code == 0, err
    d = json.loads(out)
    assert (base64.b64decode(d["body"]), d["commitLogOffset"], d["queueOffset"], d["keys"],
            d["tags"]) == (b"inner 1 of batch 11", 7833, 40, ["bcq-11-1"], "bt1")
    assert d["innerBatch"] == {"index": 1, "count": 2, "entrySize": 140}
    code, _, err = cli("get", STORE, "-t", "TopicBCQ", "-q", 0, "--queue-offset", 75)
    assert code == 2 and "queue offset 75" in err
    assert tree_hashes(STORE) == before


def test_inner_entries_tile_every_inner_batch_body():
    n = 0
    with open_store(STORE) as store:
        for e in manifest()["messages"]:
            s = e["stored"]
            msgs = inner_messages(store.read_at(s["phyOffset"]))
            if s["sysFlag"] & 0xC0 == 0xC0:
                n += 1
                assert [m.inner_batch.entry_size for m in msgs] == [
                    22 + len(m.body) + len(m.properties_text.encode()) for m in msgs]
                assert len(msgs) == int(s["properties"]["INNER_NUM"])
            else:
                assert len(msgs) == 1 and msgs[0].inner_batch is None
    assert n == 21


def test_stats_counts_messages_and_records():
    code, out, err = cli("stats", STORE, "-f", "json")
    assert code == 0, err
    s = json.loads(out)
    assert (s["commitLog"]["messages"], s["commitLog"]["records"]) == (91, 39)
    q = {(r["topic"], r["queueId"]): r for r in s["queues"]}
    for sq in manifest()["queues"]:
        row = q[sq["topic"], sq["queueId"]]
        assert (row["cqMinOffset"], row["cqMaxOffset"]) == (sq["minOffset"], sq["maxOffset"])
        assert row["messages"] == sq["maxOffset"] - sq["minOffset"]
        assert row["maxQueueOffset"] == sq["maxOffset"] - 1
    assert q["TopicBCQ", 0]["records"] == 26


def test_a_short_last_file_places_the_missing_units_in_it(tmp_path):
    # TopicBCQ/0's second file holds 10 units; cut to 5, the 6th is missing: verify names
    # that file and the byte where the unit belongs (the broker puts it there), not the
    # file after it
    from conftest import copy_store
    from rmqstore.recovery.verify import verify

    store = copy_store(STORE, tmp_path / "s")
    last = store / "batchconsumequeue" / "TopicBCQ" / "0" / "00000000000000000736"
    with open(last, "r+b") as f:
        f.truncate(5 * L.BCQ_UNIT_SIZE)
    tails = [f for f in verify(store).findings if f.code == "bcq-missing-tail"]
    assert len(tails) == 1
    assert (tails[0].file.endswith("TopicBCQ/0/00000000000000000736"), tails[0].offset) == \
        (True, 5 * L.BCQ_UNIT_SIZE), (tails[0].file, tails[0].offset)
