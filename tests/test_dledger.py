"""DLedger CommitLogs (issue #14 WP1) against the stores real RocketMQ wrote in DLedger mode:
every message where RocketMQ served it, the ConsumeQueue pointing at the offsets computed
here, the entry chain ending where DLedger's recovery ends it, and damaged copies giving the
documented end or a typed error (design-14 §1, fixtures README "DLedger on-disk layout")."""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import FIXTURES, tree_hashes
from rmqstore.files import dledger as D
from rmqstore.format import dledger_layout as DL
from rmqstore.format import layout as L
from rmqstore.format.message import offset_msg_id
from rmqstore.files.consumequeue import ConsumeQueue, list_queues
from rmqstore.errors import ConfigError, NotAStoreError, OffsetError, RecordError, RmqStoreError
from rmqstore.scan.records import columns, consistent

FOLDERS = {
    "4.9.8/basic": FIXTURES / "rocketmq-4.9.8-dledger" / "basic",
    "4.9.8/crash": FIXTURES / "rocketmq-4.9.8-dledger" / "crash",
    "5.3.3/basic": FIXTURES / "rocketmq-5.3.3-dledger" / "basic",
}
NO_DLEDGER = f"RocketMQ-written DLedger fixtures not found under {FIXTURES} (../shared/fixtures)"
BASIC = FOLDERS["4.9.8/basic"]
FILE = 65536  # mappedFileSizeCommitLog of every DLedger fixture (storeConfig)


def folders():
    return [pytest.param(name, marks=pytest.mark.skipif(not p.is_dir(), reason=NO_DLEDGER))
            for name, p in FOLDERS.items()]


_manifests: dict[str, dict] = {}


def manifest(name: str) -> dict:
    if name not in _manifests:
        _manifests[name] = json.loads((FOLDERS[name] / "manifest.json").read_text())
    return _manifests[name]


def queues_served(m: dict) -> list[dict]:
    """The queues RocketMQ served for the files now on disk (crash: before the crash; the
    JVM was halted, so page cache = disk, and recovery changed no ConsumeQueue)."""
    return m.get("queuesBeforeCrash") or m["queues"]


@pytest.fixture
def basic_copy(tmp_path):
    """A writable copy of 4.9.8-dledger/basic's dledger-n0 folder (the store root around it
    is not needed by this module)."""
    if not BASIC.is_dir():
        pytest.skip(NO_DLEDGER)
    dst = tmp_path / "store" / "dledger-n0"
    shutil.copytree(BASIC / "dledger-n0", dst)
    for p in [dst, *dst.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


def entry_pos_of(i: int) -> int:
    """Entry ``i``'s position as RocketMQ reported it (its record's phyOffset - 48)."""
    return manifest("4.9.8/basic")["messages"][i]["stored"]["phyOffset"] - 48


def data_file(ledger: Path, pos: int) -> Path:
    return ledger / "data" / f"{pos - pos % FILE:020d}"


def poke(ledger: Path, pos: int, data: bytes) -> None:
    """Overwrite bytes of the data files at absolute offset ``pos``."""
    with open(data_file(ledger, pos), "r+b") as f:
        f.seek(pos % FILE)
        f.write(data)


# --- layout -----------------------------------------------------------------------------

def test_schemas_have_dledgers_widths():
    # DLedgerEntryCoder#encode/encodeIndex: 48-byte header (Java HEADER_SIZE 44 + body size),
    # 32-byte index unit; MmapFileList#preAppend: blank = int -1, int remaining.
    assert DL.DLedgerEntryHeader.sizeof() == 48 == DL.DLEDGER_BODY_OFFSET
    assert DL.DLedgerIndexUnit.sizeof() == 32 == DL.DLEDGER_INDEX_UNIT_SIZE
    assert DL.DLedgerBlank.sizeof() == 8
    assert DL.ENTRY_HEADER_STRUCT.size == 48 and DL.INDEX_UNIT_STRUCT.size == 32
    assert DL.ENTRY_HEADER_DTYPE.itemsize == 48 and DL.INDEX_UNIT_DTYPE.itemsize == 32
    assert DL.DLedgerBlank.build({"size": 951}) == b"\xff\xff\xff\xff\x00\x00\x03\xb7"
    assert DL.DEFAULT_INDEX_FILE_SIZE == 167_772_160


i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.tuples(i32, i32, i64, i64, i64, i32, i32, i32, i32))
def test_entry_header_schema_round_trips_through_every_form(values):
    obj = dict(zip(DL.ENTRY_HEADER_FIELDS, values))
    built = DL.DLedgerEntryHeader.build(obj)
    assert len(built) == 48
    assert DL.ENTRY_HEADER_STRUCT.pack(*values) == built
    parsed = DL.DLedgerEntryHeader.parse(built)
    assert tuple(parsed[k] for k in DL.ENTRY_HEADER_FIELDS) == values
    row = np.frombuffer(built, dtype=DL.ENTRY_HEADER_DTYPE)[0]
    assert tuple(int(row[k]) for k in DL.ENTRY_HEADER_FIELDS) == values
    assert DL.EntryHeader(*values).record_offset == values[4] + 48


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.tuples(i32, i64, i32, i64, i64))
def test_index_unit_schema_round_trips(values):
    built = DL.DLedgerIndexUnit.build(dict(zip(DL.INDEX_UNIT_FIELDS, values)))
    assert DL.INDEX_UNIT_STRUCT.pack(*values) == built
    row = np.frombuffer(built, dtype=DL.INDEX_UNIT_DTYPE)[0]
    assert tuple(int(row[k]) for k in DL.INDEX_UNIT_FIELDS) == values


