"""A repair step (:class:`Step`, planned by :mod:`rmqstore.recovery.repair_plan`) and how
it runs: what it may change (its scope, saved first by :mod:`rmqstore.recovery.journal`)
and its writes. The space a plan needs is :mod:`rmqstore.recovery.repair_space`'s; bytes
rewritten in place (zeroing, CRC fields) :mod:`rmqstore.recovery.repair_rewrites`'; the
BatchConsumeQueue steps :mod:`rmqstore.recovery.repair_bcq`'s.

Writes go through descriptors opened without following links, never through a mapping.
Rebuilt queues and re-dispatched keys go through the library's ConsumeQueue and IndexFile
writers, with the broker's write rules.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RefusedError, UnsafePathError
from ..files import checkpoint as ckpt
from ..files.config import StoreConfig
from ..files.consumequeue import UNIT, ConsumeQueue, effective_file_size
from ..files.consumequeue_writer import ConsumeQueueWriter
from ..files.index import IndexGeometry, list_index_files
from ..files.index_service import IndexService
from ..files.sparse import fsync_dir
from ..format import layout as L
from .journal import Journal
from .repair_rewrites import fix_body_crc, fix_prop_crc, prop_crc_digits_range, zero_range
from .store_paths import confine, is_dir

#: Steps that take a path out of the store (into the backup).
MOVES = {"remove-leftover", "move-stray", "move-segment", "remove-index"}
QUEUE_STEPS = {"cut-queue", "rebuild-queue", "dispatch-queue"}


@dataclass
class Step:
    """One explicit change. ``path`` is relative to the store; ``offset``/``length`` a byte
    range in it when the step rewrites part of a file."""

    action: str
    path: str | None
    explanation: str
    offset: int | None = None
    length: int | None = None
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("data"))
        return d



@dataclass
class StepContext:
    root: Path
    cfg: StoreConfig
    report: object  # the VerifyReport the plan came from
    d: object  # scan.per_queue.Dispatched of its scan
    clock: object = None
    gone: set[str] = field(default_factory=set)  # paths earlier steps take out (preflight)

    @property
    def cq_size(self) -> int:
        return effective_file_size(self.cfg.cq_file_size)

    @property
    def geometry(self) -> IndexGeometry:
        return IndexGeometry(self.cfg.max_hash_slot_num, self.cfg.max_index_num)


def with_abort_steps(steps: list, abort_exists: bool) -> list:
    """The steps as run: ``create-abort`` first unless abort exists (a broker started
    before the repair ends then runs its full recovery, §8.2) and ``remove-abort`` last."""
    body = [s for s in steps if s.action != "remove-abort"]
    last = next((s for s in steps if s.action == "remove-abort"), None)
    if last is None:
        last = Step("remove-abort", ckpt.ABORT, "the store is consistent again: the next "
                    "broker start runs normal recovery (§8.2)", data={"implicit": True})
    first = [] if abort_exists else [
        Step("create-abort", ckpt.ABORT, "mark the store as being modified until the repair "
             "ends: a broker started before then runs its full recovery (§8.2)",
             data={"implicit": True})]
    return first + body + [last]


# --- checks and scopes -------------------------------------------------------------------


def step_queue(step) -> tuple[str, int]:
    parts = (step.path or "").split("/")
    if len(parts) != 3 or parts[0] != "consumequeue" or not parts[2].isdigit() \
            or len(parts[2]) > 10 or int(parts[2]) > 2**31 - 1:
        raise RefusedError(f"repair step {step.action}: {step.path!r} is not a queue "
                           "directory (consumequeue/TOPIC/QUEUE_ID); nothing was changed")
    return parts[1], int(parts[2])


def check_step(step, ctx: StepContext) -> None:
    """Before anything changes: the step's path stays inside the store and means what
    the step needs (a queue directory, a regular file to rewrite)."""
    if step.path is not None:
        p = confine(ctx.root, step.path)
        if step.action in ("fix-body-crc", "fix-prop-crc", "zero-tail", "extend-segment", "write-checkpoint",
                           "create-abort", "remove-abort") and os.path.islink(p):
            raise UnsafePathError("a symbolic link: rmqstore does not write through it", p)
    if step.action in QUEUE_STEPS:
        step_queue(step)
    if step.action.endswith("-bcq"):
        from .repair_bcq import queue_key

        queue_key(step)


def _digits(qdir: Path) -> list[str]:
    """Segment names (20 digits) of a queue directory, in order."""
    return sorted(n for n in os.listdir(qdir) if len(n) == 20 and n.isdigit())


def _cut_point(qdir: Path, file_size: int, phy: int) -> int | None:
    """Byte position of the first unit pointing at or past ``phy`` (truncateDirtyLogicFiles,
    §10.4), or None."""
    with ConsumeQueue(qdir, file_size) as cq:
        units = cq.units
        cut = np.flatnonzero((units["commit_log_offset"] >= phy)
                             & (units["size"] != L.CQ_PLACEHOLDER_SIZE))
        return (cq.base_offset + int(cut[0])) * UNIT if len(cut) else None


def scope(step, ctx: StepContext) -> list[tuple]:
    """What ``step`` may change, as requests for :meth:`Journal.start`, from the store
    as it is now (just before the step runs)."""
    a, rel, root = step.action, step.path, ctx.root
    if a.endswith("-bcq"):
        from . import repair_bcq

        return repair_bcq.scope(step, ctx)
    if a in MOVES or a == "rebuild-queue":
        return [("move", rel)]
    if a == "fix-body-crc":
        digits = prop_crc_digits_range(confine(root, rel), step.offset - L.OFFSET_OF["body_crc"])
        return [("range", rel, step.offset, 4)] + ([("range", rel, *digits)] if digits else [])
    if a == "fix-prop-crc":
        digits = prop_crc_digits_range(confine(root, rel), step.offset)
        return [("range", rel, *digits)] if digits else []
    if a == "zero-tail":
        return [("range", rel, step.offset, step.length)]
    if a == "extend-segment":
        have = os.lstat(confine(root, rel)).st_size
        return [("range", rel, have, max(0, ctx.cfg.mapped_file_size_commit_log - have))]
    if a == "remove-abort" and ctx.cfg.broker_version != "4.9":
        return [("file", rel), ("file", ckpt.ABORT_BAK), ("file", ckpt.COMPACTION_POSITION)]
    if a in ("write-checkpoint", "create-abort", "remove-abort"):
        return [("file", rel)]
    if a == "cut-queue":
        q = confine(root, rel)
        byte = _cut_point(q, ctx.cfg.cq_file_size, ctx.report.end) if is_dir(root, rel) else None
        if byte is None:
            return []
        out = []
        for n in _digits(q):
            s = int(n)
            if s >= byte:
                out.append(("move", f"{rel}/{n}"))
            elif s + ctx.cq_size > byte:
                out.append(("range", f"{rel}/{n}", byte - s, s + ctx.cq_size - byte))
        return out
    if a == "dispatch-queue":
        q = confine(root, rel)
        if not is_dir(root, rel):
            return [("entries", rel)]
        with ConsumeQueue(q, ctx.cfg.cq_file_size) as cq:
            wp = cq.max_offset * UNIT if cq.segments else 0
        first = 0 if wp == 0 else (wp - UNIT) - (wp - UNIT) % ctx.cq_size
        return [("file", f"{rel}/{n}") for n in _digits(q) if int(n) >= first] + [("entries", rel)]
    if a == "reindex":
        idx = confine(root, rel)
        if not is_dir(root, rel):
            return [("entries", rel)]
        kept = [p for p in list_index_files(idx) if f"{rel}/{p.name}" not in ctx.gone]
        return ([("file", f"{rel}/{kept[-1].name}")] if kept else []) + [("entries", rel)]
    raise RefusedError(f"unknown repair step {a!r}; nothing was changed")


# --- running ---------------------------------------------------------------------------


def run(step, ctx: StepContext, items: list[dict], j: Journal) -> None:
    """Do ``step``; its scope (``items``) is saved and journaled already."""
    a, root = step.action, ctx.root
    p = confine(root, step.path) if step.path is not None else None
    if a.endswith("-bcq"):
        from . import repair_bcq

        repair_bcq.run(step, ctx, items, j)
    elif a in MOVES:
        for it in items:
            j.move(it)
    elif a == "fix-body-crc":
        fix_body_crc(p, step.offset)
    elif a == "fix-prop-crc":
        fix_prop_crc(p, step.offset)
    elif a == "zero-tail":
        zero_range(p, step.offset, step.length)
    elif a == "extend-segment":
        size = ctx.cfg.mapped_file_size_commit_log
        fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # zeros as a hole, as the broker creates segments
            os.fsync(fd)
        finally:
            os.close(fd)
    elif a == "cut-queue":
        for it in items:
            if it["kind"] == "move":
                j.move(it)
            else:
                zero_range(root / it["path"], it["offset"], ctx.cq_size, size=ctx.cq_size)
    elif a == "rebuild-queue":
        for it in items:
            j.move(it)
        units = ctx.d.units.get(step_queue(step))
        if units is not None:
            from ..files.consumequeue_writer import build_consume_queue

            build_consume_queue(p, *units, ctx.cfg.cq_file_size, fsync=True)
        else:
            # No valid record of this queue: its units go, its directory stays, as a
            # broker's recovery truncates a queue (truncateDirtyLogicFiles, §10.4) and
            # never deletes the directory.
            os.mkdir(p)
            fsync_dir(p.parent)
    elif a == "dispatch-queue":
        units = ctx.d.units.get(step_queue(step))
        if units is not None:
            have = 0
            if is_dir(root, step.path):
                with ConsumeQueue(p, ctx.cfg.cq_file_size) as cq:
                    have = cq.max_offset
            sel = units[0] >= have
            with ConsumeQueueWriter(p, ctx.cfg.cq_file_size) as w:
                w.put_many(*(x[sel] for x in units))
                w.flush()
    elif a == "reindex":
        _reindex(ctx)
    elif a == "write-checkpoint":
        _drop_special(p)
        _fix_checkpoint(ctx)
    elif a == "create-abort":
        _drop_special(p)
        ckpt.create_abort(root)
    elif a == "remove-abort":
        if ctx.cfg.broker_version != "4.9":
            # What a 5.x broker's start and clean shutdown leave (design-14 §7): abort's
            # content kept in abort.bak, the compaction positions persisted.
            ckpt.shutdown_files(root)
        ckpt.remove_abort(root)
    else:
        raise RefusedError(f"unknown repair step {a!r}")


def _drop_special(p: Path) -> None:
    """A FIFO, socket or device where a state file belongs (saved in the backup already,
    as its kind): removed before the file is written, which would otherwise write into a
    pipe and leave it there (a second repair would plan the same step)."""
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        os.unlink(p)
        fsync_dir(p.parent)


def _reindex(ctx: StepContext) -> None:
    """Re-dispatch keys from the end of the last IndexFile kept (§7.3, §14.7)."""
    d = ctx.d
    with IndexService(ctx.root / "index", ctx.geometry, clock=ctx.clock) as svc:
        start = svc.files[-1].header.end_phy_offset if svc.files else 0
        sel = d.key_offset >= start
        svc.put_hashes(d.key_hash[sel], d.key_offset[sel], d.key_timestamp[sel], skip_stale=True)
        svc.flush()


def _fix_checkpoint(ctx: StepContext) -> None:
    """logicsMsgTimestamp = the last message with a unit, physicMsgTimestamp no later than
    the newest record, indexMsgTimestamp = the last full IndexFile's end (§8.1)."""
    from .rebuild import last_full_index_timestamp

    root, cfg, d, scan = ctx.root, ctx.cfg, ctx.d, ctx.report.scan
    path = root / ckpt.CHECKPOINT
    try:
        cp = ckpt.read_checkpoint(path) if path.exists() else ckpt.Checkpoint()
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is replaced
        cp = ckpt.Checkpoint()
    ts = scan.records("store_timestamp")
    last = int(ts.max()) if len(ts) else 0
    cp.physic_msg_timestamp = min(cp.physic_msg_timestamp, last)
    if d.last_cq_timestamp:
        cp.logics_msg_timestamp = d.last_cq_timestamp
        if getattr(scan, "chain", None) is not None:  # DLedger: dispatch sets both (design-14 §1.6)
            cp.physic_msg_timestamp = cp.logics_msg_timestamp
    full = last_full_index_timestamp(root / "index", ctx.geometry)
    cp.index_msg_timestamp = full if full is not None else min(cp.index_msg_timestamp, last)
    if cfg.broker_version != "4.9":
        # 5.x recovery sets the confirm offset to the start of the last valid record, and
        # the shutdown after it persists that (spec §8.1; 5.3.3's crash-recovered: 467284).
        offsets = scan.records("offset")
        if len(offsets):
            cp.confirm_phy_offset = int(offsets[-1])
    ckpt.write_checkpoint(root, cp, version="4.9" if cfg.broker_version == "4.9" else "5.x")
