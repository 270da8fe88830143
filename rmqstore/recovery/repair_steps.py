"""A repair step (:class:`Step`, planned by :mod:`rmqstore.recovery.repair_plan`) and how
it runs: what it may change (its scope, saved first by :mod:`rmqstore.recovery.journal`),
its writes, and the space it needs (the preflight).

Writes here are ``pwrite``/``ftruncate``/``rename`` on descriptors opened without
following links, never through a mapping: on a full disk a write into a hole is then an
ENOSPC error, not a SIGBUS. Zeroing rewrites only the chunks that are not zero already,
so it never allocates a hole. Rebuilt queues and re-dispatched keys go through the
library's ConsumeQueue and IndexFile writers, with the broker's write rules.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..files import checkpoint as ckpt
from ..format import layout as L
from ..format.crc import body_crc, ends_in_prop_crc, prop_crc_entry, record_prop_crc
from ..files.config import StoreConfig
from ..files.consumequeue import UNIT, ConsumeQueue, effective_file_size
from ..files.consumequeue_writer import ConsumeQueueWriter
from ..errors import RefusedError, UnsafePathError
from ..files.index import IndexGeometry, list_index_files
from ..files.index_service import IndexService
from .journal import Journal, pwrite_all
from .store_paths import confine, is_dir
from ..files.sparse import BLOCK, CHUNK, allocated, allocated_in, fsync_dir, is_zero

#: Steps that take a path out of the store (into the backup).
MOVES = {"remove-leftover", "move-stray", "move-segment", "remove-index"}
QUEUE_STEPS = {"cut-queue", "rebuild-queue", "dispatch-queue"}
#: Room for the manifest and journal records (a step's records and saved-file blocks
#: take a few KiB; the margin covers directory blocks and estimates rounding).
JOURNAL_BYTES = 256 << 10
JOURNAL_BYTES_PER_STEP = 4096
_SYS_FLAG, _BODY_CRC = L.HEAD_FIELD_STRUCT["sys_flag"], L.HEAD_FIELD_STRUCT["body_crc"]


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


def _queue(step) -> tuple[str, int]:
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
        _queue(step)


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


# --- space -------------------------------------------------------------------------------


def _pages(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def backup_bytes(req: tuple, ctx: StepContext, same_fs: bool) -> int:
    """What saving ``req`` takes on the backup's filesystem (allocated blocks)."""
    kind, rel = req[0], req[1]
    p = ctx.root / rel
    if not os.path.lexists(p):
        return 0
    if kind == "range":
        return _pages(allocated_in(p, req[2], req[3])) + BLOCK
    if kind == "file":
        return allocated(p) + BLOCK
    if kind == "move":
        return 0 if same_fs else allocated(p) + BLOCK
    return 0


def _last_index_file(ctx: StepContext) -> Path | None:
    idx = ctx.root / "index"
    kept = [p for p in list_index_files(idx) if f"index/{p.name}" not in ctx.gone] \
        if is_dir(ctx.root, "index") else []
    return kept[-1] if kept else None


#: What the IndexFile and ConsumeQueue writers may allocate beyond what they write (they
#: allocate before storing through a map, never into a hole: header and slot table of an
#: IndexFile they write to, entries and units a stretch ahead); an upper bound otherwise.
INDEX_AHEAD = 1 << 20
CQ_AHEAD = 64 << 10