# --- the fixtures, read ------------------------------------------------------------------

@pytest.mark.parametrize("name", folders())
def test_files_and_small_files_are_what_dledger_wrote(name):
    m = manifest(name)
    dl = m["dLedger"]
    with D.open_ledger(FOLDERS[name]) as log:
        assert log.ledger_dir.name == "dledger-" + m["storeConfig"]["dLegerSelfId"]
        assert log.files.data_file_size == dl["dataFileSize"] == m["storeConfig"]["mappedFileSizeCommitLog"]
        assert log.files.index_file_size == dl["indexFileSize"] == m["storeConfig"]["dLedgerIndexFileSize"]
        assert [s.start for s in log.data_files] == [k * FILE for k in range(8)]
        assert [s.start for s in log.files.index.segments] == [0, 8192]
        assert log.files.problems == []
        # the README: committedIndex=399 on disk after the crash (checkpoint every 3 s),
        # the ledger's final committedIndex otherwise; currterm voteLeader=n0, currTerm=0.
        want = 399 if name.endswith("crash") else dl["committedIndex"]
        assert (log.checkpoint.committed_index, log.checkpoint.end_index) == (want, want)
        assert log.checkpoint.problems == [] and not log.checkpoint.tmp_left
        assert log.checkpoint.bak_exists == (name == "5.3.3/basic")
        assert (log.currterm.term, log.currterm.vote_leader) == (dl["term"], "n0")


@pytest.mark.parametrize("name", folders())
def test_chain_ends_where_dledgers_recovery_ends_it(name):
    m = manifest(name)
    dl = m["dLedger"]
    with D.open_ledger(FOLDERS[name]) as log:
        end = log.walk()
        assert end.offset == m["maxPhyOffset"] == dl["dataMaxWrotePosition"]
        assert (end.reason, end.clean, end.tail_clean) == (D.END_SIZE_ZERO, True, True)
        assert end.error() is None
        assert end.entries == m["messageCount"] == 500
        assert (end.begin_index, end.end_index, end.end_term) == (
            dl["ledgerBeginIndex"], dl["ledgerEndIndex"], dl["ledgerEndTerm"])
        assert end.last_entry_end == end.offset
        assert end.recovery_start == 5 * FILE  # max(0, 8 - 3): its first entry checks out
        assert end.index_rewrite_from is None and end.damage == [] and end.refuses_start == []
        assert end.files_after_end == []
        assert end.path.name == f"{7 * FILE:020d}" and end.position == end.offset - 7 * FILE
        if name.endswith("crash"):
            # committedIndex 399 from the checkpoint: RocketMQ served up to 371602 after load().
            assert end.committed_index == 399
            assert end.committed_pos == end.max_offset == m["recovery"]["maxPhyOffsetAfterLoad"] == 371602
            assert m["recovery"]["dLedger"]["ledgerEndIndex"] == end.end_index
        else:
            assert (end.committed_index, end.committed_pos) == (dl["committedIndex"], dl["committedPos"])
            assert end.max_offset == dl["committedPos"]


