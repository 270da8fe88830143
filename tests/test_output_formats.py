"""Every format of every command (table, json, jsonl, csv, tsv), held to one rule set:

* ``-f json`` is exactly one document, compact (it equals its own compact re-encoding);
* ``-f jsonl`` is one compact object a line, and the lines are the items of the json
  document (messages, units, queues, findings, steps ...), equal field for field;
* ``-f csv``/``-f tsv`` read back through the csv module: a header row naming every field
  the items have, then one row per item whose cells are the item's values as text;
* ``-f table`` prints something that is not JSON, with the same exit code.

Commands run in-process (CliRunner), on the checked-in samples or copies of them.
"""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest
from typer.testing import CliRunner

from cli.main import app
from conftest import REPO

SAMPLE = REPO / "samples" / "multi-segment"
CRASHED = REPO / "samples" / "crashed"
FORMATS = ("json", "jsonl", "csv", "tsv", "table")
# Fields that differ from one run to the next (times, wall-clock file names, output
# folders): compared by presence only.
VOLATILE = {"seconds", "msgsPerSec", "mbPerSec", "out", "backup", "indexFiles"}
runner = CliRunner()


def _first_message():
    from rmqstore.reader import open_store

    with open_store(SAMPLE) as r:
        m = next(r.messages(limit=1))
    return m.topic, m.uniq_key


_TOPIC, _UNIQ = _first_message()
_INDEX = sorted((SAMPLE / "index").iterdir())[0]


def _fresh(kind):
    """Per run: a fresh copy (writing commands) or no store at all, always at one path."""
    def make(tmp_path, n):
        dst = tmp_path / kind
        if dst.exists():
            shutil.rmtree(dst)
        if kind != "new":
            shutil.copytree(CRASHED if kind == "crashed" else SAMPLE, dst)
        return dst
    return make


def _same(doc):
    return doc


def _one(doc):
    return [doc]


# name: (args with {store} for a per-run store, store maker or None, exit code, items of the json doc)
CASES = {
    "dump": (["dump", SAMPLE, "--limit", "7"], None, 0, _same),
    "dump-text-bodies": (["dump", SAMPLE, "--limit", "4", "--body", "text"], None, 0, _same),
    "dump-segment": (["dump", SAMPLE / "commitlog" / "00000000000000000000", "--limit", "5"], None, 0, _same),
    "dump-consumequeue": (["dump", SAMPLE / "consumequeue" / "OrderEvents" / "0", "--limit", "5"], None, 0, _same),
    "dump-indexfile": (["dump", _INDEX, "--limit", "5"], None, 0, lambda d: d["entries"]),
    "dump-checkpoint": (["dump", SAMPLE / "checkpoint"], None, 0, _one),
    "get": (["get", SAMPLE, "--offset", "0"], None, 0, _one),
    "get-uniq-key": (["get", SAMPLE, "--topic", _TOPIC, "--uniq-key", _UNIQ], None, 0, _same),
    "query-key": (["query-key", SAMPLE, "--topic", "OrderEvents", "--key", "order-1010"], None, 0, _same),
    "stats": (["stats", SAMPLE], None, 0, lambda d: d["queues"]),
    "verify": (["verify", SAMPLE], None, 0, lambda d: d["findings"]),
    "verify-crashed": (["verify", CRASHED], None, 1, lambda d: d["findings"]),
    "repair-dry-run": (["repair", "{store}", "--dry-run"], _fresh("crashed"), 1, lambda d: d["steps"]),
    "repair": (["repair", "{store}", "--yes", "--no-backup"], _fresh("crashed"), 0, lambda d: d["steps"]),
    "rebuild": (["rebuild", "{store}"], _fresh("sample"), 0, _one),
    "append": (["append", "{store}", "--create", "--commitlog-size", "65536", "--topic", "T",
                "--body", "hi, \"there\"\nsecond line"], _fresh("new"), 0, _same),
    "bench": (["bench", "scan", "--size-mb", "0.05", "--runs", "1"], None, 0, _same),
}


