"""The steps of a repair plan that :func:`rmqstore.recovery.repair.repair` refuses unless
``allow_data_loss``: those that would remove more than the damage justifies (the rules of
:mod:`rmqstore.recovery.guard`, applied to the plan's steps).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import RmqStoreError
from ..files.listing import offset_name
from ..files.segments import SegmentQueue
from ..scan.survivors import find_survivors
from .guard import unit_loss, units_from
from .repair_bcq import units_past
from .repair_steps import Step
from .verify import VerifyReport


#: Steps that delete or zero bytes of files that may hold records; without a backup
#: nothing keeps those bytes.
_LOSSY_WITHOUT_BACKUP = ("move-stray", "remove-leftover", "move-segment", "zero-tail")


def refused_steps(root: Path, cfg, rep: VerifyReport, steps: list[Step],
           backup: bool = True) -> list[tuple[Step, str]]:
    """The steps that would remove more than the damage justifies (:mod:`rmqstore.recovery.guard`):

    1. ``zero-tail``/``move-segment`` over CRC-valid records found after the verified end
       (a chain break before intact data, not a torn write);
    2. ``cut-queue``/``rebuild-queue`` (and ``cut-bcq``/``rebuild-bcq``) dropping units
       that point at such records, or at offsets no segment file holds, or any unit at
       all when no CommitLog segment holds a byte (a missing or empty commitlog/);
    3. without a backup, any step of :data:`_LOSSY_WITHOUT_BACKUP` over bytes holding a
       CRC-valid record wherever it stands (a segment renamed or copied to a stray name
       or place, records whose PHYSICALOFFSET is not their position): with a backup
       they are kept there, without one they are gone.
    """
    refused = _guard_evidence(root, cfg, rep, steps)
    if not backup:
        done = {id(s) for s, _ in refused}
        for s in steps:
            if s.action in _LOSSY_WITHOUT_BACKUP and id(s) not in done:
                why = _no_backup_loss(root, cfg, s)
                if why:
                    refused.append((s, why))
    return refused


def _no_backup_loss(root: Path, cfg, s: Step) -> str | None:
    from ..scan.survivors import first_record_in

    if not s.path:
        return None
    p = Path(s.path) if os.path.isabs(s.path) else root / s.path
    start, stop = (s.offset or 0, (s.offset or 0) + (s.length or 0)) \
        if s.action == "zero-tail" else (0, None)
    hit = first_record_in(p, cfg.max_message_size + 65536, start, stop)
    if hit is None:
        return None
    f, pos = hit
    where = f.relative_to(root) if f.is_relative_to(root) else f
    return (f"{where} holds CRC-valid records (the first at byte {pos}) and without a "
            "backup nothing keeps what this step removes: repair with a backup (the "
            "default), or check the file by hand")


def _guard_evidence(root: Path, cfg, rep: VerifyReport, steps: list[Step]) -> list[tuple[Step, str]]:
    """Rules 1 and 2 of :func:`refused_steps`."""
    risky = [s for s in steps if s.action in ("zero-tail", "move-segment", "cut-queue",
                                              "rebuild-queue", "cut-bcq", "rebuild-bcq")]
    if not risky:
        return []
    refused = []
    size = cfg.mapped_file_size_commit_log
    with SegmentQueue(cfg.commit_log_dirs, size, kind="commitlog") as q:
        surv = find_survivors(q, rep.end, cfg.max_message_size + 65536)
        for s in risky:
            why = None
            if s.action in ("zero-tail", "move-segment"):
                start = offset_name(Path(s.path).name)
                if start is None:
                    continue
                lo = start + (s.offset or 0) if s.action == "zero-tail" else start
                hi = lo + s.length if s.action == "zero-tail" else start + size
                n, first = surv.within(lo, hi)
                if n:
                    why = (f"it holds {n} CRC-valid record(s) after the end of valid data "
                           f"{rep.end} (first at CommitLog offset {first}): the record chain "
                           "breaks before them (RocketMQ refuses to load such a CommitLog)")
            else:
                qdir = root / s.path
                if qdir.is_dir():
                    try:
                        offs = units_past(qdir, s.data["fileSize"], rep.end) \
                            if s.action.endswith("-bcq") else \
                            units_from(qdir, cfg.cq_file_size, rep.end)[1]
                    except RmqStoreError:
                        continue
                    why = unit_loss(q, surv, offs, rep.end)
            if why:
                refused.append((s, why))
    return refused
