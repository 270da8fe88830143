"""Issue #14 WP C: DLedger stores read through the store root (design-14 §1, §10 T1-T3, T9,
T10) against what RocketMQ stored, served and answered in its DLedger fixtures.

``dump``, ``get`` (offset, offsetMsgId, queue position), ``query-key`` and ``stats`` give
RocketMQ's answers; a DLedger store is never reported empty; the writing commands refuse
with one line naming DLedger (verify, rebuild, repair and spark export are
tests/test_dledger_{verify,rebuild,repair,spark}.py); no read changes a byte."""

from __future__ import annotations

import json
import struct

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.files.index_query import IndexReader
from rmqstore.format.message import parse_properties, split_keys
from rmqstore.reader import open_store
from rmqstore.view import message_dict

runner = CliRunner()

FOLDERS = {
    "4.9.8/basic": FIXTURES / "rocketmq-4.9.8-dledger" / "basic",
    "4.9.8/crash": FIXTURES / "rocketmq-4.9.8-dledger" / "crash",
    "5.3.3/basic": FIXTURES / "rocketmq-5.3.3-dledger" / "basic",
}
NO_DLEDGER = f"RocketMQ-written DLedger fixtures not found under {FIXTURES} (../shared/fixtures)"
FILE = 65536  # mappedFileSizeCommitLog = DLedger data file size in every DLedger fixture

#: design-14 §10 T9 (and §1.4/§1.7): what stats says of each folder's DLedger log.
T9 = {
    "4.9.8/basic": dict(committedIndex=499, committedPos=459701, servedUpTo=459701, end=459701),
    "4.9.8/crash": dict(committedIndex=399, committedPos=371602, servedUpTo=371602, end=459701),
    "5.3.3/basic": dict(committedIndex=499, committedPos=468150, servedUpTo=468150, end=468150),
}


def folders():
    return [pytest.param(n, marks=pytest.mark.skipif(not p.is_dir(), reason=NO_DLEDGER))
            for n, p in FOLDERS.items()]


_manifests: dict[str, dict] = {}


def manifest(name: str) -> dict:
    if name not in _manifests:
        _manifests[name] = json.loads((FOLDERS[name] / "manifest.json").read_text())
    return _manifests[name]


def served(m: dict, what: str):
    """RocketMQ's answers for the files on disk (crash: before it, page cache = disk)."""
    return m.get(f"{what}BeforeCrash") or m[what]


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def rows(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("rmqstore: ") and ": note: " not in x
             and ": warning: " not in x]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def same_message(row: dict, s: dict) -> None:
    """A message JSON row equals RocketMQ's stored message, field by field (T1)."""
    got = {k: row[k] for k in ("commitLogOffset", "storeSize", "topic", "queueId", "queueOffset",
                               "flag", "sysFlag", "bornTimestamp", "bornHost", "storeTimestamp",
                               "storeHost", "reconsumeTimes", "preparedTransactionOffset",
                               "bodyCRC", "offsetMsgId", "tags", "uniqKey", "crcOk")}
    want = {"commitLogOffset": s["phyOffset"], "storeSize": s["storeSize"], "topic": s["topic"],
            "queueId": s["queueId"], "queueOffset": s["queueOffset"], "flag": s["flag"],
            "sysFlag": s["sysFlag"], "bornTimestamp": s["bornTimestamp"], "bornHost": s["bornHost"],
            "storeTimestamp": s["storeTimestamp"], "storeHost": s["storeHost"],
            "reconsumeTimes": s["reconsumeTimes"],
            "preparedTransactionOffset": s["preparedTransactionOffset"], "bodyCRC": s["bodyCRC"],
            "offsetMsgId": s["msgId"], "tags": s["tags"],
            "uniqKey": s["uniqKey"] or parse_properties(s["propertiesString"]).get("UNIQ_KEY"),
            "crcOk": True}
    assert got == want, s["phyOffset"]
    assert row["magic"] == {-626843481: "v1", -626843477: "v2"}[s.get("magic", -626843481)]
    assert row["keys"] == split_keys(s["keys"])
    assert row["properties"] == parse_properties(s["propertiesString"])
    assert row.get("propertiesText", s["propertiesString"]) == s["propertiesString"]
    assert row.get("storedBody", row["body"]) == s["bodyBase64"]


