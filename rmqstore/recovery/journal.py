"""The journal and backup of a repair, so that it can be finished after an interrupt and
undone afterwards (``rmqstore restore``).

Every repair step declares its *scope* before it runs, as requests:

- ``("range", rel, offset, length)``: bytes of a file it rewrites, or the size it extends
  the file to;
- ``("file", rel)``: a whole file it rewrites or creates;
- ``("move", rel)``: a file or directory it takes out of the store (into the backup);
- ``("entries", rel)``: a directory it adds entries to.

:meth:`Journal.start` saves the prior state of the whole scope into the journal
directory (ranges with the file's size and mtime, whole files copied sparsely or noted
"absent", the names a directory held), fsyncs it, then appends an fsync'd ``start``
record; only then does the step change the store, and a ``done`` record follows. A move
is the step's own first action (:meth:`Journal.move`): a rename into the backup on the
same filesystem, else a sparse copy, fsync'd and renamed to its final name, before the
original is removed.

The journal directory is the backup directory; with ``--no-backup`` it is a small one
inside the store, ``.rmqstore-repair.d``, that saves no data and goes at the end:

- ``manifest.json``: written once, before any change: format, rmqstore version, store,
  pid, host, time, the configuration used, whether there is a backup, the lock file's
  prior state, and every step to run (the plan plus the implicit ``create-abort`` /
  ``remove-abort``), numbered from 1;
- ``journal.jsonl``: one JSON object a line, each written whole and fsync'd::

      {"event": "begin"}
      {"event": "start", "step": k, "action": a, "path": p, "items": [...]}
      {"event": "done", "step": k, "after": {path: fingerprint}}
      {"event": "end", "after": {path: fingerprint}}   every step done, abort removed
      {"event": "failed", "step": k, "error": "..."}
      {"event": "undo", "why": "interrupted" | "restore"}
      {"event": "undone", "step": k}
      {"event": "undo-end", "after": {path: fingerprint}}   the store as before

- saved data at the store's own paths: whole files and moved paths as ``rel``, ranges as
  ``rel.<start>-<end>.bin`` (a ``~k`` suffix when a name is taken).

While a repair or a restore runs, ``STORE/.rmqstore-repair`` (JSON: journal directory,
operation, pid, host, start time) tells the next run that one did not finish.

The rule: a step whose ``start`` record is in the journal may have changed anything in
its scope, and the backup holds all of that scope's prior state; a step without one has
changed nothing. :mod:`rmqstore.recovery.undo` builds on it (resume, restore);
:mod:`rmqstore.recovery.journal_state` reads a journal back, and
:mod:`rmqstore.recovery.store_paths` keeps every path it saves inside the store.
"""

from __future__ import annotations

import errno as _errno
import json
import os
import socket
import stat
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

from .. import __version__
from ..errors import RmqStoreError, StoreIOError
from ..files.repair_marker import MARKER
from ..files.sparse import copy_range, copy_tree, fsync_dir, fsync_tree, remove_tree
from .store_paths import confine, fingerprint, is_dir, missing_parents

FORMAT = "rmqstore-repair-journal/1"
INTERNAL = ".rmqstore-repair.d"
MANIFEST = "manifest.json"
JOURNAL = "journal.jsonl"
_RESERVED = {MANIFEST, JOURNAL}
CHUNK = 1 << 20


def journal_io_error(op: str, path, e: OSError) -> StoreIOError:
    return StoreIOError(f"cannot {op}: {e.strerror or e}", e.filename or path, errno=e.errno)


# --- the marker ----------------------------------------------------------------------------


