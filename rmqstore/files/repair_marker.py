"""``STORE/.rmqstore-repair``: the marker a repair or restore leaves in the store while it
runs (JSON: journal directory, operation, pid, host, start time), so that the next run,
and every other writer, knows one did not finish. :mod:`rmqstore.recovery.journal` writes
and removes it; here it is read, by anyone who must not write over an unfinished repair.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import RefusedError

MARKER = ".rmqstore-repair"
_MARKER_MAX = 1 << 16


def read_marker(root: Path) -> dict | None:
    """The marker of an unfinished repair or restore, or None."""
    p = Path(root) / MARKER
    if not os.path.lexists(p):
        return None
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            doc = json.loads(os.read(fd, _MARKER_MAX))
        finally:
            os.close(fd)
        if not isinstance(doc, dict) or not isinstance(doc.get("journal"), str):
            raise ValueError("no journal named")
    except (OSError, ValueError) as e:
        raise RefusedError(f"unreadable marker of an unfinished rmqstore repair ({e}); look for "
                           "its backup beside the store, then remove this file to repair from "
                           "the store as it is", p) from None
    return doc


def refuse_if_unfinished(root: str | os.PathLike, command: str) -> None:
    """For writers other than repair and restore (under the store lock): a half-done
    repair must be finished or undone first, or its undo would mix with their writes."""
    marker = read_marker(Path(root))
    if marker is not None:
        raise RefusedError(f"an rmqstore {marker.get('operation', 'repair')} of this store did "
                           f"not finish (journal {marker['journal']}); {command} would change "
                           "what it may still undo: run `rmqstore repair` to finish it first",
                           Path(root) / MARKER)
