"""MessageStore: spec vectors for both broker versions, limits as statuses, lock and abort,
reopening, and the `rmqstore append` command's contract."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from rmqstore.format import layout as L
from rmqstore.engine.results import PutStatus
from rmqstore.format.message import Host, Message
from rmqstore.files.commitlog import CommitLog
from rmqstore.files.config import StoreConfig
from rmqstore.files.consumequeue import open_consume_queue
from rmqstore.files.consumequeue_writer import ConsumeQueueWriter
from rmqstore.errors import NotAStoreError, StoreLockedError
from rmqstore.engine.store import MessageStore
from rmqstore.reader import open_store

# spec §12.3: the complete 5.3.3 record (254 bytes), copied from the spec's hex dump.
SPEC_12_3 = bytes.fromhex(textwrap.dedent("""
    00 00 00 fe da a3 20 a7 69 c8 65 ed 00 00 00 03 00 00 00 00 00 00 00 00 00 00 00 2a 00 00 00 00
    00 00 08 00 00 00 00 00 00 00 01 8b cf e5 68 00 c0 a8 00 0a 00 00 d4 31 00 00 01 8b cf e5 68 7b
    c0 a8 00 64 00 00 2a 9f 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 0e 48 65 6c 6c 6f 20 52 6f
    63 6b 65 74 4d 51 09 54 6f 70 69 63 54 65 73 74 00 8c 4d 53 47 5f 52 45 47 49 4f 4e 01 44 65 66
    61 75 6c 74 52 65 67 69 6f 6e 02 55 4e 49 51 5f 4b 45 59 01 30 41 30 30 30 30 30 31 31 30 39 32
    32 41 39 46 31 42 36 44 34 39 36 45 44 34 30 30 30 30 30 37 02 43 4c 55 53 54 45 52 01 44 65 66
    61 75 6c 74 43 6c 75 73 74 65 72 02 54 41 47 53 01 54 61 67 41 02 4b 45 59 53 01 4f 72 64 65 72
    49 44 31 38 38 02 57 41 49 54 01 74 72 75 65 02 54 52 41 43 45 5f 4f 4e 01 74 72 75 65 02
