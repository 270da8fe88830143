"""The ConsumeQueue steps of a repair plan (spec §6.1, §10.4): one per queue directory, and
only those that converge (a second run finds nothing left to do).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RmqStoreError
from ..scan.properties import sorted_isin
from .repair_steps import Step
from .verify import VerifyReport

_QUEUE_REBUILD = {"cq-hole", "cq-mismatch", "cq-bad-pointer", "cq-duplicate", "cq-missing",
                  "cq-segment"}


def queue_of(rel: str | None) -> str | None:
    """``consumequeue/{topic}/{queueId}`` of a path at or inside a queue directory."""
    if not rel:
        return None
    parts = Path(rel).parts
    if len(parts) >= 3 and parts[0] == "consumequeue":
        return str(Path(*parts[:3]))
    return None


class QueuePlan:
    """ConsumeQueue steps: one per queue directory, and only those that converge.

    A queue is rebuilt (or its tail dispatched) only when the records give a consistent
    queue: their queue offsets count up by one and their PHYSICALOFFSET is their position
    (dispatch writes units densely, so any other records would be misplaced again, and a
    second run would find the same problem). A queue directory holding a symbolic link or
    special file gets no step at all."""

    def __init__(self, root: Path, cfg, rep: VerifyReport, by_code, unfixed: list):
        self.root, self.cfg, self.rep, self.by_code, self.unfixed = root, cfg, rep, by_code, unfixed
        self._d = self._valid = None
        self.odd = [f.file for code in ("symlink", "special-file")
                    for f in by_code.get(code, []) if f.file]
        self.rebuild: dict[str, object] = {}
        for code in sorted(_QUEUE_REBUILD):
            for f in by_code.get(code, []):
                q = queue_of(f.file)
                if q and q not in self.rebuild:
                    self.rebuild[q] = f
        # A stray inside a queue directory goes with a rebuild of that queue.
        self.strays = {}
        for f in by_code.get("stray-file", []):
            q = queue_of(f.file)
            if q and q != f.file:
                self.strays.setdefault(q, f)
        for q, f in self.strays.items():
            if q in self.rebuild or self._units(q) is not None:  # else: just move the stray
                self.rebuild.setdefault(q, f)
        self.ok_rebuild = {q for q in self.rebuild if self._rebuildable(q, self.rebuild[q])}

    @property
    def d(self):
        """What dispatch would write for the valid records (made only when a queue needs it)."""
        if self._d is None:
            self._d = self.rep.dispatched()  # LMQ units included (design-14 §5.2)
        return self._d

    @property
    def valid(self) -> np.ndarray:
        if self._valid is None:
            scan = self.rep.scan
            self._valid = scan.records("offset") if scan is not None else np.zeros(0, np.int64)
        return self._valid

    def blocked(self, q: str) -> bool:
        """Is a link or special file at, inside or above queue directory ``q``?"""
        return any(p == q or p.startswith(q + "/") or q.startswith(p + "/") for p in self.odd)

    def absorbs(self, rel: str | None) -> bool:
        q = queue_of(rel)
        return q is not None and q != rel and q in self.ok_rebuild

    def _units(self, q: str):
        parts = Path(q).parts
        try:
            key = (parts[1], int(parts[2]))
        except (IndexError, ValueError):
            return None
        return self.d.units.get(key) if self.d is not None else None

    def _consistent(self, q: str, qo, phy, first: int | None) -> str | None:
        """Why units built from these records would not make a consistent queue."""
        if first is not None and len(qo) and int(qo[0]) != first:
            return (f"the next record (CommitLog {int(phy[0])}) has queue offset {int(qo[0])}, "
                    f"but the queue ends at {first}")
        jump = np.flatnonzero(np.diff(qo) != 1)
        if len(jump):
            i = int(jump[0])
            return (f"records disagree on queue offsets: CommitLog {int(phy[i])} has queue "
                    f"offset {int(qo[i])}, the next one ({int(phy[i + 1])}) {int(qo[i + 1])}")
        stray = ~sorted_isin(np.asarray(phy, np.int64), self.valid)
        if stray.any():
            return (f"a record stores PHYSICALOFFSET {int(phy[stray][0])}, not its position: "
                    "its unit would point elsewhere")
        return None

    def _rebuildable(self, q: str, f) -> bool:
        if self.blocked(q):
            self.unfixed.append((f, f"{q} is, holds or lies under a symbolic link or special "
                                    "file; repair leaves it"))
            return False
        units = self._units(q)
        if units is not None:
            why = self._consistent(q, units[0], units[1], None)
            if why:
                self.unfixed.append((f, f"{why}; rebuilding {q} would not give a consistent "
                                        "queue, so its units are left as they are"))
                return False
        return True

    def steps(self) -> list[Step]:
        out = []
        for q in sorted(self.ok_rebuild):
            f = self.rebuild[q]
            why = f.code if f.code != "stray-file" else "a stray file inside it"
            what = ("rebuild this queue from the records" if self._units(q) is not None else
                    "no valid record belongs to this queue: its units go to the backup and "
                    "its directory stays, empty (a broker's recovery truncates a queue, "
                    "never deletes it, §10.4)")
            out.append(Step("rebuild-queue", q, f"units disagree with the CommitLog ({why}): "
                            f"{what}"))
        for f in self.by_code.get("cq-beyond-end", []):
            q = queue_of(f.file)
            if q and q not in self.rebuild and not self.blocked(q):
                out.append(Step("cut-queue", q, f"cut {f.data.get('count')} unit(s) from queue "
                                f"offset {f.data.get('queueOffset')}: they point at or past the "
                                f"CommitLog end {self.rep.end} (truncateDirtyLogicFiles, §10.4)",
                                data={"queueOffset": f.data.get("queueOffset")}))
            elif q and self.blocked(q):
                self.unfixed.append((f, f"{q} is, holds or lies under a symbolic link or "
                                        "special file; repair leaves it"))
        for f in self.by_code.get("cq-missing-tail", []):
            q = queue_of(f.file)
            if not q or q in self.rebuild:
                continue
            if self.blocked(q):
                self.unfixed.append((f, f"{q} is, holds or lies under a symbolic link or "
                                        "special file; repair leaves it"))
                continue
            why = self._tail_problem(q, f)
            if why:
                self.unfixed.append((f, why))
                continue
            out.append(Step("dispatch-queue", q, f"dispatch {f.data.get('count')} missing "
                            f"unit(s) from queue offset {f.data.get('queueOffset')} (§6.1 "
                            "write rules)", data={"queueOffset": f.data.get("queueOffset")}))
        return out

    def _tail_problem(self, q: str, f) -> str | None:
        from ..files.consumequeue import ConsumeQueue

        units = self._units(q)
        if units is None:
            return None
        p = self.root / q
        have = 0
        if p.is_dir():
            try:
                with ConsumeQueue(p, self.cfg.cq_file_size) as cq:
                    have = cq.max_offset if cq.segments else None
            except RmqStoreError as e:
                return f"the queue cannot be read ({e.message})"
        sel = units[0] >= (have or 0)
        why = self._consistent(q, units[0][sel], units[1][sel], have)
        if why:
            return f"{why}; dispatching would not give a consistent queue"
        return None
