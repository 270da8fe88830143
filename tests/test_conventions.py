"""The command-line conventions every rmqstore command keeps (one test per convention).

They run ``rmqstore`` on the checked-in sample stores. Exit codes, one-line errors on
stderr, output formats and colour rules are decided inside the command, so those tests
call the app in-process (:data:`runner`, as tests/test_output_formats.py does); a real
process (:func:`rmq_process`) only where the convention is about the process: what a real
pipe gets, what a fresh interpreter imports, which pages the process touches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app
from conftest import REPO

SAMPLE = REPO / "samples" / "multi-segment"
UNICODE = REPO / "samples" / "ipv6-unicode"
RMQSTORE = str(Path(sys.executable).parent / "rmqstore")
ANSI = re.compile(r"\x1b\[")
HEAVY = ("pyspark", "pyarrow", "pandas", "numba", "llvmlite")


runner = CliRunner()
#: Unset for every run unless a test sets them: the outer environment must not decide.
_COLOUR_ENV = {"NO_COLOR": None, "FORCE_COLOR": None, "TTY_COMPATIBLE": None}


def rmq(*args, env=None):
    """``rmqstore ARGS`` in-process; ``.exit_code``, ``.stdout``, ``.stderr``. An exception
    the command let through (a traceback, for a user) fails the test here."""
    out = runner.invoke(app, [str(a) for a in args], env={**_COLOUR_ENV, **(env or {})},
                        prog_name="rmqstore")
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        raise out.exception
    return out


def rmq_process(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    """The installed ``rmqstore`` in its own process, output through real pipes."""
    base = {k: v for k, v in os.environ.items() if k not in _COLOUR_ENV}
    return subprocess.run([RMQSTORE, *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env={**base, **(env or {})})


def _root():
    from cli.main import app

    return typer.main.get_command(app)


def _walk(cmd, path=("rmqstore",)):
    yield path, cmd
    if hasattr(cmd, "list_commands"):
        ctx = typer.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from _walk(cmd.get_command(ctx, name), path + (name,))


def _commands():
    return list(_walk(_root()))


def _leaf_commands():
    return [(p, c) for p, c in _commands() if not hasattr(c, "list_commands")]


def test_every_command_and_option_has_help():
    missing = []
    for path, cmd in _commands():
        if not (cmd.help or "").strip():
            missing.append(" ".join(path))
        for p in cmd.params:
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{' '.join(path)} {p.opts[0] if p.opts else p.name}")
    assert not missing, f"no help text: {missing}"
    # And --help itself works for each, exit 0.
    for path, _ in _commands()[:1] + _leaf_commands()[:3]:
        assert rmq(*path[1:], "--help").exit_code == 0


def test_version():
    from rmqstore import __version__

    for flag in ("--version", "-V"):
        out = rmq(flag)
        assert out.exit_code == 0
        assert out.stdout.strip() == f"rmqstore {__version__}"


def test_shell_completion_is_available(monkeypatch):
    # Typer detects the shell from the parent process unless told not to; a test run
    # under a daemon or CI has no shell parent, so the shell is named explicitly. Typer
    # reads the switch when it builds the command, before CliRunner applies ``env``.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    out = rmq("--show-completion", "bash")
    assert out.exit_code == 0, out.stderr
    assert "_rmqstore_completion" in out.stdout and "complete" in out.stdout
    assert "--install-completion" in rmq("--help").stdout


# Commands that list results: each must offer --format table|json|jsonl|csv|tsv (every
# command and format: tests/test_output_formats.py).
LISTING = {
    ("rmqstore", "dump"): [SAMPLE, "--limit", "3"],
    ("rmqstore", "get"): [SAMPLE, "--offset", "0"],
    ("rmqstore", "query-key"): [SAMPLE, "--topic", "OrderEvents", "--key", "order-1010"],
    ("rmqstore", "stats"): [SAMPLE],
    ("rmqstore", "bench", "scan"): ["--size-mb", "0.1", "--runs", "1"],
    ("rmqstore", "verify"): [SAMPLE],
    ("rmqstore", "repair"): [SAMPLE, "--dry-run"],
}


def test_format_table_json_jsonl_csv_tsv_wherever_results_are_listed():
    commands = dict(_commands())
    for path, args in LISTING.items():
        assert path in commands, f"{' '.join(path)} is missing"
        assert any("--format" in p.opts for p in commands[path].params), f"{' '.join(path)} has no --format"
        usage = rmq(*path[1:], "--help", env={"COLUMNS": "200"}).stdout
        assert re.search(r"--format <table\|json\|jsonl\|csv\|tsv>", usage), (path, "choices are not table|json|jsonl|csv|tsv")
        for fmt in ("table", "json", "jsonl", "csv", "tsv"):
            out = rmq(*path[1:], *args, "--format", fmt)
            assert out.exit_code == 0, (path, fmt, out.stderr)
            if fmt == "json":
                json.loads(out.stdout)
            elif fmt == "jsonl":
                pass  # one value per line: test_jsonl_is_one_json_value_per_line
            else:
                assert out.stdout.strip() and not out.stdout.lstrip().startswith(("{", "["))


def test_jsonl_is_one_json_value_per_line():
    """JSON Lines means every line parses on its own, for single-object results too
    (``jq -c``-style), so piped output can be processed line by line."""
    for path, args in LISTING.items():
        out = rmq(*path[1:], *args, "--format", "jsonl")
        assert out.exit_code == 0, (path, out.stderr)
        for line in out.stdout.splitlines():
            try:
                json.loads(line)
            except ValueError:
                pytest.fail(f"{' '.join(path)} --format jsonl: not one JSON value per line: {line[:60]!r}")


def test_piped_output_is_plain_and_stable():
    # A real process: the convention is what a real pipe on stdout gets (no terminal, so
    # no styles, and JSON Lines by default), not what CliRunner's buffer gets.
    runs = [rmq_process("stats", SAMPLE, "--format", "table") for _ in range(2)]
    assert all(r.returncode == 0 for r in runs)
    assert not ANSI.search(runs[0].stdout), "escape codes in piped output"
    assert runs[0].stdout == runs[1].stdout
    # Piped without --format: JSON Lines, one object per line.
    dump = rmq_process("dump", SAMPLE, "--limit", "4")
    assert [json.loads(line)["commitLogOffset"] for line in dump.stdout.splitlines()][0] == 0
    assert len(dump.stdout.splitlines()) == 4


def test_no_color_wins_over_a_forced_terminal():
    forced = {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"}
    styled = rmq("stats", SAMPLE, "--format", "table", env=forced)
    assert styled.exit_code == 0
    assert ANSI.search(styled.stdout), "FORCE_COLOR should make rich style the table (test premise)"
    plain = rmq("stats", SAMPLE, "--format", "table", env={**forced, "NO_COLOR": "1"})
    assert plain.exit_code == 0
    assert not ANSI.search(plain.stdout), "NO_COLOR set, yet escape codes were printed"
    assert "multi-segment" in plain.stdout


def test_times_as_epoch_ms_or_iso_and_printed_as_iso():
    ms, text = "1700000150000", "2023-11-14T22:15:50Z"
    by_ms = rmq("dump", SAMPLE, "--since", ms, "--limit", "3", "--format", "jsonl")
    by_iso = rmq("dump", SAMPLE, "--since", text, "--limit", "3", "--format", "jsonl")
    offset_iso = rmq("dump", SAMPLE, "--since", "2023-11-15T00:15:50+02:00", "--limit", "3", "--format", "jsonl")
    assert by_ms.exit_code == by_iso.exit_code == offset_iso.exit_code == 0
    assert by_ms.stdout == by_iso.stdout == offset_iso.stdout
    first = json.loads(by_ms.stdout.splitlines()[0])
    assert first["storeTimestamp"] >= int(ms) and first["commitLogOffset"] > 0
    q = [rmq("query-key", SAMPLE, "--topic", "OrderEvents", "--key", "order-1010", "--begin", b,
             "--format", "jsonl") for b in ("1700000140000", "2023-11-14T22:15:40Z")]
    assert q[0].exit_code == q[1].exit_code == 0 and q[0].stdout == q[1].stdout
    assert len(q[0].stdout.splitlines()) == 2  # one of the three hits is earlier
    table = rmq("dump", SAMPLE, "--limit", "1", "--format", "table", env={"COLUMNS": "250"})
    assert "2023-11-14T22:13:20.000Z" in table.stdout
    assert "1700000000000" not in table.stdout
    bad = rmq("dump", SAMPLE, "--since", "yesterday-ish")
    assert bad.exit_code == 2 and "--since" in bad.stderr


def test_exit_codes():
    assert rmq("stats", SAMPLE, "--format", "json").exit_code == 0
    # 1: the command worked and found nothing / problems.
    assert rmq("query-key", SAMPLE, "--topic", "OrderEvents", "--key", "no-such-key").exit_code == 1
    assert rmq("get", SAMPLE, "--topic", "OrderEvents", "--uniq-key", "00").exit_code == 1
    assert rmq("verify", SAMPLE).exit_code == 0
    assert rmq("verify", REPO / "samples" / "crashed").exit_code == 1
    # 2: bad usage, Typer's own usage errors included, and unusable input.
    assert rmq("stats").exit_code == 2  # missing argument
    assert rmq("stats", SAMPLE, "--no-such-option").exit_code == 2
    assert rmq("no-such-command").exit_code == 2
    assert rmq("dump", SAMPLE, "--format", "xml").exit_code == 2
    assert rmq("get", SAMPLE).exit_code == 2  # none of the ways to find a message
    assert rmq("stats", REPO / "no-such-store").exit_code == 2
    assert rmq("get", SAMPLE, "--offset", "5").exit_code == 2
    assert rmq("verify", REPO / "no-such-store").exit_code == 2


def test_errors_are_one_line_naming_file_and_offset():
    out = rmq("get", SAMPLE, "--offset", "5")
    assert out.exit_code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    segment = str(SAMPLE / "commitlog" / "00000000000000000000")
    assert segment in lines[0] or "samples/multi-segment/commitlog/00000000000000000000" in lines[0]
    assert re.search(r"\boffset 5\b", lines[0]), lines[0]
    missing = rmq("dump", REPO / "no-such-store")
    assert len(missing.stderr.strip().splitlines()) == 1 and "no-such-store" in missing.stderr


def test_damaged_record_error_names_file_and_offset(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(SAMPLE, store)
    seg = store / "commitlog" / "00000000000000000000"
    data = bytearray(seg.read_bytes())
    data[363 + 4:363 + 8] = b"\0\0\0\0"  # the second record's magic
    seg.write_bytes(bytes(data))
    out = rmq("get", store, "--offset", "363")
    assert out.exit_code == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert str(seg) in out.stderr and "offset 363" in out.stderr


def _wall(args) -> float:
    # A real process: a cold lookup's time is mostly the interpreter starting and importing.
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        out = rmq_process(*args)
        best = min(best, time.perf_counter() - t0)
        assert out.returncode == 0, out.stderr
    return best


COLD_LOOKUPS = pytest.mark.parametrize("args", [
    ("get", SAMPLE, "--offset", "0", "--format", "json"),
    ("query-key", SAMPLE, "--topic", "OrderEvents", "--key", "order-1010", "--format", "jsonl"),
], ids=["get", "query-key"])


_FAULTS = ("import resource, runpy, sys; sys.argv = ['rmqstore'] + sys.argv[1:]\n"
           "try:\n    runpy.run_module('cli.main', run_name='__main__')\n"
           "except SystemExit as e:\n    code = e.code\n"
           "print('minflt', resource.getrusage(resource.RUSAGE_SELF).ru_minflt, file=sys.stderr)\n"
           "sys.exit(code)\n")


@COLD_LOOKUPS
def test_cold_lookups_import_nothing_heavy(args):
    # A fresh interpreter: in this process the test session has imported much already.
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "cli.main", *map(str, args)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr[-1000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)
    assert not heavy, f"{args[0]} imports {heavy[:5]}"


@pytest.fixture(scope="module")
def small_and_big(tmp_path_factory):
    """The same generated store at 1 MiB and at 128 MiB (one 128 MiB segment)."""
    from rmqstore import bench as B

    root = tmp_path_factory.mktemp("lookups")
    # The easy shape: the query-key case below looks up its key bk0000000032.
    small = B.make_store(root / "small", 1 << 20, shape="easy", segment_size=128 << 20)
    big = B.make_store(root / "big", 128 << 20, shape="easy", segment_size=128 << 20)
    return small, big


@pytest.mark.parametrize("args", [
    ("get", "{store}", "--offset", "0", "--format", "json"),
    ("query-key", "{store}", "--topic", "BenchTopic00", "--key", "bk0000000032", "--format", "jsonl"),
    ("dump", "{store}", "--limit", "5", "--format", "jsonl"),
], ids=["get", "query-key", "dump-limit"])
def test_lookups_touch_pages_for_what_they_read_not_for_the_store(small_and_big, args):
    """Page faults of the whole process, for the same command on a 1 MiB and a 128 MiB
    store: imports and code are the same, so the difference is the data touched. Reading
    the big segment once would be 32768 faults; a lookup (and a dump stopped by --limit
    after one scan window) stays far below. This replaces a wall-clock budget (see
    test_cold_lookups_are_fast, in the stress run)."""
    def faults(g):
        # A process of its own: its page-fault count is what is measured.
        argv = [a.format(store=g.root) for a in args]
        out = subprocess.run([sys.executable, "-c", _FAULTS, *argv], capture_output=True,
                             text=True, cwd=REPO, timeout=120)
        assert out.returncode == 0, out.stderr[-1000:]
        return int(out.stderr.rsplit("minflt ", 1)[1].split()[0])

    small, big = small_and_big
    assert faults(big) - faults(small) < 4096  # 16 MiB of 4 KiB pages


@pytest.mark.stress
@COLD_LOOKUPS
def test_cold_lookups_are_fast(args):
    # A wall-clock budget: only in the stress run (RMQSTORE_STRESS=1), on a quiet machine.
    wall = _wall(args)
    assert wall < 0.5, f"rmqstore {args[0]} took {wall:.2f} s (best of 3), budget 0.5 s"