@pytest.mark.parametrize("name", folders())
def test_entries_and_blanks_are_rocketmqs_walk(name):
    m = manifest(name)
    with D.open_ledger(FOLDERS[name]) as log:
        got = []
        for run in log.runs():
            got += [("MESSAGE", run.start + int(p), int(s)) for p, s in zip(run.entry_pos, run.size)]
            assert (np.diff(run.index) == 1).all()
            if run.blank is not None:
                got.append(("BLANK", *run.blank))
    assert got == [(w["type"], w["offset"], w["size"]) for w in m["commitlogWalk"]]


def _expected(stored: dict) -> dict:
    return dict(topic=stored["topic"], queue_id=stored["queueId"], queue_offset=stored["queueOffset"],
                commit_log_offset=stored["physicalOffsetField"], store_size=stored["storeSize"],
                flag=stored["flag"], sys_flag=stored["sysFlag"], born_timestamp=stored["bornTimestamp"],
                born_host=stored["bornHost"], store_timestamp=stored["storeTimestamp"],
                store_host=stored["storeHost"], reconsume_times=stored["reconsumeTimes"],
                prepared_transaction_offset=stored["preparedTransactionOffset"],
                body_crc=stored["bodyCRC"], properties_text=stored["propertiesString"],
                body=base64.b64decode(stored["bodyBase64"]), magic=stored.get("magic", L.MAGIC_V1))


@pytest.mark.parametrize("name", folders())
def test_every_manifest_message_reads_as_rocketmq_served_it(name):
    m = manifest(name)
    with D.open_ledger(FOLDERS[name]) as log:
        for entry in m["messages"]:
            s = entry["stored"]
            assert s["phyOffset"] == entry["put"]["wroteOffset"]
            msg = log.message_at(s["phyOffset"], check_crc=True)
            got = {k: getattr(msg, k) for k in _expected(s)}
            got["born_host"], got["store_host"] = str(msg.born_host), str(msg.store_host)
            assert got == _expected(s), entry["index"]
            assert offset_msg_id(msg.store_host, s["phyOffset"]) == s["msgId"]
        # The walk yields exactly those records, in put order, with their sizes and bytes.
        walked = [(off, len(rec), bytes(rec[:4])) for off, rec in log.records()]
        assert walked == [(e["stored"]["phyOffset"], e["stored"]["storeSize"],
                           e["stored"]["storeSize"].to_bytes(4, "big")) for e in m["messages"]]


@pytest.mark.parametrize("name", folders())
def test_columnar_record_decoders_run_on_entry_runs(name):
    m = manifest(name)
    offsets, qoffs, stamps, topics, crc = [], [], [], [], []
    with D.open_ledger(FOLDERS[name]) as log:
        for run in log.runs():
            c = columns(run.u8, run.record_pos, run.start)
            assert consistent(c).all() and run.record_ok().all()
            assert (c.size == run.record_size).all() and (c.offset == run.record_offset).all()
            offsets += c.offset.tolist()
            qoffs += c.queue_offset.tolist()
            stamps += c.store_timestamp.tolist()
            names, ids = c.topic_table()
            topics += [names[i] for i in ids]
            crc += c.crc_ok().tolist()
    st_ = [e["stored"] for e in m["messages"]]
    assert offsets == [s["phyOffset"] for s in st_] == [s["physicalOffsetField"] for s in st_]
    assert qoffs == [s["queueOffset"] for s in st_]
    assert stamps == [s["storeTimestamp"] for s in st_]
    assert topics == [s["topic"] for s in st_]
    assert all(crc)


@pytest.mark.parametrize("name", folders())
def test_consume_queue_units_point_at_the_computed_offsets(name):
    m = manifest(name)
    root = FOLDERS[name]
    cq_size = m["storeConfig"]["mappedFileSizeConsumeQueue"]
    with D.open_ledger(root) as log:
        records = {}
        for run in log.runs():
            c = columns(run.u8, run.record_pos, run.start)
            names, ids = c.topic_table()
            for off, size, qid, qoff, t in zip(run.record_offset.tolist(), run.record_size.tolist(),
                                               c.queue_id.tolist(), c.queue_offset.tolist(), ids.tolist()):
                records[off] = (size, names[t], qid, qoff)
    served = {(q["topic"], q["queueId"]): q["cqEntries"] for q in queues_served(m)}
    listing = list_queues(root)
    assert listing.problems == []
    units = 0
    for ref in listing.queues:
        with ConsumeQueue(ref.path, cq_size) as cq:
            got = [[int(q), int(u["commit_log_offset"]), int(u["size"]), int(u["tags_code"])]
                   for q, u in zip(range(cq.base_offset, cq.max_offset), cq.units)]
        assert got == served[(ref.topic, ref.queue_id)]
        for qoff, phy, size, _ in got:
            assert records[phy] == (size, ref.topic, ref.queue_id, qoff)
        units += len(got)
    assert units == len(records) == 500