"""))
UNIQ = "0A00000110922A9F1B6D496ED4000007"
BORN, STORE = Host.parse("192.168.0.10:54321"), Host.parse("192.168.0.100:10911")


def _config(**kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                max_hash_slot_num=64, max_index_num=256)
    base.update(kw)
    return StoreConfig(**base)


def _msg(topic="T", body=b"x", **kw) -> Message:
    return Message(topic=topic, body=body, born_timestamp=1, store_timestamp=2, **kw)


def _spec_message(props: dict) -> Message:
    return Message(topic="TopicTest", body=b"Hello RocketMQ", queue_id=3, properties=props,
                   born_timestamp=1700000000000, born_host=BORN,
                   store_timestamp=1700000000123, store_host=STORE)


def _at_offset_2048_with_queue_offset_42(root, cfg) -> None:
    """Two 1024-byte filler records, then a ConsumeQueue for TopicTest/3 holding 42 units,
    so the next TopicTest/3 message lands at 2048 with queue offset 42: it also proves the
    counters are restored from the CQ max offsets on open (spec §10.6)."""
    with MessageStore.open(root, cfg, create=True) as st:
        for _ in range(2):
            r = st.put(Message(topic="Filler", body=b"f" * 927, born_host=BORN, store_host=STORE))
            assert r.ok and r.size == 1024
    with ConsumeQueueWriter(root / "consumequeue" / "TopicTest" / "3", cfg.cq_file_size) as w:
        for i in range(42):
            assert w.put(i, i, 1, 0)


def test_spec_12_3_record_by_a_5x_store(tmp_path):
    cfg = _config(broker_version="5")
    root = tmp_path / "s"
    _at_offset_2048_with_queue_offset_42(root, cfg)
    props = {"MSG_REGION": "DefaultRegion", "UNIQ_KEY": UNIQ, "CLUSTER": "DefaultCluster",
             "TAGS": "TagA", "KEYS": "OrderID188", "WAIT": "true", "TRACE_ON": "true"}
    with MessageStore.open(root, cfg) as st:
        assert os.path.exists(root / "abort")
        assert (root / "abort").read_text() == str(os.getpid())  # 5.x: the PID (§8.2)
        r = st.put(_spec_message(props))
    assert (r.status, r.offset, r.size, r.queue_offset) == (PutStatus.PUT_OK, 2048, 254, 42)
    assert r.msg_id == "C0A8006400002A9F0000000000000800"  # spec §12.4
    data = (root / "commitlog" / "00000000000000000000").read_bytes()
    assert data[2048:2048 + 254] == SPEC_12_3
    cq = (root / "consumequeue" / "TopicTest" / "3" / "00000000000000000000").read_bytes()
    assert cq[840:860] == bytes.fromhex("0000000000000800000000FE000000000027A807")
    # 5 longs: confirmPhyOffset is what this open's recovery set, the start of the last
    # valid record then (the second filler, spec §8.1); appends do not move it (RocketMQ
    # 5.3.3's fixtures: a store written in one run keeps 0).
    assert struct.unpack(">5q", (root / "checkpoint").read_bytes()[:40])[4] == 1024
    assert not (root / "abort").exists()


def test_spec_12_3_record_by_a_49_store(tmp_path):
    cfg = _config()
    root = tmp_path / "s"
    _at_offset_2048_with_queue_offset_42(root, cfg)
    props = {"KEYS": "OrderID188", "UNIQ_KEY": UNIQ, "CLUSTER": "DefaultCluster", "TAGS": "TagA"}
    with MessageStore.open(root, cfg) as st:
        assert (root / "abort").read_bytes() == b""  # 4.9: empty
        r = st.put(_spec_message(props))
    assert (r.offset, r.size, r.queue_offset) == (2048, 204, 42)  # 0xCC, spec §12.3
    rec = (root / "commitlog" / "00000000000000000000").read_bytes()[2048:2048 + 204]
    assert rec[:0x70] == bytes([0, 0, 0, 0xCC]) + SPEC_12_3[4:0x70]
    assert rec[0x70:0x72] == (90).to_bytes(2, "big") and not rec.endswith(b"\x02")
    ck = (root / "checkpoint").read_bytes()
    assert len(ck) == 4096 and ck[24:] == bytes(4096 - 24)  # 3 longs only


def test_spec_12_7_minimal_v2_record(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, _config(broker_version="5"), create=True) as st:
        r = st.put(Message(topic="T", magic=L.MAGIC_V2, born_timestamp=1700000000000,
                           born_host=BORN, store_timestamp=1700000000123, store_host=STORE))
    assert r.ok and r.size == 93
    expected = (bytes.fromhex("0000005d daa320ab") + bytes(4 * 3 + 8 * 2 + 4)
                + SPEC_12_3[0x28:0x48] + bytes(4 + 8) + bytes(4) + b"\x00\x01T" + b"\x00\x00")
    assert (root / "commitlog" / "00000000000000000000").read_bytes()[:93] == expected


def test_long_topic_is_v2_on_5_and_illegal_on_49(tmp_path):
    long_topic = "%RETRY%" + "g" * 121  # 128 characters
    with MessageStore.open(tmp_path / "a", _config(broker_version="5"), create=True) as st:
        r = st.put(_msg(long_topic))
        assert r.ok
        assert CommitLog(st.config, queue=st._log_queue).read_at(0).magic == L.MAGIC_V2
    with MessageStore.open(tmp_path / "b", _config(), create=True) as st:
        assert st.put(_msg(long_topic)).status is PutStatus.MESSAGE_ILLEGAL
        assert st.put(_msg("t" * 127)).ok  # the 4.9.8 maximum
        assert st.put(_msg(topic="x", magic=L.MAGIC_V2)).status is PutStatus.MESSAGE_ILLEGAL


def test_limits_are_statuses_and_write_nothing(tmp_path):
    cfg = _config(max_message_size=1024)
    with MessageStore.open(tmp_path / "s", cfg, create=True) as st:
        assert st.put(_msg(body=b"b" * 1024)).ok
        end = st.appender.end
        big = st.put(_msg(body=b"b" * 1025))
        assert big.status is PutStatus.MESSAGE_ILLEGAL and big.offset == -1
        cjk = st.put(_msg(properties={"k": "订" * 11000}))  # 33000 bytes, 11000 chars
        assert cjk.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
        # 4.9 checks the Java length first: over 32767 chars is MESSAGE_ILLEGAL (§3.6.1).
        assert st.put(_msg(properties={"k": "a" * 33000})).status is PutStatus.MESSAGE_ILLEGAL
        assert st.put(_msg("t" * 128)).status is PutStatus.MESSAGE_ILLEGAL
        batch = st.put_batch([_msg(), _msg(body=b"b" * 2000)])
        assert [r.status for r in batch] == [PutStatus.MESSAGE_ILLEGAL] * 2
        assert st.appender.end == end
        assert st.queue_offsets[("T", 0)] == 1
    with MessageStore.open(tmp_path / "v5", _config(broker_version="5"), create=True) as st:
        r = st.put(_msg(properties={"k": "a" * 33000}))
        assert r.status is PutStatus.PROPERTIES_SIZE_EXCEEDED


def test_transaction_types_and_blank_roll(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, _config(), create=True) as st:
        assert st.put(_msg(queue_id=1)).queue_offset == 0
        prepared = st.put(_msg(queue_id=1, sys_flag=L.TRANSACTION_PREPARED))
        rollback = st.put(_msg(queue_id=1, sys_flag=L.TRANSACTION_ROLLBACK))
        assert prepared.queue_offset == rollback.queue_offset == 0
        assert st.put(_msg(queue_id=1, sys_flag=L.TRANSACTION_COMMIT)).queue_offset == 1
        # Fill the segment so that a 3-record batch no longer fits: the whole batch moves.
        left = 65536 - st.appender.end
        filler = st.put(_msg(body=b"z" * (left - 8 - 91 - 300)))
        assert filler.ok
        batch = st.put_batch([_msg(body=b"q" * 100) for _ in range(3)])
        assert [r.offset for r in batch] == [65536, 65536 + 192, 65536 + 384]
        assert [r.queue_offset for r in batch] == [1, 2, 3]
    seg0 = (root / "commitlog" / "00000000000000000000").read_bytes()
    blank_at = filler.offset + filler.size
    assert L.BLANK_STRUCT.unpack_from(seg0, blank_at) == (65536 - blank_at, L.MAGIC_BLANK)
    with open_consume_queue(root, "T", 1, 1280) as cq:
        assert [u.commit_log_offset for u in cq] == [0, 3 * 93]  # NOT_TYPE and COMMIT only
    assert sorted(p.name for p in (root / "commitlog").iterdir()) == [
        "00000000000000000000", "00000000000000065536"]  # preallocated 131072 dropped


def test_lock_abort_and_second_open_refused(tmp_path):
    root = tmp_path / "s"
    st = MessageStore.open(root, _config(), create=True)
    try:
        # (Not reading the lock file here: closing any descriptor of it would drop this
        # process's POSIX lock.)
        assert (root / "abort").exists()
        with pytest.raises(StoreLockedError):
            MessageStore.open(root, _config())
        code = ("import sys\nfrom rmqstore.engine.store import MessageStore\n"
                "from rmqstore.errors import StoreLockedError\n"
                "try:\n    MessageStore.open(sys.argv[1])\nexcept StoreLockedError as e:\n"
                "    print(e); sys.exit(3)\n")
        res = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True)
        assert res.returncode == 3 and "locked by another process" in res.stdout
        cli = subprocess.run([sys.executable, "-m", "rmqstore", "append", str(root), "--topic", "T",
                              "--body", "x"], capture_output=True, text=True)
        assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "locked" in cli.stderr
    finally:
        st.close()
    assert not (root / "abort").exists()
    assert (root / "lock").read_bytes() == b"lock"  # spec §8.3
    MessageStore.open(root).close()  # released


def test_missing_store_is_refused(tmp_path):
    with pytest.raises(NotAStoreError):
        MessageStore.open(tmp_path / "nope", _config())


def test_reopen_continues_and_catches_up_dispatch(tmp_path):
    root = tmp_path / "s"
    cfg = _config()
    with MessageStore.open(root, cfg, create=True, dispatch="off") as st:
        first = [st.put(_msg(body=b"a" * 5000, properties={"KEYS": f"k{i}"})) for i in range(20)]
    assert not (root / "consumequeue").exists()
    with MessageStore.open(root, cfg) as st:  # re-dispatches what the queues lack (§9)
        assert st.appender.end == first[-1].offset + first[-1].size
        nxt = st.put(_msg())
        assert nxt.queue_offset == 20 and nxt.offset == st.appender.end - nxt.size
        hits = st.dispatcher.index.query("T", "k7").phy_offsets
    with open_consume_queue(root, "T", 0, 1280) as cq:
        assert [u.commit_log_offset for u in cq] == [r.offset for r in first] + [nxt.offset]
    assert hits == [first[7].offset]


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "rmqstore", "append", *args], input=stdin,
                          capture_output=True, text=True)


GEO = ["--commitlog-size", "65536", "--cq-size", "1280", "--index-slots", "64", "--index-num", "256"]


def test_cli_exit_codes_and_bad_lines(tmp_path):
    root = tmp_path / "s"
    res = _cli(str(root), "--topic", "T", "--body", "x")
    assert res.returncode == 2 and "no such store" in res.stderr
    good = json.dumps({"topic": "T", "body": "hello", "properties": {"KEYS": "a"}})
    lines = "\n".join([good, '{"topic": "T", "queueId": "one"}', good]) + "\n"
    res = _cli(str(root), "--create", "--jsonl", "-", *GEO, stdin=lines)
    assert res.returncode == 2
    assert res.stderr.strip() == "rmqstore: <stdin>:2: queueId must be a whole number, got 'one'"
    assert len(res.stdout.splitlines()) == 1  # line 1 stays appended, line 3 never ran
    res = _cli(str(root), "--jsonl", "-", stdin="{not json\n")
    assert res.returncode == 2 and res.stderr.startswith("rmqstore: <stdin>:1: not valid JSON")
    big = json.dumps({"topic": "T", "body": "a" * (4 * 1024 * 1024 + 1)})
    res = _cli(str(root), "--jsonl", "-", stdin=good + "\n" + big + "\n")
    assert res.returncode == 1
    out = [json.loads(l) for l in res.stdout.splitlines()]
    assert [o["status"] for o in out] == ["PUT_OK", "MESSAGE_ILLEGAL"]
    assert out[0]["queueOffset"] == 1 and out[0]["offsetMsgId"].endswith(f"{out[0]['commitLogOffset']:016X}")


def test_cli_as_broker_delay_rewrite(tmp_path):
    root = tmp_path / "s"
    res = _cli(str(root), "--create", *GEO, "--as-broker", "--topic", "Orders", "--queue-id", "2",
               "--body", "x", "--tags", "T1", "-p", "DELAY=25")
    assert res.returncode == 0, res.stderr
    with MessageStore.open(root) as st:
        m = CommitLog(st.config, queue=st._log_queue).read_at(0)
    assert (m.topic, m.queue_id) == ("SCHEDULE_TOPIC_XXXX", 17)  # level clamped to 18
    assert m.properties["REAL_TOPIC"] == "Orders" and m.properties["REAL_QID"] == "2"
    assert m.properties["DELAY"] == "18" and m.properties["CLUSTER"] == "DefaultCluster"
    assert len(m.properties["UNIQ_KEY"]) == 32 and m.store_host == Host.parse("127.0.0.1:10911")
    with open_consume_queue(root, "SCHEDULE_TOPIC_XXXX", 17, 1280) as cq:
        unit = next(iter(cq))
    assert unit.tags_code == m.store_timestamp + 2 * 3600 * 1000  # level 18 = 2h (§6.1)


def test_put_after_close_raises_even_through_a_saved_reference(tmp_path):
    """The one-at-a-time put installed at open (a closure) still refuses a closed store,
    also when a caller kept ``put = st.put`` from before the close."""
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.errors import RecordError
    from rmqstore.engine.store import MessageStore

    st = MessageStore.open(tmp_path / "s", StoreConfig(mapped_file_size_commit_log=65536),
                           create=True)
    put = st.put
    assert put(Message(topic="T", body=b"x")).status.name == "PUT_OK"
    st.close()
    for p in (put, st.put):
        with pytest.raises(RecordError, match="closed"):
            p(Message(topic="T", body=b"y"))


@pytest.mark.parametrize("version", ["4.9", "5"])
def test_a_topic_whose_bytes_overflow_v1s_length_byte_is_refused(version, tmp_path):
    # 64 characters pick magic v1 (RocketMQ counts Java characters), but they are 128 UTF-8
    # bytes: v1's signed length byte would read back as -128, a record no reader can
    # decode (spec §3.1). Every put path refuses it and writes nothing.
    from rmqstore.engine.message_batch import MessageBatch

    cfg = _config(broker_version=version)
    wide, fits = "é" * 64, "é" * 63
    with MessageStore.open(tmp_path / "s", cfg, create=True) as st:
        for put in (lambda t: st.put(_msg(topic=t)),
                    lambda t: st.put_batch([_msg(topic=t), _msg(topic=t)])[0],
                    lambda t: st.put_columns(MessageBatch(topic=t, bodies=[b"x", b"y"]))[0]):
            r = put(wide)
            assert r.status == PutStatus.MESSAGE_ILLEGAL and "128 UTF-8 bytes" in r.reason
            assert st.max_offset == 0
        ok = st.put(_msg(topic=fits))
        assert ok.ok
    with open_store(tmp_path / "s") as s:
        assert s.read_at(ok.offset).topic == fits
