"""The writer engine in 5.x mode reproduces RocketMQ 5.3.3's own stores byte for byte
(issue #14, design-14 §10 T7): every message of a 5.3.3 fixture's manifest is put in its
stored form, in order (batches through the batch API), into an empty store with that
fixture's geometry; the CommitLog, ConsumeQueue files and IndexFile contents must equal
RocketMQ's, the puts report what RocketMQ reported, and the checkpoint holds RocketMQ's
values (physicMsgTimestamp is masked: in 5.x it depends on flush timing, design-14 §7)."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from conftest import FIXTURES
from test_append_fixtures import _files, put_groups, stored_message
from rmqstore.files.config import StoreConfig
from rmqstore.engine.store import MessageStore

R5 = FIXTURES / "rocketmq-5.3.3"


def _manifest(scenario: str) -> dict:
    if not (R5 / scenario).is_dir():
        pytest.skip(f"no RocketMQ-written fixture at {R5 / scenario}")
    return json.loads((R5 / scenario / "manifest.json").read_text())


def _config(man: dict) -> StoreConfig:
    sc = man["storeConfig"]
    return StoreConfig(
        enabled_append_prop_crc=sc.get("enabledAppendPropCRC", False),
        mapped_file_size_commit_log=sc["mappedFileSizeCommitLog"],
        mapped_file_size_consume_queue=sc["mappedFileSizeConsumeQueue"],
        max_hash_slot_num=sc["maxHashSlotNum"], max_index_num=sc["maxIndexNum"],
        flush_disk_type=sc["flushDiskType"], broker_version="5",
        transient_store_pool_enable=sc["transientStorePoolEnable"])


def _given(s: dict):
    """The stored message minus what the store adds: its __CRC32# entry (spec §3.8)."""
    m = stored_message(s)
    if m.properties_text and m.properties_text.endswith("\x02") and "__CRC32#" in m.properties_text[-20:]:
        m.properties_text = m.properties_text[:-20]
    return m


def _put_group(st, group: list, given) -> list:
    """One put of the manifest as the client made it: a batch request through
    ``put_batch``, else its one message through ``put``; the results in order."""
    if "batchRequest" in group[0]["request"]:
        return st.put_batch([given(x["stored"]) for x in group])
    return [st.put(given(group[0]["stored"]))]


def _replay(scenario: str, root, *, config=None, given=None) -> dict:
    """Every put of ``scenario`` through the engine (``config(manifest)``, ``given(stored)``:
    the plain forms by default), each result checked against what RocketMQ stored."""
    man = _manifest(scenario)
    given = given or _given
    with MessageStore.open(root, (config or _config)(man), create=True) as st:
        for group in put_groups(man["messages"]):
            for r, x in zip(_put_group(st, group, given), group):
                s = x["stored"]
                assert r.ok, (x["index"], r)
                assert (r.offset, r.size, r.queue_offset, r.msg_id) == (
                    s["phyOffset"], s["storeSize"], s["queueOffset"], s["msgId"]), x["index"]
    return man


@pytest.mark.parametrize("scenario", ["basic", "long-topics", "crash", "prop-crc"])
def test_engine_reproduces_rocketmq_533_store(scenario, tmp_path):
    root = tmp_path / "store"
    man = _replay(scenario, root)
    ref = R5 / ("crash-recovered" if scenario == "crash" else scenario)
    mine, theirs = _files(root, "commitlog"), _files(ref, "commitlog")
    assert sorted(mine) == sorted(theirs)
    for name in theirs:
        assert mine[name] == theirs[name], f"commitlog/{name} differs"
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(R5 / scenario, "index").values())
    mine_cp = struct.unpack(">5q", (root / "checkpoint").read_bytes()[:40])
    want = json.loads((ref / "manifest.json").read_text())["checkpoint"] \
        if scenario != "crash" else json.loads((ref / "manifest.json").read_text())["recovery"][
            "checkpointAfterShutdown"]
    assert mine_cp[1:3] == (want["logicsMsgTimestamp"], want["indexMsgTimestamp"])
    assert mine_cp[3] == want["masterFlushedOffset"]
    if scenario != "crash":  # a store written in one run: nothing was recovered, 0 (§7)
        assert mine_cp[4] == want["confirmPhyOffset"]
    assert not (root / "abort").exists()


