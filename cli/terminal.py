"""Text for a terminal: escaping what came from disk, cell widths, fitting and folding.

Everything a record holds (topic, tags, keys, properties, bodies, file names) is data: a
terminal must never interpret it. :func:`escape` shows control characters the way Python
writes them (``\\x1b``, ``\\r``, ``\\u202e``) and doubles the backslash, so what is shown
is unambiguous; nothing here knows about markup, so ``[/x]`` is just five characters.
"""

from __future__ import annotations

import os
import re
import unicodedata
from functools import lru_cache

# the one definition, which callers reach as terminal.json_safe
from rmqstore.json_lines import json_safe  # noqa: F401

# C0 controls, DEL, C1 controls (ESC's 8-bit twins: U+009B is CSI), the soft hyphen, the
# bidirectional and zero-width format characters (they reorder or hide text: "Trojan
# source"), line/paragraph separators, BOM, interlinear annotations, lone surrogates; and
# the backslash, which escaping itself uses.
_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]")
_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_one(m: re.Match) -> str:
    ch = m.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def escape(text: str) -> str:
    """``text`` with every character a terminal could act on written as an escape."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape_one, text)


def escape_bytes(data: bytes) -> str:
    """Raw bytes as text: printable ASCII as is, everything else ``\\xNN``."""
    return "".join(chr(b) if 0x20 <= b < 0x7f and b != 0x5c else
                   ("\\\\" if b == 0x5c else f"\\x{b:02x}") for b in data)


def clean(message: str) -> str:
    """A one-line message (stderr) with control characters escaped and line breaks made
    spaces; backslashes stay as they are, as messages quote values with ``repr``."""
    text = " ".join(message.splitlines())
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: m.group() if m.group() == "\\" else _escape_one(m), text)


# Lone surrogates are how Python holds bytes of a file name that are not UTF-8
# (surrogateescape): written as escapes they keep JSON valid UTF-8 and the name exact.


@lru_cache(maxsize=4096)
def _char_width(ch: str) -> int:
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def width(text: str) -> int:
    """Terminal cells ``text`` takes (wide East Asian characters take two)."""
    if text.isascii():
        return len(text)
    return sum(map(_char_width, text))


def fit(text: str, cells: int, ellipsis: str = "…") -> str:
    """``text`` cut to at most ``cells`` cells, ending in ``ellipsis`` when cut."""
    return fit_width(text, cells, ellipsis)[0]


def fit_width(text: str, cells: int, ellipsis: str = "…") -> tuple[str, int]:
    """:func:`fit` and the width of what it returns."""
    if text.isascii():
        if len(text) <= cells:
            return text, len(text)
    else:
        w = width(text)
        if w <= cells:
            return text, w
    ew = width(ellipsis)
    room = cells - ew
    if room < 0:
        cut = ellipsis[:max(cells, 0)]
        return cut, width(cut)
    if text.isascii():
        return text[:room] + ellipsis, room + ew
    used, out = 0, []
    for ch in text:
        w = _char_width(ch)
        if used + w > room:
            break
        out.append(ch)
        used += w
    return "".join(out) + ellipsis, used + ew


def fold(text: str, cells: int) -> list[str]:
    """``text`` in pieces of at most ``cells`` cells, broken after a space where one is
    near the end of a piece, else anywhere (a long token is never lost, only split)."""
    cells = max(cells, 1)
    if width(text) <= cells:
        return [text]
    lines = []
    while text:
        if width(text) <= cells:
            lines.append(text)
            break
        used, cut = 0, 0
        for i, ch in enumerate(text):
            w = _char_width(ch)
            if used + w > cells:
                break
            used += w
            cut = i + 1
        cut = max(cut, 1)
        space = text.rfind(" ", 0, cut + 1)
        if space >= cut // 2 and space > 0:
            lines.append(text[:space])
            text = text[space + 1:]
        else:
            lines.append(text[:cut])
            text = text[cut:]
    return lines


def _env_int(name: str) -> int | None:
    try:
        v = int(os.environ.get(name, ""))
    except ValueError:
        return None
    return v if v > 0 else None


def size(stream) -> tuple[int | None, int | None]:
    """(columns, lines) of the terminal ``stream`` writes to; ``COLUMNS`` / ``LINES`` win.
    None where unknown: a pipe has no width, so nothing is cut."""
    cols, lines = _env_int("COLUMNS"), _env_int("LINES")
    if cols is None or lines is None:
        try:
            ts = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError, AttributeError):
            ts = None
        if ts is not None:
            cols = cols or (ts.columns or None)
            lines = lines or (ts.lines or None)
    return cols, lines


def is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def colour(stream) -> bool:
    """Styles on a terminal (or with ``FORCE_COLOR``), never with ``NO_COLOR`` or a dumb
    terminal (no-color.org, force-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return is_tty(stream) and os.environ.get("TERM") != "dumb"


BOLD = "\x1b[1m"
RESET = "\x1b[0m"
