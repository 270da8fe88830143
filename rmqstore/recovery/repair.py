"""Repair: what a broker's recovery would do (spec §10), as an explicit plan, then done
offline with a backup of every byte changed. Each step is saved and journaled before it
runs (:mod:`rmqstore.recovery.journal`, :mod:`rmqstore.recovery.repair_steps`), so a repair cut short is
undone by the next one, which plans afresh, and a finished one can be undone
(:mod:`rmqstore.recovery.undo`).

``plan_repair(root)`` (:mod:`rmqstore.recovery.repair_plan`) runs
:func:`rmqstore.recovery.verify.verify` and turns its problems into
:class:`~rmqstore.recovery.repair_steps.Step` objects (data; ``rmqstore repair --dry-run``
prints them). ``repair(root)``
executes the plan under the store lock (:class:`~rmqstore.errors.StoreLockedError`
while a broker holds it), after creating ``abort`` so that a crash mid-repair makes the
next broker start run its own full recovery (§8.2):

1. leftovers of an interrupted rebuild and stray files are moved to the backup;
2. CommitLog: a record inside the log whose body fails its CRC gets its BODYCRC rewritten
   (the broker would otherwise cut the log there and drop every later message); the
   segment holding the end of valid data is extended to full size if truncated and its
   bytes after the end are zeroed; later segments are moved to the backup (§10.4);
3. ConsumeQueue: units at or past the CommitLog end are cut, a queue with holes, wrong or
   duplicate units is rebuilt from the CommitLog, and units missing at the tail are
   dispatched with the broker's write rules (§6.1);
4. IndexFile: files the broker's abnormal start deletes (newer than the checkpoint's
   indexMsgTimestamp, §7.5) and files with broken chains or entries past the end are
   moved to the backup, with every later file; keys are re-dispatched from the end of the
   last file kept (the broker's ``offset < endPhyOffset`` rule, §7.3);
5. checkpoint rewritten to agree with the data; ``abort`` removed.

Nothing verify calls valid is dropped; a second run finds nothing to do: only steps that
resolve their finding are planned, the rest is listed in ``RepairPlan.unfixed`` with the
reason (symbolic links, unsafe topics, queues whose records disagree). Steps that would
remove CRC-valid records found after the verified end, or units pointing at them or at
missing files, are listed in ``RepairPlan.refused``; :func:`repair` then changes nothing
and raises :class:`~rmqstore.errors.RefusedError` unless ``allow_data_loss``
(:mod:`rmqstore.recovery.guard`, :mod:`rmqstore.recovery.repair_refusals`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..errors import RefusedError, RmqStoreError, StoreIOError
from ..files import checkpoint as ckpt
from ..files.config import StoreConfig, config_for, load_config
from .repair_plan import RepairPlan, plan_repair
from .repair_steps import Step


@dataclass
class RepairResult:
    plan: RepairPlan
    executed: bool
    backup_dir: str | None  # the backup actually used
    seconds: float
    resumed: object = None  # journal_state.Interrupted: an unfinished repair found (and dealt with) first
    steps: list[Step] = field(default_factory=list)  # what ran: the plan + create/remove-abort


def default_backup_dir(root: Path) -> Path:
    """``{store}.rmqstore-backup-<timestamp>``, beside (outside) the store; ``-2``, ``-3``
    … when that exists already."""
    root = Path(root).resolve()
    p = root.parent / f"{root.name}.rmqstore-backup-{time.strftime('%Y%m%d-%H%M%S')}"
    return _unused(p) if os.path.lexists(p) else p


# --- execution ---------------------------------------------------------------------------


def _backup_target(root: Path, requested, resumed) -> Path:
    """The backup directory to use: outside the store, new (or empty)."""
    from .journal import abandoned_begin

    if requested is None:
        return default_backup_dir(root)
    p = _outside(root, Path(requested).resolve())
    if os.path.lexists(p):
        if resumed is not None and Path(resumed.journal).resolve() == p:
            return _unused(p)  # the same --backup as the run just undone: keep that one
        if p.is_dir() and not p.is_symlink() and abandoned_begin(p, root):
            # A run killed before it changed anything: its manifest goes, the folder stays.
            for n in os.listdir(p):
                os.unlink(p / n)
            return p
        if not (p.is_dir() and not p.is_symlink() and not any(p.iterdir())):
            raise RefusedError("already exists and is not empty: choose a new directory for "
                               "the backup", p)
    return p


def _reload(root: Path, cfg: StoreConfig) -> StoreConfig:
    """``cfg`` again after an undo: geometry it took from the files (or defaults) is read
    again, what came from broker.conf or options (or a config made in code) is kept."""
    from ..files.config import GEOMETRY

    def given(name: str) -> bool:
        src = cfg.sources.get(name)
        return name not in GEOMETRY or src is None or src in ("broker.conf", "option")

    keep = {f.name: getattr(cfg, f.name) for f in fields(cfg)
            if f.init and f.name not in ("sources", "store_path_root_dir") and given(f.name)}
    return load_config(root, overrides=keep)


def _outside(root: Path, p: Path) -> Path:
    if p == root or root in p.parents:
        raise RefusedError("the backup directory must be outside the store (repair would "
                           "take it for stray files)", p)
    return p


def _unused(p: Path) -> Path:
    n = 2
    while os.path.lexists(p.with_name(f"{p.name}-{n}")):
        n += 1
    return p.with_name(f"{p.name}-{n}")


def repair(root: str | os.PathLike, *, dry_run: bool = False, backup_dir: str | os.PathLike | None = None,
           backup: bool = True, config: StoreConfig | None = None, clock=None,
           plan: RepairPlan | None = None, processes: int | None = None,
           progress=None, conf: str | os.PathLike | None = None,
           allow_data_loss: bool = False) -> RepairResult:
    """Plan and (unless ``dry_run``) execute the repair of the store at ``root``.

    Under the store lock: an unfinished earlier repair is undone from its backup first
    (:func:`rmqstore.recovery.undo.resume`; ``result.resumed`` says what was found), then the
    store is planned afresh (``plan`` is only used by a dry run), the space checked
    (:func:`~rmqstore.recovery.repair_space.preflight`), and every step run journaled
    (:mod:`rmqstore.recovery.journal`). ``progress(done, total)`` sees steps as they finish.

    ENOSPC, EIO and other errors of the operating system give :class:`StoreIOError`
    naming the file; the store is then left mid-repair, with its marker, and the next
    ``repair`` finishes the job (or ``rmqstore restore BACKUP`` undoes it).

    Without ``config`` the settings come from ``conf`` (a broker.conf) and the files, read
    after any undo: a half-done store can mislead what the files say.

    A plan with refused steps (``RepairPlan.refused``: they would remove valid data or act
    without evidence) raises :class:`~rmqstore.errors.RefusedError` before anything is
    changed, unless ``allow_data_loss`` (the CLI's ``--allow-data-loss``).
    """
    from . import journal as J
    from .journal_state import find_interrupted
    from . import repair_steps as R
    from .repair_space import preflight
    from .undo import resume

    t0 = time.perf_counter()
    root = Path(root).resolve()
    if dry_run:
        cfg = config_for(root, config, conf)
        plan = plan or plan_repair(root, config=cfg, processes=processes, backup=backup)
        return RepairResult(plan, False, None, time.perf_counter() - t0,
                            resumed=find_interrupted(root))
    if backup_dir is not None and backup:
        _outside(root, Path(backup_dir).resolve())  # refused before the lock is taken
    lock_before = J.lock_state(root)
    with ckpt.hold_lock(root):
        # Planned under the lock, so no broker can change the store in between.
        resumed = resume(root, progress=progress)
        cfg = config_for(root, config, conf)
        if config is not None and resumed is not None and resumed.outcome == "undone":
            cfg = _reload(root, config)
        plan = plan_repair(root, config=cfg, processes=processes, backup=backup)
        if not plan.steps:
            return RepairResult(plan, False, None, time.perf_counter() - t0, resumed=resumed)
        if plan.refused and not allow_data_loss:
            raise plan.refusal()
        where = _backup_target(root, backup_dir, resumed) if backup else None
        steps = R.with_abort_steps(plan.steps, ckpt.abort_exists(root))
        ctx = R.StepContext(root, cfg, plan.report, plan.report.dispatched(), clock)
        space = preflight(ctx, steps, where)
        manifest = {"config": cfg, "lock": lock_before, "space": space,
                    "verify": plan.report.summary(),
                    "unfixed": [{"code": f.code, "file": f.file, "why": why} for f, why in plan.unfixed],
                    "steps": [s.as_dict() for s in steps]}
        j = J.Journal.begin(root, where, manifest)
        try:
            _run_steps(j, ctx, steps, where, progress)
        finally:
            j.close()
    return RepairResult(plan, True, str(where) if where else None, time.perf_counter() - t0,
                        resumed=resumed, steps=steps)


def _forget(j, root: Path) -> bool:
    """No step started: the marker can go, the store is as it was."""
    from .journal import remove_marker

    try:
        j.close()
        remove_marker(root)
        return True
    except RmqStoreError:
        return False


def _run_steps(j, ctx, steps: list[Step], where: Path | None, progress) -> None:
    from . import repair_steps as R

    all_items: list[dict] = []
    k, phase, s = 0, "start", None
    try:
        for k, s in enumerate(steps, 1):
            phase = "save to the backup"
            items = j.start(k, s.action, s.path, R.scope(s, ctx))
            phase = "write"
            R.run(s, ctx, items, j)
            phase = "sync"
            j.done(k, items)
            all_items += items
            if progress:
                progress(k, len(steps))
        phase = "finish"
        j.end(all_items)
    except (OSError, RmqStoreError) as e:
        at = f"in repair step {k} of {len(steps)}, {s.action} {s.path or ''}".rstrip() if s \
            else "in the repair"
        if isinstance(e, OSError):
            err: RmqStoreError = StoreIOError(f"cannot {phase} ({e.strerror or e}) {at}",
                                              e.filename or ctx.root / (s.path or ""), errno=e.errno)
        else:
            e.message = f"{e.message} ({at})"
            err = e
        j.failed(k, str(err))
        if k == 1 and phase == "save to the backup" and _forget(j, ctx.root):
            err.message += "; nothing was changed"
        else:
            err.message += ("; the store is mid-repair: fix the cause, then run `rmqstore "
                            "repair` again to finish it" + (f", or `rmqstore restore {where}` "
                                                             "to undo it" if where else ""))
        raise err from None
    except BaseException as e:  # an interrupt or a bug: leave the journal saying so
        j.failed(k, f"{type(e).__name__}: {e}")
        raise