def test_the_brokers_put_hook_refuses_what_rocketmq_533_refused(tmp_path):
    # The store writes 128- and 255-byte plain topics (magic v2, as RocketMQ did with its
    # hooks off); a put through the broker refuses the ones its hook refused.
    from rmqstore.engine.broker import broker_hook_refusal, put_as_broker
    from rmqstore.engine.results import PutStatus
    from rmqstore.format.message import Host, Message

    man = _manifest("long-topics")
    cfg = _config(man)
    refused = [r["request"] for r in man["rejectedPuts"] if "topic" in r["request"]]
    assert refused
    for req in refused:
        assert broker_hook_refusal(req["topic"], cfg) is not None, req["topic"]
    stored = [x for x in man["messages"]  # client sends through the broker's checks
              if x["request"].get("brokerChecks", True) and "path" not in x["request"]
              and "batchRequest" not in x["request"]]
    assert stored
    assert all(broker_hook_refusal(x["stored"]["topic"], cfg) is None for x in stored)
    with MessageStore.open(tmp_path / "s", cfg, create=True) as st:
        r = put_as_broker(st, Message(topic=refused[0]["topic"], body=b"x"), cfg, now=1)
        assert r.status == PutStatus.MESSAGE_ILLEGAL and r.offset == -1
        assert st.max_offset == 0


def test_the_text_a_property_crc_is_appended_to():
    # spec §3.8 / design-14 §6, with the prop-crc fixture's raw puts #19 and #20
    from rmqstore.format.message import without_prop_crc

    assert without_prop_crc("") == ""
    assert without_prop_crc("a\x01b") == "a\x01b\x02"
    assert without_prop_crc("a\x01b\x02") == "a\x01b\x02"
    assert without_prop_crc("__CRC32#\x010000000123\x02TAGS\x01t\x02") == "TAGS\x01t\x02"
    assert without_prop_crc("TAGS\x01t\x02__CRC32#\x011\x02KEYS\x01k") == "TAGS\x01t\x02KEYS\x01k\x02"
    assert without_prop_crc("TAGS\x01t\x02__CRC32#\x011") == "TAGS\x01t\x02"
    assert without_prop_crc("X\x01a__CRC32#\x01b\x02") == "X\x01a__CRC32#\x01b\x02"  # a value


def test_a_client_crc_property_is_replaced_by_the_stores(tmp_path):
    # prop-crc #12: the client sent __CRC32#=0000000123; RocketMQ stored one entry, its own.
    man = _manifest("prop-crc")
    x = man["messages"][12]
    s = x["stored"]
    text = s["propertiesString"][:-20]
    m = stored_message(s)
    m.properties_text = "__CRC32#\x010000000123\x02" + text
    cfg = _config(man)
    root = tmp_path / "s"
    with MessageStore.open(root, cfg, create=True) as st:
        r = st.put(m)
    assert r.ok and r.size == s["storeSize"]
    rec = (root / "commitlog" / f"{0:020d}").read_bytes()[:r.size]
    from rmqstore.format.crc import prop_crc_entry, record_prop_crc
    from rmqstore.format.record import decode_record

    got = decode_record(rec, 0).properties_text
    assert got == text + prop_crc_entry(record_prop_crc(rec)).decode()


def _client_message(x: dict):
    """The message a client sent (the manifest's request): its properties in the order the
    client's HashMap (capacity 16) serialised them; a broker-made UNIQ_KEY (request
    ``uniqKey`` null) is the stored one, inserted where the broker inserts it: last."""
    import base64

    from rmqstore.engine.broker import hashmap_order
    from rmqstore.format.message import Host, Message

    r, s = x["request"], x["stored"]
    props = {}
    if r.get("tags"):
        props["TAGS"] = r["tags"]
    if r.get("keys"):
        props["KEYS"] = r["keys"]
    props["WAIT"] = "true"
    props.update(r["userProperties"])
    props.update(r["systemProperties"])
    if r["uniqKey"]:
        props["UNIQ_KEY"] = r["uniqKey"]
    props = {k: props[k] for k in hashmap_order(list(props), 16)}
    if not r["uniqKey"]:
        props["UNIQ_KEY"] = s["uniqKey"]
    return Message(topic=r["topic"], body=base64.b64decode(s["bodyBase64"]),
                   queue_id=r["queueId"], flag=r["flag"], sys_flag=r["sysFlag"],
                   born_timestamp=r["bornTimestamp"], born_host=Host.parse(r["bornHost"]),
                   reconsume_times=r["reconsumeTimes"], properties=props)


