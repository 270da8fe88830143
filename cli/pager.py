"""Where a command's output goes: stdout, or a pager once it outgrows the screen.

Like git: only when stdout is a terminal, never when piped or with ``--no-pager``; the
pager is ``RMQSTORE_PAGER``, else ``PAGER``, else ``less`` (empty or ``cat``: none), run
by the shell with ``LESS=FRX`` and ``LV=-c`` unless those are set. Unlike git, output
that fits on the screen never starts one: text is held until it is longer than the
screen (start the pager), the command ends (print it), or it has waited
:data:`PATIENCE` seconds (start the pager: with ``less -F`` a short output still just
prints, and slow output shows as it comes).
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import time

from cli import terminal

PATIENCE = 0.2


def pager_command() -> str | None:
    cmd = os.environ.get("RMQSTORE_PAGER")
    if cmd is None:
        cmd = os.environ.get("PAGER", "less")
    cmd = cmd.strip()
    if not cmd or cmd == "cat":
        return None
    try:
        program = shlex.split(cmd)[0]
    except (ValueError, IndexError):
        return None
    return cmd if shutil.which(program) else None


class Sink:
    """Text out: ``write`` and ``flush`` as a file has, ``finish`` at the end.

    ``stream`` is the command's stdout. With ``page`` (a terminal of ``lines`` lines) the
    first screenful is held while deciding. Not thread-safe: :class:`cli.output.Output`
    serialises the calls."""

    def __init__(self, stream, *, page: bool = False, lines: int | None = None,
                 columns: int | None = None):
        self.stream = stream
        self.pager: subprocess.Popen | None = None
        self._out = stream
        self._held: list[str] | None = [] if page and lines and pager_command() else None
        self._held_lines = 0
        self._held_since = 0.0
        self._lines = lines or 0
        self._columns = columns
        self._dirty = False
        self._flushed_at = time.monotonic()

    @property
    def deciding(self) -> bool:
        return self._held is not None

    @property
    def paging(self) -> bool:
        return self.pager is not None

    def write(self, text: str) -> None:
        if self._held is None:
            self._out.write(text)
            self._dirty = True
            return
        if not self._held:
            self._held_since = time.monotonic()
        self._held.append(text)
        self._held_lines += self._count(text)
        if self._held_lines >= self._lines:
            self._start_pager()

    def write_bytes(self, data: bytes) -> None:
        """UTF-8 text given as bytes (lines the library encoded): straight to the binary
        stream under the text one when that is UTF-8 and nothing is held back, else as
        text; the same bytes either way."""
        raw = getattr(self._out, "buffer", None)
        enc = (getattr(self._out, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if self._held is not None or raw is None or enc != "utf8":
            self.write(data.decode("utf-8"))
            return
        self._out.flush()  # what the text layer holds goes first
        raw.write(data)
        self._dirty = True

    def _count(self, text: str) -> int:
        """Screen lines ``text`` adds (long lines wrap)."""
        parts = text.split("\n")
        n = len(parts) - 1
        if self._columns:
            for p in parts:
                if len(p) > self._columns:
                    n += (terminal.width(p) - 1) // self._columns
        return n

    def tick(self, now: float) -> None:
        """Called every so often: held text that waited too long goes to a pager; written
        text that waited too long is flushed, so slow output still shows at once."""
        if self._held:
            if now - self._held_since >= PATIENCE:
                self._start_pager()
        elif self._dirty and now - self._flushed_at >= PATIENCE / 2:
            self.flush()

    def _start_pager(self) -> None:
        held, self._held = self._held or [], None
        cmd = pager_command()
        if cmd is not None:
            env = dict(os.environ)
            env.setdefault("LESS", "FRX")
            env.setdefault("LV", "-c")
            try:
                self.stream.flush()
                self.pager = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, env=env)
            except OSError:
                self.pager = None
        if self.pager is not None:
            enc = getattr(self.stream, "encoding", None) or "utf-8"
            self._out = io.TextIOWrapper(self.pager.stdin, encoding=enc,
                                         errors="backslashreplace")
        for text in held:
            self._out.write(text)
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self._dirty = False
            self._flushed_at = time.monotonic()
            self._out.flush()

    def finish(self, *, broken: bool = False) -> None:
        """The end: print what is held, close the pager and wait for the user to quit it."""
        try:
            if self._held is not None:
                held, self._held = self._held, None
                if not broken:
                    for text in held:
                        self._out.write(text)
                    self._dirty = True
            if not broken:
                self.flush()
        finally:
            if self.pager is not None:
                pager, self.pager = self.pager, None
                try:
                    self._out.close()
                except OSError:  # the user quit the pager before the end
                    pass
                while True:
                    try:
                        pager.wait()
                        break
                    except KeyboardInterrupt:  # ^C reaches both; the pager decides
                        continue
                self._out = self.stream