@pytest.mark.parametrize("name", folders())
def test_offsets_map_to_file_and_position_and_back(name):
    m = manifest(name)
    with D.open_ledger(FOLDERS[name]) as log:
        for i, e in enumerate(m["messages"]):
            off = e["stored"]["phyOffset"]
            seg, pos = log.locate(off)
            assert (seg.start, pos) == (off - off % FILE, off % FILE)
            assert seg.path.name == f"{off - off % FILE:020d}"
            assert log.offset_of(seg, pos) == log.offset_of(seg.path, pos) == off
            h = log.header_at(D.entry_pos(off))
            size = e["stored"]["storeSize"] + 48
            assert (h.index, h.pos, h.size, h.record_offset) == (i, off - 48, size, off)
            assert (h.channel, h.chain_crc, h.body_crc) == (0, 0, 0)  # 0.3.1.2 computes no CRC
            assert log.index_unit(i) == (1, off - 48, size, i, 0)
        end = log.walk().offset
        for bad in (-1, 8 * FILE, 2**63):
            with pytest.raises(OffsetError):
                log.locate(bad)
        for bad in (0, 47, end, end + 100):  # before the first record, at/after the end
            with pytest.raises(OffsetError):
                log.record_at(bad)
        with pytest.raises(RecordError) as err:  # inside a record: no entry 48 bytes before
            log.record_at(m["messages"][3]["stored"]["phyOffset"] + 10)
        assert err.value.path.endswith("00000000000000000000")
        with pytest.raises(OffsetError):
            log.offset_of("00000000000000999999", 0)
        with pytest.raises(OffsetError):
            log.offset_of(log.data_files[0], FILE)


def test_reading_changes_no_byte(basic_copy):
    before = tree_hashes(basic_copy.parent)
    with D.open_ledger(basic_copy.parent) as log:
        log.walk()
        for off, rec in log.records():
            log.message_at(off, check_crc=True)
    assert tree_hashes(basic_copy.parent) == before


# --- damaged copies ----------------------------------------------------------------------

def _walk(ledger: Path) -> D.ChainEnd:
    with D.DLedgerLog(ledger) as log:
        return log.walk()


def _offsets(ledger: Path) -> list[int]:
    with D.DLedgerLog(ledger) as log:
        return [o for run in log.runs() for o in run.record_offset.tolist()]


def _all(n: int) -> list[int]:
    return [e["stored"]["phyOffset"] for e in manifest("4.9.8/basic")["messages"][:n]]


def test_flipped_magic_of_the_last_entry_ends_the_chain_there(basic_copy):
    pos = entry_pos_of(499)
    poke(basic_copy, pos, struct.pack(">i", 2))
    end = _walk(basic_copy)
    assert (end.offset, end.reason, end.end_index) == (pos, D.END_BAD_MAGIC, 498)
    assert end.last_entry_end == pos and not end.clean and end.refuses_start == []
    err = end.error()
    assert isinstance(err, RecordError) and err.offset == pos
    assert err.path == str(data_file(basic_copy, pos))
    assert str(err).startswith(f"{data_file(basic_copy, pos)} @ offset {pos}: ")
    assert _offsets(basic_copy) == _all(499)


def test_a_blank_magic_in_the_last_file_ends_at_that_files_end_as_dledger_does(basic_copy):
    # DLedgerMmapFileStore#recover: magic -1 means "next file"; with none, processOffset is
    # the end of the last file. Entry 499 is then lost to DLedger, and the tail is not clean.
    pos = entry_pos_of(499)
    poke(basic_copy, pos, struct.pack(">i", -1))
    end = _walk(basic_copy)
    assert (end.offset, end.reason, end.end_index) == (8 * FILE, D.END_LAST_BLANK, 498)
    assert end.last_entry_end == pos and end.tail_clean is False and not end.clean
    assert _offsets(basic_copy) == _all(499)


