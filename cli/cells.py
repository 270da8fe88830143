"""One value as text: a table cell (escaped, and whether it is a number) or a csv field
(exact). A command's ``cells`` hook gives its own text for a column, escaped the same."""

from __future__ import annotations

from typing import Any, Callable

from cli import terminal
from cli.formats import encode_json


def csv_text(value: Any) -> str:
    """A value as csv text: exact, nested values as compact JSON."""
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return encode_json(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return terminal.escape_bytes(bytes(value))
    return str(value)


def table_cell(value: Any) -> tuple[str, bool]:
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
        return terminal.clean(terminal.json_safe(encode_json(value))), False
    return terminal.escape(str(value)), False


def rendered_cell(f: Callable[[Any], str]) -> Callable[[Any], tuple[str, bool]]:
    """A command's cell function as a cell maker (its text escaped like any other)."""
    def conv(value):
        return ("", False) if value is None else (terminal.escape(str(f(value))), False)
    return conv
