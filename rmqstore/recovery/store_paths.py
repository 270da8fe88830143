"""Paths inside a store that a repair or restore writes: confined to the store (never
through a symbolic link but a top-level one, never out of it), and fingerprinted so a later
run can tell whether something else changed them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import UnsafePathError


#: Top-level directories that may be symbolic links to other disks (the rule of
#: :mod:`rmqstore.files.listing`): read through, and written inside where they lead.
LINKABLE = ("commitlog", "consumequeue", "index")


def is_dir(root: Path, rel: str) -> bool:
    """A directory of the store: a real one, or a top-level link to one."""
    p = root / rel
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return True
    return stat.S_ISLNK(st.st_mode) and rel in LINKABLE and os.path.isdir(p)


def confine(root: Path, rel: str) -> Path:
    """``root / rel`` when ``rel`` is a plain relative path whose directories inside the
    store are real directories (no ``..``, no symbolic link but a top-level one of
    :data:`LINKABLE`): writes never leave the store."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        raise UnsafePathError(f"not a path inside the store: {rel!r}", root)
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"not a plain path inside the store: {rel!r}", root)
    for i in range(1, len(parts)):
        if not is_dir(root, "/".join(parts[:i])):
            if not os.path.lexists(root.joinpath(*parts[:i])):
                break
            raise UnsafePathError("a symbolic link or a file where a directory is expected: "
                                  "repair does not write through it", root.joinpath(*parts[:i]))
    return root / rel


def missing_parents(root: Path, rel: str) -> list[str]:
    """The directories above ``rel`` that do not exist yet, outermost first: a step that
    creates ``rel`` creates them too, and undoing it removes them again."""
    parts = rel.split("/")[:-1]
    for i in range(len(parts)):
        if not os.path.lexists(root.joinpath(*parts[:i + 1])):
            return ["/".join(parts[:j + 1]) for j in range(i, len(parts))]
    return []


def fingerprint(path: Path):
    """What a path is now, cheaply: None (absent), [size, mtime_ns] (a file),
    ["->", target] (a link), or {name: fingerprint} (a directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ["->", os.readlink(path)]
    if stat.S_ISDIR(st.st_mode):
        return {n: fingerprint(path / n) for n in sorted(os.listdir(path))}
    return [st.st_size, st.st_mtime_ns]


def describe_fingerprint(fp) -> str:
    if fp is None:
        return "absent"
    if isinstance(fp, dict):
        return f"a directory of {len(fp)} entr(y/ies)"
    if fp and fp[0] == "->":
        return f"a symlink to {fp[1]!r}"
    return f"{fp[0]} bytes, mtime {fp[1] / 1e9:.3f}"


def overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")