def test_a_torn_tail_header_ends_the_chain_at_that_entry(basic_copy):
    pos = entry_pos_of(499)  # size and everything after it never reached the disk
    poke(basic_copy, pos + 4, bytes(8 * FILE - pos - 4))
    end = _walk(basic_copy)
    assert (end.offset, end.reason, end.end_index, end.tail_clean) == (pos, D.END_SIZE_ZERO, 498, False)
    assert end.error() is None  # DLedger cannot tell it from unwritten space: a clean stop
    poke(basic_copy, pos, bytes(4))
    assert _walk(basic_copy).clean


def test_a_torn_record_inside_a_whole_entry_is_kept_by_dledger_and_refused_by_the_reader(basic_copy):
    # DLedger never looks inside an entry (no CRC): the chain keeps it; the record check
    # (RocketMQ's reput) does not.
    pos = entry_pos_of(499)
    size = manifest("4.9.8/basic")["messages"][499]["stored"]["storeSize"]
    poke(basic_copy, pos + 48 + size - 200, bytes(200))  # body length on: a torn page
    end = _walk(basic_copy)
    assert (end.offset, end.end_index, end.clean) == (pos + 48 + size, 499, True)
    with D.DLedgerLog(basic_copy) as log:
        ok = np.concatenate([run.record_ok() for run in log.runs()])
        assert ok.all()  # TOTALSIZE, magic and PHYSICALOFFSET are intact...
        with pytest.raises(RecordError) as err:  # ...the record's own lengths are not
            log.message_at(pos + 48, check_crc=True)
        assert err.value.offset == pos + 48 and err.value.path == str(data_file(basic_copy, pos))
    poke(basic_copy, pos + 48, bytes(4))  # TOTALSIZE gone: record_ok sees it
    with D.DLedgerLog(basic_copy) as log:
        ok = np.concatenate([run.record_ok() for run in log.runs()])
        assert ok.tolist() == [True] * 499 + [False]


@pytest.mark.parametrize("what,reason", [
    (lambda p: (p + 24, struct.pack(">q", 12345)), D.END_BAD_POS),
    (lambda p: (p + 44, struct.pack(">i", 7)), D.END_BAD_BODY_SIZE),
    (lambda p: (p + 8, struct.pack(">q", 77)), D.END_BAD_INDEX),
    (lambda p: (p + 16, struct.pack(">q", -5)), D.END_BAD_TERM),
    (lambda p: (p + 4, struct.pack(">i", 40) + bytes(36) + struct.pack(">i", -8)), D.END_TOO_SMALL),
    (lambda p: (p + 4, struct.pack(">i", FILE) + bytes(36) + struct.pack(">i", FILE - 48)), D.END_PAST_FILE),
])
def test_each_header_check_ends_the_chain_with_its_reason(basic_copy, what, reason):
    pos = entry_pos_of(450)  # in file 393216, after the recovery start (327680)
    at, data = what(pos)
    if reason == D.END_TOO_SMALL:
        data = data[:4] + struct.pack(">qqq", 450, 0, pos) + bytes(12) + data[-4:]
    if reason == D.END_PAST_FILE:
        data = data[:4] + struct.pack(">qqq", 450, 0, pos) + bytes(12) + data[-4:]
    poke(basic_copy, at, data)
    end = _walk(basic_copy)
    assert (end.offset, end.reason, end.end_index) == (pos, reason, 449)
    assert end.path == data_file(basic_copy, pos) and end.error().offset == pos
    # DLedger deletes the data files after the end; this end is within a file of the last.
    assert end.files_after_end == [basic_copy / "data" / f"{7 * FILE:020d}"]
    assert end.refuses_start == []
    assert _offsets(basic_copy) == _all(450)


def test_an_end_more_than_a_file_before_the_last_makes_dledger_refuse_to_start(basic_copy):
    pos = entry_pos_of(340)  # file 327680, the recovery start file
    poke(basic_copy, pos + 24, struct.pack(">q", 1))
    end = _walk(basic_copy)
    assert (end.offset, end.reason, end.end_index) == (pos, D.END_BAD_POS, 339)
    assert len(end.refuses_start) == 1 and "refuses to start" in end.refuses_start[0]


