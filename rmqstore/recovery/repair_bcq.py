"""The BatchConsumeQueue steps of a repair (design-14 §4.2): what RocketMQ 5.x's recovery
and dispatch do to ``batchconsumequeue/{topic}/{queueId}``, planned from verify's
``bcq-*`` findings, run with every changed byte saved first (:mod:`rmqstore.recovery.journal`):

* ``cut-bcq`` (``bcq-beyond-end``), ``BatchConsumeQueue#truncateDirtyLogicFiles(end)``:
  from the last file back, a file whose first unit's record *starts* at or past the
  CommitLog end goes to the backup, else its units from the first such one are zeroed (the
  broker only moves its write position; offline the next load would read them again);
* ``dispatch-bcq`` (``bcq-missing-tail``): the units dispatch writes for the records after
  the last unit's record (``putBatchMessagePositionInfo`` skips a record at or before
  ``maxMsgPhyOffsetInCommitLog``, the last unit's *start*), written at the recovered end
  (``recover``: the first invalid unit); what lies after that end is zeroed, later files
  go to the backup (``truncateDirtyFiles`` deletes them);
* ``rebuild-bcq`` (``bcq-mismatch``, ``bcq-segment``): the queue goes to the backup and
  is written anew from the records, as ``rebuild`` writes it.

The units come from verify's dispatch (:attr:`~rmqstore.recovery.verify.VerifyReport.variants`,
:func:`~rmqstore.scan.dispatch_5x.apply_5x`). LMQ queues (``consumequeue/%LMQ%…/0``) are
ConsumeQueues: :mod:`rmqstore.recovery.repair_queues` plans them with the LMQ units verify
added (design-14 §5.2).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import RefusedError
from ..files.batchconsumequeue import (FOLDER, UNIT, BatchConsumeQueue, bcq_file_size,
                                       build_batch_consume_queue)
from ..files.consumequeue import first_false
from ..files.sparse import BLOCK, fsync_dir
from ..format import layout as L
from .journal import pwrite_all
from .repair_rewrites import zero_range
from .repair_steps import Step
from .store_paths import confine, is_dir

#: The BatchConsumeQueue steps.
STEPS = ("cut-bcq", "dispatch-bcq", "rebuild-bcq")
_REBUILD = ("bcq-mismatch", "bcq-segment")

#: BatchConsumeQueue and LMQ findings repair leaves as they are, and why.
UNFIXED = {
    "bcq-skipped": "the record is kept; RocketMQ's dispatch gives it no unit either",
    "lmq-dispatch": "the record is kept; RocketMQ's dispatch cannot use its LMQ properties "
                    "either",
}


def queue_of(rel: str | None) -> str | None:
    """``batchconsumequeue/{topic}/{queueId}`` of a path at or inside a BCQ directory."""
    parts = Path(rel).parts if rel else ()
    if len(parts) >= 3 and parts[0] == FOLDER:
        return str(Path(*parts[:3]))
    return None


def _empty() -> np.ndarray:
    return np.zeros(0, L.BCQ_UNIT_DTYPE)


class BatchQueuePlan:
    """The BCQ steps of a plan: one per queue directory, in the order cut, rebuild,
    dispatch; a queue with no step gets its finding in ``unfixed`` with the reason."""

    def __init__(self, root: Path, cfg, rep, by_code, unfixed: list):
        self.root, self.cfg, self.rep, self.by_code, self.unfixed = root, cfg, rep, by_code, unfixed
        self.odd = [f.file for code in ("symlink", "special-file")
                    for f in by_code.get(code, []) if f.file]
        self.size: int | None = None  # mapperFileSizeBatchConsumeQueue, once steps are asked

    def _why_not(self, q: str) -> str | None:
        """Why repair writes nothing in queue ``q``, or None."""
        from ..scan.dispatch_5x import store_queue_kinds

        if any(p == q or p.startswith(q + "/") or q.startswith(p + "/") for p in self.odd):
            return f"{q} is, holds or lies under a symbolic link or special file; repair leaves it"
        topic = Path(q).parts[1]
        if topic not in store_queue_kinds(self.root, self.cfg).batch_topics:
            return (f"only its records say topic {topic} is BatchCQ (inner batches): neither "
                    f"{FOLDER}/{topic}/ nor config/topics.json does; restore config/topics.json "
                    "(design-14 D5)")
        if self.size is None:
            return (f"no {FOLDER}/ file is left to tell mapperFileSizeBatchConsumeQueue and no "
                    "broker.conf says it: repair will not write BatchConsumeQueue files of a "
                    "guessed size; pass --config with the broker's broker.conf")
        return None

    def steps(self) -> list[Step]:
        found = [f for code in ("bcq-beyond-end", "bcq-missing-tail") + _REBUILD
                 for f in self.by_code.get(code, [])]
        for code, why in UNFIXED.items():
            self.unfixed += [(f, why) for f in self.by_code.get(code, [])]
        if not found:
            return []
        if self.rep.variants is None:  # no BCQ units from verify: nothing to write them from
            self.unfixed += [(f, "verify gave no BatchConsumeQueue units to repair from")
                             for f in found]
            return []
        self.size = bcq_file_size(self.cfg)  # a broker.conf the files contradict: ConfigError
        rebuild: dict[str, object] = {}
        for code in _REBUILD:
            for f in self.by_code.get(code, []):
                q = queue_of(f.file)
                if q is None:
                    self.unfixed.append((f, "not one queue's file: see the finding"))
                elif q not in rebuild:
                    rebuild[q] = f
        out, cut, tail = [], [], []
        left: dict[str, str] = {}  # queue -> why repair leaves it
        for q, f in sorted(rebuild.items()):
            why = self._why_not(q)
            if why:
                left[q] = why
                self.unfixed.append((f, why))
                continue
            out.append(Step("rebuild-bcq", q, f"units disagree with the records ({f.code}): "
                            "the queue goes to the backup and is written anew from the "
                            "records (design-14 §4.2)", data={"fileSize": self.size}))
        for code, steps in (("bcq-beyond-end", cut), ("bcq-missing-tail", tail)):
            for f in self.by_code.get(code, []):
                q = queue_of(f.file)
                if q in rebuild:  # the rebuild writes the whole queue, or nothing
                    if q in left:
                        self.unfixed.append((f, left[q]))
                    continue
                why = self._why_not(q) if q else "not one queue's file: see the finding"
                if why:
                    self.unfixed.append((f, why))
                    continue
                n = f.data.get("count")
                if code == "bcq-beyond-end":
                    steps.append(Step("cut-bcq", q, f"cut {n} unit(s) whose record starts at or "
                                      f"past the CommitLog end {self.rep.end} "
                                      "(BatchConsumeQueue#truncateDirtyLogicFiles)",
                                      data={"fileSize": self.size, "count": n}))
                else:
                    steps.append(Step("dispatch-bcq", q, f"dispatch {n} missing unit(s) from "
                                      f"queue offset {f.data.get('queueOffset')} at the "
                                      "recovered end (putBatchMessagePositionInfo)",
                                      data={"fileSize": self.size,
                                            "queueOffset": f.data.get("queueOffset")}))
        return cut + out + tail


# --- checks, scopes and space --------------------------------------------------------------


def queue_key(step) -> tuple[str, int]:
    """(topic, queue id) of a BCQ step's path, or :class:`RefusedError`."""
    parts = (step.path or "").split("/")
    if len(parts) != 3 or parts[0] != FOLDER or not parts[2].isdigit() \
            or len(parts[2]) > 10 or int(parts[2]) > 2**31 - 1:
        raise RefusedError(f"repair step {step.action}: {step.path!r} is not a queue "
                           f"directory ({FOLDER}/TOPIC/QUEUE_ID); nothing was changed")
    return parts[1], int(parts[2])