def test_client_sends_through_the_broker_reproduce_rocketmq_533(tmp_path):
    # design-14 §10 T8: basic's 500 client requests put the way a 5.3.3 broker puts them
    # (without the send context RocketMQ's fixture harness bypassed), stamped with the
    # stored times, give RocketMQ's CommitLog byte for byte.
    from rmqstore.engine.broker import put_as_broker

    man = _manifest("basic")
    host = man["messages"][0]["stored"]["storeHost"]
    cfg = _config(man).with_values(broker_cluster_name="OracleCluster",
                                   broker_ip1=host.split(":")[0], listen_port=int(host.split(":")[1]))
    assert sum(1 for x in man["messages"] if not x["request"]["uniqKey"]) > 0
    root = tmp_path / "s"
    with MessageStore.open(root, cfg, create=True) as st:
        for x in man["messages"]:
            r = put_as_broker(st, _client_message(x), cfg, now=x["stored"]["storeTimestamp"],
                              send_context=False, stamp=False)
            assert r.ok and (r.offset, r.size, r.msg_id) == (
                x["stored"]["phyOffset"], x["stored"]["storeSize"], x["stored"]["msgId"])
    assert _files(root, "commitlog") == _files(R5 / "basic", "commitlog")
    assert _files(root, "consumequeue") == _files(R5 / "basic", "consumequeue")


def test_the_send_context_adds_msg_region_and_trace_on():
    # spec §12.3: a 5.x client send carries MSG_REGION and TRACE_ON
    from rmqstore.engine.broker import as_broker
    from rmqstore.format.message import Message

    cfg = StoreConfig(broker_version="5")
    with_ctx = as_broker(Message(topic="T", properties={"UNIQ_KEY": "U"}), cfg, now=1)
    without = as_broker(Message(topic="T", properties={"UNIQ_KEY": "U"}), cfg, now=1,
                        send_context=False)
    assert with_ctx.properties_text.startswith("MSG_REGION\x01DefaultRegion\x02")
    assert with_ctx.properties_text.endswith("TRACE_ON\x01true\x02")
    assert "MSG_REGION" not in without.properties_text and "TRACE_ON" not in without.properties_text


# --- BatchCQ topics and LMQ (design-14 §4, §5; T7) ------------------------------------------


def _given_5x(s: dict):
    """The stored message minus what the 5.x store adds: INNER_BASE (an inner batch's queue
    offset) and INNER_MULTI_QUEUE_OFFSET (LMQ), design-14 §10 T7."""
    from rmqstore.format.message import parse_properties, serialize_properties

    m = _given(s)
    props = parse_properties(m.properties_text or "")
    for name in ("INNER_BASE", "INNER_MULTI_QUEUE_OFFSET"):
        if name in props:
            del props[name]
            m.properties_text = serialize_properties(props, True)
    return m


def _config_5x(man: dict):
    sc = man["storeConfig"]
    return _config(man).with_values(
        enable_lmq=sc["enableLmq"], enable_multi_dispatch=sc["enableMultiDispatch"],
        mapper_file_size_batch_consume_queue=sc["mapperFileSizeBatchConsumeQueue"])


def _new_store(scenario: str, root):
    """An empty store root holding the fixture's config/topics.json (the queue types)."""
    root.mkdir(parents=True)
    if (R5 / scenario / "config").is_dir():
        (root / "config").mkdir()
        for p in (R5 / scenario / "config").iterdir():
            (root / "config" / p.name).write_bytes(p.read_bytes())


def _replay_5x(scenario: str, root) -> dict:
    _new_store(scenario, root)
    return _replay(scenario, root, config=_config_5x, given=_given_5x)


@pytest.mark.parametrize("scenario", ["batch-cq", "lmq"])
def test_engine_reproduces_rocketmq_533_batch_cq_and_lmq(scenario, tmp_path):
    root = tmp_path / "store"
    man = _replay_5x(scenario, root)
    ref = R5 / scenario
    mine, theirs = _files(root, "commitlog"), _files(ref, "commitlog")
    assert sorted(mine) == sorted(theirs)
    for name in theirs:
        assert mine[name] == theirs[name], f"commitlog/{name} differs"
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert _files(root, "batchconsumequeue") == _files(ref, "batchconsumequeue")
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())
    mine_cp = struct.unpack(">5q", (root / "checkpoint").read_bytes()[:40])
    want = man["checkpoint"]
    assert mine_cp[1:] == (want["logicsMsgTimestamp"], want["indexMsgTimestamp"],
                           want["masterFlushedOffset"], want["confirmPhyOffset"])
    assert not (root / "abort").exists()