def test_a_bad_first_entry_moves_the_recovery_start_back_a_file(basic_copy):
    # recover(): start file max(0, n-3) = 5 fails its pre-check, so the walk starts in
    # file 4 and ends where file 5 begins (its first entry, index 338, fails in the walk).
    pos = 5 * FILE
    assert entry_pos_of(338) == pos
    poke(basic_copy, pos, struct.pack(">i", 0))
    end = _walk(basic_copy)
    assert (end.recovery_start, end.offset, end.reason) == (4 * FILE, pos, D.END_BAD_MAGIC)
    assert end.end_index == 337
    assert end.refuses_start  # 458752 - 327680 > 65536


def test_damage_before_the_recovery_start_skips_the_rest_of_that_file(basic_copy):
    # File 3 (196608) is not walked by DLedger's recovery; reads stop in it at the damage
    # and go on with file 4, as RocketMQ's reput does. The end stays where it was.
    pos = entry_pos_of(250)
    assert 3 * FILE <= pos < 4 * FILE
    poke(basic_copy, pos + 24, struct.pack(">q", 0))
    end = _walk(basic_copy)
    assert (end.offset, end.reason, end.end_index) == (459701, D.END_SIZE_ZERO, 499)
    assert len(end.damage) == 1 and not end.clean
    assert (end.damage[0].offset, end.damage[0].path) == (pos, str(data_file(basic_copy, pos)))
    skipped = [o for o in _all(500) if pos < o < 4 * FILE]
    assert len(skipped) == 264 - 250 + 1  # entries 250..264; file 262144 starts with 265
    assert _offsets(basic_copy) == [o for o in _all(500) if not pos < o < 4 * FILE]
    assert end.entries == 500 - len(skipped)


def test_a_zeroed_index_unit_is_where_dledger_rewrites_the_index(basic_copy):
    with open(basic_copy / "index" / f"{8192:020d}", "r+b") as f:
        f.seek((450 - 256) * 32)
        f.write(bytes(32))
    end = _walk(basic_copy)
    assert (end.offset, end.end_index, end.index_rewrite_from, end.entries) == (459701, 499, 450, 500)
    assert _offsets(basic_copy) == _all(500)


def test_without_index_files_every_entry_is_still_read(basic_copy):
    for p in (basic_copy / "index").iterdir():
        p.unlink()
    with D.DLedgerLog(basic_copy) as log:
        end = log.walk()
        assert log.files.index_file_size == DL.DEFAULT_INDEX_FILE_SIZE  # nothing to take it from
        # no unit: every pre-check fails, so the walk starts in file 0 and rewrites all
        assert (end.recovery_start, end.index_rewrite_from, end.offset, end.entries) == (0, 0, 459701, 500)
        assert [o for run in log.runs() for o in run.record_offset.tolist()] == _all(500)


def test_a_short_data_file_is_reported_and_read_as_far_as_it_goes(basic_copy):
    last = basic_copy / "data" / f"{7 * FILE:020d}"
    pos = entry_pos_of(499)
    os.truncate(last, pos - 7 * FILE + 100)
    with D.DLedgerLog(basic_copy) as log:
        end = log.walk()
        assert [p.code for p in log.files.problems] == ["wrong-size"]
        assert (end.offset, end.reason, end.end_index) == (pos, D.END_PAST_FILE, 498)
        assert len(end.refuses_start) == 1  # MmapFileList#doLoad: every file is 65536 bytes
        assert str(last) in end.refuses_start[0] and "65536" in end.refuses_start[0]


def test_checkpoint_damage_is_reported_not_raised(basic_copy):
    (basic_copy / "checkpoint").write_text("committedIndex=4x9\nendIndex=\n")
    (basic_copy / "checkpoint.tmp").write_text("")
    with D.DLedgerLog(basic_copy) as log:
        ck = log.checkpoint
        assert (ck.committed_index, ck.end_index, ck.tmp_left) == (None, None, True)
        assert len(ck.problems) == 1 and "committedIndex" in ck.problems[0]
        end = log.walk()
        assert (end.checkpoint_index, end.committed_index, end.committed_pos) == (None, -1, -1)
        assert end.max_offset == 0  # no committed position: the first file's start
    (basic_copy / "checkpoint").unlink()
    (basic_copy / "currterm").write_text("# comment\ncurrTerm = 3\nvoteLeader=\n")
    with D.DLedgerLog(basic_copy) as log:
        assert not log.checkpoint.exists and log.checkpoint.committed_index is None
        assert (log.currterm.term, log.currterm.vote_leader) == (3, None)
    (basic_copy / "checkpoint").write_text("committedIndex=100\n")
    stored = manifest("4.9.8/basic")["messages"][100]["stored"]
    with D.DLedgerLog(basic_copy) as log:  # before the walk's start: pos + size from the index
        end = log.walk()
        assert (end.committed_index, end.committed_pos) == (100, stored["phyOffset"] + stored["storeSize"])


