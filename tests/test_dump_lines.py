"""`rmqstore dump --format jsonl` rendered a block at a time (rmqstore/view_lines, its
numba kernel rmqstore/view_lines_jit) prints exactly what the per-record path printed:
``cli.terminal.json_safe(cli.formats.encode_json(d))`` of each message dict the scan gives
(``MessageScan.dicts``), the output layer's own encoding. Checked on every fixture store
RocketMQ wrote (4.9.8, DLedger, 5.3.3, 5.3.3 DLedger, a loose 4.x segment) in every body
mode, on a generated store of hostile records (bytes that are not UTF-8, controls, quotes,
backslashes, DEL, C1, U+2028, non-ASCII topics and keys, empty bodies, lossy and odd
properties texts, compressed bodies, IPv6 hosts), on Hypothesis-made records, and through
the CLI itself. A deliberately wrong kernel makes these comparisons fail.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from cli.formats import encode_json
from cli.main import app
from cli.streams import write_jsonl
from cli.terminal import json_safe
from conftest import FIXTURES, REPO
from rmqstore import uniqkey, view_lines
from rmqstore.format import layout as L
from rmqstore.format.message import Host, Message, client_msg_id
from rmqstore.format.record import encode_record
from rmqstore.json_lines import JsonLines, json_text
from rmqstore.reader import open_segment_file, open_store
from rmqstore.scan.records import columns, walk_chain
from rmqstore.selection import MessageFilter

MODES = ("base64", "text", "hex", "none", "raw")
STORES = sorted(p for group in ("rocketmq-4.9.8", "rocketmq-4.9.8-dledger", "rocketmq-5.3.3",
                                "rocketmq-5.3.3-dledger")
                for p in (FIXTURES / group).glob("*") if p.is_dir())
SEGMENT = FIXTURES / "rocketmq-4.x-segment" / "00000000000000000000"


@pytest.fixture
def kernel_always(monkeypatch):
    """The kernel for every block, however small (the fixtures are small stores)."""
    monkeypatch.delenv("RMQSTORE_NO_JIT", raising=False)
    assert view_lines.kernel_ready(), "numba is a dependency: the kernel must load here"
    monkeypatch.setattr(view_lines, "MIN_KERNEL", 0)
    before = view_lines.used["kernel"]
    yield lambda: view_lines.used["kernel"] - before


def cli_text(dicts) -> str:
    """What the output layer writes for these message dicts in -f jsonl (the reference)."""
    out: list[str] = []
    write_jsonl(dicts, out.append, threading.Lock())
    return "".join(out)


def blocks_text(blocks) -> str:
    blocks = list(blocks)
    assert all(isinstance(b, JsonLines) and b.data.count(b"\n") == b.count for b in blocks)
    return b"".join(b.data for b in blocks).decode("utf-8")


def _open(path: Path):
    return open_segment_file(path) if path.is_file() else open_store(path)


def both(path: Path, mode: str = "base64", *, charset: str = "utf-8", tz=None, extra=None,
         **filters):
    """(reference text, block text) of one store, and the two scans' ends."""
    with _open(path) as r:
        ref = r.scan(MessageFilter.make(**filters))
        dicts = ref.dicts(mode, charset=charset, tz=tz)
        want = cli_text({**d, **extra} if extra else d for d in dicts)
    with _open(path) as r:
        new = r.scan(MessageFilter.make(**filters))
        got = blocks_text(new.json_lines(mode, charset=charset, tz=tz, extra=extra))
    assert (new.given, new.stop, new.bad_crc) == (ref.given, ref.stop, ref.bad_crc)
    return want, got


# --- the encoder -----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(st.characters(), max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(st.characters(), max_size=6), inner, max_size=4),
    max_leaves=12)


@given(json_values)
@settings(max_examples=400, deadline=None)
def test_the_library_encodes_json_as_the_output_layer_does(value):
    assert json_text(value) == json_safe(encode_json(value))


def test_uniq_key_times_use_one_slack():
    assert view_lines.SLACK_MS is uniqkey.SLACK_MS


# --- RocketMQ's own stores -------------------------------------------------------------

