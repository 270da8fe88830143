"""The streaming writers of the machine formats: one ``-f json`` document built as its
sections arrive (:class:`JsonDoc`), JSON Lines (:func:`write_jsonl`) and csv/tsv
(:class:`CsvStream`). Each writes rows as they are read, under the output's lock, so
memory stays bounded and the helper thread may flush between rows."""

from __future__ import annotations

import csv
from typing import Callable, Iterable, Mapping, Sequence

from cli import terminal
from cli.cells import csv_text
from cli.formats import Format, encode_json
from rmqstore.json_lines import JsonLines


class JsonDoc:
    """Exactly one JSON document, written as sections arrive."""

    def __init__(self, write: Callable[[str], None]):
        self.write = write
        self.state: str | None = None  # None, "object", "done" (array or value written)
        self.given = False  # document() was called: sections add nothing
        self._first = True

    def _enc(self, v) -> str:
        return terminal.json_safe(encode_json(v))

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


def write_jsonl(rows: Iterable, write: Callable[[str], None], lock,
                write_bytes: Callable[[bytes], None] | None = None) -> int:
    """One compact JSON object per line, written as the rows come; returns how many.
    A :class:`~rmqstore.json_lines.JsonLines` item is lines the library encoded already
    (the same text, as UTF-8): written as they are (``write_bytes``), counted as the rows
    they hold."""
    n = 0
    for row in rows:
        if isinstance(row, JsonLines):
            with lock:
                if write_bytes is not None:
                    write_bytes(row.data)
                else:
                    write(row.text)
            n += row.count
            continue
        text = terminal.json_safe(encode_json(row)) + "\n"
        with lock:
            write(text)
        n += 1
    return n


class CsvStream:
    """csv or tsv: a header row, then one row per item as it comes. ``write`` is the
    output's current sink (replaced when the output pauses its pager)."""

    def __init__(self, write: Callable[[str], None], lock, fmt: Format, *, tty: bool,
                 warn: Callable[[str], None]):
        self.write = write
        self.fmt = fmt
        self.warn = warn
        self._lock = lock
        self._escape = terminal.escape if tty else (lambda s: s)
        self._header = False

    def rows(self, rows, fields: Sequence[str] | None, columns: Sequence[str] | None = None) -> int:
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
                    rows = chain(first, rows)
        if not fields:
            return 0
        fields = list(fields)
        known = set(fields)
        escape = self._escape
        writer = csv.writer(_SinkFile(self.write),
                            dialect="excel-tab" if self.fmt is Format.tsv else "excel",
                            lineterminator="\n")
        with self._lock:
            if self._header:
                self.write("\n")  # a second table: never expected, kept readable
            writer.writerow([escape(f) for f in fields])
            self._header = True
        n = 0
        warned = False
        for row in rows:
            if not warned and not known.issuperset(row):
                extra = next(k for k in row if k not in known)
                self.warn(f"{extra!r} of row {n + 1} is not a {self.fmt.value} column: "
                          "use --format jsonl to see every field")
                warned = True
            line = [escape(csv_text(row.get(f))) for f in fields]
            with self._lock:
                writer.writerow(line)
            n += 1
        return n


def chain(first, rest):
    """``first``, then the rest of the iterator it was taken from."""
    yield first
    yield from rest