def test_configured_sizes_that_no_file_has_are_config_errors(basic_copy):
    with pytest.raises(ConfigError) as err:
        D.DLedgerLog(basic_copy, data_file_size=1 << 30)
    assert "1073741824" in str(err.value) and "65536" in str(err.value)
    with D.DLedgerLog(basic_copy, data_file_size=FILE, index_file_size=8192) as log:
        assert log.walk().offset == 459701


def test_no_data_files_is_an_empty_ledger(tmp_path):
    (tmp_path / "dledger-n0" / "data").mkdir(parents=True)
    with D.open_ledger(tmp_path) as log:
        end = log.walk()
        assert (end.offset, end.reason, end.entries, end.end_index) == (0, D.END_NO_FILES, 0, -1)
        assert end.path is None
        assert list(log.runs()) == [] and end.clean


def test_open_ledger_finds_one_folder_or_says_why_not(tmp_path):
    with pytest.raises(NotAStoreError):
        D.open_ledger(tmp_path)
    (tmp_path / "dledger-a" / "data").mkdir(parents=True)
    (tmp_path / "dledger-b" / "index").mkdir(parents=True)
    (tmp_path / "dledger-c").mkdir()  # neither data/ nor index/: not DLedger's
    assert [p.name for p in D.find_ledger_dirs(tmp_path)] == ["dledger-a", "dledger-b"]
    with pytest.raises(ConfigError) as err:
        D.open_ledger(tmp_path)
    assert "dledger-a, dledger-b" in str(err.value)
    with D.open_ledger(tmp_path / "dledger-b") as log:
        assert log.walk().reason == D.END_NO_FILES
    other = tmp_path / "other-disk"
    (other / "data").mkdir(parents=True)
    shutil.rmtree(tmp_path / "dledger-b")
    (tmp_path / "dledger-b").symlink_to(other)  # a folder on another disk, like commitlog/
    assert [p.name for p in D.find_ledger_dirs(tmp_path)] == ["dledger-a", "dledger-b"]


def test_links_and_stray_files_are_reported_never_read(basic_copy, tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(bytes(FILE))
    (basic_copy / "data" / f"{8 * FILE:020d}").symlink_to(outside)
    (basic_copy / "data" / "notes.txt").write_text("x")
    (basic_copy / "currterm").unlink()
    (basic_copy / "currterm").symlink_to(outside)
    with D.DLedgerLog(basic_copy) as log:
        codes = sorted(p.code for p in log.files.problems)
        assert codes == ["stray-file", "symlink"]
        assert log.currterm.term is None and "symbolic link" in log.currterm.problems[0]
        end = log.walk()
        # DLedger's load fails on the stray file; the link it would follow, rmqstore does not
        assert end.offset == 459701 and len(end.refuses_start) == 1
        assert "notes.txt" in end.refuses_start[0]


def test_random_header_damage_never_raises_anything_but_a_typed_error(basic_copy):
    rng = random.Random(1414)
    m = manifest("4.9.8/basic")["messages"]
    originals = {p.name: p.read_bytes() for p in (basic_copy / "data").iterdir()}
    for _ in range(40):
        i = rng.randrange(300, 500)
        pos = entry_pos_of(i)
        at = pos + rng.randrange(0, 48 + 64)
        poke(basic_copy, at, bytes([rng.randrange(256)]))
        end = _walk(basic_copy)
        assert end.offset <= 8 * FILE and end.end_index <= 499
        # The chain ends at the damaged entry, or at the next one (a term raised past
        # the next entry's), or not at all (fields DLedger never checks, or the record).
        nxt = entry_pos_of(i + 1) if i < 499 else 459701
        assert end.offset == 459701 or end.offset <= nxt or end.reason == D.END_LAST_BLANK
        with D.DLedgerLog(basic_copy) as log:
            for off, _ in log.records():
                try:
                    log.message_at(off, check_crc=True)
                except RmqStoreError:
                    pass
        for name, data in originals.items():
            (basic_copy / "data" / name).write_bytes(data)
    assert _walk(basic_copy).offset == 459701 and len(m) == 500