def write_marker(root: Path, jdir: Path, operation: str) -> None:
    doc = {"format": FORMAT, "journal": str(jdir), "operation": operation, "pid": os.getpid(),
           "host": socket.gethostname(), "started": _now()}
    tmp = root / (MARKER + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            _write_all(fd, (json.dumps(doc) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, root / MARKER)
        fsync_dir(root)
    except OSError as e:
        raise journal_io_error("write the repair marker", root / MARKER, e) from None


def remove_marker(root: Path) -> None:
    try:
        os.unlink(Path(root) / MARKER)
        fsync_dir(root)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise journal_io_error("remove the repair marker", Path(root) / MARKER, e) from None


# --- the journal as written ----------------------------------------------------------------


def abandoned_begin(jdir: Path, root: Path) -> bool:
    """Is ``jdir`` what a repair of ``root`` left when it was killed before its marker was
    in the store (only our manifest and a journal with no step started)? Nothing in the
    store was changed then, so the directory may be used again."""
    try:
        names = set(os.listdir(jdir))
    except OSError:
        return False
    if not names <= {MANIFEST, JOURNAL, MANIFEST + ".tmp"} or os.path.lexists(root / MARKER):
        return False
    if MANIFEST in names:
        try:
            with open(jdir / MANIFEST, "rb") as f:
                raw = f.read()
        except OSError:
            return False
        try:
            doc = json.loads(raw)
            ours = isinstance(doc, dict) and doc.get("store") == str(root)
        except ValueError:
            # Killed while writing it: empty, or the start of what :meth:`Journal.begin`
            # writes (its first key is the format).
            head = ('{\n  "format": ' + json.dumps(FORMAT)).encode()
            ours = raw[:len(head)] == head[:len(raw)]
        if not ours:
            return False
    try:
        with open(jdir / JOURNAL, "rb") as f:
            events = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        events = ""
    except OSError:
        return False
    return '"start"' not in events


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pwrite_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _json_safe(v):
    if is_dataclass(v):
        v = asdict(v)
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def lock_state(root: Path) -> dict:
    """The lock file before a repair takes it (restore puts it back)."""
    p = Path(root) / "lock"
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return {"exists": False}
    if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
        return {"exists": True}
    with open(p, "rb") as f:
        return {"exists": True, "data": f.read().hex()}


class Journal:
    """One running repair's journal (see the module docstring)."""

    def __init__(self, root: Path, jdir: Path, backup: bool):
        self.root, self.dir, self.backup = root, jdir, backup
        self._fd: int | None = None
        self._taken: set[str] = set(_RESERVED)
        self._broken = False

    @classmethod
    def begin(cls, root: Path, backup_dir: Path | None, manifest: dict) -> "Journal":
        """Create the journal directory and manifest, then the marker in the store."""
        jdir = backup_dir if backup_dir is not None else root / INTERNAL
        j = cls(root, jdir, backup_dir is not None)
        try:
            if backup_dir is None:
                remove_tree(jdir)  # a leftover of a run killed after its marker went
            jdir.parent.mkdir(parents=True, exist_ok=True)
            try:
                jdir.mkdir()
            except FileExistsError:
                if not jdir.is_dir() or jdir.is_symlink() or any(jdir.iterdir()):
                    raise
            doc = {"format": FORMAT, "rmqstore": __version__, "store": str(root),
                   "created": _now(), "pid": os.getpid(), "host": socket.gethostname(),
                   "backup": j.backup, **_json_safe(manifest)}
            fd = os.open(jdir / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, json.dumps(doc, indent=2).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            j._fd = os.open(jdir / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fsync_dir(jdir)
            fsync_dir(jdir.parent)
        except OSError as e:
            j.close()
            raise journal_io_error("create the repair journal", jdir, e) from None
        j.record("begin")
        write_marker(root, jdir, "repair")
        return j

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def record(self, event: str, **data) -> None:
        if self._broken or self._fd is None:
            raise StoreIOError("the repair journal could not be written before", self.dir / JOURNAL)
        line = json.dumps({"event": event, "t": _now(), **data}, separators=(",", ":")) + "\n"
        try:
            _write_all(self._fd, line.encode())
            os.fsync(self._fd)
        except OSError as e:
            self._broken = True  # a torn line must stay the last one
            raise journal_io_error("append to the repair journal", self.dir / JOURNAL, e) from None

    # --- saving a scope ----------------------------------------------------------------

    def _name(self, rel: str, k: int) -> str:
        name, i = rel, 0
        while (name in self._taken or name + ".partial" in self._taken
               or os.path.lexists(self.dir / name) or name.split("/")[0] in _RESERVED):
            i += 1
            name = f"{rel}~{k}" + (f".{i}" if i > 1 else "")
        self._taken.add(name)
        return name

    def _mkparents(self, name: str) -> Path:
        dst = self.dir / name
        made = []
        p = dst.parent
        while not p.exists():
            made.append(p)
            p = p.parent
        dst.parent.mkdir(parents=True, exist_ok=True)
        for d in reversed(made):
            fsync_dir(d.parent)
        return dst

    def _save(self, k: int, req: tuple) -> dict:
        kind, rel = req[0], req[1]
        p = confine(self.root, rel)
        if kind == "range":
            offset, length = int(req[2]), int(req[3])
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                item = {"kind": kind, "path": rel, "offset": offset, "size": st.st_size,
                        "mtime_ns": st.st_mtime_ns,
                        "length": max(0, min(offset + length, st.st_size) - offset)}
                if self.backup:
                    name = self._name(f"{rel}.{offset}-{offset + item['length']}.bin", k)
                    dst = self._mkparents(name)
                    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    try:
                        copy_range(fd, out, offset, item["length"])
                        os.ftruncate(out, item["length"])
                        os.fsync(out)
                    finally:
                        os.close(out)
                    item["saved"] = name
            finally:
                os.close(fd)
            return item
        if kind == "file":
            item = {"kind": kind, "path": rel, "exists": os.path.lexists(p),
                    "created": missing_parents(self.root, rel)}
            if self.backup and item["exists"]:
                name = self._name(rel, k)
                copy_tree(p, self._mkparents(name))
                item["saved"] = name
            return item
        if kind == "move":
            item = {"kind": kind, "path": rel, "saved": None}
            if self.backup:
                item["saved"] = self._name(rel, k)
            return item
        if kind == "entries":
            exists = is_dir(self.root, rel)
            return {"kind": kind, "path": rel, "exists": exists,
                    "names": sorted(os.listdir(p)) if exists else [],
                    "created": missing_parents(self.root, rel)}
        raise ValueError(f"unknown scope kind {kind!r}")

    def start(self, k: int, action: str, path: str | None, requests: list[tuple]) -> list[dict]:
        """Save the prior state of step ``k``'s scope, fsync it, journal ``start``."""
        items = []
        try:
            for req in requests:
                items.append(self._save(k, req))
            for it in items:
                if it.get("saved") and it["kind"] != "move":
                    fsync_dir((self.dir / it["saved"]).parent)
        except OSError as e:
            raise journal_io_error("save to the backup", self.dir, e) from None
        self.record("start", step=k, action=action, path=path, items=items)
        return items

    def move(self, item: dict) -> None:
        """Take ``item['path']`` out of the store: into the backup (rename when it can),
        or deleted without a backup."""
        src = confine(self.root, item["path"])
        if not os.path.lexists(src):
            return
        name = item.get("saved")
        if name is None:
            remove_tree(src)
            fsync_dir(src.parent)
            return
        dst = self._mkparents(name)
        try:
            os.rename(src, dst)
        except OSError as e:
            if e.errno != _errno.EXDEV:
                raise
            part = dst.with_name(dst.name + ".partial")
            remove_tree(part)
            copy_tree(src, part)
            os.rename(part, dst)
            fsync_dir(dst.parent)
            remove_tree(src)
        fsync_dir(dst.parent)
        fsync_dir(src.parent)

    def done(self, k: int, items: list[dict]) -> None:
        """fsync what step ``k`` wrote, then journal ``done`` with the fingerprints."""
        after = {}
        for it in items:
            p = self.root / it["path"]
            if os.path.lexists(p):
                fsync_tree(p)
            if os.path.lexists(p.parent):
                fsync_dir(p.parent)
            if it["kind"] != "entries":
                after[it["path"]] = fingerprint(p)
        self.record("done", step=k, after=after)

    def end(self, all_items: list[dict]) -> None:
        """Every step done: journal ``end`` (final fingerprints), remove the marker."""
        after = {it["path"]: fingerprint(self.root / it["path"])
                 for it in all_items if it["kind"] != "entries"}
        self.record("end", after=after)
        self.close()
        remove_marker(self.root)
        if not self.backup:
            remove_tree(self.dir)
            fsync_dir(self.root)

    def failed(self, k: int, error: str) -> None:
        """Best effort: the journal may be what failed."""
        try:
            self.record("failed", step=k, error=error)
        except RmqStoreError:
            pass
