"""verify, repair and rebuild. verify only reads; repair and rebuild take the store lock.

Exit codes: 0 clean (or done), 1 problems found (verify; repair --dry-run with steps to
take), 2 unusable input, a locked store, or a repair refused without confirmation.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from cli.common import ConfigOption, app, fail, handles_errors, report_config
from cli.output import Output, output_options
from rmqstore.errors import EXIT_OK, EXIT_PROBLEMS, EXIT_UNUSABLE

FINDING_COLUMNS = ("severity", "code", "file", "offset", "explanation")
STEP_COLUMNS = ("action", "path", "offset", "length", "explanation")


def _config(store: Path, config: Optional[Path], *writes: str):
    """The store's settings (:func:`rmqstore.config.load_config`); for a writing command,
    refused first when it cannot run safely (:func:`rmqstore.storekind.require_writable`),
    then the notes and warnings printed."""
    from rmqstore.config import load_config
    from rmqstore.reader import classify
    from rmqstore.storekind import require_writable

    kind = classify(store)
    if kind.kind != "store":
        raise fail(f"{store}: is a {kind.kind}, not a store root")
    cfg = load_config(kind.root, config)
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
    from rmqstore.verify import verify as run

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
    backup: Optional[Path] = typer.Option(None, "--backup", help="Where to save every byte changed (default: STORE.rmqstore-backup-<time>, beside the store)."),
    no_backup: bool = typer.Option(False, "--no-backup", help="Do not save what is changed."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    allow_data_loss: bool = typer.Option(False, "--allow-data-loss", help="Run the plan even where a step would remove CRC-valid records (or the units pointing at them) that lie after a break in the record chain, or cut queues while the CommitLog is missing; refused (exit 2) otherwise."),
    config: Optional[Path] = ConfigOption,
    *, out: Output,
) -> None:
    """Do what a broker's recovery would do, offline: cut the CommitLog after the last valid
    record, fix ConsumeQueues and IndexFiles to match, rewrite the checkpoint, remove abort.

    The steps are printed first. Without --yes it asks on a terminal and refuses (exit 2)
    otherwise. Refuses while a broker holds the store lock, and (exit 2, nothing changed)
    when a step would remove valid data, unless --allow-data-loss. jsonl, csv and tsv: one
    row per step; json: one document with the plan and, after a repair, its result."""
    from rmqstore.checkpoint import is_locked
    from rmqstore.recovery import default_backup_dir, plan_repair, repair as run

    if backup is not None and no_backup:
        raise fail("--backup and --no-backup exclude each other")
    cfg = _config(store, config, "repair")
    if not dry_run and is_locked(cfg.root):
        raise fail(f"{cfg.root / 'lock'}: the store is locked by another process (a running "
                   "broker?); stop it first", EXIT_UNUSABLE)
    plan = plan_repair(cfg.root, config=cfg)
    _show_steps(plan, out)
    if not plan.steps:
        out.line(f"nothing to repair: {plan.store} is consistent")
        raise typer.Exit(EXIT_OK)
    if plan.refused and not allow_data_loss:
        raise plan.refusal()
    if dry_run:
        raise typer.Exit(EXIT_PROBLEMS)
    if not yes:
        if not sys.stdin.isatty():
            raise fail("repair changes the store: pass --yes to confirm (stdin is not a "
                       "terminal, so there is no one to ask)", EXIT_UNUSABLE)
        where = "no backup" if no_backup else f"backup in {backup or default_backup_dir(cfg.root)}"
        out.pause()
        if not typer.confirm(f"Apply {len(plan.steps)} step(s) to {cfg.root} ({where})?",
                             err=True):
            raise fail("not confirmed; nothing changed", EXIT_UNUSABLE)
    result = run(cfg.root, backup_dir=backup, backup=not no_backup, config=cfg,
                 allow_data_loss=allow_data_loss)
    summary = {"store": str(cfg.root), "steps": len(result.plan.steps),
               "executed": result.executed, "backup": result.backup_dir,
               "seconds": round(result.seconds, 3)}
    out.record(summary, key="result", items=False, table=False)
    out.warn(f"repaired {cfg.root}: {summary['steps']} step(s)"
             + (f", backup in {result.backup_dir}" if result.backup_dir else ""))


def _show_steps(plan, out: Output) -> None:
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
    from rmqstore.rebuild import rebuild as run

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