def _jsonl_5x(man: dict) -> str:
    """The fixture's records as ``rmqstore append --jsonl`` input: an inner batch as a
    ``batch`` list of its entries (the CLI makes the body, sysFlag 0xC0 and INNER_NUM), any
    other record in its stored form; without what the store adds (INNER_BASE,
    INNER_MULTI_QUEUE_OFFSET)."""
    from rmqstore.format.message import parse_properties, serialize_properties
    from rmqstore.format.record import inner_entries

    lines = []
    for x in man["messages"]:
        s = x["stored"]
        props = parse_properties(s["propertiesString"])
        props.pop("INNER_BASE", None)
        props.pop("INNER_MULTI_QUEUE_OFFSET", None)
        row = {k: s[k] for k in ("topic", "queueId", "flag", "sysFlag", "bornTimestamp",
                                 "bornHost", "storeTimestamp", "storeHost", "reconsumeTimes",
                                 "preparedTransactionOffset")}
        if s["sysFlag"] & 0x80:
            props.pop("INNER_NUM")
            row["sysFlag"] = s["sysFlag"] & ~0xC0
            row["batch"] = [{"flag": f, "bodyBase64": base64.b64encode(b).decode(),
                             "propertiesText": t}
                            for _, f, b, t in inner_entries(base64.b64decode(s["bodyBase64"]))]
        else:
            row["bodyBase64"] = s["bodyBase64"]
        text = s["propertiesString"]
        if text.endswith("\x02") and "__CRC32#" in text[-20:]:
            text = text[:-20]  # the store's property CRC entry (spec §3.8): it adds its own
        row["propertiesText"] = serialize_properties(props, True) if (
            len(props) < len(parse_properties(s["propertiesString"]))) else text
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("scenario", ["basic", "long-topics", "crash", "prop-crc", "batch-cq", "lmq"])
def test_cli_append_reproduces_rocketmq_533_store(scenario, tmp_path):
    # T7 through `rmqstore append --broker-version 5`: every 5.3.3 folder's records, one
    # line each (inner batches as a ``batch`` list, docs/cli.md), with broker.conf's
    # enableLmq/enableMultiDispatch/mapperFileSizeBatchConsumeQueue/enabledAppendPropCRC,
    # give RocketMQ's files (the crash store: what its recovery kept, crash-recovered).
    from test_append_fixtures import GEOMETRY_ARGS, _rmqstore

    man = _manifest(scenario)
    sc = man["storeConfig"]
    root = tmp_path / "store"
    _new_store(scenario, root)
    conf = tmp_path / "broker.conf"
    conf.write_text(f"enableLmq={str(sc['enableLmq']).lower()}\n"
                    f"enableMultiDispatch={str(sc['enableMultiDispatch']).lower()}\n"
                    f"mapperFileSizeBatchConsumeQueue={sc['mapperFileSizeBatchConsumeQueue']}\n"
                    f"enabledAppendPropCRC={str(sc['enabledAppendPropCRC']).lower()}\n")
    res = _rmqstore("append", str(root), "--create", "--jsonl", "-", "--config", str(conf),
                    "--broker-version", "5", *GEOMETRY_ARGS, "--format", "jsonl",
                    stdin=_jsonl_5x(man))
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["commitLogOffset"], r["storeSize"], r["queueOffset"], r["offsetMsgId"])
            for r in rows] == [(x["stored"]["phyOffset"], x["stored"]["storeSize"],
                                x["stored"]["queueOffset"], x["stored"]["msgId"])
                               for x in man["messages"]]
    ref = R5 / ("crash-recovered" if scenario == "crash" else scenario)
    for part in ("commitlog", "consumequeue", "batchconsumequeue"):
        assert _files(root, part) == _files(ref, part), part
    assert list(_files(root, "index").values()) == list(_files(R5 / scenario, "index").values())