def store_bytes(step, ctx: StepContext) -> int:
    """What ``step`` newly allocates in the store, at most: what the ConsumeQueue and
    IndexFile writers allocate (their files are sparse: their size says nothing), a page
    for a file it creates. Zeroing, cutting and extending allocate nothing."""
    a, d = step.action, ctx.d
    if a == "write-checkpoint":
        return 0 if os.path.lexists(ctx.root / ckpt.CHECKPOINT) else BLOCK
    if a in ("rebuild-queue", "dispatch-queue"):
        units = d.units.get(_queue(step))
        if units is None or not len(units[0]):
            return 0
        first, last = int(units[0][0]), int(units[0][-1])
        if a == "dispatch-queue":
            span = len(units[0]) * UNIT
        else:  # from the start of the first unit's file (placeholders before it)
            span = (last + 1) * UNIT - (first * UNIT - first * UNIT % ctx.cq_size)
        files = 1 + span // ctx.cq_size
        return _pages(span) + files * (min(CQ_AHEAD, ctx.cq_size) + BLOCK)
    if a == "reindex":
        g = ctx.geometry
        head, last = g.entries_start, _last_index_file(ctx)  # header + slot table
        start = room = total = 0
        if last is not None:
            with open(last, "rb") as f:
                h = f.read(L.INDEX_HEADER_STRUCT.size)
            if len(h) == L.INDEX_HEADER_STRUCT.size:
                _, _, _, start, _, count = L.INDEX_HEADER_STRUCT.unpack(h)  # endPhyOffset (§7.3)
                room = max(0, g.index_num - max(count, 1))
            total += max(0, head - allocated_in(last, 0, head)) + INDEX_AHEAD
        n = int(np.count_nonzero(d.key_offset >= start))
        total += _pages(min(n, room) * L.INDEX_ENTRY_SIZE)
        rest = n - min(n, room)
        files = -(-rest // max(1, g.index_num - 1))
        return total + files * (_pages(head) + INDEX_AHEAD) + _pages(rest * L.INDEX_ENTRY_SIZE)
    return 0


def _free(path: Path) -> tuple[int, int, Path]:
    """(device, bytes free to unprivileged writers, the existing directory asked)."""
    p = path
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    return os.stat(p).st_dev, st.f_bavail * st.f_frsize, p


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def preflight(ctx: StepContext, steps: list, backup_dir: Path | None) -> dict:
    """Check every step, then the space the plan needs against what the filesystems
    have; :class:`RefusedError` with the figures when it is not there. Changes nothing."""
    sdev, sfree, _ = _free(ctx.root)
    bdev, bfree, banchor = _free(backup_dir) if backup_dir is not None else (None, 0, None)
    same = bdev == sdev
    need_b = JOURNAL_BYTES + JOURNAL_BYTES_PER_STEP * len(steps) if backup_dir else 0
    need_s = 0 if backup_dir else JOURNAL_BYTES + JOURNAL_BYTES_PER_STEP * len(steps)
    try:
        for s in steps:
            check_step(s, ctx)
            reqs = scope(s, ctx)
            if backup_dir is not None:
                need_b += sum(backup_bytes(r, ctx, same) for r in reqs)
            need_s += store_bytes(s, ctx)
            ctx.gone.update(r[1] for r in reqs if r[0] == "move")
    finally:
        ctx.gone.clear()
    advice = ("free some space, put the backup on another filesystem (--backup DIR), or "
              "repair without one (--no-backup)") if backup_dir is not None else "free some space"
    if backup_dir is not None and same:
        need = need_b + need_s
        if need > sfree:
            raise RefusedError(f"not enough free space: the repair needs {need:,} bytes "
                               f"({_mib(need)}: backup {need_b:,}, new data {need_s:,}) on this "
                               f"filesystem, which has {sfree:,} bytes ({_mib(sfree)}) free; "
                               f"nothing was changed; {advice}", ctx.root)
    else:
        if need_s > sfree:
            raise RefusedError(f"not enough free space: the repair writes {need_s:,} bytes "
                               f"({_mib(need_s)}) in the store, whose filesystem has "
                               f"{sfree:,} bytes ({_mib(sfree)}) free; nothing was changed; "
                               f"{advice}", ctx.root)
        if backup_dir is not None and need_b > bfree:
            raise RefusedError(f"not enough free space for the backup: it needs {need_b:,} "
                               f"bytes ({_mib(need_b)}), the filesystem of {banchor} has "
                               f"{bfree:,} bytes ({_mib(bfree)}) free; nothing was changed; "
                               f"{advice}", backup_dir)
    return {"backupBytes": need_b, "storeBytes": need_s, "storeFree": sfree,
            "backupFree": bfree if backup_dir is not None else None, "sameFilesystem": same}


# --- running ---------------------------------------------------------------------------


def _zero(path: Path, offset: int, length: int, size: int | None = None) -> None:
    """Zero ``[offset, offset + length)`` (within the file), rewriting only the chunks
    that are not zero; then extend the file to ``size`` if shorter. fsync'd."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        end = min(offset + length, os.fstat(fd).st_size)
        pos = offset
        while pos < end:
            data = os.pread(fd, min(CHUNK, end - pos), pos)
            if not data:
                break
            if not is_zero(data):
                pwrite_all(fd, bytes(len(data)), pos)
            pos += len(data)
        if size is not None and os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fix_body_crc(path: Path, at: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        head = os.pread(fd, L.RECORD_FIXED_SIZE[True, True] + 4, at - 8)
        sys_flag = _SYS_FLAG.unpack_from(head, L.OFFSET_OF["sys_flag"])[0]
        fixed = L.RECORD_FIXED_SIZE[bool(sys_flag & L.SYSFLAG_BORNHOST_V6),
                                    bool(sys_flag & L.SYSFLAG_STOREHOST_V6)]
        n = int.from_bytes(os.pread(fd, 4, at - 8 + fixed - 4), "big", signed=True)
        body = os.pread(fd, max(n, 0), at - 8 + fixed)
        pwrite_all(fd, _BODY_CRC.pack(body_crc(body)), at)
        # A record that ends in a property CRC covers BODYCRC too (spec §3.8): renew it,
        # or a broker with forceVerifyPropCRC would cut the log at this record instead.
        _renew_prop_crc(fd, at - L.OFFSET_OF["body_crc"])
        os.fsync(fd)
    finally:
        os.close(fd)


def _record_at(fd: int, record_at: int) -> bytes:
    size = int.from_bytes(os.pread(fd, 4, record_at), "big", signed=True)
    return os.pread(fd, max(size, 0), record_at) if 0 < size <= (1 << 30) else b""


def prop_crc_digits_range(path: Path, record_at: int) -> tuple[int, int] | None:
    """(position, length) of the digits of the record's ``__CRC32#`` entry, or None when
    the record at ``record_at`` does not end in one."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        rec = _record_at(fd, record_at)
    finally:
        os.close(fd)
    if not ends_in_prop_crc(rec):
        return None
    return record_at + len(rec) - L.PROP_CRC_ENTRY_SIZE + len(L.PROP_CRC_PREFIX), 10


def _renew_prop_crc(fd: int, record_at: int) -> None:
    rec = _record_at(fd, record_at)
    if ends_in_prop_crc(rec):
        entry = prop_crc_entry(record_prop_crc(rec))
        pwrite_all(fd, entry, record_at + len(rec) - L.PROP_CRC_ENTRY_SIZE)


def _fix_prop_crc(path: Path, record_at: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        _renew_prop_crc(fd, record_at)
        os.fsync(fd)
    finally:
        os.close(fd)


def run(step, ctx: StepContext, items: list[dict], j: Journal) -> None:
    """Do ``step``; its scope (``items``) is saved and journaled already."""
    a, root = step.action, ctx.root
    p = confine(root, step.path) if step.path is not None else None
    if a in MOVES:
        for it in items:
            j.move(it)
    elif a == "fix-body-crc":
        _fix_body_crc(p, step.offset)
    elif a == "fix-prop-crc":
        _fix_prop_crc(p, step.offset)
    elif a == "zero-tail":
        _zero(p, step.offset, step.length)
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
                _zero(root / it["path"], it["offset"], ctx.cq_size, size=ctx.cq_size)
    elif a == "rebuild-queue":
        for it in items:
            j.move(it)
        units = ctx.d.units.get(_queue(step))
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
        units = ctx.d.units.get(_queue(step))
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
