"""The evidence a writing command needs before it removes anything.

Repair and rebuild treat the CommitLog as ending where verify's walk of the record chain
stops (the verified end, spec §10.5): what lies after it is cut, moved away, and no
ConsumeQueue unit may point there. That is what a broker's recovery does after a torn
write. But the chain can also stop *before* valid data: a truncated or stray middle
segment, a missing segment, one flipped TOTALSIZE bit. The records after such a break are
intact (RocketMQ itself refuses to load such a CommitLog rather than drop them), so a plan
that would remove them, or the units pointing at them, exceeds what the damage justifies.

:func:`rmqstore.scan.survivors.find_survivors` finds them; here are the rules that weigh
them (:func:`unit_loss`, :func:`refused_error`). The plans that use them are in
:mod:`rmqstore.recovery.repair_refusals` and :mod:`rmqstore.recovery.rebuild`; each
refusal names :data:`OVERRIDE`, the one flag that lets the plan run anyway.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RefusedError
from ..files.segments import SegmentQueue
from ..scan.survivors import Survivors

#: The override, in the library (``allow_data_loss=True``) and the CLI.
OVERRIDE = "--allow-data-loss"


def uncovered(queue: SegmentQueue, offsets: np.ndarray) -> np.ndarray:
    """Which ``offsets`` no segment file's range ``[start, start + segment size)`` holds:
    units pointing there point at files that are not on disk."""
    offsets = np.asarray(offsets, np.int64)
    if not queue.segments:
        return np.ones(len(offsets), bool)
    starts = np.array([s.start for s in queue.segments], np.int64)
    i = np.searchsorted(starts, offsets, side="right") - 1
    ok = i >= 0
    ok[ok] = offsets[ok] < starts[i[ok]] + queue.segment_size
    return ~ok


def units_from(qdir: Path, file_size: int, phy: int) -> tuple[np.ndarray, np.ndarray]:
    """(queue offsets, CommitLog offsets) of a queue's real units pointing at or past
    ``phy`` (placeholders left out), as the broker's load reads the queue."""
    from ..format import layout as L
    from ..files.consumequeue import ConsumeQueue

    with ConsumeQueue(qdir, file_size) as cq:
        u = cq.units
        off = u["commit_log_offset"].astype(np.int64)
        real = ~((u["size"] == L.CQ_PLACEHOLDER_SIZE) & (off == 0)) & (off >= phy)
        qo = cq.base_offset + np.flatnonzero(real)
        return qo.astype(np.int64), off[real]


def unit_loss(queue: SegmentQueue, survivors: Survivors, offsets: np.ndarray,
              end: int) -> str | None:
    """Why dropping units pointing at ``offsets`` (all at or past ``end``) would lose
    more than the damage justifies, or None."""
    if not len(offsets):
        return None
    hit = survivors.hit(offsets)
    if hit.any():
        return (f"{int(hit.sum())} of these units point at CRC-valid records after the "
                f"end of valid data {end} (first at CommitLog offset "
                f"{int(np.asarray(offsets)[hit][0])}): the CommitLog chain breaks before "
                "them, but they are intact")
    if not any(s.file_size for s in queue.segments):
        return ("the CommitLog has no segment with any byte in it (missing or empty "
                "commitlog/, or a wrong path?), so nothing shows these units are wrong")
    gone = uncovered(queue, offsets)
    if gone.any():
        return (f"{int(gone.sum())} of these units point at CommitLog offsets no segment "
                f"file holds (first {int(np.asarray(offsets)[gone][0])}): the files may be "
                "missing rather than the units wrong")
    return None


def refused_error(what: str, reasons: list[str]) -> RefusedError:
    """One line: what is refused, the first reason, and the override."""
    n = f"{len(reasons)} steps would remove valid data or act without evidence; first: " \
        if len(reasons) > 1 else ""
    return RefusedError(f"{what} refused: {n}{reasons[0]}. Restore the damaged files if you "
                        f"can; pass {OVERRIDE} to accept losing this data")