@pytest.mark.skipif(not STORES, reason=f"RocketMQ-written fixtures not found at {FIXTURES}")
@pytest.mark.parametrize("path", STORES + [SEGMENT], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_store_prints_the_same_lines(path, kernel_always):
    if not path.exists():
        pytest.skip(f"{path} not found")
    for mode in MODES:
        want, got = both(path, mode)
        assert got == want, mode
    assert kernel_always() > 0


@pytest.mark.skipif(not (FIXTURES / "rocketmq-5.3.3" / "batch-cq").is_dir(),
                    reason="5.3.3 fixtures not found")
@pytest.mark.parametrize("limit", [1, 2, 5, 7, 40])
def test_limits_cut_where_the_rows_did(limit, kernel_always):
    """Inner batches give several rows a record: a limit can end inside one."""
    path = FIXTURES / "rocketmq-5.3.3" / "batch-cq"
    want, got = both(path, limit=limit, extra={"store": str(path)})
    assert got == want and got.count("\n") <= limit


# --- hostile records ---------------------------------------------------------------------

V4 = [Host(bytes([10, 0, 0, 1]), 10911), Host(bytes([192, 168, 1, 200]), 50000)]
V6 = [Host(bytes(range(16)), 10911), Host(b"\x20\x01\x0d\xb8" + bytes(12), 1)]
MARK = "@@BAD@@"  # replaced by bytes that are not UTF-8 once the records are encoded
NOT_UTF8 = [b"\xff\xfe\xfd\xfc\xfb\xfa\xf9", b"\xc0\xaf\xe0\x80\xaf\xed\xa0",
            b"a\xe2\x82b\xf4\x90\x80", b"\xf0\x9f\x98\x80\xc3(\x80"]
ODD_TEXT = ["q\"uote", "back\\slash", "nl\nline\ttab\r", "\x00\x01nul", "del\x7f",
            "c1\x80\x85\x9f", "ls\u2028ps\u2029", "é订单😀", "/*</script>*/", "\ufeffbom", ""]


def hostile_messages() -> list[Message]:
    uniq = client_msg_id(bytes([10, 1, 2, 3]), 4321, 0xFFFFFFFB, 86_400_000 * 3 + 7, 65535)
    uniq6 = client_msg_id(bytes(range(16)), 1, 2**31 - 1, 0, 0)
    texts = [
        "", "A\x01b", "A\x01b\x02", "A\x01x\x02A\x01y", "\x01x\x02B\x01y", "A\x01\x02B\x01y",
        "A\x02\x02B\x01y", "A\x01b\x01c", "KEYS\x01  a  b   c  \x02TAGS\x01t",
        "KEYS\x01   ", f"UNIQ_KEY\x01{uniq}\x02KEYS\x01k1 k2", f"UNIQ_KEY\x01{uniq.lower()}",
        f"UNIQ_KEY\x01{uniq6}", f"UNIQ_KEY\x01{uniq[:-1]}", f"UNIQ_KEY\x01{uniq[:-1]}G",
        "TAGS\x01" + "\x02".join(f"n{i}\x01v{i}" for i in range(70)),
        "KEYS\x01" + " ".join(f"k{i}" for i in range(600)),
        "TAGS\x01q\"t\\\x02KEYS\x01é 😀 \"x\"\x02\u2028\x01\x85",
        f"TAGS\x01{MARK}", f"KEYS\x01a {MARK} b", f"{MARK}\x01v", f"n\x01v{MARK}",
    ] + [f"TAGS\x01{t}x\x02KEYS\x01{t}y z{t}\x02P{t}\x01{t}v" for t in ODD_TEXT]
    bodies = [b"", b"plain", bytes(range(256)), "text é😀\u2028\x7f\x85\"\\\n".encode(),
              b"\xff\xfe", b"ab", b"abc", b"abcd", MARK.encode()]
    topics = ["T", "订单-é😀", "t" * 130, f"t{MARK}", "q\"\\\x7f\x85"]
    out = []
    for i, text in enumerate(texts):
        for j in range(3):
            k = i * 3 + j
            out.append(Message(
                topic=topics[k % len(topics)], body=bodies[k % len(bodies)],
                properties_text=text, queue_id=k % 5, flag=[0, -1, 2**31 - 1, -2**31][k % 4],
                sys_flag=[0, L.SYSFLAG_MULTI_TAGS, L.TRANSACTION_PREPARED][k % 3],
                born_timestamp=[0, -1, 1_700_000_000_000, 2**62][k % 4],
                store_timestamp=[1_700_000_000_000 + k, 259_200_000 + k, 0, -86_400_000][k % 4],
                born_host=(V4 + V6)[k % 4], store_host=(V4 + V6)[(k // 4) % 4],
                reconsume_times=k % 17, prepared_transaction_offset=[0, 2**40][k % 2],
                queue_offset=k))
    out.append(Message(topic="Z", body=zlib.compress(b"z" * 100), sys_flag=L.SYSFLAG_COMPRESSED,
                       properties_text="TAGS\x01z"))
    return out


def hostile_segment(msgs: list[Message], size: int = 1 << 20) -> bytearray:
    seg = bytearray(size)
    pos = 0
    for m in msgs:
        m.commit_log_offset = pos
        rec = encode_record(m)
        seg[pos:pos + len(rec)] = rec
        pos += len(rec)
    bad = 0
    at = seg.find(MARK.encode())
    while at >= 0:  # same length: the record's lengths still add up
        seg[at:at + len(MARK)] = NOT_UTF8[bad % len(NOT_UTF8)]
        bad += 1
        at = seg.find(MARK.encode(), at)
    assert bad >= 8
    return seg


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "store"
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / "00000000000000000000").write_bytes(hostile_segment(hostile_messages()))
    return root


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tz", [None, "Asia/Kathmandu", "-03:30"])
def test_hostile_records_print_the_same_lines(hostile_store, mode, tz, kernel_always):
    before = view_lines.used["fallback"]
    want, got = both(hostile_store, mode, tz=tz)
    assert got == want
    assert kernel_always() > 0 and view_lines.used["fallback"] > before  # both paths ran


def test_other_charsets_and_extra_members(hostile_store, kernel_always):
    for charset in ("latin-1", "gbk"):
        want, got = both(hostile_store, "text", charset=charset)
        assert got == want
    want, got = both(hostile_store, extra={"store": "/data/é\udcff"})
    assert got == want


def test_a_wrong_kernel_is_caught(hostile_store, kernel_always, monkeypatch):
    """The comparisons above fail when the kernel writes one byte wrong."""
    K = view_lines._load()
    real = K.render

    class Wrong:
        def __getattr__(self, name):
            return getattr(K, name)

        @staticmethod
        def render(out, *args):
            n = real(out, *args)
            out[n // 2] ^= 0x01
            return n

    monkeypatch.setattr(view_lines, "_kernel", Wrong())
    want, got = both(hostile_store)
    assert got != want


def test_a_short_buffer_leaves_records_to_the_per_record_path(hostile_store, kernel_always,
                                                               monkeypatch):
    """The kernel never writes past its buffer: records that might not fit take the
    per-record path, and the lines stay the same."""
    real = view_lines._Tables.buffer
    monkeypatch.setattr(view_lines._Tables, "buffer", lambda self, size: real(self, 4096)[:4096])
    before = view_lines.used["fallback"]
    want, got = both(hostile_store, "text")
    assert got == want and view_lines.used["fallback"] - before > 50


# --- generated records (Hypothesis) ------------------------------------------------------

ALPHABET = st.sampled_from(list("aK \x01\x02\"\\\n\t\x00\x1f\x7f\x80\x9f\xa0é订😀\u2028\u2029")
                           + ["TAGS", "KEYS", "UNIQ_KEY", "0A0B0C0D", "ffff"])
prop_texts = st.lists(ALPHABET, max_size=30).map("".join)
patches = st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=3)), max_size=3)


