"""Issue #14: LMQ queues read against what RocketMQ 5.3.3 stored and served in
``rocketmq-5.3.3/lmq`` (design-14 §5, §10 T1, T2).

Every ConsumeQueue RocketMQ served, the four ``%LMQ%…/0`` queues included, equals the
library's queue reader (103 units, 61 from LMQ queues); the LMQ rule
(:func:`rmqstore.format.rules.lmq_targets`) applied to the stored records gives exactly the
LMQ units; ``get --topic %LMQ%x --queue-offset N`` (queue id 0 by default) reaches the
record RocketMQ served there; nothing is written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, tree_hashes
from rmqstore.files.consumequeue import list_queues, open_consume_queue
from rmqstore.format.rules import lmq_targets, tags_hash
from rmqstore.reader import open_store
from rmqstore.view import message_dict
from test_dledger_read import same_message

runner = CliRunner()
STORE = FIXTURES / "rocketmq-5.3.3" / "lmq"
pytestmark = pytest.mark.skipif(not STORE.is_dir(), reason=f"no 5.3.3 fixtures under {FIXTURES}")


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


_m: dict = {}


def manifest() -> dict:
    if not _m:
        _m.update(json.loads((STORE / "manifest.json").read_text()))
    return _m


def test_every_queue_rocketmq_served_lmq_ones_included():
    served = manifest()["queues"]
    assert [(r.topic, r.queue_id) for r in list_queues(STORE).queues] == \
        sorted((q["topic"], q["queueId"]) for q in served)
    n = lmq = 0
    for q in served:
        with open_consume_queue(STORE, q["topic"], q["queueId"], 1280) as cq:
            assert [list(u) for u in cq] == q["cqEntries"], q["topic"]
            assert (cq.min_offset(0), cq.max_offset) == (q["minOffset"], q["maxOffset"])
            assert cq.max_physic_offset == q["maxPhysicOffset"]
            assert [p for g in q["getMessage"] for p in g["phyOffsets"]] == \
                [e[1] for e in q["cqEntries"]]
        n += len(q["cqEntries"])
        lmq += len(q["cqEntries"]) if q["topic"].startswith("%LMQ%") else 0
    assert (n, lmq) == (103, 61)


def test_the_lmq_rule_gives_every_lmq_unit_from_the_records():
    conf = manifest()["storeConfig"]
    units: dict = {}
    for e in manifest()["messages"]:
        s = e["stored"]
        for name, qid, offset in lmq_targets(s["topic"], s["properties"], s["queueId"],
                                             enable_lmq=conf["enableLmq"],
                                             multi_dispatch=conf["enableMultiDispatch"]):
            units.setdefault((name, qid), []).append(
                [offset, s["phyOffset"], s["storeSize"], tags_hash(s["tags"])])
    want = {(q["topic"], q["queueId"]): q["cqEntries"] for q in manifest()["queues"]
            if q["topic"].startswith("%LMQ%")}
    assert units == want
    # The %RETRY% record carries the properties, but retry topics get no LMQ dispatch.
    retry = [e["stored"] for e in manifest()["messages"] if e["stored"]["topic"].startswith("%RETRY%")]
    assert retry and "INNER_MULTI_DISPATCH" in retry[0]["properties"]
    assert lmq_targets(retry[0]["topic"], retry[0]["properties"], 0) == []
    # Multi-dispatch off: nothing; LMQ off: the record's own queue id.
    s = next(e["stored"] for e in manifest()["messages"] if e["stored"]["queueId"] == 1
             and "INNER_MULTI_QUEUE_OFFSET" in e["stored"]["properties"])
    assert lmq_targets(s["topic"], s["properties"], 1, multi_dispatch=False) == []
    assert {q for _, q, _ in lmq_targets(s["topic"], s["properties"], 1, enable_lmq=False)} == {1}


def test_lmq_rule_edge_cases():
    props = {"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "3"}
    got = lmq_targets("T", props, 2)
    assert got == [] and "2 queue(s)" in got.problem  # lengths differ: nothing
    props = {"INNER_MULTI_DISPATCH": "%LMQ%a,x/y,%LMQ%c", "INNER_MULTI_QUEUE_OFFSET": "3,4,5,"}
    assert lmq_targets("T", props, 2) == [("%LMQ%a", 0, 3), ("%LMQ%c", 0, 5)]  # '/' skipped
    props = {"INNER_MULTI_DISPATCH": "%LMQ%a,plain", "INNER_MULTI_QUEUE_OFFSET": "3,null"}
    got = lmq_targets("T", props, 2)
    assert got == [("%LMQ%a", 0, 3)] and "not a number" in got.problem
    for topic in ("%RETRY%g", "rmq_sys_x", "SCHEDULE_TOPIC_XXXX"):
        assert lmq_targets(topic, {"INNER_MULTI_DISPATCH": "%LMQ%a",
                                   "INNER_MULTI_QUEUE_OFFSET": "1"}, 0) == []


def test_get_by_lmq_queue_offset_gives_the_record_rocketmq_served():
    before = tree_hashes(STORE)
    stored = {e["stored"]["phyOffset"]: e["stored"] for e in manifest()["messages"]}
    with open_store(STORE) as store:
        for q in manifest()["queues"]:
            for qo, phy, _, _ in q["cqEntries"]:
                same_message(message_dict(store.get_by_queue_offset(q["topic"], q["queueId"], qo)),
                             stored[phy])
    code, out, err = cli("get", STORE, "-t", "%LMQ%room3", "--queue-offset", 7, "-f", "json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["commitLogOffset"], d["storeSize"], d["keys"]) == (131072, 30284, ["lmq-big"])
    code, out, _ = cli("get", STORE, "-t", "%LMQ%room1", "--queue-offset", 19, "-f", "json")
    assert code == 0 and json.loads(out)["commitLogOffset"] == 187912
    code, _, err = cli("get", STORE, "-t", "TopicMqttParent", "--queue-offset", 1)
    assert code == 2 and "--queue-id and --queue-offset go together" in err  # only %LMQ% defaults
    assert tree_hashes(STORE) == before


def test_stats_lists_the_lmq_queues():
    code, out, err = cli("stats", STORE, "-f", "json")
    assert code == 0, err
    q = {(r["topic"], r["queueId"]): r for r in json.loads(out)["queues"]}
    for sq in manifest()["queues"]:
        assert (q[sq["topic"], sq["queueId"]]["cqMinOffset"],
                q[sq["topic"], sq["queueId"]]["cqMaxOffset"]) == (sq["minOffset"], sq["maxOffset"])
    assert json.loads(out)["commitLog"]["messages"] == 42
