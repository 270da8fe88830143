"""Kill a repair at a chosen point: the n-th call that changes a file, or just after the
k-th journal record (a step boundary). Used in-process (the call raises :class:`Crash`,
and so does every later one: a dead process writes nothing more) and in a subprocess
(``python crashpoints.py ...`` SIGKILLs itself there).

``os.fsync`` is counted but not run: a killed process's writes stay in the page cache,
so skipping it changes nothing these tests can see, and keeps them fast.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path

from rmqstore.recovery import journal as J

#: The calls through which repair, restore and the file writers change files.
MUTATING = ("pwrite", "write", "ftruncate", "truncate", "rename", "replace", "unlink",
            "rmdir", "mkdir", "symlink", "fsync")
CLOCK = lambda: 1_800_000_000_000  # noqa: E731 - IndexFile names equal in every run


class Crash(BaseException):
    """The process died here (not an Exception: nothing may catch it)."""


class Dies:
    """``with Dies(at=n):`` the n-th mutating call raises; ``after_record=k``: the call
    after the k-th journal record does; neither: only count (``.calls``, ``.records``)."""

    def __init__(self, at: int | None = None, after_record: int | None = None,
                 kill: bool = False):
        self.at, self.after_record, self.kill = at, after_record, kill
        self.calls = self.records = 0
        self._saved: dict = {}

    def _die(self, what: str):
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise Crash(what)

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            self.calls += 1
            if self.at is not None and self.calls >= self.at:
                self._die(f"{name} #{self.calls}")
            return None if name == "fsync" else real(*args, **kwargs)
        return call

    def __enter__(self) -> "Dies":
        for name in MUTATING:
            self._saved[name] = getattr(os, name)
            setattr(os, name, self._wrap(name, self._saved[name]))
        real_record = self._saved["record"] = J.Journal.record

        def record(journal, event, **data):
            real_record(journal, event, **data)
            self.records += 1
            if self.after_record is not None and self.records == self.after_record:
                self.at = self.calls + 1
        J.Journal.record = record
        return self

    def __exit__(self, *exc) -> None:
        J.Journal.record = self._saved.pop("record")
        for name, real in self._saved.items():
            setattr(os, name, real)
        self._saved.clear()


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root``: sha256 of files, "dir", or the target of a link; so two
    equal snapshots mean byte-identical files and no stray file or directory."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[rel] = h.hexdigest()
    return out


if __name__ == "__main__":
    # crashpoints.py STORE BACKUP at|after_record N: repair, SIGKILLed at that point.
    from rmqstore.recovery.repair import repair

    store, backup, kind, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with Dies(kill=True, **{kind: n}):
        repair(store, backup_dir=backup, clock=CLOCK)
    sys.exit(3)  # not killed: the point lies beyond the end of the repair
