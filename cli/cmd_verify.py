"""verify, repair, restore and rebuild. verify only reads; the others take the store lock.

Exit codes: 0 clean (or done), 1 problems found (verify; repair --dry-run with steps to
take), 2 unusable input, a locked store, a refused plan or restore, a full disk or an
I/O error (one line naming the file), or a repair refused without confirmation.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from cli.common import ConfigOption, app, fail, handles_errors, report_config
from cli.output import Output, output_options
from rmqstore.errors import EXIT_OK, EXIT_PROBLEMS, EXIT_UNUSABLE, RmqStoreError

FINDING_COLUMNS = ("severity", "code", "file", "offset", "explanation")
STEP_COLUMNS = ("action", "path", "offset", "length", "explanation")


def _root(store: Path) -> Path:
    from rmqstore.reader import classify

    kind = classify(store)
    if kind.kind != "store":
        raise fail(f"{store}: is a {kind.kind}, not a store root")
    return kind.root


def _config(store: Path, config: Optional[Path], *writes: str):
    """The store's settings (:func:`rmqstore.files.config.load_config`); for a writing command,
    refused first when it cannot run safely (:func:`rmqstore.files.storekind.require_writable`),
    then the notes and warnings printed."""
    from rmqstore.files.config import load_config
    from rmqstore.files.storekind import require_writable

    cfg = load_config(_root(store), config)
    for op in writes:
        require_writable(cfg, op)
    report_config(cfg)
    return cfg


def _progress(label: str):
    """A rich progress bar on a terminal, nothing when piped: (callback, context)."""
    if not sys.stderr.isatty():
        return None, _Null()
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    prog = Progress(TextColumn(label), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                    TimeRemainingColumn(), transient=True)
    task = prog.add_task(label, total=1)

    def cb(done: int, total: int) -> None:
        prog.update(task, completed=done, total=max(total, 1))

    return cb, prog


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@app.command()
@handles_errors
@output_options
def verify(
    store: Path = typer.Argument(..., help="The store root."),
    deep: bool = typer.Option(False, "--deep", help="Also look up every key of every message in the IndexFiles, and explain every entry."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Check CommitLog, ConsumeQueues, IndexFiles, checkpoint and abort file; read-only.
    jsonl, csv and tsv: one row per finding; json: the summary and the findings.

    Exit 0: clean (only notes); 1: problems found; 2: not a usable store."""
    from rmqstore.recovery.verify import verify as run

    cfg = _config(store, config)
    cb, ctx = _progress("verify")
    with ctx:
        report = run(cfg.root, deep=deep, config=cfg, progress=cb)
    s = report.summary()
    out.record(s, items=False, table=False)
    out.rows([f.as_dict() for f in report.findings], FINDING_COLUMNS, key="findings",
             prose=("explanation",),
             title=f"{s['store']}: valid up to {s['validUpTo']} ({s['messages']} "
                   f"messages), {s['errors']} error(s), {s['warnings']} warning(s)")
    raise typer.Exit(EXIT_OK if report.ok else EXIT_PROBLEMS)


