"""JSON Lines text as ``rmqstore dump --format jsonl`` writes it, and the block type that
carries many lines at once from the library to the output layer.

The text of a value is compact JSON with non-ASCII as itself, then DEL, the C1 controls,
U+2028/9 and lone surrogates written as ``\\uXXXX``: the one definition, which the CLI's
output layer uses for every JSON text it writes (``cli.formats.encode_json``,
``cli.terminal.json_safe``). Light on purpose: the CLI imports it at start.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

#: Compact JSON, non-ASCII as itself (before :func:`json_safe`).
encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def json_safe(encoded: str) -> str:
    """Compact JSON with DEL, the C1 controls, U+2028/2029 and lone surrogates (non-UTF-8
    bytes of a file name) written as ``\\uXXXX``: the same JSON value (json escapes C0
    itself), valid UTF-8, and nothing a terminal acts on."""
    if encoded.isascii() and "\x7f" not in encoded:
        return encoded
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", encoded)


def json_text(value: Any) -> str:
    """``value`` as compact JSON text (see the module docstring)."""
    return json_safe(encode_json(value))


def json_line(obj: Mapping[str, Any]) -> str:
    """One JSON Lines line: ``obj``'s text and a newline."""
    return json_text(obj) + "\n"


class JsonLines:
    """Lines of JSON text (UTF-8, each ending in a newline) for ``count`` items: what the
    output layer writes as they are, where it would encode ``count`` rows one by one."""

    __slots__ = ("data", "count")

    def __init__(self, data: bytes, count: int):
        self.data = data
        self.count = count

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")

    def head(self, n: int) -> "JsonLines":
        """The first ``n`` lines (JSON text never holds a raw newline)."""
        if n >= self.count:
            return self
        end = -1
        for _ in range(n):
            end = self.data.index(b"\n", end + 1)
        return JsonLines(self.data[:end + 1], n)


__all__ = ["JsonLines", "encode_json", "json_line", "json_safe", "json_text"]
