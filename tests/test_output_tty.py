"""The real command on a pseudo-terminal, where behaviour depends on the terminal:
streaming, the pager, cutting to the terminal's width, colours and NO_COLOR, escaping of
hostile bytes, and one-line usage errors.

The hostile store is written here with the engine (MessageStore): markup-like tags,
escape sequences, C1 controls, a right-to-left override and binary bodies. What it holds
is known from how it was written, so exactness checks compare with those inputs.
"""

from __future__ import annotations

import base64
import csv
import fcntl
import io
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import REPO
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.engine.store import MessageStore

RMQSTORE = str(Path(sys.executable).parent / "rmqstore")
SAMPLE = REPO / "samples" / "multi-segment"
STYLE = re.compile(rb"\x1b\[[01]m")  # the only escape codes rmqstore writes itself
CLEAN_ENV = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "PAGER", "RMQSTORE_PAGER", "LESS",
             "TTY_COMPATIBLE")


def pty_run(*args, cols=120, rows=40, env=None, stdin=None, feed=None, timeout=120):
    """Run rmqstore with stdout on a pty of ``cols`` x ``rows``: (exit code, what the
    terminal got with CRLF made LF, stderr). ``feed(seen_so_far) -> bytes | None`` is
    called as output arrives and may write to the child's stdin pipe (``stdin=PIPE``)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    base = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    p = subprocess.Popen([RMQSTORE, *map(str, args)], stdin=stdin if stdin is not None else slave,
                         stdout=slave, stderr=subprocess.PIPE, env={**base, **(env or {})},
                         cwd=REPO, start_new_session=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout  # a hang guard, not a budget
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
                if feed is not None:
                    feed(out)
            elif p.poll() is not None:
                break
        else:
            p.kill()
            pytest.fail(f"rmqstore {' '.join(map(str, args))} hung; got {out[-500:]!r}")
        err = p.stderr.read().decode()
        code = p.wait(timeout=60)
    finally:
        os.close(master)
        p.stderr.close()
    return code, out.replace(b"\r\n", b"\n"), err


def visible(out: bytes) -> list[str]:
    return STYLE.sub(b"", out).decode().splitlines()


def no_terminal_controls(out: bytes) -> None:
    """Nothing that drives a terminal, apart from rmqstore's own bold/reset."""
    text = STYLE.sub(b"", out).decode("utf-8")
    bad = sorted({f"U+{ord(c):04X}" for c in text
                  if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c == "\u202e"})
    assert not bad, f"raw control characters reached the terminal: {bad}"


# --- streaming -----------------------------------------------------------------------------


def test_rows_reach_the_terminal_while_the_command_is_still_reading(tmp_path):
    """`append --jsonl -` on a terminal: the second message is sent only after the first
    one's row is on the screen, so the command cannot have finished before it showed."""
    store = tmp_path / "s"
    line = json.dumps({"topic": "T", "body": "hello", "queueId": 0}) + "\n"
    sent = []

    def feed(seen: bytes) -> None:
        if not sent and b"PUT_OK" in seen:
            sent.append(True)
            p_stdin.write(line.encode())
            p_stdin.close()

    r, w = os.pipe()
    p_stdin = os.fdopen(w, "wb", buffering=0)
    p_stdin.write(line.encode())
    try:
        code, out, err = pty_run("append", store, "--create", "--commitlog-size", 65536,
                                 "--jsonl", "-", stdin=r, feed=feed)
    finally:
        os.close(r)
        if not p_stdin.closed:
            p_stdin.close()
    assert sent, f"the first row never showed while the command waited for input: {out!r} {err}"
    assert code == 0, err
    rows = [x for x in visible(out) if "PUT_OK" in x]
    assert len(rows) == 2 and visible(out)[0].split()[:2] == ["status", "commitLogOffset"]


# --- the pager -------------------------------------------------------------------------------


@pytest.fixture
def fake_pager(tmp_path):
    """A PAGER that records its input and environment instead of showing them."""
    record = tmp_path / "paged"
    script = tmp_path / "pager.sh"
    script.write_text(f'#!/bin/sh\nprintf "%s" "$LESS" > "{record}.less"\ncat > "{record}"\n')
    script.chmod(0o755)
    return script, record


