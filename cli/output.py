"""The one output layer: every command prints through an :class:`Output`.

``@output_options`` gives a command ``--format/-f table|json|jsonl|csv|tsv`` and
``--no-pager`` (defined here only) and hands it ``out``. A command then says what it has,
section by section, and the format decides how it looks:

* ``out.rows(rows, columns)``: items (messages, units, findings, queues ...);
* ``out.record(obj)``: one object (a summary, a checkpoint, one message);
* ``out.document(value)``: the whole ``-f json`` document, when the command has one
  already (then sections add nothing to it).

How each format shows sections:

=========  ============================================================================
table      every section for people: streaming tables (:mod:`cli.table`), records as
           ``name  value`` lines; data escaped (:mod:`cli.terminal`); a pager on a
           terminal when longer than the screen (:mod:`cli.pager`). Default on a terminal.
json       exactly one compact document: a bare array when the command's only section
           is rows without a ``key``; else an object, each section under its ``key``
           (a record without ``key`` gives its fields). Arrays stream as they are read.
jsonl      one compact JSON object per line, one line per item: the sections marked
           ``items`` (a summary beside the items, like stats' CommitLog, is not an item).
           Default when piped.
csv, tsv   a header row, then one row per item (the ``items`` sections); nested values
           as compact JSON, None as empty; quoted as the csv module does, so newlines,
           commas and tabs in values round-trip.
=========  ============================================================================

JSON and CSV stay exact. On a terminal, csv/tsv cells are escaped like table cells and
JSON writes DEL, C1 controls and U+2028/9 as ``\\uXXXX`` (the same JSON value), so no
format lets bytes from a store drive the terminal.

Rows are written as they come, with bounded memory. Whatever is held back (a table's
first rows while its widths are decided, a screenful while deciding on a pager, a
stream's buffer) is written within :data:`cli.pager.PATIENCE` seconds by a helper
thread, so slow output still shows at once.

Hooks for commands: ``times`` (columns printed as ISO times in tables), ``prose``
(columns folded rather than cut), ``cells`` (column -> function of the value giving the
table text: a body preview, a decoded id), ``fields`` (the csv columns of a stream).
"""

from __future__ import annotations

import csv
import enum
import functools
import inspect
import io
import json
import sys
import threading
import time
import typing
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import typer

from cli import terminal
from cli.pager import PATIENCE, Sink
from cli.table import Table


