"""Undo a repair from its journal: after an interrupt (the next ``repair`` calls
:func:`resume`) or on request (:func:`restore`, ``rmqstore restore BACKUP``).

Undo restores each started step's scope (:mod:`rmqstore.recovery.journal`), newest step first,
each saved item newest first. Every item's restore is idempotent (a range is rewritten
where it differs, a file replaced by rename, a moved path renamed or copied back, what a
step added removed) and each step's undo is journaled (``undone``), so an undo cut short
anywhere is simply run again: it continues where it stopped.

The next ``repair`` after an interrupted one undoes it from the backup, then plans
afresh; its end state is what one uninterrupted repair of the original store gives,
whatever step was cut short (simpler to prove than finishing a half-done step). Without
a backup there is nothing to undo from: the next repair says what ran and plans from the
store as it is (every step is one a plan makes from damage, so that converges too).

Before undoing, every path a finished step wrote must still be as that step left it
(size and mtime: :func:`~rmqstore.recovery.store_paths.fingerprint`); otherwise something else wrote
to the store since (a broker, a newer repair) and undoing would mix the two, so it is
refused. Undo puts mtimes back too, so backups of successive repairs are restored newest
first, one after the other.
"""

from __future__ import annotations

import errno as _errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import RefusedError
from ..files.repair_marker import MARKER, read_marker
from ..files.sparse import copy_tree, fsync_dir, remove_tree
from .journal import (CHUNK, INTERNAL, JOURNAL, Journal, journal_io_error, pwrite_all, remove_marker,
                      write_marker)
from .journal_state import Interrupted, JournalState, interrupted_from, journal_state_for, read_backup
from .store_paths import confine, describe_fingerprint, fingerprint, is_dir, overlaps


def check_unchanged(root: Path, state: JournalState) -> None:
    """Refuse when a path a finished step wrote is no longer as the step left it."""
    if state.end is not None:
        expected = dict(state.end)
    else:
        expected = {}
        for k in sorted(state.started):
            paths = [it["path"] for it in state.started[k]["items"]]
            for q in [q for q in expected if any(overlaps(q, p) for p in paths)]:
                del expected[q]
            if k in state.done:
                expected.update(state.done[k])
    # An earlier undo that was cut short put back the steps it journaled as undone, and
    # perhaps part of the next one (undo goes newest first): their paths are not checked.
    touched = set(state.undone)
    pending = [k for k in state.started if k not in state.undone]
    if state.undo_why is not None and pending:
        touched.add(max(pending))
    undone_paths = [it["path"] for k in touched for it in state.started[k]["items"]]
    for rel, want in expected.items():
        if any(overlaps(rel, p) for p in undone_paths):
            continue
        have = fingerprint(confine(root, rel))
        if have != want:
            raise RefusedError(
                f"changed since the repair ({'finished' if state.end is not None else 'interrupted'}"
                f" in {state.dir}) left it: now {describe_fingerprint(have)}, then {describe_fingerprint(want)}. "
                "Something else wrote to the store (a broker?); undoing would mix the two, so "
                "nothing was changed. Compare by hand with the backup"
                + (f"; to repair the store as it is now, remove {root / MARKER}"
                   if os.path.lexists(root / MARKER) else ""), root / rel)


def _restore_item(root: Path, jdir: Path, it: dict) -> None:
    _restore_path(root, jdir, it)
    # Directories the step created above its path (a queue under a topic directory that
    # did not exist), innermost first; only while empty, as a later step's may be shared.
    for rel in reversed(it.get("created", [])):
        d = confine(root, rel)
        try:
            os.rmdir(d)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in (_errno.ENOTEMPTY, _errno.EEXIST):
                break
            if e.errno != _errno.ENOTDIR:
                raise
            break
        fsync_dir(d.parent)


