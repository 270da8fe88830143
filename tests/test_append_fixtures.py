"""The writer engine reproduces RocketMQ 4.9.8's own stores byte for byte.

Every message of a scenario's manifest is put, in order and in its stored form (same
timestamps, hosts, queue ids, flags, properties text in stored order; batches through
the batch API), into an empty store with that scenario's geometry. Then:

* CommitLog segments equal RocketMQ's, file set included (a clean close drops the
  preallocated next segment, as the broker does). ``async-transient``: the broker's
  reused write buffer left stale bytes after one BLANK header, so bytes after each BLANK
  header are masked there (fixtures/README).
* ConsumeQueue files equal RocketMQ's.
* IndexFiles have identical contents (their names are wall-clock times).
* Puts report the offsets, sizes, queue offsets and msgIds RocketMQ reported.
* The checkpoint's three timestamps equal RocketMQ's.

``crash``: its 400 messages are compared with ``crash-recovered`` (what the broker made
of the crash store); the index is compared with the crash store's pre-crash files,
because recovery re-indexed one record a second time (fixtures/README).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NO_FIXTURES, ROCKETMQ_498, manifest, scenario_params
from rmqstore.format import layout as L
from rmqstore.format.message import Host, Message, parse_properties, serialize_properties
from rmqstore.files.config import StoreConfig
from rmqstore.engine.dispatch import Dispatcher
from rmqstore.engine.store import MessageStore

BYTE_SCENARIOS = ["basic", "unicode", "ipv6", "special", "sync-flush", "async-transient", "crash"]


def fixture_config(scenario: str) -> StoreConfig:
    sc = manifest(scenario)["storeConfig"]
    return StoreConfig(
        mapped_file_size_commit_log=sc["mappedFileSizeCommitLog"],
        mapped_file_size_consume_queue=sc["mappedFileSizeConsumeQueue"],
        max_hash_slot_num=sc["maxHashSlotNum"], max_index_num=sc["maxIndexNum"],
        flush_disk_type=sc["flushDiskType"],
        transient_store_pool_enable=sc["transientStorePoolEnable"],
        # Short flush periods so the flush thread really runs during the test.
        flush_interval_commit_log=5, commit_interval_commit_log=5)


def stored_message(s: dict) -> Message:
    return Message(
        topic=s["topic"], body=base64.b64decode(s["bodyBase64"]), queue_id=s["queueId"],
        flag=s["flag"], sys_flag=s["sysFlag"], born_timestamp=s["bornTimestamp"],
        born_host=Host.parse(s["bornHost"]), store_timestamp=s["storeTimestamp"],
        store_host=Host.parse(s["storeHost"]), reconsume_times=s["reconsumeTimes"],
        prepared_transaction_offset=s["preparedTransactionOffset"],
        properties_text=s["propertiesString"])


def parsed_message(s: dict) -> Message:
    """:func:`stored_message` with its properties as a dict when that gives back the
    stored text: the single put's fast path, whose dispatch lets index keys wait."""
    m = stored_message(s)
    props = parse_properties(m.properties_text)
    if serialize_properties(props) != m.properties_text:
        return m
    return dataclasses.replace(m, properties=props, properties_text=None)


def put_groups(messages: list[dict]):
    """The manifest's messages grouped as they were put: singles, and whole batches."""
    i = 0
    while i < len(messages):
        x = messages[i]
        n = x["put"]["msgNum"] if "batchRequest" in x["request"] else 1
        yield messages[i:i + n]
        i += n


def replay(scenario: str, root, *, make=stored_message, **open_kw) -> None:
    cfg = fixture_config(scenario)
    with MessageStore.open(root, cfg, create=True, **open_kw) as st:
        for group in put_groups(manifest(scenario)["messages"]):
            if "batchRequest" in group[0]["request"]:
                results = st.put_batch([make(x["stored"]) for x in group])
            else:
                results = [st.put(make(group[0]["stored"]))]
            for r, x in zip(results, group):
                s = x["stored"]
                assert r.ok, r
                assert (r.offset, r.size, r.queue_offset, r.msg_id) == (
                    s["phyOffset"], s["storeSize"], s["queueOffset"], s["msgId"])