class Format(str, enum.Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"
    csv = "csv"
    tsv = "tsv"


FORMAT_HELP = ("Output format: table (default on a terminal), json (one document), jsonl (one "
               "object per line, default when piped), csv or tsv (a header row, then one row "
               "per item).")
FormatOption = typer.Option(None, "--format", "-f", help=FORMAT_HELP, case_sensitive=False)
NoPagerOption = typer.Option(False, "--no-pager", help="Do not page output longer than the "
                             "screen (a pager is only used on a terminal: $RMQSTORE_PAGER, "
                             "$PAGER or less, with LESS=FRX).")

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def resolve_format(fmt: Optional[Format], stream=None) -> Format:
    """Table on a terminal, JSON Lines when piped, unless the user chose."""
    if fmt is not None:
        return Format(fmt)
    return Format.table if terminal.is_tty(stream or sys.stdout) else Format.jsonl


def output_options(fn: Callable | None = None, *, pager: bool = True):
    """Decorator: add ``--format`` and ``--no-pager`` to a command and call it with
    ``out=Output(...)``, closed when the command returns (``pager=False``: never page,
    for a command that reads the terminal itself)."""

    def deco(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in sig.parameters.values() if p.name != "out"]
        params += [
            inspect.Parameter("fmt", inspect.Parameter.KEYWORD_ONLY, default=FormatOption,
                              annotation=Optional[Format]),
            inspect.Parameter("no_pager", inspect.Parameter.KEYWORD_ONLY, default=NoPagerOption,
                              annotation=bool),
        ]

        @functools.wraps(fn)
        def wrapper(*args, fmt: Optional[Format] = None, no_pager: bool = False, **kwargs):
            with Output(fmt, pager=pager and not no_pager) as out:
                return fn(*args, out=out, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco(fn) if fn is not None else deco


def _plain(value: Any) -> str:
    """A value as csv text: exact, nested values as compact JSON."""
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return _encode(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return terminal.escape_bytes(bytes(value))
    return str(value)


def _cell(value: Any) -> tuple[str, bool]:
    """A value as table text (escaped) and whether it is a number."""
    if value is None:
        return "", False
    if value is True or value is False:
        return ("true" if value else "false"), False
    if isinstance(value, (int, float)):
        return str(value), True
    if isinstance(value, str):
        return terminal.escape(value), False
    if isinstance(value, (bytes, bytearray, memoryview)):
        return terminal.escape_bytes(bytes(value)), False
    if isinstance(value, (dict, list, tuple)):
        # JSON text is its own notation: its escapes (\u001b) stand, nothing is doubled.
        return terminal.clean(terminal.json_safe(_encode(value))), False
    return terminal.escape(str(value)), False


def _rendered(f: Callable[[Any], str]) -> Callable[[Any], tuple[str, bool]]:
    """A command's cell function as a cell maker (its text escaped like any other)."""
    def conv(value):
        return ("", False) if value is None else (terminal.escape(str(f(value))), False)
    return conv


class _JsonDoc:
    """Exactly one JSON document, written as sections arrive."""

    def __init__(self, write: Callable[[str], None]):
        self.write = write
        self.state: str | None = None  # None, "object", "done" (array or value written)
        self.given = False  # document() was called: sections add nothing
        self._first = True

    def _enc(self, v) -> str:
        return terminal.json_safe(_encode(v))

    def value(self, v) -> None:
        self._fresh()
        self.write(self._enc(v))
        self.state, self.given = "done", True

    def _fresh(self) -> None:
        if self.state is not None:
            raise RuntimeError("a command's -f json output must be one document")

    def _member(self, key: str) -> None:
        if self.state is None:
            self.write("{")
            self.state = "object"
        elif self.state != "object":
            self._fresh()
        self.write(("" if self._first else ",") + self._enc(key) + ":")
        self._first = False

    def member(self, key: str, v) -> None:
        self._member(key)
        self.write(self._enc(v))

    def members(self, obj: Mapping) -> None:
        for k, v in obj.items():
            self.member(k, v)

    def array(self, rows: Iterable, key: str | None, lock) -> int:
        with lock:
            if key is None:
                self._fresh()
                self.state = "done"
            else:
                self._member(key)
            self.write("[")
        n = 0
        for row in rows:
            text = self._enc(row)
            with lock:
                self.write(text if not n else "," + text)
            n += 1
        with lock:
            self.write("]")
        return n

    def close(self, ok: bool) -> None:
        if self.state is None or not ok:
            return  # nothing, or an incomplete document that must not parse as whole
        if self.state == "object":
            self.write("}")
        self.write("\n")


class _SinkFile:
    """The file the csv module writes to."""

    def __init__(self, write):
        self.write = write


class Output:
    """A command's output in one format; see the module docstring. Use as a context
    manager (``@output_options`` does)."""

    def __init__(self, fmt: Optional[Format] = None, *, pager: bool = True, stream=None,
                 err=None):
        self.stream = stream if stream is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.fmt = resolve_format(fmt, self.stream)
        self.tty = terminal.is_tty(self.stream)
        self.width, self.height = terminal.size(self.stream)
        self.style = self.fmt is Format.table and terminal.colour(self.stream)
        self._prepare_stream()
        enc = (getattr(self.stream, "encoding", None) or "").lower().replace("-", "")
        self.ellipsis = "…" if enc in ("utf8", "") else "..."
        self.sink = Sink(self.stream, page=pager and self.tty, lines=self.height,
                         columns=self.width)
        self._lock = threading.RLock()
        self._json = _JsonDoc(self.sink.write)
        self._table: Table | None = None
        self._wrote = False
        self._csv_header = False
        self._warnings: list[str] = []
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None
        self.closed = False

    def _prepare_stream(self) -> None:
        reconfigure = getattr(self.stream, "reconfigure", None)
        if reconfigure is None:
            return
        try:
            if self.fmt is Format.table:
                # The helper thread flushes within PATIENCE; per-line flushing would cost a
                # system call a row on a terminal.
                reconfigure(line_buffering=False, errors="backslashreplace")
            elif not self.tty:
                # JSON and CSV files are UTF-8; a file name's non-UTF-8 bytes go out as
                # they are in CSV (exact), JSON escaped them already (terminal.json_safe).
                reconfigure(encoding="utf-8", errors="surrogateescape")
        except (ValueError, OSError, io.UnsupportedOperation):
            pass

    # --- context -------------------------------------------------------------------------

    def __enter__(self) -> "Output":
        return self

    def __exit__(self, et, e, tb) -> None:
        ok = e is None or (isinstance(e, typer.Exit) and e.exit_code in (0, 1))
        if e is None:
            self.close(ok=True)
            return
        try:
            self.close(ok=ok, broken=isinstance(e, BrokenPipeError))
        except OSError:
            pass  # the error in flight says more than a failed flush after it

    def close(self, *, ok: bool = True, broken: bool = False) -> None:
        """End every section, the JSON document (only when ``ok``) and the pager."""
        if self.closed:
            return
        self.closed = True
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
        try:
            with self._lock:
                if not broken:
                    self._end_table()
                    if self.fmt is Format.json:
                        self._json.close(ok)
        finally:
            self.sink.finish(broken=broken)
            for w in self._warnings:
                self.err.write(w)
            self._warnings.clear()
            if not broken:
                try:
                    self.err.flush()
                except (OSError, ValueError):
                    pass

    def pause(self) -> None:
        """Finish what is shown and end the pager, e.g. before asking on the terminal;
        later output is written directly."""
        with self._lock:
            self._end_table()
            self.sink.finish()
            self.sink = Sink(self.stream)
            self._json.write = self.sink.write
        self._flush_warnings()

    def flush(self) -> None:
        """Show everything held back now (a command that waits, such as a follow)."""
        with self._lock:
            if self._table is not None:
                self._table.flush_pending()
            self.sink.tick(time.monotonic() + PATIENCE)
            self.sink.flush()

    def warn(self, message: str) -> None:
        """``rmqstore: message`` on stderr (escaped, one line); held while a pager shows."""
        line = f"rmqstore: {terminal.clean(message)}\n"
        with self._lock:
            if self.sink.paging or self.sink.deciding:
                self._warnings.append(line)
                return
            # What was read before the warning is shown before it.
            if self._table is not None:
                self._table.flush_pending()
            self.sink.flush()
        self.err.write(line)
        self.err.flush()

    def _flush_warnings(self) -> None:
        for w in self._warnings:
            self.err.write(w)
        self._warnings.clear()

    # --- the helper thread -----------------------------------------------------------------

    def _watch(self) -> None:
        while not self._done.wait(PATIENCE / 2):
            with self._lock:
                if self.closed:
                    return
                try:
                    now = time.monotonic()
                    t = self._table
                    if t is not None and t.pending and now - t.pending_since >= PATIENCE:
                        t.flush_pending()
                    self.sink.tick(now)
                except (OSError, ValueError):
                    return  # the main thread meets the same error on its next write

    def _started(self) -> None:
        if self._watcher is None and not self.closed:
            self._watcher = threading.Thread(target=self._watch, name="rmqstore-output",
                                             daemon=True)
            self._watcher.start()

    # --- sections ------------------------------------------------------------------------

    def document(self, value: Any) -> None:
        """The whole ``-f json`` document (nothing in other formats)."""
        if self.fmt is Format.json:
            with self._lock:
                self._json.value(value)

    def line(self, text: str) -> None:
        """A sentence for people (table format only), e.g. "nothing to repair"."""
        if self.fmt is not Format.table:
            return
        with self._lock:
            self._end_table()
            self.sink.write(terminal.escape(text) + "\n")
            self._wrote = True
        self._started()

    def rows(self, rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None, *,
             title: str | None = None, key: str | None = None, items: bool = True,
             table: bool = True, json: bool = True, fields: Sequence[str] | None = None,
             times: Sequence[str] = (), prose: Sequence[str] = (),
             cells: Mapping[str, Callable[[Any], str]] | None = None,
             vertical: bool = False) -> int:
        """Items, written as they are read; returns how many were written."""
        fmt = self.fmt
        self._started()
        if fmt is Format.table:
            if not table:
                return 0
            return self._table_rows(rows, columns, fields, title, times, prose, cells, vertical)
        if fmt is Format.json:
            if not json or self._json.given:
                return 0
            return self._json.array(rows, key, self._lock)
        if not items:
            return 0
        if fmt is Format.jsonl:
            return self._jsonl(rows)
        return self._csv(rows, fields, columns)

    def record(self, obj: Mapping[str, Any], *, title: str | None = None,
               key: str | None = None, items: bool = True, table: bool = True,
               json: bool = True, fields: Sequence[str] | None = None,
               times: Sequence[str] = (), cells: Mapping[str, Callable[[Any], str]] | None = None
               ) -> None:
        """One object: ``name  value`` lines in a table (values folded, never cut)."""
        fmt = self.fmt
        self._started()
        if fmt is Format.table:
            if table:
                self._table_rows([obj], list(obj), None, title, times, (), cells, True)
            return
        if fmt is Format.json:
            if json and not self._json.given:
                with self._lock:
                    if key is None:
                        self._json.members(obj)
                    else:
                        self._json.member(key, obj)
            return
        if not items:
            return
        if fmt is Format.jsonl:
            self._jsonl([obj])
        else:
            self._csv([obj], fields)

    # --- formats -------------------------------------------------------------------------

    def _jsonl(self, rows) -> int:
        n = 0
        write = self.sink.write
        lock = self._lock
        for row in rows:
            text = terminal.json_safe(_encode(row)) + "\n"
            with lock:
                write(text)
            n += 1
        return n

    def _csv(self, rows, fields: Sequence[str] | None, columns: Sequence[str] | None = None) -> int:
        rows = rows if isinstance(rows, (list, tuple)) else iter(rows)
        if fields is None:
            if isinstance(rows, (list, tuple)):
                seen: dict[str, None] = {}
                for r in rows:
                    seen.update(dict.fromkeys(r))
                fields = list(seen) or list(columns or ())
            else:
                first = next(rows, None)
                if first is None:
                    fields = list(columns or ())
                else:
                    fields = list(first)
                    rows = _chain(first, rows)
        if not fields:
            return 0
        fields = list(fields)
        known = set(fields)
        escape = terminal.escape if self.tty else (lambda s: s)
        writer = csv.writer(_SinkFile(self.sink.write),
                            dialect="excel-tab" if self.fmt is Format.tsv else "excel",
                            lineterminator="\n")
        with self._lock:
            if self._csv_header:
                self.sink.write("\n")  # a second table: never expected, kept readable
            writer.writerow([escape(f) for f in fields])
            self._csv_header = True
        n = 0
        warned = False
        for row in rows:
            if not warned and not known.issuperset(row):
                extra = next(k for k in row if k not in known)
                self.warn(f"{extra!r} of row {n + 1} is not a {self.fmt.value} column: "
                          "use --format jsonl to see every field")
                warned = True
            line = [escape(_plain(row.get(f))) for f in fields]
            with self._lock:
                writer.writerow(line)
            n += 1
        return n

    def _end_table(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None

    def _table_rows(self, rows, columns, fields, title, times, prose, cells, vertical) -> int:
        render: dict[str, Callable[[Any], str]] = {}
        if times:
            from cli.common import iso

            render.update({c: iso for c in times})
        render.update(cells or {})
        rows = iter(rows)
        names = list(columns or fields or ())
        if not names:
            first = next(rows, None)
            if first is None:
                return 0
            names = list(first)
            rows = _chain(first, rows)
        kinds = {c: "fixed" for c in times}
        kinds.update({c: "fold" for c in prose})
        with self._lock:
            self._end_table()
            if self._wrote:
                self.sink.write("\n")
            self._wrote = True
            t = self._table = Table(self.sink.write, [terminal.escape(n) for n in names],
                                    width=self.width, style=self.style,
                                    title=terminal.escape(title) if title else None,
                                    kinds={terminal.escape(k): v for k, v in kinds.items()},
                                    vertical=vertical, ellipsis=self.ellipsis,
                                    text_kind="fold" if vertical else "cut")
        convs = [(c, _rendered(render[c]) if c in render else _cell) for c in names]
        lock = self._lock
        n = 0
        for row in rows:
            get = row.get
            line = [conv(get(c)) for c, conv in convs]
            with lock:
                t.add(line)
            n += 1
        with lock:
            if self._table is t:
                self._end_table()
        return n


def _chain(first, rest):
    yield first
    yield from rest

