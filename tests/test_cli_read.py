"""The read-side commands on RocketMQ's own stores, and on broken input: right answers,
documented exit codes, one line on stderr, no traceback, and no file changed."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import MESSAGE_SCENARIOS, ROCKETMQ_498, manifest, scenario_params, tree_hashes
from rmqstore.format.message import parse_properties, split_keys
from rmqstore.reader import open_store

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def jsonl(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("scenario", scenario_params(MESSAGE_SCENARIOS))
def test_dump_store_lists_every_message_in_physical_order(scenario):
    root = ROCKETMQ_498 / scenario
    before = tree_hashes(root)
    rows = jsonl(run("dump", root, "--format", "jsonl"))
    stored = sorted((e["stored"] for e in manifest(scenario)["messages"]), key=lambda s: s["phyOffset"])
    assert [r["commitLogOffset"] for r in rows] == [s["phyOffset"] for s in stored]
    for r, s in zip(rows, stored):
        # a decompressed body keeps the stored bytes beside it (storedBody)
        assert (r["topic"], r["queueId"], r["queueOffset"], r["storeSize"], r.get("storedBody", r["body"]),
                r["bodyEncoding"], r["offsetMsgId"], r["bornHost"], r["storeHost"]) == (
            s["topic"], s["queueId"], s["queueOffset"], s["storeSize"], s["bodyBase64"],
            "base64", s["msgId"], s["bornHost"], s["storeHost"])
        assert r["properties"] == parse_properties(s["propertiesString"])
        # the lossless extra appears exactly when the object cannot give the stored text back
        if "propertiesText" in r:
            assert r["propertiesText"] == s["propertiesString"]
    assert tree_hashes(root) == before


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_dump_filters(scenario):
    root = ROCKETMQ_498 / scenario
    stored = [e["stored"] for e in manifest(scenario)["messages"]]
    rows = jsonl(run("dump", root, "-f", "jsonl", "--topic", "TopicB", "--queue-id", "1", "--body", "none"))
    assert [r["commitLogOffset"] for r in rows] == sorted(
        s["phyOffset"] for s in stored if s["topic"] == "TopicB" and s["queueId"] == 1)
    assert all(r["body"] is None for r in rows)
    rows = jsonl(run("dump", root, "-f", "jsonl", "--from-offset", 65536, "--to-offset", 131072, "--limit", 5))
    assert len(rows) == 5 and all(65536 <= r["commitLogOffset"] < 131072 for r in rows)
    mid = sorted(s["storeTimestamp"] for s in stored)[250]
    rows = jsonl(run("dump", root, "-f", "jsonl", "--since", mid))
    assert len(rows) == sum(1 for s in stored if s["storeTimestamp"] >= mid)
    texts = jsonl(run("dump", root, "-f", "jsonl", "--body", "text"))
    for r, s in zip(texts, sorted(stored, key=lambda s: s["phyOffset"])):
        body = base64.b64decode(s["bodyBase64"])
        try:  # honest: text only when the body is UTF-8, else base64 and labelled so
            assert (r["body"], r["bodyEncoding"]) == (body.decode("utf-8"), "text")
        except UnicodeDecodeError:
            assert (r["body"], r["bodyEncoding"]) == (s["bodyBase64"], "base64")
    assert {r["bodyEncoding"] for r in texts} == {"text", "base64"}


@pytest.mark.parametrize("scenario", scenario_params(["basic", "special", "ipv6"]))
def test_get_every_way(scenario):
    root = ROCKETMQ_498 / scenario
    for e in manifest(scenario)["messages"][::7]:
        s = e["stored"]
        want = s["phyOffset"]
        assert jsonl(run("get", root, "--offset", want, "-f", "jsonl"))[0]["commitLogOffset"] == want
        assert jsonl(run("get", root, "--msg-id", s["msgId"], "-f", "jsonl"))[0]["commitLogOffset"] == want
        if s["sysFlag"] & 0xC in (0, 8):
            got = jsonl(run("get", root, "-t", s["topic"], "-q", s["queueId"], "--queue-offset",
                            s["queueOffset"], "-f", "jsonl"))
            assert got[0]["commitLogOffset"] == want
        if s["uniqKey"] and s["sysFlag"] & 0xC != 0xC:  # ROLLBACK records are not indexed
            got = jsonl(run("get", root, "-t", s["topic"], "--uniq-key", s["uniqKey"], "-f", "jsonl"))
            assert want in [g["commitLogOffset"] for g in got]


@pytest.mark.parametrize("scenario", scenario_params(MESSAGE_SCENARIOS))
def test_query_key_matches_rocketmq_after_the_key_check(scenario):
    root = ROCKETMQ_498 / scenario
    m = manifest(scenario)
    by_offset = {e["stored"]["phyOffset"]: e["stored"] for e in m["messages"]}
    store = open_store(root)
    for i, q in enumerate(m.get("queries") or m["queriesBeforeCrash"]):
        # RocketMQ's store returns hash hits; the admin client keeps records carrying the key
        want = sorted({o for o in q["phyOffsets"] if o in by_offset
                       and by_offset[o]["topic"] == q["topic"]
                       and (q["key"] in split_keys(by_offset[o]["keys"]) or by_offset[o]["uniqKey"] == q["key"])})
        assert [msg.commit_log_offset for msg in store.query_key(q["topic"], q["key"])] == want, q
        if i % 50 == 0 or not want:  # and through the command, for a sample
            result = run("query-key", root, "--topic", q["topic"], "--key", q["key"], "-f", "jsonl", "--body", "none")
            if not want:
                assert result.exit_code == 1
                continue
            assert [r["commitLogOffset"] for r in jsonl(result)] == want, q
    store.close()


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_dump_consume_queue_index_and_checkpoint(scenario):
    root = ROCKETMQ_498 / scenario
    m = manifest(scenario)
    for q in m["queues"]:
        qdir = root / "consumequeue" / q["topic"] / str(q["queueId"])
        if not qdir.is_dir():
            continue
        rows = jsonl(run("dump", qdir, "-f", "jsonl"))
        assert [[r["queueOffset"], r["commitLogOffset"], r["size"], r["tagsCode"]] for r in rows] == q["cqEntries"]
    cp = json.loads(run("dump", root / "checkpoint", "-f", "json").stdout)
    assert (cp["physicMsgTimestamp"], cp["logicsMsgTimestamp"], cp["indexMsgTimestamp"]) == (
        m["checkpoint"]["physicMsgTimestamp"], m["checkpoint"]["logicsMsgTimestamp"],
        m["checkpoint"]["indexMsgTimestamp"])
    first_index = sorted((root / "index").iterdir())[0]
    info = json.loads(run("dump", first_index, "-f", "json").stdout)
    assert info["header"]["indexCount"] - 1 == len(info["entries"]) > 0


@pytest.mark.parametrize("scenario", scenario_params(["basic", "special"]))
def test_stats_counts(scenario):
    root = ROCKETMQ_498 / scenario
    m = manifest(scenario)
    s = json.loads(run("stats", root, "-f", "json").stdout)
    assert s["commitLog"]["messages"] == m["messageCount"] and s["commitLog"]["maxOffset"] == m["maxPhyOffset"]
    for q in m["queues"]:
        row = next((r for r in s["queues"] if (r["topic"], r["queueId"]) == (q["topic"], q["queueId"])), None)
        if not q["cqEntries"]:
            continue
        in_log = [e["stored"] for e in m["messages"]
                  if (e["stored"]["topic"], e["stored"]["queueId"]) == (q["topic"], q["queueId"])]
        assert row["messages"] == len(in_log)  # PREPARED/ROLLBACK records count too
        assert row["bytes"] == sum(x["storeSize"] for x in in_log)
        assert (row["minQueueOffset"], row["maxQueueOffset"] + 1) == (q["minOffset"], q["maxOffset"])
        assert (row["cqMinOffset"], row["cqMaxOffset"]) == (q["minOffset"], q["maxOffset"])


# --- bad input -------------------------------------------------------------------------


@pytest.fixture
def broken(tmp_path, fixtures_root):
    """A private copy of `basic` to damage."""
    dst = tmp_path / "store"
    shutil.copytree(fixtures_root / "basic", dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _cli(*args):
    """The real command in a subprocess: exit code, stdout, stderr."""
    p = subprocess.run([sys.executable, "-m", "rmqstore", *map(str, args)], capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def _one_clean_line(stderr: str):
    assert "Traceback" not in stderr
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rmqstore: "), stderr


def test_missing_path_and_not_a_store(tmp_path):
    code, _, err = _cli("dump", tmp_path / "nope")
    assert code == 2 and "no such file" in err
    _one_clean_line(err)
    (tmp_path / "empty").mkdir()
    code, _, err = _cli("stats", tmp_path / "empty")
    assert code == 2 and "not a RocketMQ store" in err
    _one_clean_line(err)


def test_bad_offset_and_ids(broken):
    before = tree_hashes(broken)
    code, _, err = _cli("get", broken, "--offset", 5)
    assert code == 2 and "@ offset 5" in err and "bad magic" in err
    _one_clean_line(err)
    code, _, err = _cli("get", broken, "--msg-id", "ZZ")
    assert code == 2
    _one_clean_line(err)
    code, _, err = _cli("get", broken, "--offset", 10**12)
    assert code == 2 and "outside" in err
    code, _, err = _cli("get", broken)
    assert code == 2
    assert tree_hashes(broken) == before


def test_truncated_segment_and_garbage(broken):
    seg = broken / "commitlog" / "00000000000000131072"
    with open(seg, "r+b") as f:
        f.truncate(30000)  # a truncated segment: wrong size, data cut mid-record
    garbage = broken / "commitlog" / "00000000000000262144"
    data = bytearray(garbage.read_bytes())
    data[0:8] = b"\xde\xad\xbe\xef\xde\xad\xbe\xef"  # garbage magic at a segment start
    garbage.write_bytes(bytes(data))
    (broken / "commitlog" / "notes.txt").write_text("stray")
    before = tree_hashes(broken)
    code, out, err = _cli("dump", broken, "-f", "jsonl", "--body", "none")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and max(r["commitLogOffset"] for r in rows) < 131072 + 30000
    # the data ends in damage: everything readable is printed, one warning line, exit 1
    assert code == 1 and "dump stopped early at" in err and "00000000000000131072 @ offset" in err
    _one_clean_line(err)
    s = json.loads(run("stats", broken, "-f", "json").stdout)
    codes = {p["code"] for p in s["commitLog"]["problems"]}
    assert {"wrong-size", "stray-file"} <= codes
    assert s["commitLog"]["maxOffset"] < 131072 + 30000
    code, _, err = _cli("get", broken, "--offset", 262144)
    assert code == 2 and "bad magic" in err
    _one_clean_line(err)
    assert tree_hashes(broken) == before


def test_wrong_geometry_from_config(broken, tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog = lots\n")
    code, _, err = _cli("stats", broken, "--config", conf)
    assert code == 2 and "mappedFileSizeCommitLog" in err
    _one_clean_line(err)
    conf.write_text("flushDiskType=SOMETIMES\n")
    code, _, err = _cli("stats", broken, "--config", conf)
    assert code == 2 and "flushDiskType" in err


def test_help_and_version():
    assert run("--version").stdout.startswith("rmqstore ")
    for cmd in ("dump", "get", "query-key", "stats"):
        out = run(cmd, "--help")
        assert out.exit_code == 0 and "Usage" in out.stdout
