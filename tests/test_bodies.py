"""Bodies decoded by their SYSFLAG (spec §3.3), printed honestly, written to files safely;
crcOk; UNIQ_KEY taken apart (spec §5.2, §12.5). Golden data: the `special` fixture's four
compressed records (RocketMQ stored them as given; the stdlib's zlib is the oracle for
the plain text), the spec's test vector, and the UNIQ_KEYs a 5.3.3 broker made itself."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import zlib

import pytest

from conftest import FIXTURES, ROCKETMQ_498, manifest, scenario_params
from rmqstore import view as bodies
from rmqstore.format import compression
from rmqstore.engine.broker import _body
from rmqstore.format.message import Message
from rmqstore.reader import open_store
from rmqstore.uniqkey import uniq_key_info
from rmqstore.view import message_dict

COMPRESSED = {0x1: "zlib", 0x301: "zlib", 0x201: "zstd", 0x101: "lz4"}  # spec §3.3 table


def _compressed_records():
    return [e["stored"] for e in manifest("special")["messages"] if e["stored"]["sysFlag"] & 1]


@pytest.mark.parametrize("scenario", scenario_params(["special"]))
def test_every_compressed_fixture_body_decodes_to_the_same_text(scenario):
    recs = _compressed_records()
    assert sorted(r["sysFlag"] for r in recs) == sorted(COMPRESSED)
    legacy = next(r for r in recs if r["sysFlag"] == 0x1)
    plain = zlib.decompress(base64.b64decode(legacy["bodyBase64"]))  # the oracle
    with open_store(ROCKETMQ_498 / scenario) as store:
        for r in recs:
            msg = store.read_at(r["phyOffset"])
            d = message_dict(msg, "base64")
            assert d["bodyCompression"] == COMPRESSED[r["sysFlag"]]
            assert base64.b64decode(d["body"]) == plain, hex(r["sysFlag"])
            assert d["storedBody"] == r["bodyBase64"] and "bodyNote" not in d
            t = message_dict(msg, "text")
            assert (t["body"], t["bodyEncoding"]) == (plain.decode("utf-8"), "text")
            raw = message_dict(msg, "raw")  # the stored bytes, as BODYCRC covers them
            assert (raw["body"], raw["bodyEncoding"]) == (r["bodyBase64"], "base64")
            assert "storedBody" not in raw and raw["crcOk"] is True
        # the fast path (dump) says the same
        fast = {d["commitLogOffset"]: d for d in store.message_dicts("hex")}
        for r in recs:
            assert fast[r["phyOffset"]]["body"] == plain.hex()


def test_damaged_or_unknown_compression_is_a_note_never_an_exception():
    good = zlib.compress(b"hello world" * 100)
    for stored, flag, why in [(good[:20], 0x1, "does not decompress"),
                              (b"\x00garbage", 0x201, "does not decompress"),
                              (b"\x00garbage", 0x101, "does not decompress"),
                              (good, 0x401, "unknown compression type"),
                              (good, 0x701, "unknown compression type")]:
        f = bodies.body_fields(stored, flag, "base64")
        assert base64.b64decode(f["body"]) == stored
        assert why in f["bodyNote"] and "storedBody" not in f
    # no compressed flag: codec bits alone mean nothing (spec §3.3)
    assert bodies.body_fields(good, 0x300, "base64")["body"] == base64.b64encode(good).decode()
    assert "bodyCompression" not in bodies.body_fields(good, 0x300, "base64")


def test_decompression_bomb_is_capped(monkeypatch):
    monkeypatch.setattr(compression, "MAX_DECOMPRESSED", 1000)
    f = bodies.body_fields(zlib.compress(b"\0" * 5000), 0x1, "hex")
    assert "more than 1000 bytes" in f["bodyNote"] and f["body"] == zlib.compress(b"\0" * 5000).hex()


def test_missing_codec_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails as if not installed
    f = bodies.body_fields(b"\x28\xb5\x2f\xfd", 0x201, "base64")
    assert "install the 'zstandard' package" in f["bodyNote"]


def test_text_is_honest_and_charsets_round_trip():
    gbk = "订单已支付".encode("gbk")
    f = bodies.body_fields(gbk, 0, "text")  # not UTF-8: given as base64, labelled so
    assert (f["body"], f["bodyEncoding"]) == (base64.b64encode(gbk).decode(), "base64")
    f = bodies.body_fields(gbk, 0, "text", "gbk")
    assert (f["body"], f["bodyEncoding"], f["bodyCharset"]) == ("订单已支付", "text", "gbk")
    assert _body(f) == gbk  # append reads it back to the same bytes
    f = bodies.body_fields(b"\x01\x02", 0, "hex")
    assert (f["body"], f["bodyEncoding"]) == ("0102", "hex")
    assert bodies.body_fields(b"x", 0, "none") == {"body": None}
    # a decompressed body appends as the stored bytes (storedBody wins)
    stored = zlib.compress(b"payload")
    assert _body(bodies.body_fields(stored, 0x1, "text")) == stored


def test_body_dir_names_files_by_offset_msg_id_and_never_follows_links(tmp_path):
    sink = bodies.BodyDir(tmp_path / "bodies")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(victim, tmp_path / "bodies" / "0A00000800002A9F000000000000169A")
    path = sink("0a00000800002a9f000000000000169a", b"payload")
    assert path == str(tmp_path / "bodies" / "0A00000800002A9F000000000000169A")
    assert victim.read_bytes() == b"keep"  # the planted link was replaced, not followed
    assert (tmp_path / "bodies" / "0A00000800002A9F000000000000169A").read_bytes() == b"payload"
    assert sorted(p.name for p in (tmp_path / "bodies").iterdir()) == ["0A00000800002A9F000000000000169A"]
    from rmqstore.errors import InputError

    for bad in ("../etc/passwd", "", "A/B"):
        with pytest.raises(InputError):
            sink(bad, b"x")


@pytest.mark.parametrize("scenario", scenario_params(["special"]))
def test_body_dir_gets_decompressed_bodies(scenario, tmp_path):
    recs = _compressed_records()
    plain = zlib.decompress(base64.b64decode(recs[0]["bodyBase64"]))
    sink = bodies.BodyDir(tmp_path)
    with open_store(ROCKETMQ_498 / scenario) as store:
        for d in store.message_dicts("none", sink=sink, topic="TopicS"):
            assert open(d["bodyFile"], "rb").read() == (
                plain if d.get("bodyCompression") else base64.b64decode(
                    next(e["stored"]["bodyBase64"] for e in manifest("special")["messages"]
                         if e["stored"]["phyOffset"] == d["commitLogOffset"])))
    assert {p.name for p in tmp_path.iterdir()} >= {r["msgId"] for r in recs}


@pytest.mark.parametrize("scenario", scenario_params(["basic"]))
def test_crc_ok_flags_a_damaged_body_in_both_paths(scenario, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(ROCKETMQ_498 / scenario, root)
    victim = next(e["stored"] for e in manifest(scenario)["messages"]
                  if e["stored"]["bodyLength"] > 10 and e["stored"]["phyOffset"] < 65536)
    # spec §3.1: with IPv4 hosts the body starts 88 bytes into the record
    seg = root / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    data[victim["phyOffset"] + 88 + 3] ^= 0xFF
    seg.write_bytes(data)
    with open_store(root) as store:
        fast = list(store.message_dicts("none"))
        slow = [message_dict(m, "none") for m in store.messages()]
    assert fast == slow
    assert [d["commitLogOffset"] for d in fast if not d["crcOk"]] == [victim["phyOffset"]]


# --- UNIQ_KEY ---------------------------------------------------------------------------

def test_uniq_key_spec_vector():
    """Spec §12.5: 10.0.0.1, pid 4242, loader hash 0x2A9F1B6D, counter 7, made at
    1700000000000 in Asia/Shanghai."""
    info = uniq_key_info("0A00000110922A9F1B6D496ED4000007", 1_700_000_000_500, "Asia/Shanghai")
    assert info == {"ip": "10.0.0.1", "pid": 4242, "classLoaderHash": 0x2A9F1B6D,
                    "time": 1_700_000_000_000, "counter": 7}
    # stored a month boundary later (2023-12-01T00:00:05+08:00): still November's id
    assert uniq_key_info("0A00000110922A9F1B6D496ED4000007", 1_701_360_005_000,
                         "Asia/Shanghai")["time"] == 1_700_000_000_000
    # in UTC the same id reads 8 hours later (the zone is a guess the caller makes)
    assert uniq_key_info("0A00000110922A9F1B6D496ED4000007", 1_700_100_000_000,
                         "UTC")["time"] == 1_700_000_000_000 + 8 * 3600 * 1000
    for bad in (None, "", "XYZ", "0A000001", "G" * 32):
        assert uniq_key_info(bad, 1) is None


BROKER_MADE = FIXTURES / "rocketmq-5.3.3" / "basic"


def test_uniq_keys_a_broker_made_decode_to_its_store_times():
    """The 30 UNIQ_KEYs 5.3.3 made itself (the client sent none) were created just before the
    put, on an IPv6 host, in a UTC machine zone: decoded time within a second before the
    store time, one pid, counters 0, 1, 2, ... in put order."""
    if not BROKER_MADE.is_dir():
        pytest.skip(f"fixture not found: {BROKER_MADE}")
    m = json.loads((BROKER_MADE / "manifest.json").read_text())
    made = [e["stored"] for e in m["messages"] if e["request"].get("uniqKey") is None]
    assert len(made) == 30
    infos = []
    with open_store(BROKER_MADE) as store:
        for s in made:
            d = message_dict(store.read_at(s["phyOffset"]), "none", tz="UTC")
            assert d["uniqKey"] == s["uniqKey"]
            info = d["uniqKeyInfo"]
            assert s["storeTimestamp"] - 1000 <= info["time"] <= s["storeTimestamp"], s["uniqKey"]
            infos.append(info)
        fast = {d["commitLogOffset"]: d["uniqKeyInfo"] for d in store.message_dicts("none", tz="UTC")}
    assert [fast[s["phyOffset"]] for s in made] == infos
    assert {i["ip"] for i in infos} == {"fd00:0:0:0:0:0:0:2"} and len({i["pid"] for i in infos}) == 1
    assert [i["counter"] for i in infos] == list(range(30))


def test_message_without_uniq_key_has_null_info():
    assert message_dict(Message(topic="T"), "none")["uniqKeyInfo"] is None


def test_message_fields_list_every_key_in_order():
    from rmqstore.view import MESSAGE_FIELDS

    d = message_dict(Message(topic="T", body=zlib.compress(b"x"), sys_flag=1,
                             properties={"UNIQ_KEY": "0A00000110922A9F1B6D496ED4000007"}), "text")
    assert [k for k in MESSAGE_FIELDS if k in d] == list(d)