def _invoke(args, tmp_path, maker, n, fmt):
    argv = [str(a) for a in args]
    if maker is not None:
        argv = [str(maker(tmp_path, n)) if a == "{store}" else a for a in argv]
    return runner.invoke(app, argv + ["--format", fmt])


def _plain(v) -> str:
    """What a csv cell must hold for a JSON value (the documented mapping)."""
    if v is None:
        return ""
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return str(v)


def _stable(row: dict) -> dict:
    return {k: ("<volatile>" if k in VOLATILE else v) for k, v in row.items()}


def check_formats(invoke, code, items_of):
    """Run every format through ``invoke(fmt, n)`` and hold them to the module's rules."""
    results = {fmt: invoke(fmt, n) for n, fmt in enumerate(FORMATS)}
    for fmt, r in results.items():
        assert r.exit_code == code, (fmt, r.output, r.exception)
        assert "internal error" not in r.output
    text = results["json"].stdout
    doc = json.loads(text)  # one document: trailing data would not parse
    assert text == json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", "not compact"
    items = items_of(doc)
    lines = results["jsonl"].stdout.splitlines()
    rows = [json.loads(x) for x in lines]
    assert [x == json.dumps(r, ensure_ascii=False, separators=(",", ":")) for x, r in zip(lines, rows)] \
        == [True] * len(rows), "jsonl lines are not compact"
    assert [_stable(r) for r in rows] == [_stable(i) for i in items]
    for fmt, dialect in (("csv", "excel"), ("tsv", "excel-tab")):
        got = list(csv.reader(io.StringIO(results[fmt].stdout, newline=""), dialect=dialect))
        if not items and not got:
            continue
        header, body = got[0], got[1:]
        assert len(body) == len(items), (fmt, len(body), len(items))
        for item, row in zip(items, body):
            assert len(row) == len(header)
            assert set(item) <= set(header), (fmt, set(item) - set(header))
            cells = dict(zip(header, row))
            for k, v in item.items():
                if k not in VOLATILE:
                    assert cells[k] == _plain(v), (fmt, k)
    table = results["table"].stdout
    assert not table.lstrip().startswith(("{", "[")), table[:100]
    assert "\x1b" not in table  # CliRunner is not a terminal: plain text
    return doc


@pytest.mark.parametrize("name", list(CASES))
def test_every_format_of_every_command(name, tmp_path, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    args, maker, code, items_of = CASES[name]
    check_formats(lambda fmt, n: _invoke(args, tmp_path, maker, n, fmt), code, items_of)


def test_every_command_that_prints_has_the_shared_options():
    import typer

    def walk(cmd, path):
        yield path, cmd
        if hasattr(cmd, "list_commands"):
            ctx = typer.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), path + [name])

    leaves = [(p, c) for p, c in walk(typer.main.get_command(app), ["rmqstore"])
              if not hasattr(c, "list_commands")]
    assert len(leaves) >= 17
    for path, cmd in leaves:
        opts = {o for p in cmd.params for o in p.opts}
        assert {"--format", "-f", "--no-pager"} <= opts, path
        bad = runner.invoke(app, [*path[1:], "--format", "xml"])
        assert bad.exit_code == 2, path
        assert "'table', 'json', 'jsonl', 'csv', 'tsv'" in bad.output, (path, bad.output)


# --- Spark ----------------------------------------------------------------------------------


SPARK_CASES = {
    "stats": (["spark", "stats", SAMPLE], lambda d: d["queues"]),
    "audit": (["spark", "audit", SAMPLE], lambda d: d["findings"]),
    "export": (["spark", "export", SAMPLE, "--out", "{out}"], _one),
    "rebuild-cq": (["spark", "rebuild-cq", SAMPLE, "--out", "{out}"], _one),
}


@pytest.mark.spark
@pytest.mark.parametrize("name", list(SPARK_CASES))
def test_every_format_of_every_spark_command(spark, name, tmp_path):
    args, items_of = SPARK_CASES[name]

    def invoke(fmt, n):
        argv = [str(tmp_path / f"out{n}") if a == "{out}" else str(a) for a in args]
        return runner.invoke(app, argv + ["--master", "local[2]", "--format", fmt])

    check_formats(invoke, 0, items_of)