def _files(root, part: str) -> dict[str, bytes]:
    base = root / part
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def _mask_after_blanks(data: bytes, segment_size: int) -> bytes:
    """Zero every byte after a BLANK header (spec §4: they are not part of the data)."""
    buf = bytearray(data)
    pos = 0
    while pos + 8 <= len(buf):
        size, magic = L.BLANK_STRUCT.unpack_from(buf, pos)
        if magic == L.MAGIC_BLANK:
            buf[pos + 8:] = bytes(len(buf) - pos - 8)
            break
        if magic not in L.MESSAGE_MAGICS or size <= 0:
            break
        pos += size
    return bytes(buf)


@pytest.mark.parametrize("scenario", scenario_params(BYTE_SCENARIOS))
def test_engine_reproduces_rocketmq_store(scenario, tmp_path):
    root = tmp_path / "store"
    replay(scenario, root)
    ref = ROCKETMQ_498 / ("crash-recovered" if scenario == "crash" else scenario)
    mine, theirs = _files(root, "commitlog"), _files(ref, "commitlog")
    assert sorted(mine) == sorted(theirs)
    size = manifest(scenario)["storeConfig"]["mappedFileSizeCommitLog"]
    for name in theirs:
        a, b = mine[name], theirs[name]
        if scenario == "async-transient":
            a, b = _mask_after_blanks(a, size), _mask_after_blanks(b, size)
        assert a == b, f"commitlog/{name} differs"
    if scenario == "async-transient":
        # The mask must matter somewhere, or this scenario proves less than it claims.
        assert any(_mask_after_blanks(v, size) != v for v in theirs.values())
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    index_ref = ROCKETMQ_498 / scenario
    assert list(_files(root, "index").values()) == list(_files(index_ref, "index").values())
    ck_mine = struct.unpack(">3q", (root / "checkpoint").read_bytes()[:24])
    ck_ref = manifest(scenario)["checkpoint"]
    if scenario != "crash":  # the crash store's checkpoint is from before the crash
        assert ck_mine == (ck_ref["physicMsgTimestamp"], ck_ref["logicsMsgTimestamp"],
                           ck_ref["indexMsgTimestamp"])
    assert (root / "checkpoint").stat().st_size == 4096
    assert not (root / "abort").exists()


@pytest.mark.parametrize("scenario", scenario_params(["basic", "unicode", "ipv6", "special"]))
def test_parsed_properties_and_waiting_keys_reproduce_rocketmq(scenario, tmp_path, monkeypatch):
    """The same replay with properties given as dicts: the fast single put, its index
    keys waiting to be put together, still makes RocketMQ's CommitLog, queues and index."""
    waited = []
    drain = Dispatcher._drain

    def counting(self):
        waited.append(self.keys_waiting)
        drain(self)
    monkeypatch.setattr(Dispatcher, "_drain", counting)
    root = tmp_path / "store"
    replay(scenario, root, make=parsed_message)
    assert sum(waited) > 0  # keys did wait: the case under test
    ref = ROCKETMQ_498 / scenario
    assert _files(root, "commitlog") == _files(ref, "commitlog")
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())


def _jsonl_from_manifest(scenario: str) -> str:
    """The message JSON lines `rmqstore dump --format jsonl` prints for a store, built
    from the manifest (the dump is tested against the same manifest elsewhere)."""
    out = []
    for x in manifest(scenario)["messages"]:
        s = x["stored"]
        out.append(json.dumps({
            "commitLogOffset": s["phyOffset"], "storeSize": s["storeSize"], "topic": s["topic"],
            "queueId": s["queueId"], "flag": s["flag"], "queueOffset": s["queueOffset"],
            "sysFlag": s["sysFlag"], "bornTimestamp": s["bornTimestamp"], "bornHost": s["bornHost"],
            "storeTimestamp": s["storeTimestamp"], "storeHost": s["storeHost"],
            "reconsumeTimes": s["reconsumeTimes"],
            "preparedTransactionOffset": s["preparedTransactionOffset"],
            "properties": s["properties"], "propertiesText": s["propertiesString"],
            "body": s["bodyBase64"], "bodyEncoding": "base64", "offsetMsgId": s["msgId"]}))
    return "\n".join(out) + "\n"


