"""Tables that stream: rows are written as they come, in bounded memory.

Column widths are decided once, from the header and the first :data:`SAMPLE` rows (or
whatever came before the output layer's patience ran out), and the terminal width:

* numbers and times are never cut; a later, longer value widens its column from that
  row on (the header is not written again);
* data columns (topic, tags, keys, properties, body, ...) share what is left and a
  longer value is cut with an ellipsis, so one record stays one line;
* prose columns (explanations) fold onto more lines instead, as prose is read whole;
* when even that does not fit, each row is written as a block of ``name  value``
  lines (as psql's expanded display does).

Without a known width (a pipe) nothing is cut. Cells arrive already escaped
(:mod:`cli.terminal`); this module only measures, pads, cuts and folds.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from cli import terminal

SAMPLE = 50
GAP = 2
MIN_DATA = 6  # a data column is not cut narrower than this (or its header)


class Table:
    """One table: ``add`` rows of cells, then ``close``.

    A cell is ``(text, is_number)``. ``kinds`` may pin a column to ``fixed`` (never cut),
    ``fold`` or ``cut``; otherwise numbers make a column fixed and text makes it
    ``text_kind``. ``vertical``: every row as a block (one record, ``get``)."""

    def __init__(self, write: Callable[[str], None], columns: Sequence[str], *,
                 width: int | None, style: bool = False, title: str | None = None,
                 kinds: dict[str, str] | None = None, vertical: bool = False,
                 ellipsis: str = "…", text_kind: str = "cut"):
        self.write = write
        self.names = list(columns)
        self.width = width
        self.style = style
        self.title = title
        self.kinds = kinds or {}
        self.vertical = vertical
        self.ellipsis = ellipsis
        self.text_kind = text_kind
        self.pending: list[list[tuple[str, bool]]] = []
        self.pending_since = 0.0
        self.laid_out = False
        self.rows = 0
        self._kind: list[str] = []
        self._nat: list[int] = []
        self._w: list[int] = []
        self._right: list[bool] = []
        self._labels: list[int] = []
        self._blocks = False

    # --- rows in -----------------------------------------------------------------------

    def add(self, cells: list[tuple[str, bool]]) -> None:
        self.rows += 1
        if self.laid_out:
            self._row(cells)
            return
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(cells)
        if len(self.pending) >= SAMPLE:
            self.flush_pending()

    def flush_pending(self) -> None:
        """Decide the layout from the rows held so far and write them."""
        if self.laid_out:
            return
        self._layout(self.pending)
        held, self.pending = self.pending, []
        for cells in held:
            self._row(cells)

    def close(self) -> None:
        self.flush_pending()

    # --- layout --------------------------------------------------------------------------

    def _layout(self, sample: list[list[tuple[str, bool]]]) -> None:
        self.laid_out = True
        n = len(self.names)
        labels = [terminal.width(c) for c in self.names]
        nat = labels[:]
        numeric = [None] * n
        for cells in sample:
            for i, (text, is_num) in enumerate(cells):
                w = terminal.width(text)
                if w > nat[i]:
                    nat[i] = w
                if text:
                    numeric[i] = is_num if numeric[i] is None else (numeric[i] and is_num)
        self._right = [bool(x) for x in numeric]
        self._kind = [self.kinds.get(c) or ("fixed" if numeric[i] else self.text_kind)
                      for i, c in enumerate(self.names)]
        self._nat = nat
        self._labels = labels
        self._fit()
        if self.title:
            self._title()
        if not self.vertical:
            header = self._join([(c, False) for c in self.names], header=True)
            self.write(self._bold(header[0]) + "\n")

    def _fit(self) -> None:
        """Widths for the terminal, or the expanded (vertical) display when a row cannot
        fit on one line."""
        nat, kinds = self._nat, self._kind
        self._w = nat[:]
        if self.width is None or self.vertical:
            return
        n = len(nat)
        budget = self.width - GAP * (n - 1) - sum(w for w, k in zip(nat, kinds) if k == "fixed")
        flex = [i for i in range(n) if kinds[i] != "fixed"]
        if sum(nat[i] for i in flex) <= budget:
            return
        floor = {i: min(nat[i], max(self._labels[i], MIN_DATA)) for i in flex}
        if sum(floor.values()) > budget:
            self.vertical = True
            return
        w = dict(floor)
        left = budget - sum(w.values())
        while left > 0:
            hungry = [i for i in flex if w[i] < nat[i]]
            if not hungry:
                break
            share = max(1, left // len(hungry))
            for i in hungry:
                give = min(share, nat[i] - w[i], left)
                w[i] += give
                left -= give
                if not left:
                    break
        for i in flex:
            self._w[i] = w[i]

    def _title(self) -> None:
        lines = terminal.fold(self.title, self.width) if self.width else [self.title]
        for line in lines:
            self.write(self._bold(line) + "\n")

    def _bold(self, text: str) -> str:
        return f"{terminal.BOLD}{text}{terminal.RESET}" if self.style and text else text

    # --- rows out ------------------------------------------------------------------------

    def _row(self, cells: list[tuple[str, bool]]) -> None:
        if self.vertical:
            self._block(cells)
            return
        if "fold" in self._kind:
            for i, (text, _) in enumerate(cells):
                if self._kind[i] == "fixed" and terminal.width(text) > self._w[i]:
                    self._grow(i, terminal.width(text))
                    return self._row(cells)
            self.write("\n".join(self._join(cells)) + "\n")
            return
        # One line a row, the common case: measure, cut and pad each cell in one pass.
        ws, kinds, right = self._w, self._kind, self._right
        last = len(cells) - 1
        cut = self.width is not None
        out = []
        for i, (text, _) in enumerate(cells):
            w = ws[i]
            n = len(text) if text.isascii() else terminal.width(text)
            if n > w:
                if kinds[i] == "fixed" or not cut:  # never cut a number; a pipe cuts nothing
                    self._grow(i, n)
                    return self._row(cells)
                text, n = terminal.fit_width(text, w, self.ellipsis)
            if right[i]:
                out.append(" " * (w - n) + text)
            elif i == last:
                out.append(text)
            else:
                out.append(text + " " * (w - n))
        self.write("  ".join(out).rstrip() + "\n")

    def _grow(self, i: int, n: int) -> None:
        """A cell wider than its column that must not be cut: widen from this row on."""
        self._nat[i] = n
        self._fit()

    def _join(self, cells, header: bool = False) -> list[str]:
        """The line(s) of one row: cut, folded and padded cells, ``GAP`` apart."""
        pieces: list[list[str]] = []
        height = 1
        last = len(cells) - 1
        for i, (text, _) in enumerate(cells):
            w = self._w[i]
            kind = self._kind[i]
            if header or kind == "fixed" or self.width is None:
                parts = [text]
            elif kind == "fold":
                parts = terminal.fold(text, w)
            else:
                parts = [terminal.fit(text, w, self.ellipsis)]
            height = max(height, len(parts))
            pieces.append(parts)
        lines = []
        for k in range(height):
            out = []
            for i, parts in enumerate(pieces):
                text = parts[k] if k < len(parts) else ""
                pad = self._w[i] - terminal.width(text)
                if self._right[i]:
                    out.append(" " * pad + text)
                elif i == last:
                    out.append(text)
                else:
                    out.append(text + " " * pad)
            lines.append((" " * GAP).join(out).rstrip())
        return lines

    def _block(self, cells) -> None:
        """One row as ``name  value`` lines, a blank line before each row but the first."""
        lw = max(self._labels) if self._labels else 0
        vw = None if self.width is None else max(self.width - lw - GAP, 8)
        out = [""] if self._blocks else []
        indent = " " * (lw + GAP)
        for i, (text, _) in enumerate(cells):
            label = self.names[i]
            head = self._bold(label) + " " * (lw - self._labels[i] + GAP)
            if vw is None or self._kind[i] == "fixed":
                parts = [text]
            elif self._kind[i] == "fold":
                parts = terminal.fold(text, vw)
            else:
                parts = [terminal.fit(text, vw, self.ellipsis)]
            out.append((head + parts[0]).rstrip())
            out.extend(indent + p for p in parts[1:])
        self._blocks = True
        self.write("\n".join(out) + "\n")