def _expected(step, ctx) -> np.ndarray:
    v = getattr(ctx.report, "variants", None)
    return v.bcq.get(queue_key(step), _empty()) if v is not None else _empty()


def _size(step, ctx) -> int:
    return int(step.data.get("fileSize") or bcq_file_size(ctx.cfg))


def _files(qdir: Path) -> list[int]:
    """Starts of the queue's files (20-digit names), in order."""
    return sorted(int(n) for n in os.listdir(qdir) if len(n) == 20 and n.isdigit())


def _cut(qdir: Path, size: int, end: int) -> list[tuple[int, int | None]]:
    """(file start, byte position) of what ``truncateDirtyLogicFiles(end)`` drops: a
    position from which the file's units go, or None when the whole file goes; units
    compare by their record's start (design-14 §4.2)."""
    with BatchConsumeQueue(qdir, size) as bcq:
        files = [(start, units[:n]["commit_log_offset"].astype(np.int64))
                 for (start, units), n in zip(bcq.segments, bcq._used)]
    out: list[tuple[int, int | None]] = []
    for start, phy in reversed(files):
        if not len(phy):
            continue  # no unit the broker keeps: nothing to cut here
        if phy[0] >= end:
            out.append((start, None))
            continue
        k = first_false(phy < end)
        if k < len(phy):
            out.append((start, k * UNIT))
        break
    return out