@st.composite
def records(draw):
    uniq = client_msg_id(draw(st.sampled_from([bytes(4), bytes([127, 0, 0, 1]), bytes(range(16))])),
                         draw(st.integers(0, 65535)), draw(st.integers(0, 2**32 - 1)),
                         draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 65535)))
    text = draw(prop_texts)
    if draw(st.booleans()):
        text = f"UNIQ_KEY\x01{uniq}\x02" + text
    return Message(
        topic=draw(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)),
        body=draw(st.binary(max_size=40) | st.text(max_size=20).map(
            lambda t: t.encode("utf-8", "surrogatepass"))),
        properties_text=text, flag=draw(st.integers(-2**31, 2**31 - 1)),
        sys_flag=draw(st.sampled_from([0, L.SYSFLAG_COMPRESSED, L.SYSFLAG_MULTI_TAGS])),
        born_timestamp=draw(st.integers(-2**63, 2**63 - 1)),
        store_timestamp=draw(st.integers(-2**40, 2**45)),
        born_host=draw(st.sampled_from(V4 + V6)), store_host=draw(st.sampled_from(V4 + V6)),
        queue_offset=draw(st.integers(0, 2**63 - 1)), reconsume_times=draw(st.integers(0, 99)))


@pytest.mark.usefixtures("kernel_always")
@given(st.lists(records(), min_size=1, max_size=6), patches, st.sampled_from(MODES),
       st.sampled_from([None, "Asia/Shanghai", "+05:45"]))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_generated_records_print_the_same_lines(msgs, patch, mode, tz):
    seg = bytearray()
    for m in msgs:
        m.commit_log_offset = len(seg)
        seg += encode_record(m)
    for at, raw in patch:  # raw bytes over the first record's variable part and on
        at = L.RECORD_FIXED_SIZE[False, False] + at % len(seg)
        seg[at:at + len(raw)] = raw[:max(len(seg) - at, 0)]
    u8 = np.frombuffer(bytes(seg), np.uint8)
    starts, _, _ = walk_chain(u8, 0, len(u8))
    cols = columns(u8, starts)
    whole = np.flatnonzero((cols.topic_len >= 0) & (cols.props_pos + cols.props_len == cols.pos + cols.size))
    lines = lambda jit: "".join(b.data.decode("utf-8") for b in view_lines.message_lines(
        cols, whole, mode, tz=tz, jit_=jit))
    assert lines(True) == lines(False)