# --- T1: every message, every field --------------------------------------------------------


@pytest.mark.parametrize("name", folders())
def test_dump_gives_every_message_rocketmq_stored_never_an_empty_store(name):
    root = FOLDERS[name]
    before = tree_hashes(root)
    code, out, err = cli("dump", root, "-f", "jsonl")
    assert code == 0, err
    got = rows(out)
    stored = [e["stored"] for e in manifest(name)["messages"]]
    assert len(got) == len(stored) == 500 and got[0]["commitLogOffset"] == 48
    for row, s in zip(got, stored):  # entry order is put order
        same_message(row, s)
    assert "DLedger CommitLog (dledger-n0/): reads, verify, rebuild and repair are supported" in err
    assert "warning" not in err
    # The filters work on record offsets, as on a plain store.
    code, out, _ = cli("dump", root, "-f", "jsonl", "--body", "none", "--topic", "TopicB",
                       "--from-offset", FILE, "--to-offset", 3 * FILE, "--limit", 7)
    want = [s["phyOffset"] for s in stored
            if s["topic"] == "TopicB" and FILE <= s["phyOffset"] < 3 * FILE][:7]
    assert code == 0 and [r["commitLogOffset"] for r in rows(out)] == want and len(want) == 7
    assert tree_hashes(root) == before


@pytest.mark.parametrize("name", folders())
def test_get_by_offset_and_msg_id_reads_every_message(name):
    root = FOLDERS[name]
    before = tree_hashes(root)
    with open_store(root) as store:
        assert store.framing == "dledger"
        for e in manifest(name)["messages"]:
            s = e["stored"]
            same_message(message_dict(store.read_at(s["phyOffset"]), "base64"), s)
            assert store.get_by_msg_id(s["msgId"]).commit_log_offset == s["phyOffset"]
    for e in manifest(name)["messages"][::50]:  # and through the command, for a sample
        s = e["stored"]
        for way in (["--offset", s["phyOffset"]], ["--msg-id", s["msgId"]]):
            code, out, err = cli("get", root, *way, "-f", "jsonl")
            assert code == 0, err
            same_message(rows(out)[0], s)
    # An offset no record starts at: one line naming it, exit 2 (never a wrong record).
    for bad in (0, 47, 49, T9[name]["end"], T9[name]["end"] + 48):
        code, _, err = cli("get", root, "--offset", bad)
        assert code == 2 and str(bad) in error_line(err), (bad, err)
    assert tree_hashes(root) == before


# --- T2: queues ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", folders())
def test_queues_and_get_by_queue_offset_are_what_rocketmq_served(name):
    root = FOLDERS[name]
    before = tree_hashes(root)
    m = manifest(name)
    by_offset = {e["stored"]["phyOffset"]: e["stored"] for e in m["messages"]}
    units = 0
    with open_store(root) as store:
        listed = {(r.topic, r.queue_id) for r in store.queues().queues}
        # RocketMQ also serves the (empty) delay-level queues it never wrote a file for
        assert listed == {(q["topic"], q["queueId"]) for q in served(m, "queues") if q["cqEntries"]}
        for q in served(m, "queues"):
            if not q["cqEntries"]:
                continue
            with store.consume_queue(q["topic"], q["queueId"]) as cq:
                got = [[int(o), int(u["commit_log_offset"]), int(u["size"]), int(u["tags_code"])]
                       for o, u in zip(range(cq.base_offset, cq.max_offset), cq.units)]
                assert (cq.min_offset(store.commitlog.min_offset), cq.max_offset) == (
                    q["minOffset"], q["maxOffset"])
            assert got == q["cqEntries"], q["topic"]
            for qoff, phy, size, _ in got:  # phyOffsets are record offsets: entry pos + 48
                msg = store.get_by_queue_offset(q["topic"], q["queueId"], qoff)
                assert (msg.commit_log_offset, msg.store_size, msg.topic, msg.queue_id,
                        msg.queue_offset) == (phy, size, q["topic"], q["queueId"], qoff)
                assert by_offset[phy]["queueOffset"] == qoff
            units += len(got)
    assert units == 500
    q = next(q for q in served(m, "queues") if q["cqEntries"])
    qoff, phy = q["cqEntries"][-1][:2]
    code, out, err = cli("get", root, "-t", q["topic"], "-q", q["queueId"], "--queue-offset",
                         qoff, "-f", "jsonl")
    assert code == 0, err
    same_message(rows(out)[0], by_offset[phy])
    assert tree_hashes(root) == before