@pytest.mark.parametrize("scenario", ["batch-cq", "lmq"])
def test_a_reopened_store_goes_on_where_rocketmq_did(scenario, tmp_path):
    # Close after every 7th put and open again: BatchConsumeQueue offsets (base + batchNum)
    # and LMQ offsets come back from the files (design-14 §4.2, §5.4), so the rest of the
    # replay still gives RocketMQ's bytes.
    man = _manifest(scenario)
    cfg = _config_5x(man)
    root = tmp_path / "store"
    _new_store(scenario, root)
    groups = list(put_groups(man["messages"]))
    for k in range(0, len(groups), 7):
        with MessageStore.open(root, cfg, create=k == 0) as st:
            for group in groups[k:k + 7]:
                results = _put_group(st, group, _given_5x)
                assert [(r.offset, r.queue_offset) for r in results] == [
                    (x["stored"]["phyOffset"], x["stored"]["queueOffset"]) for x in group]
    ref = R5 / scenario
    for part in ("commitlog", "consumequeue", "batchconsumequeue"):
        assert _files(root, part) == _files(ref, part), part


def _bcq_store(tmp_path, topics: dict[str, str] | None = None):
    root = tmp_path / "s"
    (root / "config").mkdir(parents=True)
    table = {t: {"topicName": t, "attributes": {"queue.type": k} if k else {}}
             for t, k in (topics or {"B": "BatchCQ", "S": ""}).items()}
    (root / "config" / "topics.json").write_text(json.dumps({"topicConfigTable": table}))
    return root, StoreConfig(broker_version="5", mapped_file_size_commit_log=65536,
                             mapper_file_size_batch_consume_queue=46 * 4)


def test_the_store_refuses_what_a_533_store_refuses_of_inner_batches(tmp_path):
    # DefaultMessageStore#asyncPutMessage @5.x: INNER_NUM without the 0x80 flag, the flag
    # on a SimpleCQ topic: MESSAGE_ILLEGAL, nothing written.
    from rmqstore.engine.results import PutStatus
    from rmqstore.format.message import Message

    root, cfg = _bcq_store(tmp_path)
    with MessageStore.open(root, cfg, create=True) as st:
        for m in (Message(topic="B", body=b"x", properties={"INNER_NUM": "2"}),
                  Message(topic="S", body=b"x", sys_flag=0xC0, properties={"INNER_NUM": "1"}),
                  Message(topic="B", body=b"x", sys_flag=0xC0, properties={"INNER_NUM": "0"}),
                  Message(topic="B", body=b"x", sys_flag=0xC0, properties={"INNER_NUM": "x"})):
            r = st.put(m)
            assert r.status is PutStatus.MESSAGE_ILLEGAL and r.reason, m
        assert st.put_batch([Message(topic="B", body=b"x", sys_flag=0xC0,
                                     properties={"INNER_NUM": "1"})])[0].status \
            is PutStatus.MESSAGE_ILLEGAL
        assert st.max_offset == 0
        # an inner batch of 3, then a plain record: queue offsets 0 and 3, units 0+3 and 3+1
        r1 = st.put(Message(topic="B", body=b"xyz", sys_flag=0xC0, properties={"INNER_NUM": "3"}))
        r2 = st.put_columns(topic="B", bodies=[b"plain"])[0]
        assert (r1.queue_offset, r2.queue_offset) == (0, 3)
    from rmqstore.files.batchconsumequeue import BatchConsumeQueue

    with BatchConsumeQueue(root / "batchconsumequeue" / "B" / "0") as q:
        assert [(u.base_offset, u.batch_num, u.commit_log_offset) for u in q] == [
            (0, 3, r1.offset), (3, 1, r2.offset)]
    assert not (root / "consumequeue" / "B").exists()


@pytest.mark.parametrize("case", ["bcq-dir-simple-topic", "config-bcq-cq-dir"])
def test_append_refuses_when_the_files_and_topics_json_disagree(case, tmp_path):
    from rmqstore.errors import ConfigError
    from rmqstore.format.message import Message

    root, cfg = _bcq_store(tmp_path, {"B": "BatchCQ", "S": "SimpleCQ"})
    with MessageStore.open(root, cfg, create=True) as st:
        st.put(Message(topic="B", body=b"x"))
        st.put(Message(topic="S", body=b"x"))
    table = json.loads((root / "config" / "topics.json").read_text())
    if case == "bcq-dir-simple-topic":  # batchconsumequeue/B exists, topics.json: SimpleCQ
        table["topicConfigTable"]["B"]["attributes"] = {}
    else:  # topics.json: S is BatchCQ, consumequeue/S holds its queues
        table["topicConfigTable"]["S"]["attributes"] = {"queue.type": "BatchCQ"}
    (root / "config" / "topics.json").write_text(json.dumps(table))
    before = _files(root, "commitlog")
    with pytest.raises(ConfigError, match="files are the truth"):
        MessageStore.open(root, cfg)
    assert _files(root, "commitlog") == before and not (root / "abort").exists()


