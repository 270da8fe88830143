"""The output layer in-process (cli/output.py and the formats, cells, streams, table and
terminal modules it uses): escaping, widths, one JSON document, streaming with bounded
memory, csv that round-trips.

Golden values are written out here from the definitions (Python's escape notation, RFC
8259 JSON, the csv module), never taken from the code under test.
"""

from __future__ import annotations

import csv
import io
import json
import re
import threading
import time

import pytest

from cli import table as T
from cli import terminal
from cli.formats import Format
from cli.output import Output

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class FakeTTY(io.StringIO):
    """A terminal for Output: isatty, no file descriptor (size comes from COLUMNS/LINES);
    ``on_write`` sees every write."""

    def __init__(self, on_write=None):
        super().__init__()
        self.on_write = on_write

    def isatty(self):
        return True

    def fileno(self):
        raise io.UnsupportedOperation("no fd")

    def write(self, s):
        n = super().write(s)
        if self.on_write:
            self.on_write(self.getvalue())
        return n


class Pipe(io.StringIO):
    def isatty(self):
        return False


@pytest.fixture
def term(monkeypatch):
    def make(cols=100, lines=40, **env):
        monkeypatch.setenv("COLUMNS", str(cols))
        monkeypatch.setenv("LINES", str(lines))
        for k in ("NO_COLOR", "FORCE_COLOR"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    return make


# --- terminal text --------------------------------------------------------------------


@pytest.mark.parametrize("raw, shown", [
    ("plain [bold] [/x] text", "plain [bold] [/x] text"),  # markup is just text
    ("\x1b[31mred", "\\x1b[31mred"),                         # ESC
    ("a\rb\x07c\x00", "a\\rb\\x07c\\x00"),                    # CR, BEL, NUL
    ("tab\tnew\nline", "tab\\tnew\\nline"),
    ("\x7f\x85\x9b2J", "\\x7f\\x85\\x9b2J"),                   # DEL, NEL, CSI (C1)
    ("abc\u202edcba", "abc\\u202edcba"),                      # right-to-left override
    ("back\\slash", "back\\\\slash"),                          # the escape character itself
    ("日本語 ünïcödé", "日本語 ünïcödé"),
])
def test_escape_shows_what_a_terminal_would_act_on(raw, shown):
    assert terminal.escape(raw) == shown


def test_messages_keep_backslashes_but_not_controls():
    assert terminal.clean("C:\\x 'a\\x00'\nnext\x1b") == "C:\\x 'a\\x00' next\\x1b"


def test_widths_and_cutting_count_terminal_cells():
    assert terminal.width("abc") == 3
    assert terminal.width("日本") == 4            # wide characters take two cells
    assert terminal.width("e\u0301") == 1         # a combining accent takes none
    assert terminal.fit("abcdefgh", 5) == "abcd…"
    assert terminal.fit("abc", 5) == "abc"
    assert terminal.fit("日本語日本語", 7) == "日本語…"  # 6 cells + the ellipsis
    assert terminal.fold("aaaa bbbb cccc", 9) == ["aaaa bbbb", "cccc"]
    assert terminal.fold("x" * 10, 4) == ["xxxx", "xxxx", "xx"]


def test_json_stays_exact_but_writes_c1_and_del_as_escapes():
    value = {"t": "a\x9b[2Jb\x7f\u2028"}
    text = terminal.json_safe(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    assert not re.search("[\x7f-\x9f\u2028]", text)
    assert json.loads(text) == value


# --- one JSON document ------------------------------------------------------------------


def _run(fmt, emit, stream=None, **kw):
    stream = stream if stream is not None else Pipe()
    with Output(fmt, stream=stream, err=io.StringIO(), **kw) as out:
        emit(out)
    return stream.getvalue()


def test_rows_alone_are_one_compact_array_written_as_read():
    rows = [{"a": i, "s": f"v{i}", "n": None, "d": {"k": [1, 2]}} for i in range(5)]
    text = _run(Format.json, lambda o: o.rows(iter(rows), ("a",)))
    assert text == json.dumps(rows, separators=(",", ":")) + "\n"


def test_sections_make_one_object():
    def emit(o):
        o.record({"store": "s", "ok": True}, items=False)
        o.rows(iter([{"x": 1}, {"x": 2}]), ("x",), key="findings")
        o.record({"y": 3}, key="result", items=False)
        o.rows([{"z": 0}], ("z",), key="hidden", json=False)
    text = _run(Format.json, emit)
    assert text == '{"store":"s","ok":true,"findings":[{"x":1},{"x":2}],"result":{"y":3}}\n'
    assert json.loads(text)["findings"] == [{"x": 1}, {"x": 2}]


def test_a_second_bare_document_is_refused():
    def emit(o):
        o.rows([{"x": 1}], ("x",))
        o.rows([{"x": 2}], ("x",))
    with pytest.raises(RuntimeError, match="one document"):
        _run(Format.json, emit)


def test_a_failed_command_leaves_no_complete_looking_document():
    def rows():
        yield {"x": 1}
        raise ValueError("disk said no")

    stream = Pipe()
    with pytest.raises(ValueError):
        _run(Format.json, lambda o: o.rows(rows(), ("x",)), stream=stream)
    with pytest.raises(json.JSONDecodeError):
        json.loads(stream.getvalue())


def test_document_wins_and_other_formats_get_the_items():
    doc = {"commitLog": {"messages": 2}, "queues": [{"q": 0}, {"q": 1}]}

    def emit(o):
        o.document(doc)
        o.record(doc["commitLog"], title="CommitLog", items=False)
        o.rows(doc["queues"], ("q",), title="Queues")
    assert json.loads(_run(Format.json, emit)) == doc
    assert _run(Format.jsonl, emit) == '{"q":0}\n{"q":1}\n'
    assert _run(Format.csv, emit) == "q\n0\n1\n"


# --- jsonl and csv -----------------------------------------------------------------------

NASTY = [
    {"id": 1, "text": 'comma, "quote"\nnewline\r\ttab', "props": {"K": "a,b"}, "keys": ["x", "y"]},
    {"id": 2, "text": "\x1b[31mESC\x9b", "props": {}, "keys": [], "none": None, "flag": True},
]


def test_jsonl_is_compact_json_one_item_a_line():
    text = _run(Format.jsonl, lambda o: o.rows(iter(NASTY), ("id",)))
    lines = text.splitlines()
    assert len(lines) == 2
    for line, row in zip(lines, NASTY):
        assert json.loads(line) == row
        assert line == terminal.json_safe(json.dumps(row, ensure_ascii=False, separators=(",", ":")))


@pytest.mark.parametrize("fmt, dialect", [(Format.csv, "excel"), (Format.tsv, "excel-tab")])
def test_csv_and_tsv_round_trip_through_the_csv_module(fmt, dialect):
    fields = ("id", "text", "props", "keys", "none", "flag")
    text = _run(fmt, lambda o: o.rows(iter(NASTY), ("id",), fields=fields))
    got = list(csv.reader(io.StringIO(text, newline=""), dialect=dialect))
    assert got[0] == list(fields)
    assert got[1] == ["1", 'comma, "quote"\nnewline\r\ttab', '{"K":"a,b"}', '["x","y"]', "", ""]
    assert got[2] == ["2", "\x1b[31mESC\x9b", "{}", "[]", "", "true"]
    assert len(got) == 3


def test_csv_on_a_terminal_is_escaped_like_a_table(term):
    term()
    text = _run(Format.csv, lambda o: o.rows(iter(NASTY[1:]), ("id",), fields=("id", "text")),
                stream=FakeTTY(), pager=False)
    assert "\x1b" not in text and "\\x1b[31mESC\\x9b" in text


def test_csv_says_when_a_row_has_a_field_the_header_lacks():
    err = io.StringIO()
    rows = iter([{"a": 1}, {"a": 2, "extra": 3}])
    with Output(Format.csv, stream=Pipe(), err=err) as out:
        out.rows(rows, ("a",))
    assert "'extra' of row 2" in err.getvalue()


# --- tables -------------------------------------------------------------------------------


def _lines(text):
    return ANSI.sub("", text).splitlines()


def test_table_cells_are_escaped_never_markup(term):
    term(cols=200)
    rows = [{"topic": "T[bold]", "tags": "[/x]", "body": "\x1b]0;owned\x07\x1b[2J\r"}]
    text = _run(Format.table, lambda o: o.rows(rows, ("topic", "tags", "body")),
                stream=FakeTTY(), pager=False)
    plain = ANSI.sub("", text)
    assert "[/x]" in plain and "T[bold]" in plain
    assert "\\x1b]0;owned\\x07\\x1b[2J\\r" in plain
    assert "\x07" not in text and "\r" not in text and "\x1b]" not in text


def test_long_cells_are_cut_to_the_terminal_width(term):
    term(cols=80)
    rows = [{"offset": i * 1000, "topic": "T", "body": "word " * 100} for i in range(20)]
    text = _run(Format.table, lambda o: o.rows(rows, ("offset", "topic", "body")),
                stream=FakeTTY(), pager=False)
    lines = _lines(text)
    assert len(lines) == 21  # header + one line a row: nothing wraps
    assert all(terminal.width(line) <= 80 for line in lines)
    assert all(line.endswith("…") for line in lines[1:])
    assert lines[5].split()[0] == "4000"


def test_numbers_are_never_cut_a_longer_one_widens_its_column(term):
    term(cols=60)
    rows = [{"n": 1, "body": "b" * 100} for _ in range(T.SAMPLE)] + [{"n": 10**15, "body": "b"}]
    text = _run(Format.table, lambda o: o.rows(rows, ("n", "body")), stream=FakeTTY(), pager=False)
    lines = _lines(text)
    assert lines[-1].split()[0] == str(10**15)
    assert all(terminal.width(line) <= 60 for line in lines)


def test_a_row_too_wide_for_the_terminal_becomes_a_block(term):
    term(cols=45)
    row = {"commitLogOffset": 12345, "storeTimestamp": 1700000000000, "queueOffset": 7,
           "body": "x" * 200}
    text = _run(Format.table, lambda o: o.rows([row, row], list(row),
                                               times=("storeTimestamp",)),
                stream=FakeTTY(), pager=False)
    lines = _lines(text)
    assert lines[0].split() == ["commitLogOffset", "12345"]
    assert "2023-11-14T22:13:20.000Z" in lines[1]
    assert all(terminal.width(line) <= 45 for line in lines)
    assert lines.count("") == 1  # two blocks, one blank line between them


def test_no_color_means_no_escape_codes(term):
    rows = [{"a": 1, "b": "x"}]
    term()
    styled = _run(Format.table, lambda o: o.rows(rows, ("a", "b")), stream=FakeTTY(), pager=False)
    assert "\x1b[1m" in styled
    term(NO_COLOR="1")
    plain = _run(Format.table, lambda o: o.rows(rows, ("a", "b")), stream=FakeTTY(), pager=False)
    assert "\x1b" not in plain and plain == ANSI.sub("", styled)


def test_a_pipe_gets_plain_uncut_tables(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    rows = [{"a": 1, "body": "y" * 500}]
    text = _run(Format.table, lambda o: o.rows(rows, ("a", "body")))
    assert "\x1b" not in text and "y" * 500 in text


# --- streaming --------------------------------------------------------------------------


def test_table_rows_stream_with_bounded_memory(term):
    """Row k is asked for only once rows up to k - SAMPLE are on the stream: the first
    rows are held only to decide the widths, and nothing more is ever held."""
    term(cols=120)
    stream = FakeTTY()
    seen = []

    def rows():
        for k in range(10 * T.SAMPLE):
            shown = len(_lines(stream.getvalue())) - 1  # minus the header
            seen.append((k, shown))
            yield {"k": k, "v": "x" * (k % 7)}

    _run(Format.table, lambda o: o.rows(rows(), ("k", "v")), stream=stream, pager=False)
    assert all(shown >= k - T.SAMPLE for k, shown in seen), seen[-5:]
    assert len(_lines(stream.getvalue())) == 10 * T.SAMPLE + 1


@pytest.mark.parametrize("fmt", [Format.table, Format.jsonl])
def test_a_slow_source_shows_its_first_row_while_it_waits(term, fmt):
    """The source blocks after one row until the row is on the stream; without the
    helper thread writing held rows, this would wait for ever (the event guards it)."""
    term()
    first_shown = threading.Event()
    stream = FakeTTY(on_write=lambda text: "row-one" in text and first_shown.set())

    def rows():
        yield {"name": "row-one"}
        assert first_shown.wait(60), "the first row was held back while the source waited"
        yield {"name": "row-two"}

    text = _run(fmt, lambda o: o.rows(rows(), ("name",)), stream=stream, pager=False)
    assert "row-two" in text


def test_the_helper_thread_ends_with_the_output():
    # The helper thread wakes every PATIENCE/2 and is joined when the output closes.
    before = threading.active_count()
    _run(Format.jsonl, lambda o: o.rows([{"a": 1}], ("a",)))
    deadline = time.monotonic() + 30
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
