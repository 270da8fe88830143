"""The writer engine in 5.x mode reproduces RocketMQ 5.3.3's own stores byte for byte
(issue #14, design-14 §10 T7): every message of a 5.3.3 fixture's manifest is put in its
stored form, in order (batches through the batch API), into an empty store with that
fixture's geometry; the CommitLog, ConsumeQueue files and IndexFile contents must equal
RocketMQ's, the puts report what RocketMQ reported, and the checkpoint holds RocketMQ's
values (physicMsgTimestamp is masked: in 5.x it depends on flush timing, design-14 §7)."""

from __future__ import annotations

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


def _replay(scenario: str, root) -> dict:
    man = _manifest(scenario)
    with MessageStore.open(root, _config(man), create=True) as st:
        for group in put_groups(man["messages"]):
            if "batchRequest" in group[0]["request"]:
                results = st.put_batch([_given(x["stored"]) for x in group])
            else:
                results = [st.put(_given(group[0]["stored"]))]
            for r, x in zip(results, group):
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
    man = _manifest(scenario)
    _new_store(scenario, root)
    with MessageStore.open(root, _config_5x(man), create=True) as st:
        for group in put_groups(man["messages"]):
            if "batchRequest" in group[0]["request"]:
                results = st.put_batch([_given_5x(x["stored"]) for x in group])
            else:
                results = [st.put(_given_5x(group[0]["stored"]))]
            for r, x in zip(results, group):
                s = x["stored"]
                assert r.ok, (x["index"], r)
                assert (r.offset, r.size, r.queue_offset, r.msg_id) == (
                    s["phyOffset"], s["storeSize"], s["queueOffset"], s["msgId"]), x["index"]
    return man


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