# --- T3: queries ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", folders())
def test_queries_give_rocketmqs_offsets(name):
    root = FOLDERS[name]
    before = tree_hashes(root)
    m = manifest(name)
    queries = served(m, "queries")
    assert len(queries) == {"5.3.3/basic": 1037}.get(name, 1007)
    by_offset = {e["stored"]["phyOffset"]: e["stored"] for e in m["messages"]}
    with IndexReader(root / "index") as idx:  # IndexFile offsets are record offsets
        for q in queries:
            res = idx.query(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
            assert res.phy_offsets == sorted(q["phyOffsets"]), q
    with open_store(root) as store:
        for i, q in enumerate(queries):
            # RocketMQ returns hash hits; the key check keeps the records carrying the key
            want = sorted({o for o in q["phyOffsets"] if by_offset[o]["topic"] == q["topic"]
                           and (q["key"] in split_keys(by_offset[o]["keys"])
                                or by_offset[o]["uniqKey"] == q["key"]
                                or parse_properties(by_offset[o]["propertiesString"]).get("UNIQ_KEY") == q["key"])})
            got = store.query_key(q["topic"], q["key"], broker_cap=True)
            assert [msg.commit_log_offset for msg in got] == want, q
            if i % 100 == 0:
                code, out, err = cli("query-key", root, "-t", q["topic"], "-k", q["key"],
                                     "--broker-cap", "-f", "jsonl", "--body", "none")
                assert code == (0 if want else 1), err
                assert [r["commitLogOffset"] for r in rows(out)] == want
    assert tree_hashes(root) == before


# --- T9: stats -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", folders())
def test_stats_counts_every_message_and_describes_the_ledger(name):
    root = FOLDERS[name]
    before = tree_hashes(root)
    code, out, err = cli("stats", root, "-f", "json")
    assert code == 0, err
    s = json.loads(out)
    m = manifest(name)
    want = T9[name]
    assert s["storeKind"]["log"] == "dledger"
    assert s["storeKind"]["family"] == ("5" if name.startswith("5") else "4.9")
    cl = s["commitLog"]
    assert (cl["messages"], cl["minOffset"], cl["maxOffset"], cl["endReason"], cl["segments"],
            cl["segmentSize"]) == (500, 0, want["end"], "zeros", 8, FILE)
    assert cl["bytes"] == sum(e["stored"]["storeSize"] for e in m["messages"])
    d = s["dledger"]
    assert {k: d[k] for k in ("entries", "ledgerBeginIndex", "ledgerEndIndex", "committedIndex",
                              "committedPos", "servedUpTo", "dataFileSize", "indexFileSize",
                              "indexBytes")} == {
        "entries": 500, "ledgerBeginIndex": 0, "ledgerEndIndex": 499,
        "committedIndex": want["committedIndex"], "committedPos": want["committedPos"],
        "servedUpTo": want["servedUpTo"], "dataFileSize": FILE, "indexFileSize": 8192,
        "indexBytes": 16000}
    if name != "4.9.8/crash":  # RocketMQ's own view after the puts (design-14 T9)
        r = m["dLedger"]
        assert (d["committedPos"], d["indexBytes"], d["endOffset"]) == (
            r["committedPos"], r["indexMaxWrotePosition"], r["dataMaxWrotePosition"])
    else:
        assert d["servedUpTo"] == m["recovery"]["maxPhyOffsetAfterLoad"]
    by_queue = {(q["topic"], q["queueId"]): q for q in s["queues"]}
    for q in served(m, "queues"):
        if not q["cqEntries"]:
            assert (q["topic"], q["queueId"]) not in by_queue
            continue
        row = by_queue[q["topic"], q["queueId"]]
        assert (row["messages"], row["cqMinOffset"], row["cqMaxOffset"]) == (
            len(q["cqEntries"]), q["minOffset"], q["maxOffset"])
    code, out, _ = cli("stats", root, "-f", "table")  # names the kind, shows the ledger
    assert code == 0 and "dledger" in out and "committedPos" in out
    assert tree_hashes(root) == before


# --- T10: what still refuses ---------------------------------------------------------------


@pytest.mark.parametrize("name", folders())
def test_writes_refuse_naming_dledger_and_change_nothing(name, tmp_path):
    store = copy_store(FOLDERS[name], tmp_path / "store")
    before = tree_hashes(store)
    data = store / "dledger-n0" / "data"
    refused = [
        ["append", store, "--topic", "TopicA", "--body", "x"],
        ["dump", store, "--follow", "-f", "jsonl"],
        ["spark", "stats", store],
        ["spark", "audit", store], ["spark", "rebuild-cq", store, "--out", tmp_path / "cq"],
        ["dump", sorted(data.iterdir())[0]], ["dump", data],
    ]
    for args in refused:
        code, out, err = cli(*args)
        line = error_line(err)
        assert code == 2 and "DLedger CommitLog" in line, (args, err)
        assert '"ok": true' not in out and "0 messages" not in out
    for op in ("append",):
        code, _, err = cli(*next(a for a in refused if a[0] == op))
        assert f"{op}" in error_line(err) and "not supported on it yet" in error_line(err)
    # The store's other files read as they do in a plain store.
    for args in (["dump", store / "consumequeue" / "TopicA" / "0", "-f", "jsonl"],
                 ["dump", sorted((store / "index").iterdir())[0], "-f", "json"],
                 ["dump", store / "checkpoint", "-f", "json"]):
        code, out, err = cli(*args)
        assert code == 0 and out.strip(), (args, err)
    assert tree_hashes(store) == before


# --- damage: never silently wrong ------------------------------------------------------------


def _entry(ledger, i: int, m: dict) -> tuple[str, int]:
    """(data file, position in it) of entry ``i``'s header."""
    pos = m["messages"][i]["stored"]["phyOffset"] - 48
    return ledger / "data" / f"{pos - pos % FILE:020d}", pos % FILE


@pytest.fixture
def damaged(tmp_path):
    if not FOLDERS["4.9.8/basic"].is_dir():
        pytest.skip(NO_DLEDGER)
    return copy_store(FOLDERS["4.9.8/basic"], tmp_path / "store")


def _patch(path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def test_a_torn_last_entry_ends_the_dump_there_with_exit_1(damaged):
    m = manifest("4.9.8/basic")
    path, p = _entry(damaged / "dledger-n0", 499, m)
    _patch(path, p, struct.pack(">i", 7))  # entry magic 7: DLedger's recovery cuts here
    before = tree_hashes(damaged)
    code, out, err = cli("dump", damaged, "-f", "jsonl", "--body", "none")
    assert code == 1 and len(rows(out)) == 499
    assert "DLedger entry" in err and str(m["messages"][499]["stored"]["phyOffset"] - 48) in err
    code, out, _ = cli("stats", damaged, "-f", "json")
    s = json.loads(out)
    assert code == 0 and s["commitLog"]["messages"] == 499 and s["commitLog"]["endReason"] == "bad-magic"
    assert s["dledger"]["ledgerEndIndex"] == 498
    code, _, err = cli("get", damaged, "--offset", m["messages"][499]["stored"]["phyOffset"])
    assert code == 2 and "outside the DLedger log" in error_line(err)
    assert tree_hashes(damaged) == before


def test_a_bad_record_in_a_good_entry_is_skipped_and_said(damaged):
    """DLedger keeps the entry (it never looks inside); the entry framing says where the
    next record starts, so the dump goes on past it and exits 1 naming it."""
    m = manifest("4.9.8/basic")
    path, p = _entry(damaged / "dledger-n0", 10, m)
    _patch(path, p + 48 + 4, struct.pack(">i", 0x12345678))  # the record's magic
    code, out, err = cli("dump", damaged, "-f", "jsonl", "--body", "none")
    bad = m["messages"][10]["stored"]["phyOffset"]
    assert code == 1 and len(rows(out)) == 499 and bad not in [r["commitLogOffset"] for r in rows(out)]
    assert f"skipped {path} @ offset {bad}" in err
    s = json.loads(cli("stats", damaged, "-f", "json")[1])
    assert s["commitLog"]["messages"] == 499
    assert s["dledger"]["recordsSkipped"] == [{"file": str(path), "offset": bad}]