def _restore_path(root: Path, jdir: Path, it: dict) -> None:
    p = confine(root, it["path"])
    kind = it["kind"]
    if kind == "entries":
        if not it["exists"]:
            remove_tree(p)
        elif is_dir(root, it["path"]):
            keep = set(it["names"])
            for n in os.listdir(p):
                if n not in keep:
                    remove_tree(p / n)
            fsync_dir(p)
        fsync_dir(p.parent)
        return
    if kind == "move":
        src = jdir / it["saved"]
        remove_tree(src.with_name(src.name + ".partial"))
        if not os.path.lexists(src):
            return  # never moved, or already moved back
        remove_tree(p)  # what the step put there, or what a cross-device removal left
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(src, p)
        except OSError as e:
            if e.errno != _errno.EXDEV:
                raise
            tmp = p.with_name(f".{p.name}.rmqstore-restore")
            remove_tree(tmp)
            copy_tree(src, tmp)
            os.rename(tmp, p)
        fsync_dir(p.parent)
        return
    if kind == "file":
        if not it["exists"]:
            remove_tree(p)
        else:
            tmp = p.with_name(f".{p.name}.rmqstore-restore")
            p.parent.mkdir(parents=True, exist_ok=True)
            remove_tree(tmp)
            copy_tree(jdir / it["saved"], tmp)
            if is_dir(root, it["path"]):
                remove_tree(p)
            os.rename(tmp, p)
        fsync_dir(p.parent)
        return
    if kind == "range":
        try:
            fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise RefusedError("cannot put saved bytes back: the file is gone", p) from None
        try:
            src = os.open(jdir / it["saved"], os.O_RDONLY)
            try:
                off, n = it["offset"], it["length"]
                pos = 0
                while pos < n:
                    want = os.pread(src, min(CHUNK, n - pos), pos)
                    if not want:
                        want = bytes(min(CHUNK, n - pos))  # a short saved file: zeros
                    if os.pread(fd, len(want), off + pos) != want:
                        pwrite_all(fd, want, off + pos)
                    pos += len(want)
            finally:
                os.close(src)
            if os.fstat(fd).st_size != it["size"]:
                os.ftruncate(fd, it["size"])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.utime(p, ns=(os.lstat(p).st_atime_ns, it["mtime_ns"]), follow_symlinks=False)
        return
    raise ValueError(f"unknown saved item kind {kind!r}")


def undo(root: Path, state: JournalState, why: str, progress=None) -> int:
    """Put back every started step's scope, newest first; returns how many steps were
    undone now. Run it again after an interrupt: it continues where it stopped."""
    if not state.backup:
        raise RefusedError("the repair ran with --no-backup: there is nothing to undo from",
                           state.dir)
    todo = [k for k in sorted(state.started, reverse=True) if k not in state.undone]
    j = Journal(root, state.dir, True)
    try:
        j._fd = os.open(state.dir / JOURNAL, os.O_WRONLY | os.O_APPEND)
    except OSError as e:
        raise journal_io_error("open the repair journal", state.dir / JOURNAL, e) from None
    try:
        j.record("undo", why=why)
        for i, k in enumerate(todo):
            try:
                for it in reversed(state.started[k]["items"]):
                    _restore_item(root, state.dir, it)
            except OSError as e:
                raise journal_io_error(f"put back what step {k} changed", state.dir, e) from None
            j.record("undone", step=k)
            state.undone.add(k)
            if progress:
                progress(i + 1, len(todo))
        after = {it["path"]: fingerprint(root / it["path"]) for it in state.items
                 if it["kind"] != "entries"}
        j.record("undo-end", after=after)
        state.undo_ended, state.undo_after = True, after
    finally:
        j.close()
    return len(todo)


def resume(root: Path, *, progress=None) -> Interrupted | None:
    """Under the store lock, before a repair plans: deal with an unfinished one.

    With a backup it is undone (an interrupted restore is finished), so the store is
    as before it; without one, or when every step had finished, only its marker goes.
    Returns what was found (``outcome`` says what was done), or None."""
    marker = read_marker(root)
    if marker is None:
        _clean_leftovers(root)
        return None
    state = journal_state_for(root, marker)
    info = interrupted_from(marker, state)
    if state.undo_ended:
        info.outcome = "undone"
    elif state.end is not None and state.undo_why is None:
        info.outcome = "completed"
    elif not state.backup:
        info.outcome = "replanned"
    else:
        check_unchanged(root, state)
        undo(root, state, "interrupted" if state.undo_why is None else state.undo_why, progress)
        info.outcome = "undone"
    remove_marker(root)
    if not state.backup and state.dir == root / INTERNAL:
        remove_tree(state.dir)
    return info


