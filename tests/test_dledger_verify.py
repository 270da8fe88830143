"""Issue #14 WP D1: verify on DLedger stores (design-14 §1.10, §10 T4) against what RocketMQ
wrote, served and lost in its DLedger fixtures: clean on the healthy folders, RocketMQ's
recovery loss forecast on the crash folder, the documented findings on damaged copies."""

from __future__ import annotations

import json
import struct

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import FIXTURES, copy_store, tree_hashes
from rmqstore.recovery.verify import verify

runner = CliRunner()

FOLDERS = {
    "4.9.8/basic": FIXTURES / "rocketmq-4.9.8-dledger" / "basic",
    "4.9.8/crash": FIXTURES / "rocketmq-4.9.8-dledger" / "crash",
    "5.3.3/basic": FIXTURES / "rocketmq-5.3.3-dledger" / "basic",
}
NO_DLEDGER = f"RocketMQ-written DLedger fixtures not found under {FIXTURES} (../shared/fixtures)"
FILE = 65536  # DLedger data file size in every DLedger fixture


def need(name: str):
    if not FOLDERS[name].is_dir():
        pytest.skip(NO_DLEDGER)
    return FOLDERS[name]


def manifest(name: str) -> dict:
    return json.loads((FOLDERS[name] / "manifest.json").read_text())


def codes(report, severity=None) -> list[str]:
    return sorted(f.code for f in report.findings if severity is None or f.severity == severity)


def one(report, code: str):
    got = [f for f in report.findings if f.code == code]
    assert len(got) == 1, (code, report.findings)
    return got[0]


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("name", ["4.9.8/basic", "5.3.3/basic"])
def test_a_healthy_dledger_store_verifies_clean(name):
    root = need(name)
    m = manifest(name)
    before = tree_hashes(root)
    r = verify(root, deep=True)
    assert r.ok and r.problems == [], r.problems
    assert codes(r) == ["dledger-end"]
    assert r.messages == len(m["messages"]) == 500
    assert r.end == m["maxPhyOffset"]  # the last entry's end (design-14 §1.4)
    end = one(r, "dledger-end")
    assert end.data["reason"] == "clean" and end.data["endIndex"] == 499
    assert tree_hashes(root) == before


def test_the_crash_store_forecasts_what_rocketmq_4_9_recovery_lost():
    """RocketMQ 4.9.8 on DLedger deleted index file 5 and re-indexed nothing (design-14 §1.7):
    the keys of the records whose offsets vanished from the recorded queries are lost."""
    root = need("4.9.8/crash")
    m = manifest("4.9.8/crash")
    before = {(q["topic"], q["key"]): set(q["phyOffsets"]) for q in m["queriesBeforeCrash"]}
    after = {(q["topic"], q["key"]): set(q["phyOffsets"]) for q in m["recovery"]["queries"]}
    lost = set().union(*(before[k] - after.get(k, set()) for k in before))
    removed = [c["path"].split("/")[-1] for c in m["recovery"]["changesMadeByRecoveryAndShutdown"]
               if c["path"].startswith("index/") and c["change"] == "removed"]
    r = verify(root, deep=True)
    assert codes(r, "error") + codes(r, "warning") == ["abort-present"]
    a = one(r, "abort-present")
    assert a.severity == "error"  # design-14 §1.10: keys are lost on the next start
    assert "deletes index file(s) 20261124073013983 and re-indexes nothing: keys of 93 " \
        "records become unfindable" in a.explanation
    assert a.data["indexFilesDeleted"] == removed == ["20261124073013983"]
    assert a.data["reindexed"] is False
    assert a.data["keyedRecordsLost"] == len(lost) == 93
    assert r.forecast.index_files_deleted == removed
    u = one(r, "dledger-uncommitted")
    assert (u.data["committedIndex"], u.data["endIndex"]) == (399, 499)
    assert u.data["servedEndAfterLoad"] == m["recovery"]["maxPhyOffsetAfterLoad"] == 371602
    # DLedger's recovery kept every entry: RocketMQ's end after the restart.
    assert r.end == m["recovery"]["maxPhyOffset"] == 459701 and r.messages == 500


def test_the_command_exits_0_clean_and_1_on_the_crash_store():
    need("4.9.8/basic")
    code, out, err = cli("verify", FOLDERS["4.9.8/basic"], "-f", "json")
    assert code == 0, err
    code, out, err = cli("verify", FOLDERS["4.9.8/crash"], "-f", "json")
    assert code == 1 and "abort-present" in out and "keyedRecordsLost" in out, err
    doc = json.loads(out)
    assert [f["severity"] for f in doc["findings"] if f["code"] == "abort-present"] == ["error"]
    assert doc["errors"] == 1


# --- damaged copies ---------------------------------------------------------------------------


@pytest.fixture
def damaged(tmp_path):
    need("4.9.8/basic")
    return copy_store(FOLDERS["4.9.8/basic"], tmp_path / "store")


def _entry(store, i: int) -> tuple:
    """(data file, position, entry pos) of entry ``i``'s header (from the manifest)."""
    pos = manifest("4.9.8/basic")["messages"][i]["stored"]["phyOffset"] - 48
    return store / "dledger-n0" / "data" / f"{pos - pos % FILE:020d}", pos % FILE, pos


