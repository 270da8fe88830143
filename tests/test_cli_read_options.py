"""The read commands' new options, through the real command (subprocess: exit codes and
stderr as a user sees them). Golden data from the fixtures' manifests."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import select
import subprocess
import sys
import zlib

import pytest

from conftest import ROCKETMQ_498, manifest, scenario_params
from rmqstore.format.message import Host, Message
from rmqstore.files.config import StoreConfig
from rmqstore.engine.store import MessageStore


def _cli(*args, env=None, timeout=120):
    p = subprocess.run([sys.executable, "-m", "rmqstore", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rmqstore: ") and "Traceback" not in err, err
    return lines[0]


def _stored(scenario):
    return sorted((e["stored"] for e in manifest(scenario)["messages"]), key=lambda s: s["phyOffset"])


@pytest.mark.parametrize("scenario", scenario_params(["crash"]))
def test_dump_end_of_data_exit_codes(scenario):
    code, out, err = _cli("dump", ROCKETMQ_498 / "crash", "-f", "jsonl", "--body", "none")
    assert (code, err) == (0, "") and len(_rows(out)) == 400  # zeros after the data: a clean end
    code, out, err = _cli("dump", ROCKETMQ_498 / "crash-torn", "-f", "jsonl", "--body", "none")
    assert code == 1 and len(_rows(out)) == 399
    line = _one_line(err)
    assert "00000000000000458752 @ offset 464829" in line and "torn record" in line


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_dump_several_stores_filters_and_times(scenario, tmp_path):
    stored = _stored(scenario)
    a, b = ROCKETMQ_498 / "basic", ROCKETMQ_498 / "sync-flush"
    code, out, _ = _cli("dump", a, b, "-f", "jsonl", "--body", "none", "--key", "dup-key", "--topic", "TopicB")
    rows = _rows(out)
    want = [s["phyOffset"] for s in stored if s["topic"] == "TopicB" and "dup-key" in (s["keys"] or "").split(" ")]
    assert code == 0 and [r["commitLogOffset"] for r in rows] == want * 2
    assert [r["store"] for r in rows] == [str(a)] * len(want) + [str(b)] * len(want)
    # --limit counts over all paths
    code, out, _ = _cli("dump", a, b, "-f", "jsonl", "--body", "none", "--limit", 502)
    assert [r["store"] for r in _rows(out)] == [str(a)] * 500 + [str(b)] * 2
    # epoch seconds are seconds; mqadmin's format keeps its milliseconds
    mid = stored[250]["storeTimestamp"]
    secs = mid // 1000
    expect = [s["phyOffset"] for s in stored if s["storeTimestamp"] >= secs * 1000]
    code, out, _ = _cli("dump", a, "-f", "jsonl", "--body", "none", "--since", secs)
    assert [r["commitLogOffset"] for r in _rows(out)] == expect
    shanghai = dt.datetime.fromtimestamp(mid / 1000, dt.timezone(dt.timedelta(hours=8)))
    text = shanghai.strftime("%Y-%m-%d#%H:%M:%S:") + f"{mid % 1000:03d}"
    code, out, _ = _cli("dump", a, "-f", "jsonl", "--body", "none", "--since", text, "--tz", "Asia/Shanghai")
    assert [r["commitLogOffset"] for r in _rows(out)] == [s["phyOffset"] for s in stored if s["storeTimestamp"] >= mid]
    code, out, _ = _cli("dump", a, "-f", "jsonl", "--body", "none", "--since", text,
                        env={"RMQSTORE_TZ": "Asia/Shanghai"})
    assert [r["commitLogOffset"] for r in _rows(out)] == [s["phyOffset"] for s in stored if s["storeTimestamp"] >= mid]
    # ambiguous times and unknown zones are usage errors, one line
    for args in (("--since", "12345"), ("--until", "noon"), ("--tz", "Mars/Base")):
        code, _, err = _cli("dump", a, *args)
        assert code == 2
        _one_line(err)


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_display_zone(scenario):
    s = _stored(scenario)[0]
    code, out, _ = _cli("get", ROCKETMQ_498 / scenario, "--offset", s["phyOffset"], "-f", "table",
                        "--tz", "+08:00", env={"COLUMNS": "200"})
    local = dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=s["storeTimestamp"] + 8 * 3600 * 1000)
    assert code == 0 and local.strftime("%Y-%m-%dT%H:%M:%S.") + f"{s['storeTimestamp'] % 1000:03d}+08:00" in out


@pytest.mark.parametrize("scenario", scenario_params(["special"]))
def test_bodies_on_the_command_line(scenario, tmp_path):
    root = ROCKETMQ_498 / scenario
    comp = [s for s in _stored(scenario) if s["sysFlag"] & 1]
    plain = zlib.decompress(base64.b64decode(comp[0]["bodyBase64"]))
    code, out, _ = _cli("dump", root, "-f", "jsonl", "--tag", "compressed", "--body", "text")
    rows = _rows(out)
    assert code == 0 and [r["commitLogOffset"] for r in rows] == [s["phyOffset"] for s in comp]
    assert all(r["body"] == plain.decode() and r["bodyEncoding"] == "text" for r in rows)
    assert [r["bodyCompression"] for r in rows] == ["zlib", "zlib", "zstd", "lz4"]
    code, out, _ = _cli("get", root, "--msg-id", comp[2]["msgId"], "-f", "jsonl", "--body", "raw")
    assert _rows(out)[0]["body"] == comp[2]["bodyBase64"]
    code, out, _ = _cli("dump", root, "-f", "jsonl", "--tag", "compressed", "--body-dir", tmp_path / "b")
    rows = _rows(out)
    assert all(r["body"] is None for r in rows)  # --body-dir: bodies go to files by default
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(s["msgId"] for s in comp)
    assert all((tmp_path / "b" / s["msgId"]).read_bytes() == plain for s in comp)
    code, _, err = _cli("dump", root, "--charset", "klingon")
    assert code == 2 and "unknown charset" in _one_line(err)


def test_query_key_every_hit_cap_and_messages(tmp_path):
    root = tmp_path / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                      max_hash_slot_num=64, max_index_num=64)
    offsets = []
    with MessageStore.open(root, cfg, create=True) as s:
        for i in range(80):
            r = s.put(Message(topic="TopicQ", body=b"y" * 300, properties={"KEYS": "hot"},
                              store_timestamp=1_718_000_000_000 + i, born_host=Host(b"\x0a\0\0\x01", 1)))
            offsets.append(r.offset)
    conf = tmp_path / "broker.conf"
    conf.write_text("maxHashSlotNum=64\nmaxIndexNum=64\n")
    base = ("query-key", root, "-t", "TopicQ", "-k", "hot", "-f", "jsonl", "--body", "none", "-c", conf)
    code, out, err = _cli(*base, "--max-num", 1000)  # issue #12: this printed 64
    assert (code, err) == (0, "") and [r["commitLogOffset"] for r in _rows(out)] == offsets
    code, out, err = _cli(*base, "--broker-cap")
    assert code == 0 and [r["commitLogOffset"] for r in _rows(out)] == offsets[-64:]
    assert "maxMsgsNumBatch=64" in _one_line(err)
    code, out, err = _cli(*base, "--max-num", 3)
    assert [r["commitLogOffset"] for r in _rows(out)] == offsets[-3:] and "--max-num 3" in _one_line(err)
    code, out, err = _cli("query-key", root, "-t", "TopicQ", "-k", "cold", "-c", conf)
    assert (code, out) == (1, "") and _one_line(err) == "rmqstore: no message matches"


def _writable_store(root, n):
    cfg = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
                      max_hash_slot_num=64, max_index_num=256)
    with MessageStore.open(root, cfg, create=True) as s:
        for i in range(n):
            r = s.put(Message(topic="TopicF", body=b"%04d" % i, properties={"KEYS": f"k{i}"}), stamp=True)
    return cfg, r.offset + r.size


def test_dump_follow_streams_rows_as_they_are_written(tmp_path):
    root = tmp_path / "store"
    cfg, end = _writable_store(root, 3)
    conf = tmp_path / "broker.conf"
    conf.write_text("maxHashSlotNum=64\nmaxIndexNum=256\n")
    p = subprocess.Popen([sys.executable, "-m", "rmqstore", "dump", str(root), "--follow", "-f", "jsonl",
                          "--limit", "3", "--from-offset", str(end), "--body", "text", "-c", str(conf)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        got = []
        with MessageStore.open(root, cfg) as s:
            for i in range(3, 6):
                s.put(Message(topic="TopicF", body=b"%04d" % i, properties={"KEYS": f"k{i}"}), stamp=True)
                # each row arrives while the follower still runs: rows are flushed one by one
                ready, _, _ = select.select([p.stdout], [], [], 120)
                assert ready, "no row from the follower"
                got.append(json.loads(p.stdout.readline())["body"])
                assert p.poll() is None or i == 5
        assert got == ["0003", "0004", "0005"]
        assert p.wait(60) == 0  # --limit reached
    finally:
        p.kill()
        p.wait()
    # with --from-offset it starts with what is there
    code, out, err = _cli("dump", root, "--follow", "-f", "jsonl", "--limit", 6, "--from-offset", 0,
                          "--body", "text", "-c", conf)
    assert code == 0 and [r["body"] for r in _rows(out)] == ["%04d" % i for i in range(6)]
    code, _, err = _cli("dump", root, root, "--follow")
    assert code == 2 and "exactly one store" in _one_line(err)


def test_a_body_failing_its_crc_is_flagged_in_every_format(tmp_path):
    """JSON carries crcOk false; a table, which has no crcOk column, marks the body cell."""
    store = tmp_path / "s"
    _writable_store(store, 3)
    seg = store / "commitlog" / "00000000000000000000"
    with open(seg, "r+b") as f:
        data = bytearray(f.read(4096))
        at = data.index(b"0001")  # second message's body "0001"
        f.seek(at)
        f.write(b"X")
    code, out, err = _cli("dump", store, "-f", "jsonl", "--body", "text")
    rows = _rows(out)
    assert code == 1 and [r["crcOk"] for r in rows] == [True, False, True]
    assert "crcOk false" in _one_line(err)
    code, out, _ = _cli("dump", store, "-f", "table", "--body", "text")
    flagged = [line for line in out.splitlines() if "(body fails its CRC)" in line]
    assert code == 1 and len(flagged) == 1 and "X001" in flagged[0]