def _clean_leftovers(root: Path) -> None:
    """With no marker: what a run killed before writing it (its temporary file) or after
    removing it (a no-backup journal) left in the store."""
    try:
        remove_tree(root / (MARKER + ".tmp"))
        remove_tree(root / INTERNAL)
    except OSError as e:
        raise journal_io_error("remove a leftover of an earlier repair", root, e) from None


@dataclass
class RestoreResult:
    store: str
    backup: str
    steps: int  # steps whose changes were put back
    seconds: float
    resumed: bool  # an interrupted restore (or repair) of this backup was continued


def restore(backup_dir: str | os.PathLike, *, store: str | os.PathLike | None = None,
            progress=None) -> RestoreResult:
    """Put the store back as it was before the repair that made ``backup_dir``: byte for
    byte, files the repair created removed, moved files back, mtimes as they were.

    Takes the store lock. Refuses when another repair of the store is unfinished, when
    the backup was already undone, or when the store changed since the repair in a way
    the backup cannot explain."""
    from ..files.checkpoint import hold_lock

    t0 = time.perf_counter()
    jdir = Path(backup_dir).resolve()
    state = read_backup(jdir)
    if not state.backup:
        raise RefusedError("this journal belongs to a repair run with --no-backup: there is "
                           "nothing to restore from", jdir)
    root = Path(store if store is not None else state.store).resolve()
    if not root.is_dir():
        raise RefusedError("the store this backup was made from is not there (pass the "
                           "store's new path if it moved)", root)
    with hold_lock(root):
        marker = read_marker(root)
        resumed = marker is not None
        if marker is None:
            _clean_leftovers(root)
        if marker is not None and Path(marker["journal"]).resolve() != jdir:
            raise RefusedError(f"another rmqstore {marker.get('operation', 'repair')} of this "
                               f"store did not finish (journal {marker['journal']}): run "
                               f"`rmqstore repair` to finish it, or restore {marker['journal']} "
                               "first", root / MARKER)
        if state.undo_ended:
            # Undone already (cut short after that, perhaps): nothing to do if the store
            # is still as the undo left it, that is as before the repair.
            now = {rel: fingerprint(confine(root, rel)) for rel in state.undo_after or {}}
            if marker is None and now != state.undo_after:
                raise RefusedError("this repair was undone already (by a restore, or by the "
                                   "next repair after an interrupt), and the store changed "
                                   "since: nothing to restore", jdir)
            _restore_lock(root, state.manifest.get("lock") or {})
            remove_marker(root)
            return RestoreResult(str(root), str(jdir), 0, time.perf_counter() - t0, True)
        if marker is None and not state.started:
            # It stopped before its first step (the marker goes in before): nothing
            # changed but, perhaps, the lock file it created.
            _restore_lock(root, state.manifest.get("lock") or {})
            return RestoreResult(str(root), str(jdir), 0, time.perf_counter() - t0, False)
        check_unchanged(root, state)
        if marker is None:
            write_marker(root, jdir, "restore")
        n = undo(root, state, "restore", progress)
        _restore_lock(root, state.manifest.get("lock") or {})
        remove_marker(root)
    return RestoreResult(str(root), str(jdir), n, time.perf_counter() - t0, resumed)


def _restore_lock(root: Path, before: dict) -> None:
    p = root / "lock"
    if before.get("exists") is False:
        try:
            os.unlink(p)  # we hold it; unlinking while locked is fine, close drops it
        except FileNotFoundError:
            pass
    elif before.get("data") is not None:
        data = bytes.fromhex(before["data"])
        fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW)
        try:
            if os.pread(fd, len(data) + 1, 0) != data:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                os.fsync(fd)
        finally:
            os.close(fd)
