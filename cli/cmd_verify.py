"""verify, repair and rebuild. verify only reads; repair and rebuild take the store lock.

Exit codes: 0 clean (or done), 1 problems found (verify; repair --dry-run with steps to
take), 2 unusable input, a locked store, or a repair refused without confirmation.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from cli import render
from cli.common import ConfigOption, Format, FormatOption, app, fail, handles_errors, resolve_format
from rmqstore.errors import EXIT_OK, EXIT_PROBLEMS, EXIT_UNUSABLE

FINDING_COLUMNS = ("severity", "code", "file", "offset", "explanation")
STEP_COLUMNS = ("action", "path", "offset", "length", "explanation")


def _config(store: Path, config: Optional[Path]):
    from rmqstore.config import load_config
    from rmqstore.reader import classify

    kind = classify(store)
    if kind.kind != "store":
        raise fail(f"{store}: is a {kind.kind}, not a store root")
    return load_config(kind.root, config)


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
def verify(
    store: Path = typer.Argument(..., help="The store root."),
    deep: bool = typer.Option(False, "--deep", help="Also look up every key of every message in the IndexFiles, and explain every entry."),
    fmt: Optional[Format] = FormatOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Check CommitLog, ConsumeQueues, IndexFiles, checkpoint and abort file; read-only.

    Exit 0: clean (only notes); 1: problems found; 2: not a usable store."""
    from rmqstore.verify import verify as run

    out = resolve_format(fmt)
    cfg = _config(store, config)
    cb, ctx = _progress("verify")
    with ctx:
        report = run(cfg.root, deep=deep, config=cfg, progress=cb)
    rows = [f.as_dict() for f in report.findings]
    if out is Format.json:
        render.write_json({**report.summary(), "findings": rows})
    elif out is Format.jsonl:
        render.write_jsonl(rows)
    else:
        s = report.summary()
        render.write_rows(rows, out, FINDING_COLUMNS,
                          title=f"{s['store']}: valid up to {s['validUpTo']} ({s['messages']} "
                                f"messages), {s['errors']} error(s), {s['warnings']} warning(s)")
    raise typer.Exit(EXIT_OK if report.ok else EXIT_PROBLEMS)


@app.command()
@handles_errors
def repair(
    store: Path = typer.Argument(..., help="The store root."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the steps; change nothing."),
    backup: Optional[Path] = typer.Option(None, "--backup", help="Where to save every byte changed (default: STORE.rmqstore-backup-<time>, beside the store)."),
    no_backup: bool = typer.Option(False, "--no-backup", help="Do not save what is changed."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    allow_data_loss: bool = typer.Option(False, "--allow-data-loss", help="Run the plan even where a step would remove CRC-valid records (or the units pointing at them) that lie after a break in the record chain, or cut queues while the CommitLog is missing; refused (exit 2) otherwise."),
    fmt: Optional[Format] = FormatOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Do what a broker's recovery would do, offline: cut the CommitLog after the last valid
    record, fix ConsumeQueues and IndexFiles to match, rewrite the checkpoint, remove abort.

    The steps are printed first. Without --yes it asks on a terminal and refuses (exit 2)
    otherwise. Refuses while a broker holds the store lock, and (exit 2, nothing changed)
    when a step would remove valid data, unless --allow-data-loss."""
    from rmqstore.checkpoint import is_locked
    from rmqstore.recovery import default_backup_dir, plan_repair, repair as run

    if backup is not None and no_backup:
        raise fail("--backup and --no-backup exclude each other")
    out = resolve_format(fmt)
    cfg = _config(store, config)
    if not dry_run and is_locked(cfg.root):
        raise fail(f"{cfg.root / 'lock'}: the store is locked by another process (a running "
                   "broker?); stop it first", EXIT_UNUSABLE)
    plan = plan_repair(cfg.root, config=cfg)
    _show_steps(plan, out)
    if not plan.steps:
        if out is Format.table:
            typer.echo(f"nothing to repair: {plan.store} is consistent")
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
        if not typer.confirm(f"Apply {len(plan.steps)} step(s) to {cfg.root} ({where})?",
                             err=True):
            raise fail("not confirmed; nothing changed", EXIT_UNUSABLE)
    result = run(cfg.root, backup_dir=backup, backup=not no_backup, config=cfg,
                 allow_data_loss=allow_data_loss)
    summary = {"store": str(cfg.root), "steps": len(result.plan.steps),
               "executed": result.executed, "backup": result.backup_dir,
               "seconds": round(result.seconds, 3)}
    if out is Format.table:
        typer.echo(f"repaired {cfg.root}: {summary['steps']} step(s)"
                   + (f", backup in {result.backup_dir}" if result.backup_dir else ""), err=True)
    else:
        render.write_jsonl([{"result": summary}]) if out is Format.jsonl else render.write_json(summary)


def _show_steps(plan, out: Format) -> None:
    rows = [s.as_dict() for s in plan.steps]
    if out is Format.jsonl:
        render.write_jsonl(rows)
    elif out is Format.json:
        render.write_json({"store": plan.store, "steps": rows,
                           "unfixed": [{"code": f.code, "file": f.file, "why": why}
                                       for f, why in plan.unfixed],
                           "refused": [{"action": s.action, "path": s.path, "why": why}
                                       for s, why in plan.refused]})
    elif rows:
        render.write_rows(rows, out, STEP_COLUMNS, title=f"repair plan for {plan.store}")
        for f, why in plan.unfixed:
            typer.echo(f"not repaired: {f.code} {f.file or ''}: {why}", err=True)
        for s, why in plan.refused:
            typer.echo(f"needs --allow-data-loss: {s.action} {s.path}: {why}", err=True)


@app.command()
@handles_errors
def rebuild(
    store: Path = typer.Argument(..., help="The store root."),
    consumequeue: bool = typer.Option(False, "--consumequeue", help="Rebuild ConsumeQueues."),
    index: bool = typer.Option(False, "--index", help="Rebuild IndexFiles."),
    from_offset: Optional[int] = typer.Option(None, "--from-offset", min=0, help="Re-dispatch only records at or after this CommitLog offset."),
    allow_data_loss: bool = typer.Option(False, "--allow-data-loss", help="Rebuild even when existing units point at CRC-valid records after a break in the record chain (the rebuilt queues drop them), or the CommitLog holds no valid record; refused (exit 2) otherwise."),
    fmt: Optional[Format] = FormatOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Re-dispatch ConsumeQueues and/or IndexFiles from the CommitLog (neither flag: both).

    New files are written beside the old ones and swapped in by rename."""
    from rmqstore.rebuild import rebuild as run

    out = resolve_format(fmt)
    cfg = _config(store, config)
    if not consumequeue and not index:
        consumequeue = index = True
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
    render.write_kv(row, out, title="rebuild")