_MORE = {
    "batch-cq": [
        {"topic": "TopicBCQ", "queueId": 0, "properties": {"UNIQ_KEY": "NW-1"},
         "batch": [{"body": "more 0", "properties": {"TAGS": "m0", "KEYS": "more-0"}},
                   {"body": "more 1", "properties": {"TAGS": "m1"}}]},
        {"topic": "TopicBCQ", "queueId": 1, "body": "plain", "properties": {"KEYS": "nw-2"}},
        {"topic": "TopicSimple", "queueId": 2, "body": "simple", "properties": {"TAGS": "s"}},
        {"topic": "TopicBCQ", "queueId": 0, "properties": {"UNIQ_KEY": "NW-3"},
         "batch": [{"body": f"again {i}"} for i in range(5)]},
    ],
    "lmq": [
        {"topic": "TopicMqttParent", "queueId": 0, "body": "to two rooms",
         "properties": {"KEYS": "nw-1", "WAIT": "true",
                        "INNER_MULTI_DISPATCH": "%LMQ%room1,%LMQ%room9"}},
        {"topic": "TopicMqttParent", "queueId": 1, "body": "plain", "properties": {"TAGS": "p"}},
        {"topic": "%RETRY%cg_lmq", "queueId": 0, "body": "retry",
         "properties": {"INNER_MULTI_DISPATCH": "%LMQ%room1"}},
        {"topic": "TopicMqttParent", "queueId": 1, "body": "room3",
         "properties": {"INNER_MULTI_DISPATCH": "%LMQ%room3"}},
    ],
}


