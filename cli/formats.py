"""The output formats and the two options that choose them, defined once.

Every command takes ``--format/-f table|json|jsonl|csv|tsv`` and ``--no-pager`` (see
:func:`cli.output.output_options`). How each format shows a command's sections:

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
"""

from __future__ import annotations

import enum
import sys
from typing import Optional

import typer

from cli import terminal
from rmqstore import json_lines


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

#: Compact JSON, non-ASCII as itself: the text of json, jsonl and nested csv/table values
#: (the library's one encoder, :mod:`rmqstore.json_lines`).
encode_json = json_lines.encode_json


def resolve_format(fmt: Optional[Format], stream=None) -> Format:
    """Table on a terminal, JSON Lines when piped, unless the user chose."""
    if fmt is not None:
        return Format(fmt)
    return Format.table if terminal.is_tty(stream or sys.stdout) else Format.jsonl

