"""Rendering: rich tables on a terminal, JSON / JSON Lines when asked or piped.

Only this module (and the command modules) write to stdout. ``NO_COLOR`` is honoured by
rich itself; tables fold to plain text when stdout is not a terminal.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Sequence

from cli.common import Format, iso

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def console():
    from rich.console import Console

    # rich's own NO_COLOR support drops colours but keeps bold and italic escapes;
    # no-color.org asks for plain text, so with NO_COLOR set no styles are rendered at all.
    plain = bool(os.environ.get("NO_COLOR"))
    return Console(highlight=False, soft_wrap=False, **({"color_system": None} if plain else {}))


def write_jsonl(rows: Iterable[dict[str, Any]]) -> int:
    out = sys.stdout
    n = 0
    for row in rows:
        out.write(_dumps(row))
        out.write("\n")
        n += 1
    out.flush()
    return n


def write_json(value: Any) -> None:
    json.dump(value, sys.stdout, ensure_ascii=False, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def write_rows(rows: Iterable[dict[str, Any]], fmt: Format, columns: Sequence[str],
               title: str | None = None, time_columns: Sequence[str] = ()) -> int:
    """Rows as JSON / JSONL, or as a table of ``columns`` (times printed as ISO)."""
    if fmt is Format.jsonl:
        return write_jsonl(rows)
    if fmt is Format.json:
        rows = list(rows)
        write_json(rows)
        return len(rows)
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        table.add_column(c, overflow="fold", justify="right" if c not in _LEFT else "left")
    n = 0
    for row in rows:
        table.add_row(*[_cell(row.get(c), c in time_columns) for c in columns])
        n += 1
    console().print(table)
    return n


def write_kv(pairs: dict[str, Any], fmt: Format, title: str | None = None,
             time_keys: Sequence[str] = ()) -> None:
    """One object: JSON, or a two-column table."""
    if fmt in (Format.json, Format.jsonl):
        if fmt is Format.jsonl:
            write_jsonl([pairs])
        else:
            write_json(pairs)
        return
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in pairs.items():
        table.add_row(k, _cell(v, k in time_keys))
    console().print(table)


_LEFT = {"topic", "properties", "body", "tags", "keys", "uniqKey", "offsetMsgId", "bornHost",
         "storeHost", "storeTime", "bornTime", "file", "code", "severity", "explanation",
         "firstStoreTime", "lastStoreTime", "name", "kind", "key", "path", "detail", "status"}


def _cell(value: Any, is_time: bool = False) -> str:
    if value is None:
        return ""
    if is_time and isinstance(value, int):
        return iso(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