class _Tail:
    """Where the recovered end of a queue is, and what dispatch appends there."""

    def __init__(self, qdir: Path, size: int, exp: np.ndarray, exists: bool):
        self.per = size // UNIT
        self.start, self.used, last = 0, 0, -1
        on_disk: list[int] = []
        if exists:
            on_disk = _files(qdir)
            with BatchConsumeQueue(qdir, size) as bcq:
                if bcq.segments:
                    self.start, self.used = bcq.segments[-1][0], bcq._used[-1]
                last = bcq.max_physic_offset
        if self.used == self.per:  # a full file: the next one takes the units
            self.start, self.used = self.start + size, 0
        self.units = exp[exp["commit_log_offset"].astype(np.int64) > last]
        n = -(-(self.used + len(self.units)) // self.per) if len(self.units) else \
            int(self.start in on_disk)  # nothing to add: only the rest of the end's file
        self.writes = [self.start + k * size for k in range(n)]  # files written
        after = self.writes[-1] if self.writes else self.start - 1
        self.stale = [s for s in on_disk if s > after]  # after the end: the broker deletes them

    def chunks(self, size: int):
        """(file start, byte position, unit bytes) per file written."""
        raw = self.units.astype(L.BCQ_UNIT_DTYPE).tobytes()
        at = 0
        for k, start in enumerate(self.writes):
            first = self.used if k == 0 else 0
            take = min(self.per - first, len(self.units) - at // UNIT)
            yield start, first * UNIT, raw[at:at + take * UNIT]
            at += take * UNIT


def scope(step, ctx) -> list[tuple]:
    """What a BCQ step may change, for :meth:`~rmqstore.recovery.journal.Journal.start`."""
    rel, root = step.path, ctx.root
    queue_key(step)
    q = confine(root, rel)
    exists = is_dir(root, rel)
    if step.action == "rebuild-bcq":
        return [("move", rel)] if exists else [("entries", rel)]
    size = _size(step, ctx)
    if step.action == "cut-bcq":
        if not exists:
            return []
        return [("move", f"{rel}/{s:020d}") if pos is None else
                ("range", f"{rel}/{s:020d}", pos, size - pos)
                for s, pos in _cut(q, size, ctx.report.end)]
    if step.action == "dispatch-bcq":
        if not exists:  # a new directory: undone by removing it
            return [("entries", rel)]
        t = _Tail(q, size, _expected(step, ctx), exists)
        out = []
        for k, start in enumerate(t.writes):
            name = f"{rel}/{start:020d}"
            out.append(("range", name, t.used * UNIT, size - t.used * UNIT) if k == 0
                       and os.path.lexists(root / name) else ("file", name))
        return out + [("move", f"{rel}/{s:020d}") for s in t.stale] + [("entries", rel)]
    raise RefusedError(f"unknown repair step {step.action!r}; nothing was changed")


def store_bytes(step, ctx) -> int:
    """What a BCQ step newly allocates in the store, at most."""
    if step.action == "cut-bcq":
        return 0
    exp, size = _expected(step, ctx), _size(step, ctx)
    if step.action == "rebuild-bcq":  # whole files, zeros written out as the broker's are
        return max(1, -(-len(exp) // (size // UNIT))) * (-(-size // BLOCK) * BLOCK)
    files = 1 + len(exp) * UNIT // size
    return -(-len(exp) * UNIT // BLOCK) * BLOCK + files * BLOCK


def units_past(qdir: Path, size: int, end: int) -> np.ndarray:
    """CommitLog offsets of a queue's units (as recovery reads them) at or past ``end``:
    what cutting or rebuilding it drops (for :mod:`rmqstore.recovery.guard`'s rules)."""
    with BatchConsumeQueue(qdir, size) as bcq:
        phy = bcq.units["commit_log_offset"].astype(np.int64)
    return phy[phy >= end]


# --- running ---------------------------------------------------------------------------


def run(step, ctx, items: list[dict], j) -> None:
    """Do a BCQ step; its scope (``items``) is saved and journaled already."""
    p = confine(ctx.root, step.path)
    if step.action == "rebuild-bcq":
        for it in items:
            if it["kind"] == "move":
                j.move(it)
        exp = _expected(step, ctx)
        if len(exp):
            build_batch_consume_queue(p, exp, _size(step, ctx), fsync=True)
        else:  # no valid record of the queue: its directory stays, empty (as a truncate)
            os.makedirs(p, exist_ok=True)
            fsync_dir(p.parent)
        return
    size = _size(step, ctx)
    if step.action == "cut-bcq":
        for it in items:
            if it["kind"] == "move":
                j.move(it)
            else:
                zero_range(ctx.root / it["path"], it["offset"], it["length"], size=size)
        return
    t = _Tail(p, size, _expected(step, ctx), is_dir(ctx.root, step.path))
    for it in items:
        if it["kind"] == "move":
            j.move(it)
    os.makedirs(p, exist_ok=True)
    for start, pos, data in t.chunks(size):
        _write_units(p / f"{start:020d}", pos, data, size)
    fsync_dir(p)
    fsync_dir(p.parent)


def _write_units(path: Path, pos: int, data: bytes, size: int) -> None:
    """Units at ``pos`` and zeros after them to the file's end (the file made when absent,
    at the queue's file size; never through a link)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        pwrite_all(fd, data, pos)
        os.fsync(fd)
    finally:
        os.close(fd)
    zero_range(path, pos + len(data), size - pos - len(data), size=size)
