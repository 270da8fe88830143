"""A repair journal read back (:mod:`rmqstore.recovery.journal` writes it), and the
unfinished repair or restore a store's marker points at.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RefusedError
from ..files.repair_marker import MARKER, read_marker
from .journal import FORMAT, JOURNAL, MANIFEST, journal_io_error


@dataclass
class JournalState:
    """A journal directory as read back."""

    dir: Path
    manifest: dict
    started: dict[int, dict] = field(default_factory=dict)  # step -> start record
    done: dict[int, dict] = field(default_factory=dict)  # step -> fingerprints after
    end: dict | None = None  # final fingerprints, when every step finished
    failed: dict[int, str] = field(default_factory=dict)
    undo_why: str | None = None
    undone: set[int] = field(default_factory=set)
    undo_ended: bool = False
    undo_after: dict | None = None  # fingerprints when the undo ended (the original state)

    @property
    def backup(self) -> bool:
        return bool(self.manifest.get("backup"))

    @property
    def steps(self) -> list[dict]:
        return self.manifest.get("steps") or []

    @property
    def store(self) -> str:
        return self.manifest.get("store", "")

    @property
    def interrupted(self) -> int | None:
        """The step that started and did not finish, if any."""
        open_ = [k for k in self.started if k not in self.done]
        return max(open_) if open_ else None

    @property
    def items(self) -> list[dict]:
        """Every saved item, in the order they were saved (what ``restore`` puts back)."""
        return [it for k in sorted(self.started) for it in self.started[k]["items"]]


def read_backup(backup_dir: str | os.PathLike) -> JournalState:
    """Read a journal directory: manifest and every complete journal record."""
    jdir = Path(backup_dir)
    try:
        manifest = json.loads((jdir / MANIFEST).read_text())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} manifest")
    except FileNotFoundError:
        raise RefusedError("not an rmqstore repair backup (no manifest.json)", jdir) from None
    except (OSError, ValueError) as e:
        raise RefusedError(f"unreadable repair manifest: {e}", jdir / MANIFEST) from None
    state = JournalState(jdir, manifest)
    try:
        data = (jdir / JOURNAL).read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as e:
        raise journal_io_error("read the repair journal", jdir / JOURNAL, e) from None
    for line in data.split(b"\n"):
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a torn last line: its action had not begun
        ev, k = r.get("event"), r.get("step")
        if ev == "start":
            state.started[k] = r
        elif ev == "done":
            state.done[k] = r.get("after", {})
        elif ev == "end":
            state.end = r.get("after", {})
        elif ev == "failed":
            state.failed[k] = r.get("error", "")
        elif ev == "undo":
            state.undo_why = r.get("why")
        elif ev == "undone":
            state.undone.add(k)
        elif ev == "undo-end":
            state.undo_ended = True
            state.undo_after = r.get("after")
    return state


# --- what happened -------------------------------------------------------------------------


@dataclass
class Interrupted:
    """An unfinished repair or restore found through the store's marker."""

    journal: str
    backup: str | None  # the backup directory, when the journal holds one
    operation: str  # "repair" | "restore"
    pid: int | None
    started: str | None
    steps: list[dict]
    done: list[int]
    interrupted: int | None  # the step cut short, numbered from 1
    finished: bool  # every step of the repair had finished
    undone: list[int]
    outcome: str | None = None  # what this run did: undone | replanned | completed

    def describe(self) -> str:
        n = len(self.steps)
        who = f"pid {self.pid}, started {self.started}"
        if self.operation == "restore" or (self.undone and self.finished):
            return (f"an interrupted restore from {self.journal} ({who}): {len(self.undone)} of "
                    f"{len(self.done) + (self.interrupted is not None)} step(s) undone")
        where = f"backup {self.backup}" if self.backup else "no backup"
        if self.finished:
            return f"an rmqstore repair ({who}, {where}) had finished all {n} step(s); only its marker was left"
        text = f"an interrupted rmqstore repair ({who}, {where}): {len(self.done)} of {n} step(s) finished"
        if self.interrupted is not None and 0 < self.interrupted <= n:
            s = self.steps[self.interrupted - 1]
            text += f", step {self.interrupted} ({s.get('action')} {s.get('path') or ''}) was cut short"
        else:
            text += ", none was running"
        if self.undone:
            text += f", {len(self.undone)} step(s) already undone"
        return text

    def as_dict(self) -> dict:
        return {"journal": self.journal, "backup": self.backup, "operation": self.operation,
                "pid": self.pid, "started": self.started, "steps": len(self.steps),
                "done": self.done, "interrupted": self.interrupted, "finished": self.finished,
                "undone": sorted(self.undone), "outcome": self.outcome,
                "description": self.describe()}


def interrupted_from(marker: dict, state: JournalState) -> Interrupted:
    return Interrupted(str(state.dir), str(state.dir) if state.backup else None,
                       "restore" if marker.get("operation") == "restore" else "repair",
                       marker.get("pid"), marker.get("started"), state.steps,
                       sorted(state.done), state.interrupted, state.end is not None,
                       sorted(state.undone))


def find_interrupted(root: str | os.PathLike) -> Interrupted | None:
    """The unfinished repair or restore of the store at ``root``, if any. Read-only."""
    root = Path(root)
    marker = read_marker(root)
    if marker is None:
        return None
    return interrupted_from(marker, journal_state_for(root, marker))


def journal_state_for(root: Path, marker: dict) -> JournalState:
    jdir = Path(marker["journal"])
    if not (jdir / MANIFEST).exists():
        raise RefusedError(
            f"an rmqstore repair of this store did not finish, and its journal {jdir} is "
            "missing (a disk not mounted?): what it changed cannot be told. Bring the "
            f"journal back, or remove {root / MARKER} to repair from the store as it is",
            root / MARKER)
    return read_backup(jdir)