@pytest.mark.parametrize("scenario", ["batch-cq", "lmq"])
def test_appending_to_a_533_store_never_makes_it_worse(scenario, tmp_path):
    # A copy of RocketMQ's store, appended to through the CLI (geometry, queue kinds and
    # LMQ from the files alone): verify is clean, and every byte RocketMQ wrote is still
    # there (earlier records and queue units unchanged; new units after them).
    import shutil

    from test_append_fixtures import _rmqstore

    ref = R5 / scenario
    _manifest(scenario)
    root = tmp_path / "store"
    shutil.copytree(ref, root)
    (root / "manifest.json").unlink()
    old = {part: _files(root, part) for part in ("commitlog", "consumequeue", "batchconsumequeue")}
    end = json.loads((ref / "manifest.json").read_text())["maxPhyOffset"]
    stdin = "\n".join(json.dumps(r) for r in _MORE[scenario]) + "\n"
    res = _rmqstore("append", str(root), "--jsonl", "-", "--format", "jsonl", stdin=stdin)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(rows) == len(_MORE[scenario]) and rows[0]["commitLogOffset"] >= end
    res = _rmqstore("verify", str(root), "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    for part, files in old.items():
        new = _files(root, part)
        for name, data in files.items():
            assert new[name].startswith(data.rstrip(b"\0")), f"{part}/{name} changed"
    log = b"".join(_files(root, "commitlog")[n] for n in sorted(old["commitlog"]))
    assert log[:end] == b"".join(old["commitlog"][n] for n in sorted(old["commitlog"]))[:end]
    if scenario == "batch-cq":  # queue 0 went on from 75: units 75+2 and 77+5
        from rmqstore.files.batchconsumequeue import BatchConsumeQueue

        with BatchConsumeQueue(root / "batchconsumequeue" / "TopicBCQ" / "0") as q:
            assert [(u.base_offset, u.batch_num) for u in q][-2:] == [(75, 2), (77, 5)]
        assert (rows[0]["queueOffset"], rows[3]["queueOffset"]) == (75, 77)
    else:  # room1 went on from 20, room9 is new, the retry topic dispatches nowhere
        from rmqstore.files.consumequeue import ConsumeQueue

        def units(name):
            with ConsumeQueue(root / "consumequeue" / name / "0", 1280) as q:
                return [u.commit_log_offset for u in q]
        assert units("%LMQ%room1")[-1] == rows[0]["commitLogOffset"]
        assert len(units("%LMQ%room1")) == 21
        assert units("%LMQ%room9") == [rows[0]["commitLogOffset"]]
        assert units("%LMQ%room3")[-1] == rows[3]["commitLogOffset"]


def test_a_batch_of_lmq_messages_is_refused_and_put_alone_works(tmp_path):
    # The batch path adds no INNER_MULTI_QUEUE_OFFSET (encodeBatch @5.x): rmqstore refuses
    # an LMQ message in a batch rather than store it undispatched; alone it is dispatched.
    from rmqstore.engine.results import PutStatus
    from rmqstore.format.message import Message

    cfg = StoreConfig(broker_version="5", mapped_file_size_commit_log=65536, enable_lmq=True,
                      enable_multi_dispatch=True)
    root = tmp_path / "s"
    lmq = Message(topic="T", body=b"x", properties={"INNER_MULTI_DISPATCH": "%LMQ%a"})
    with MessageStore.open(root, cfg, create=True) as st:
        rs = st.put_batch([Message(topic="T", body=b"y"), lmq])
        assert {r.status for r in rs} == {PutStatus.MESSAGE_ILLEGAL} and st.max_offset == 0
        retry = Message(topic="%RETRY%g", body=b"z", properties={"INNER_MULTI_DISPATCH": "%LMQ%a"})
        assert all(r.ok for r in st.put_batch([Message(topic="T", body=b"y"), retry]))
        r = st.put(lmq)
        assert r.ok
    from rmqstore.files.consumequeue import ConsumeQueue
    from rmqstore.reader import StoreReader

    with ConsumeQueue(root / "consumequeue" / "%LMQ%a" / "0") as q:
        assert [u.commit_log_offset for u in q] == [r.offset]
    with StoreReader(cfg.with_values(store_path_root_dir=str(root))) as rd:
        assert rd.read_at(r.offset).properties["INNER_MULTI_QUEUE_OFFSET"] == "0"


def test_client_sends_to_lmq_reproduce_rocketmq_533(tmp_path):
    # T8 for lmq: the client requests put the way a 5.3.3 broker puts them (no send
    # context), the store wrapping each LMQ message (INNER_MULTI_QUEUE_OFFSET, WAIT put
    # again, HashMap(128) order), give RocketMQ's CommitLog and queues byte for byte.
    # (The lmq requests carry no flag: RocketMQ's client sent 0, as every record holds.)
    from rmqstore.engine.broker import put_as_broker

    man = _manifest("lmq")
    host = man["messages"][0]["stored"]["storeHost"]
    cfg = _config_5x(man).with_values(broker_cluster_name="OracleCluster",
                                      broker_ip1=host.split(":")[0],
                                      listen_port=int(host.split(":")[1]))
    root = tmp_path / "s"
    with MessageStore.open(root, cfg, create=True) as st:
        for x in man["messages"]:
            x = {**x, "request": {"flag": 0, **x["request"]}}
            r = put_as_broker(st, _client_message(x), cfg, now=x["stored"]["storeTimestamp"],
                              send_context=False, stamp=False)
            assert r.ok and (r.offset, r.size, r.queue_offset, r.msg_id) == (
                x["stored"]["phyOffset"], x["stored"]["storeSize"], x["stored"]["queueOffset"],
                x["stored"]["msgId"]), x["index"]
    for part in ("commitlog", "consumequeue"):
        assert _files(root, part) == _files(R5 / "lmq", part), part


@pytest.mark.parametrize("props, why", [
    ({"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%a"}, "twice"),
    ({"INNER_MULTI_DISPATCH": "%LMQ%a,TopicX"}, "not an %LMQ% queue"),
    ({"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%" + "x" * 300}, "directory name"),
    ({"INNER_MULTI_DISPATCH": "%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "7"}, None),
])
def test_lmq_messages_that_would_leave_the_queues_inconsistent_are_refused(props, why, tmp_path):
    from rmqstore.engine.results import PutStatus
    from rmqstore.format.message import Message

    cfg = StoreConfig(broker_version="5", mapped_file_size_commit_log=65536, enable_lmq=True,
                      enable_multi_dispatch=True)
    with MessageStore.open(tmp_path / "s", cfg, create=True) as st:
        r = st.put(Message(topic="T", body=b"x", properties=props))
        if why is None:  # the store's offset replaces the client's (putProperty)
            assert r.ok
        else:
            assert r.status is PutStatus.MESSAGE_ILLEGAL and why in r.reason
            assert st.max_offset == 0
    with MessageStore.open(tmp_path / "t", cfg.with_values(enable_lmq=False), create=True) as st:
        r = st.put(Message(topic="T", body=b"x", properties={
            "INNER_MULTI_DISPATCH": "%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "7"}))
        assert r.status is PutStatus.MESSAGE_ILLEGAL and "store's to assign" in r.reason
    root, cfg = _bcq_store(tmp_path)
    with MessageStore.open(root, cfg.with_values(enable_lmq=True), create=True) as st:
        r = st.put(Message(topic="B", body=b"x", properties={"INNER_MULTI_DISPATCH": "%LMQ%c"}))
        assert r.status is PutStatus.MESSAGE_ILLEGAL and "BatchCQ" in r.reason


@pytest.mark.parametrize("scenario", ["batch-cq", "lmq"])
def test_a_reopen_dispatches_what_the_queues_lack(scenario, tmp_path):
    # Written with dispatch off, the queues are built by the next open's reput from the
    # CommitLog (spec §9): BatchConsumeQueue units and LMQ units as RocketMQ wrote them.
    man = _manifest(scenario)
    cfg = _config_5x(man)
    root = tmp_path / "store"
    _new_store(scenario, root)
    with MessageStore.open(root, cfg, create=True, dispatch="off") as st:
        for group in put_groups(man["messages"]):
            _put_group(st, group, _given_5x)
    assert not (root / "batchconsumequeue").exists() and not (root / "consumequeue").exists()
    MessageStore.open(root, cfg).close()
    ref = R5 / scenario
    for part in ("commitlog", "consumequeue", "batchconsumequeue"):
        assert _files(root, part) == _files(ref, part), part
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())


def test_a_49_writer_refuses_a_store_with_5x_queue_kinds(tmp_path):
    # 4.9 has no BatchConsumeQueue (and other LMQ rules): a 4.9-mode writer would write
    # ConsumeQueue units for a BatchCQ topic; it refuses, nothing changed.
    from rmqstore.errors import ConfigError

    root, cfg = _bcq_store(tmp_path)
    with pytest.raises(ConfigError, match="broker-version 5"):
        MessageStore.open(root, cfg.with_values(broker_version="4.9"), create=True)
    assert sorted(p.name for p in root.iterdir()) == ["config", "lock"]  # (the lock, taken first)


def test_property_crcs_on_inner_batches_and_lmq_records_verify(tmp_path):
    # design-14 §6: the __CRC32# entry goes on every record kind; verify (the files alone
    # saying prop-crc, BatchCQ and LMQ) finds every record and unit in order.
    from test_append_fixtures import _rmqstore

    from rmqstore.format.crc import record_prop_crc
    from rmqstore.format.message import Message

    root, cfg = _bcq_store(tmp_path)
    cfg = cfg.with_values(enabled_append_prop_crc=True, enable_lmq=True, enable_multi_dispatch=True)
    with MessageStore.open(root, cfg, create=True) as st:
        rs = [st.put(Message(topic="B", body=b"xyz", sys_flag=0xC0,
                             properties={"INNER_NUM": "3", "UNIQ_KEY": "U1"})),
              st.put(Message(topic="T", body=b"lmq", properties={
                  "INNER_MULTI_DISPATCH": "%LMQ%r", "__CRC32#": "0000000123"})),
              st.put(Message(topic="B", body=b"plain"))]
    assert all(r.ok for r in rs)
    data = (root / "commitlog" / f"{0:020d}").read_bytes()
    for r in rs:
        rec = data[r.offset:r.offset + r.size]
        digits = str(record_prop_crc(rec)).zfill(10)[::-1].encode()
        assert rec.endswith(b"__CRC32#\x01" + digits + b"\x02")
        assert rec.count(b"__CRC32#") == 1
    res = _rmqstore("verify", str(root), "--format", "jsonl")
    assert res.returncode == 0, res.stdout + res.stderr
    assert '"severity":"error"' not in res.stdout and '"severity":"warning"' not in res.stdout, res.stdout