def _patch(path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def test_a_zeroed_index_unit_is_an_index_mismatch(damaged):
    # Unit 300 is in the second index file (8192-byte files hold 256 units).
    _patch(damaged / "dledger-n0" / "index" / f"{8192:020d}", 300 * 32 - 8192, bytes(32))
    r = verify(damaged)
    assert codes(r, "warning") == ["dledger-index-mismatch"] and not codes(r, "error")
    f = one(r, "dledger-index-mismatch")
    assert (f.data["entryIndex"], f.data["count"], f.offset) == (300, 1, 300 * 32 - 8192)
    assert f.file == f"dledger-n0/index/{8192:020d}"
    assert "rewrites it from the data" not in f.explanation  # file 4 < DLedger's start file


def test_a_cut_index_file_is_missing_units(damaged):
    idx = damaged / "dledger-n0" / "index" / f"{8192:020d}"
    idx.unlink()
    r = verify(damaged)
    f = one(r, "dledger-index-missing")
    assert (f.data["entryIndex"], f.data["count"]) == (256, 500 - 256)
    assert "rewrites it from the data" in f.explanation  # DLedger's walk compares them


def test_a_torn_last_entry_ends_the_chain_at_its_pos(damaged):
    path, p, pos = _entry(damaged, 499)
    _patch(path, p, bytes(8))  # magic and size never reached the disk; the rest did
    r = verify(damaged)
    assert r.end == pos and r.messages == 499
    t = one(r, "dledger-torn")
    assert t.severity == "error" and (t.offset, t.data["commitLogOffset"]) == (p, pos)
    assert t.file == f"dledger-n0/data/{pos - p:020d}"
    # Its ConsumeQueue unit now points at the end of the log (the broker drops it on load).
    assert "cq-beyond-end" in codes(r)


def test_a_record_failing_its_crc_in_a_good_entry_is_a_bad_record(damaged):
    path, p, pos = _entry(damaged, 100)
    with open(path, "r+b") as f:
        f.seek(p + 48 + 200)
        b = f.read(1)
        f.seek(p + 48 + 200)
        f.write(bytes([b[0] ^ 0xFF]))
    r = verify(damaged)
    assert codes(r, "error") == ["dledger-record-bad"]
    f = one(r, "dledger-record-bad")
    assert f.data["commitLogOffset"] == pos + 48 and f.data["crc"] is False
    assert r.messages == 500  # kept and dispatched, as DLedger and the reput keep it


def test_a_record_that_does_not_fit_its_entry_is_skipped_and_its_unit_unexplained(damaged):
    path, p, pos = _entry(damaged, 10)
    _patch(path, p + 48 + 4, struct.pack(">i", 0x12345678))  # the record's magic
    r = verify(damaged)
    f = one(r, "dledger-record-bad")
    assert (f.offset, f.data["commitLogOffset"]) == (p + 48, pos + 48)
    assert "skips the rest of the data file" in f.explanation
    assert r.messages == 499 and "cq-bad-pointer" in codes(r, "error")


def test_a_chain_break_before_the_recovery_start_skips_the_rest_of_that_file(damaged):
    path, p, pos = _entry(damaged, 250)  # file 196608: DLedger's recovery starts at 327680
    _patch(path, p + 24, struct.pack(">q", 0))  # the entry's pos field
    r = verify(damaged)
    f = one(r, "dledger-chain-break")
    assert f.data["commitLogOffset"] == pos and f.offset == p
    assert r.messages == 500 - 15  # entries 250..264 lie in the rest of that file


def test_an_abort_file_on_a_5x_dledger_store_forecasts_a_rescan_that_reindexes(tmp_path):
    """RocketMQ 5 on DLedger (DLedgerCommitLog#dledgerRecoverAbnormally, design-14 §1.6)
    rescans from the newest data file whose first record (v1 magic) is stored no later than
    the checkpoint's minTimestamp, and re-dispatches (re-indexes) from there."""
    need("5.3.3/basic")
    m = manifest("5.3.3/basic")
    store = copy_store(FOLDERS["5.3.3/basic"], tmp_path / "store")
    (store / "abort").write_bytes(b"")
    # StoreCheckpoint#getMinTimestamp: min(physic, logics) - 3 s. Move both so the answer is
    # a file in the middle (with the fixture's own values no file qualifies: file 0).
    ck = {"physicMsgTimestamp": 1795505421300 + 3000, "logicsMsgTimestamp": 1795505421300 + 3000}
    with open(store / "checkpoint", "r+b") as f:
        f.write(struct.pack(">qq", ck["physicMsgTimestamp"], ck["logicsMsgTimestamp"]))
    limit = min(ck["physicMsgTimestamp"], ck["logicsMsgTimestamp"]) - 3000
    firsts = {s["phyOffset"] - 48: s for s in (x["stored"] for x in m["messages"])
              if (s["phyOffset"] - 48) % FILE == 0}
    v1 = -626843481  # MESSAGE_MAGIC_CODE 0xDAA320A7 as a Java int (spec §3.1)
    want = max(f for f, s in firsts.items() if s["magic"] == v1 and 0 < s["storeTimestamp"] <= limit)
    r = verify(store)
    a = one(r, "abort-present")
    assert a.data["reindexed"] is True and a.data["keyedRecordsLost"] == 0
    assert a.data["startOffset"] == r.forecast.start_offset == want == 4 * FILE
    assert a.severity == "error"
    assert f"rescans from data file dledger-n0/data/{want:020d} " in a.explanation


def test_forced_property_crcs_are_checked_inside_the_entries():
    """forceVerifyPropCRC on a store whose records carry no __CRC32# (spec §3.8): every
    record inside the entries is reported missing it, at its record offset (pos + 48)."""
    from rmqstore.files.config import load_config

    root = need("4.9.8/basic")
    cfg = load_config(root).with_values(force_verify_prop_crc=True)
    r = verify(root, config=cfg)
    missing = [f for f in r.findings if f.code == "prop-crc-missing"]
    first = missing[0]
    assert (first.file, first.offset, first.data["commitLogOffset"]) == (
        f"dledger-n0/data/{0:020d}", 48, 48)
    assert missing[65].data["commitLogOffset"] == 65584  # entry 65 starts data file 65536
