"""The space a repair plan needs, checked before anything changes (the preflight): what
saving each step's scope takes in the backup (:mod:`rmqstore.recovery.journal` copies
sparsely: allocated blocks count, not sizes) and what the steps newly allocate in the store.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import RefusedError
from ..files import checkpoint as ckpt
from ..files.consumequeue import UNIT
from ..files.index import list_index_files
from ..files.sparse import BLOCK, allocated, allocated_in
from ..format import layout as L
from .repair_bcq import STEPS as BCQ_STEPS, store_bytes as bcq_store_bytes
from .repair_steps import StepContext, check_step, scope, step_queue
from .store_paths import is_dir

#: Room for the manifest and journal records (a step's records and saved-file blocks
#: take a few KiB; the margin covers directory blocks and estimates rounding).
JOURNAL_BYTES = 256 << 10
JOURNAL_BYTES_PER_STEP = 4096


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
    if a in BCQ_STEPS:
        return bcq_store_bytes(step, ctx)
    if a == "write-checkpoint":
        return 0 if os.path.lexists(ctx.root / ckpt.CHECKPOINT) else BLOCK
    if a in ("rebuild-queue", "dispatch-queue"):
        units = d.units.get(step_queue(step))
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
