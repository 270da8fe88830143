"""The one output layer: every command prints through an :class:`Output`.

``@output_options`` gives a command ``--format/-f table|json|jsonl|csv|tsv`` and
``--no-pager`` (both defined in :mod:`cli.formats` only) and hands it ``out``. A command
then says what it has, section by section, and the format decides how it looks:

* ``out.rows(rows, columns)``: items (messages, units, findings, queues ...);
* ``out.record(obj)``: one object (a summary, a checkpoint, one message);
* ``out.document(value)``: the whole ``-f json`` document, when the command has one
  already (then sections add nothing to it).

Each format shows sections its own way (:mod:`cli.formats`), through the table renderer
(:mod:`cli.table`, cells from :mod:`cli.cells`) or a streaming writer (:mod:`cli.streams`).

Rows are written as they come, with bounded memory. Whatever is held back (a table's
first rows while its widths are decided, a screenful while deciding on a pager, a
stream's buffer) is written within :data:`cli.pager.PATIENCE` seconds by a helper
thread, so slow output still shows at once.

Hooks for commands: ``times`` (columns printed as ISO times in tables), ``prose``
(columns folded rather than cut), ``cells`` (column -> function of the value giving the
table text: a body preview, a decoded id), ``fields`` (the csv columns of a stream).
"""

from __future__ import annotations

import functools
import inspect
import io
import sys
import threading
import time
import typing
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import typer

from cli import terminal
from cli.cells import rendered_cell, table_cell
from cli.formats import Format, FormatOption, NoPagerOption, resolve_format
from cli.pager import PATIENCE, Sink
from cli.streams import CsvStream, JsonDoc, chain, write_jsonl
from cli.table import Table


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
        self._json = JsonDoc(self.sink.write)
        self._table: Table | None = None
        self._wrote = False
        self._csv = CsvStream(self.sink.write, self._lock, self.fmt, tty=self.tty,
                              warn=self.warn)
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
            self._csv.write = self.sink.write
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
            return write_jsonl(rows, self.sink.write, self._lock, self.sink.write_bytes)
        return self._csv.rows(rows, fields, columns)

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
            write_jsonl([obj], self.sink.write, self._lock)
        else:
            self._csv.rows([obj], fields)

    # --- tables --------------------------------------------------------------------------

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
            rows = chain(first, rows)
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
        convs = [(c, rendered_cell(render[c]) if c in render else table_cell) for c in names]
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