def test_output_longer_than_the_screen_goes_through_the_pager(fake_pager):
    script, record = fake_pager
    code, direct, _ = pty_run("dump", SAMPLE, "--limit", 60, "--no-pager", rows=24)
    assert code == 0 and len(visible(direct)) == 61
    code, out, err = pty_run("dump", SAMPLE, "--limit", 60, rows=24, env={"PAGER": str(script)})
    assert code == 0, err
    assert record.read_bytes() == direct  # the pager got exactly what the screen would have
    assert out == b""                      # and nothing went around it
    assert Path(f"{record}.less").read_text() == "FRX"
    record.unlink()
    code, _, _ = pty_run("dump", SAMPLE, "--limit", 60, rows=24,
                         env={"PAGER": str(script), "LESS": "S"})
    assert Path(f"{record}.less").read_text() == "S"  # the user's LESS wins


def test_no_pager_when_it_fits_when_asked_or_when_piped(fake_pager):
    script, record = fake_pager
    env = {"PAGER": str(script)}
    code, out, _ = pty_run("dump", SAMPLE, "--limit", 5, rows=24, env=env)
    assert code == 0 and len(visible(out)) == 6 and not record.exists()
    code, out, _ = pty_run("dump", SAMPLE, "--limit", 60, "--no-pager", rows=24, env=env)
    assert code == 0 and len(visible(out)) == 61 and not record.exists()
    code, out, _ = pty_run("dump", SAMPLE, "--limit", 60, rows=24, env={"PAGER": "cat"})
    assert code == 0 and len(visible(out)) == 61
    # The pipe's environment as pty_run's: an inherited COLUMNS (pytest-xdist's workers
    # export COLUMNS=80) would cut and wrap the table where a pipe has no width.
    base = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    piped = subprocess.run([RMQSTORE, "dump", SAMPLE, "--limit", "60", "-f", "table"],
                           capture_output=True, text=True, env={**base, **env}, cwd=REPO)
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 61
    assert not record.exists()


# --- width, colour ---------------------------------------------------------------------------


@pytest.mark.parametrize("cols", [150, 200])
def test_tables_are_cut_to_the_terminal_width(cols):
    code, out, err = pty_run("dump", SAMPLE, "--limit", 30, "--body", "text", "--no-pager",
                             cols=cols)
    assert code == 0, err
    lines = visible(out)
    assert len(lines) == 31  # one line a message: bodies of ~300 bytes do not wrap
    assert all(len(x) <= cols for x in lines), max(map(len, lines))
    assert sum(x.endswith("…") for x in lines[1:]) >= 25


def test_narrow_terminals_get_one_block_a_row_within_the_width():
    code, out, err = pty_run("dump", SAMPLE, "--limit", 3, "--body", "text", "--no-pager",
                             cols=70)
    assert code == 0, err
    lines = visible(out)
    assert all(len(x) <= 70 for x in lines)
    assert [x.split()[0] for x in lines if x.startswith("commitLogOffset")] == ["commitLogOffset"] * 3


def test_colours_on_a_terminal_and_none_with_no_color():
    code, styled, _ = pty_run("stats", SAMPLE, "--no-pager")
    assert code == 0 and b"\x1b[1m" in styled
    code, plain, _ = pty_run("stats", SAMPLE, "--no-pager", env={"NO_COLOR": "1"})
    assert code == 0 and b"\x1b" not in plain
    assert plain == STYLE.sub(b"", styled)


# --- hostile bytes -------------------------------------------------------------------------------

HOSTILE = [
    dict(topic="Hostile", body=b"\x1b[31mred\x1b[0m\r\x07 [/x] \x1b]0;owned\x07",
         properties={"TAGS": "[/x]", "KEYS": "[bold] k2", "X-OSC": "\x1b]0;title\x07\x1b[2J",
                     "UNIQ_KEY": "AA00000000000000000000000000000A"}),
    dict(topic="T[bold]", body=bytes(range(256)),
         properties={"TAGS": "\x9b2J\u202eevil", "KEYS": "k\x7fdel [red]"}),
    dict(topic="Hostile", body=b"\xff\xfe\x1b[?1049h\x9b",
         properties={"TAGS": "[bold]", "KEYS": "[/x]", "C1": "\x85\x90\x9d"}),
]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1200,
                      max_hash_slot_num=64, max_index_num=256)
    offsets = []
    with MessageStore.open(root, cfg, create=True) as st:
        for i, m in enumerate(HOSTILE):
            r = st.put(Message(born_timestamp=1700000000000 + i, store_timestamp=1700000000000 + i,
                               **m))
            assert r.ok, r
            offsets.append(r.offset)
    return root, offsets