GEOMETRY_ARGS = ["--commitlog-size", "65536", "--cq-size", "1280", "--index-slots", "64",
                 "--index-num", "256"]


def _rmqstore(*args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "rmqstore", *args], input=stdin,
                          capture_output=True, text=True)


@pytest.mark.parametrize("scenario", scenario_params(["special", "unicode"]))
def test_cli_append_from_manifest_jsonl(scenario, tmp_path):
    root = tmp_path / "new"
    res = _rmqstore("append", str(root), "--create", "--jsonl", "-", *GEOMETRY_ARGS,
                    stdin=_jsonl_from_manifest(scenario))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(l) for l in res.stdout.splitlines()]
    assert [l["status"] for l in lines] == ["PUT_OK"] * len(manifest(scenario)["messages"])
    ref = ROCKETMQ_498 / scenario
    assert _files(root, "commitlog") == _files(ref, "commitlog")
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")


@pytest.mark.parametrize("scenario", scenario_params(["basic", "special", "ipv6"]))
def test_dump_append_round_trip(scenario, tmp_path):
    """`rmqstore dump STORE --format jsonl | rmqstore append NEW --create --jsonl -`."""
    dumped = _rmqstore("dump", str(ROCKETMQ_498 / scenario), "--format", "jsonl")
    assert dumped.returncode == 0, dumped.stderr
    root = tmp_path / "copy"
    res = _rmqstore("append", str(root), "--create", "--jsonl", "-", *GEOMETRY_ARGS,
                    stdin=dumped.stdout)
    assert res.returncode == 0, res.stderr
    ref = ROCKETMQ_498 / scenario
    assert _files(root, "commitlog") == _files(ref, "commitlog")
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())


@pytest.mark.parametrize("scenario", scenario_params(["basic", "special", "unicode"]))
def test_bulk_dispatch_matches_rocketmq(scenario, tmp_path):
    """Appending with dispatch off, then reopening, dispatches the whole CommitLog through
    the vectorised path (bulk CQ writes, matrix hashing): the same CQ and index bytes."""
    root = tmp_path / "store"
    replay(scenario, root, dispatch="off")
    assert not (root / "consumequeue").exists()
    MessageStore.open(root, fixture_config(scenario)).close()
    ref = ROCKETMQ_498 / scenario
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())


def test_background_dispatch_matches_rocketmq(tmp_path):
    if not ROCKETMQ_498.is_dir():
        pytest.skip(NO_FIXTURES)
    root = tmp_path / "store"
    replay("basic", root, dispatch="background")
    ref = ROCKETMQ_498 / "basic"
    assert _files(root, "consumequeue") == _files(ref, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(ref, "index").values())


SAMPLES = Path(__file__).resolve().parents[1] / "samples"


@pytest.mark.parametrize("sample,version", [("multi-segment", "4.9"), ("ipv6-unicode", "5")])
def test_dump_append_round_trip_on_generated_stores(sample, version, tmp_path):
    """The same round trip on stores rmqstore generated (samples/), including the 5.x
    conventions: trailing property separator, IPv6 hosts, non-ASCII text."""
    src = SAMPLES / sample
    dumped = _rmqstore("dump", str(src), "--format", "jsonl")
    assert dumped.returncode == 0, dumped.stderr
    root = tmp_path / "copy"
    res = _rmqstore("append", str(root), "--create", "--jsonl", "-", *GEOMETRY_ARGS,
                    "--broker-version", version, stdin=dumped.stdout)
    assert res.returncode == 0, res.stderr
    assert _files(root, "commitlog") == _files(src, "commitlog")
    assert _files(root, "consumequeue") == _files(src, "consumequeue")
    assert list(_files(root, "index").values()) == list(_files(src, "index").values())