@app.command()
@handles_errors
@output_options
def repair(
    store: Path = typer.Argument(..., help="The store root."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the steps; change nothing."),
    backup: Optional[Path] = typer.Option(None, "--backup", help="A new directory, outside the store, for every byte changed and the journal (default: STORE.rmqstore-backup-<time>, beside the store)."),
    no_backup: bool = typer.Option(False, "--no-backup", help="Do not save what is changed (no undo; the journal still says what ran)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    allow_data_loss: bool = typer.Option(False, "--allow-data-loss", help="Run the plan even where a step would remove CRC-valid records (or the units pointing at them) that lie after a break in the record chain, cut queues while the CommitLog is missing, or, with --no-backup, delete a file holding CRC-valid records; refused (exit 2) otherwise."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Do what a broker's recovery would do, offline: cut the CommitLog after the last valid
    record, fix ConsumeQueues and IndexFiles to match, rewrite the checkpoint, remove abort.

    The steps are printed first. Without --yes it asks on a terminal and refuses (exit 2)
    otherwise. Refuses while a broker holds the store lock, (exit 2, nothing changed) when
    a step would remove valid data, unless --allow-data-loss, and when the disks lack the
    space the plan needs. Each step is journaled in the backup before it runs: a repair
    cut short (Ctrl-C, kill, full disk) is undone from its backup by the next repair, which
    then plans afresh; `rmqstore restore BACKUP` undoes a repair. jsonl, csv and tsv: one
    row per step; json: one document with the plan and, after a repair, its result."""
    from rmqstore.files.checkpoint import is_locked
    from rmqstore.recovery.journal_state import find_interrupted
    from rmqstore.recovery.repair import default_backup_dir, repair as run
    from rmqstore.recovery.repair_plan import plan_repair

    if backup is not None and no_backup:
        raise fail("--backup and --no-backup exclude each other")
    root = _root(store)
    if not dry_run and is_locked(root):
        raise fail(f"{root / 'lock'}: the store is locked by another process (a running "
                   "broker?); stop it first", EXIT_UNUSABLE)
    found = find_interrupted(root)
    undo_first = found is not None and found.backup is not None and not found.finished
    plan = None
    if found is not None:
        then = ("repair undoes it from its backup first, then plans again" if undo_first
                else "repair plans from the store as it is")
        if dry_run and is_locked(root):
            then = "the store is locked: it may still be running"
        out.warn(f"found {found.describe()}; {then}")
        out.record({"interrupted": found.as_dict()}, items=False, table=False)
    if undo_first:
        # The plan is made after the undo: the files of a half-done repair may mislead,
        # so what they say is only checked here (the library reads them again after).
        try:
            _config(store, config, "repair")
        except RmqStoreError:
            pass
        out.record({"store": str(root)}, items=False, table=False)
    else:
        plan = plan_repair(root, config=_config(store, config, "repair"), backup=not no_backup)
        _show_steps(plan, out)
        if plan.steps and plan.refused and not allow_data_loss:
            raise plan.refusal()
    if dry_run or (found is None and not plan.steps):
        if found is None and not plan.steps:
            out.line(f"nothing to repair: {plan.store} is consistent")
        raise typer.Exit(EXIT_PROBLEMS if dry_run and (found or plan.steps) else EXIT_OK)
    where = None if no_backup else (backup or default_backup_dir(root))
    if not yes:
        if not sys.stdin.isatty():
            raise fail("repair changes the store: pass --yes to confirm (stdin is not a "
                       "terminal, so there is no one to ask)", EXIT_UNUSABLE)
        what = (f"Undo the unfinished repair from {found.backup}, then repair {root} afresh"
                if undo_first else f"Apply {len(plan.steps)} step(s) to {root}")
        out.pause()
        if not typer.confirm(f"{what} ({'no backup' if where is None else f'backup in {where}'})?",
                             err=True):
            raise fail("not confirmed; nothing changed", EXIT_UNUSABLE)
    cb, ctx = _progress("repair")
    try:
        with ctx:
            result = run(root, backup_dir=where, backup=not no_backup, conf=config, progress=cb,
                         config=None if undo_first else _config(store, config),
                         allow_data_loss=allow_data_loss)
    except KeyboardInterrupt:
        raise fail("interrupted: the repair is unfinished; run `rmqstore repair` again to "
                   "finish it" + (f", or `rmqstore restore {where}` to undo it" if where else ""),
                   130) from None
    if undo_first:
        _show_steps(result.plan, out, store=False)  # the plan that ran, made after the undo
    summary = {"store": str(root), "steps": len(result.steps or result.plan.steps),
               "executed": result.executed, "backup": result.backup_dir,
               "seconds": round(result.seconds, 3),
               "resumed": result.resumed.as_dict() if result.resumed is not None else None}
    out.record(summary, key="result", items=False, table=False)
    if result.executed:
        out.warn(f"repaired {root}: {summary['steps']} step(s)"
                 + (f", backup in {result.backup_dir}" if result.backup_dir else ""))
    else:
        out.line(f"nothing to repair: {result.plan.store} is consistent")


def _show_steps(plan, out: Output, store: bool = True) -> None:
    if store:
        out.record({"store": plan.store}, items=False, table=False)
    out.rows([s.as_dict() for s in plan.steps], STEP_COLUMNS, key="steps", table=bool(plan.steps),
             title=f"repair plan for {plan.store}", prose=("explanation",))
    unfixed = [{"code": f.code, "file": f.file, "why": why} for f, why in plan.unfixed]
    out.rows(unfixed, ("code", "file", "why"), key="unfixed", items=False, table=False)
    for u in unfixed:
        out.warn(f"not repaired: {u['code']} {u['file'] or ''}: {u['why']}")
    refused = [{"action": s.action, "path": s.path, "why": why} for s, why in plan.refused]
    out.rows(refused, ("action", "path", "why"), key="refused", items=False, table=False)
    for r in refused:
        out.warn(f"note: needs --allow-data-loss: {r['action']} {r['path']}: {r['why']}")


@app.command()
@handles_errors
@output_options
def restore(
    backup: Path = typer.Argument(..., help="The backup directory a repair made (repair prints it)."),
    store: Optional[Path] = typer.Option(None, "--store", help="The store, if it moved since the repair (default: the one the backup names)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    *, out: Output,
) -> None:
    """Undo a repair: put the store back as it was before it, byte for byte (files the
    repair created removed, moved files back), from the backup it made.

    Takes the store lock. Refuses (exit 2) when the store changed since the repair in a
    way the backup cannot explain (a broker ran, a newer repair), when another repair is
    unfinished, or when the backup was already undone. Run it again if it is cut short."""
    from rmqstore.recovery.journal_state import read_backup
    from rmqstore.recovery.undo import restore as run

    state = read_backup(backup)
    target = store or state.store
    if not yes:
        if not sys.stdin.isatty():
            raise fail("restore changes the store: pass --yes to confirm (stdin is not a "
                       "terminal, so there is no one to ask)", EXIT_UNUSABLE)
        out.pause()
        if not typer.confirm(f"Put {target} back as it was before the repair of "
                             f"{state.manifest.get('created')} (from {backup})?", err=True):
            raise fail("not confirmed; nothing changed", EXIT_UNUSABLE)
    cb, ctx = _progress("restore")
    try:
        with ctx:
            r = run(backup, store=store, progress=cb)
    except KeyboardInterrupt:
        raise fail(f"interrupted: the restore is unfinished; run `rmqstore restore {backup}` "
                   "again to finish it", 130) from None
    out.record({"store": r.store, "backup": r.backup, "stepsUndone": r.steps,
                "seconds": round(r.seconds, 3)}, title="restore")


@app.command()
@handles_errors
@output_options
def rebuild(
    store: Path = typer.Argument(..., help="The store root."),
    consumequeue: bool = typer.Option(False, "--consumequeue", help="Rebuild ConsumeQueues."),
    index: bool = typer.Option(False, "--index", help="Rebuild IndexFiles."),
    from_offset: Optional[int] = typer.Option(None, "--from-offset", min=0, help="Re-dispatch only records at or after this CommitLog offset."),
    allow_data_loss: bool = typer.Option(False, "--allow-data-loss", help="Rebuild even when existing units point at CRC-valid records after a break in the record chain (the rebuilt queues drop them), or the CommitLog holds no valid record; refused (exit 2) otherwise."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Re-dispatch ConsumeQueues and/or IndexFiles from the CommitLog (neither flag: both).

    New files are written beside the old ones and swapped in by rename."""
    from rmqstore.recovery.rebuild import rebuild as run

    if not consumequeue and not index:
        consumequeue = index = True
    cfg = _config(store, config, *(["rebuild --consumequeue"] if consumequeue else []),
                  *(["rebuild --index"] if index else []))
    defaults = [k for k in ("mapped_file_size_consume_queue", "max_hash_slot_num")
                if cfg.sources.get(k) == "default"]
    if defaults and config is None:
        typer.echo("rmqstore: note: ConsumeQueue/IndexFile geometry not found in the store's "
                   "files; using RocketMQ defaults (pass --config broker.conf to choose)", err=True)
    cb, ctx = _progress("rebuild")
    with ctx:
        r = run(cfg.root, consume_queue=consumequeue, index=index, from_offset=from_offset,
                config=cfg, progress=cb, allow_data_loss=allow_data_loss)
    row = {"store": str(cfg.root), "messages": r.messages, "bytes": r.bytes, "units": r.units,
           "indexEntries": r.index_entries, "validUpTo": r.end, "indexFiles": r.index_files,
           "seconds": round(r.seconds, 3)}
    out.record(row, title="rebuild")