@pytest.mark.parametrize("args", [
    ("dump", "{store}", "--body", "text"),
    ("dump", "{store}", "--body", "hex"),
    ("get", "{store}", "--offset", "{off0}", "--body", "text"),
    ("get", "{store}", "--offset", "{off1}", "--body", "text"),
    ("get", "{store}", "--topic", "Hostile", "--uniq-key", "AA00000000000000000000000000000A"),
    ("query-key", "{store}", "--topic", "Hostile", "--key", "[bold]", "--body", "text"),
    ("query-key", "{store}", "--topic", "Hostile", "--key", "[/x]", "--body", "text"),
    ("stats", "{store}"),
    ("verify", "{store}"),
    ("dump", "{store}", "-f", "csv", "--body", "text"),
], ids=lambda a: " ".join(a[:1] + a[2:]))
def test_hostile_bytes_are_shown_escaped_never_interpreted(hostile, args):
    root, offsets = hostile
    argv = [a.format(store=root, off0=offsets[0], off1=offsets[1]) for a in args]
    code, out, err = pty_run(*argv, "--no-pager", cols=220)
    assert code == 0, err
    assert "internal error" not in err and "Traceback" not in err
    no_terminal_controls(out)
    text = STYLE.sub(b"", out).decode()
    if args[0] in ("dump", "get", "query-key"):
        assert "[/x]" in text or "[bold]" in text
    if args[0] == "get" and "{off0}" in args:
        assert "\\x1b[31mred\\x1b[0m\\r\\x07 [/x]" in text  # the body, escaped
        assert '"X-OSC":"\\u001b]0;title\\u0007\\u001b[2J"' in text  # properties, as JSON


def test_hostile_bytes_stay_exact_in_json_and_csv(hostile):
    root, offsets = hostile
    rows = [json.loads(x) for x in subprocess.run(
        [RMQSTORE, "dump", root, "-f", "jsonl"], capture_output=True, text=True,
        check=True).stdout.splitlines()]
    assert [r["commitLogOffset"] for r in rows] == offsets
    for r, m in zip(rows, HOSTILE):
        assert base64.b64decode(r["body"]) == m["body"]
        assert r["properties"] == m["properties"] and r["topic"] == m["topic"]
    text = subprocess.run([RMQSTORE, "dump", root, "-f", "csv", "--body", "hex"],
                          capture_output=True, text=True, check=True).stdout
    got = list(csv.DictReader(io.StringIO(text, newline="")))
    for r, m in zip(got, HOSTILE):
        assert bytes.fromhex(r["body"]) == m["body"]
        assert json.loads(r["properties"]) == m["properties"] and r["tags"] == m["properties"]["TAGS"]


# --- usage errors -------------------------------------------------------------------------------

ONE_LINE = re.compile(r"^(rmqstore(?: [\w-]+)*): .+ \(see \1 -h\)$")


@pytest.mark.parametrize("args", [
    ("dump", SAMPLE, "--foo"),
    ("dump",),
    ("dump", SAMPLE, "--format", "xml"),
    ("dump", SAMPLE, "--limit", "many"),
    ("no-such-command",),
    ("spark", "stats", "--bogus"),
    ("bench", "scan", "--runs", "0"),
    ("get", SAMPLE, "--offset"),
])
def test_usage_errors_are_one_line_and_exit_2(args):
    p = subprocess.run([RMQSTORE, *map(str, args)], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and ONE_LINE.match(lines[0]), p.stderr


def test_help_is_unchanged_by_the_one_line_errors():
    for flag in ("-h", "--help"):
        p = subprocess.run([RMQSTORE, "dump", flag], capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 0 and p.stdout.startswith("Usage: rmqstore dump")
        assert "-h, --help" in p.stdout and "--no-pager" in p.stdout
    bare = subprocess.run([RMQSTORE], capture_output=True, text=True, cwd=REPO)
    assert "Commands:" in bare.stdout + bare.stderr  # `rmqstore` alone still shows help