# --- the command ---------------------------------------------------------------------------

def test_the_command_prints_the_same_lines(hostile_store, kernel_always):
    runner = CliRunner()
    with open_store(hostile_store) as r:
        want = cli_text(r.scan().dicts("base64"))
    res = runner.invoke(app, ["dump", str(hostile_store), "-f", "jsonl"])
    assert res.exit_code in (0, 1), res.output
    assert res.stdout_bytes.decode("utf-8") == want
    # Two stores: every object ends with its store; a limit counts over both.
    res = runner.invoke(app, ["dump", str(hostile_store), str(hostile_store), "-f", "jsonl",
                              "-n", "130", "--body", "text"])
    with open_store(hostile_store) as r:
        first = cli_text({**d, "store": str(hostile_store)} for d in r.scan().dicts("text"))
    lines = first.splitlines(keepends=True)
    assert len(lines) < 130 and res.stdout_bytes.decode("utf-8") == "".join((lines + lines)[:130])


@pytest.mark.skipif(not STORES, reason=f"RocketMQ-written fixtures not found at {FIXTURES}")
def test_the_command_in_a_process_of_its_own():
    """Real stdout (a pipe): lines go to the binary stream, the same bytes."""
    path = FIXTURES / "rocketmq-4.9.8" / "unicode"
    with open_store(path) as r:
        want = cli_text(r.scan().dicts("base64")).encode("utf-8")
    out = subprocess.run([sys.executable, "-m", "cli.main", "dump", str(path), "-f", "jsonl"],
                         capture_output=True, cwd=REPO, timeout=120)
    assert out.returncode in (0, 1), out.stderr[-500:]
    assert out.stdout == want


# --- a head read ----------------------------------------------------------------------------

def test_a_head_read_renders_only_what_it_prints(tmp_path, monkeypatch, walk_spans):
    """dump -n 5 on a 64 MiB segment: the lines path walks about what the 5 records take
    and renders 5 lines (the per-record path: no compiled kernel is loaded for them)."""
    from rmqstore.bench_data import make_store

    g = make_store(tmp_path / "s", 8 << 20, segment_size=64 << 20, queues_and_index=False)
    asked = walk_spans
    monkeypatch.setattr(view_lines, "_kernel", None)  # as in a fresh process
    rendered = view_lines.used["records"] + view_lines.used["kernel"]
    with open_store(g.root) as store:
        scan = store.scan(MessageFilter.make(limit=5))
        text = blocks_text(scan.json_lines())
    assert len(text.splitlines()) == 5 and scan.given == 5
    assert sum(asked) <= 128 * 1024, asked
    assert view_lines.used["records"] + view_lines.used["kernel"] - rendered == 5
    assert view_lines._kernel is None
