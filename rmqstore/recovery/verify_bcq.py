"""RocketMQ 5.x queue checks for :func:`rmqstore.recovery.verify.verify` (design-14 §4, §5):
each BatchConsumeQueue against the units dispatch writes for its topic's valid records, and
the LMQ units added to what the ConsumeQueue checks (:mod:`rmqstore.recovery.verify_cq`)
expect, so ``consumequeue/%LMQ%*`` is checked like any queue.

Call :func:`check_5x_queues` after :func:`~rmqstore.scan.per_queue.dispatched` and before
the ConsumeQueue checks: it moves BatchCQ topics' units out of the dispatch data and adds
the LMQ ones. A store with neither is left alone at the cost of two directory listings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RmqStoreError
from ..files.batchconsumequeue import (FOLDER, UNIT, BatchConsumeQueue, bcq_file_size,
                                       list_batch_queues)
from ..files.commitlog import CommitLog
from ..format import layout as L
from ..scan.dispatch_5x import Variants, apply_5x, store_queue_kinds

_FIELDS = ("commit_log_offset", "size", "tags_code", "store_timestamp", "msg_base_offset",
           "batch_size", "compacted_offset", "reserved")


def check_5x_queues(c, root: Path, cfg, scan, d, q, read_at=None) -> Variants | None:
    """Check the BatchConsumeQueues, add the LMQ units to ``d`` (see the module); the
    :class:`~rmqstore.scan.dispatch_5x.Variants` found, or None for a store without them.
    ``q`` gives the CommitLog's ``min_offset``; ``read_at(offset)`` the record there (by
    default read through ``q``'s segments; a DLedger log passes its own)."""
    kinds = store_queue_kinds(root, cfg, scan)
    listing = list_batch_queues(root)
    if not kinds.any and not listing.queues and not listing.problems:
        return None
    v = apply_5x(d, kinds, read_at or CommitLog(cfg, queue=q).read_at)
    for off, why in v.bcq_skipped:
        c.add("bcq-skipped", None, off, why)
    for off, why in v.lmq_problems[:20]:
        c.add("lmq-dispatch", None, off, f"the record at CommitLog offset {off}: {why}; "
              "RocketMQ's dispatch throws or skips there (design-14 §5.2)")
    for p in listing.problems:
        c.add(p.code if p.code in ("symlink", "special-file") else "stray-file", p.path, None,
              f"{p.detail} (under {FOLDER}/)")
    try:
        size = bcq_file_size(cfg)
    except RmqStoreError as e:
        c.add("bcq-segment", root / FOLDER, None, e.message)
        return v
    refs = {(r.topic, r.queue_id): r for r in listing.queues}
    for key in sorted(set(refs) | set(v.bcq)):
        exp = v.bcq.get(key, np.zeros(0, L.BCQ_UNIT_DTYPE))
        if key not in refs:
            _missing(c, root / FOLDER / key[0] / str(key[1]), key, exp, 0)
            continue
        try:
            bcq = BatchConsumeQueue(refs[key].path, size)
        except RmqStoreError as e:
            c.add("bcq-segment", refs[key].path, None, str(e.message))
            continue
        with bcq:
            _check(c, bcq, key, exp, scan.end, q.min_offset)
    return v


def _place(bcq: BatchConsumeQueue, i: int) -> tuple[Path, int]:
    """(file, byte position) of recovered unit ``i``; past the last one, where the broker
    puts the next units: on in the last file while it has room (a short last file
    included), then in the files after it."""
    start, n = 0, 0
    for (start, _), n in zip(bcq.segments, bcq._used):
        if i < n:
            return bcq.path / f"{start:020d}", i * UNIT
        i -= n
    k, r = divmod(n + i, max(bcq.file_size // UNIT, 1))  # counted from the last file's start
    return bcq.path / f"{start + k * bcq.file_size:020d}", r * UNIT


def _rows(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(a.astype(L.BCQ_UNIT_DTYPE).tobytes(), np.uint8).reshape(-1, UNIT)


def _check(c, bcq: BatchConsumeQueue, key, exp: np.ndarray, end: int, min_offset: int) -> None:
    name = f"{key[0]}/{key[1]}"
    for p in bcq.problems:
        if p.code in ("symlink", "special-file"):
            c.add(p.code, p.path, None, p.detail)
        elif p.code != "beyond-end":
            c.add("bcq-segment", p.path, None, f"{p.code}: {p.detail}")
    units = bcq.units
    phy = units["commit_log_offset"].astype(np.int64)
    beyond = np.flatnonzero(phy >= end)
    if len(beyond):
        f, pos = _place(bcq, int(beyond[0]))
        c.add("bcq-beyond-end", f, pos, f"{name}: {len(beyond)} unit(s) point at or past the "
              f"CommitLog end {end}; a broker cuts them on load (truncateDirtyLogicFiles)",
              count=len(beyond))
    first = int(np.searchsorted(phy, min_offset)) if len(phy) else 0  # records deleted by age
    stop = len(phy) - len(beyond)
    act = units[first:stop]
    exp = exp[exp["commit_log_offset"] >= min_offset]
    n = min(len(act), len(exp))
    differ = np.flatnonzero((_rows(act[:n]) != _rows(exp[:n])).any(axis=1)) if n else []
    if len(differ):
        i = int(differ[0])
        a, e = act[i], exp[i]
        what = ", ".join(f"{f} {int(a[f])} (record gives {int(e[f])})" for f in _FIELDS
                         if int(a[f]) != int(e[f]))
        f, pos = _place(bcq, first + i)
        c.add("bcq-mismatch", f, pos, f"{name}: {len(differ)} unit(s) disagree with the units "
              f"dispatch writes for the records; first: unit {first + i}: {what}",
              count=len(differ))
    if len(act) > len(exp):
        f, pos = _place(bcq, first + len(exp))
        c.add("bcq-mismatch", f, pos, f"{name}: {len(act) - len(exp)} unit(s) beyond the last "
              f"record of the queue (first points at {int(act[len(exp)]['commit_log_offset'])})",
              count=len(act) - len(exp))
    elif len(exp) > len(act):
        _missing(c, bcq.path, key, exp[len(act):], first + len(act), bcq)


def _missing(c, qdir: Path, key, rest: np.ndarray, index: int, bcq=None) -> None:
    if not len(rest):
        return
    f, pos = _place(bcq, index) if bcq is not None else (qdir / f"{0:020d}", 0)
    c.add("bcq-missing-tail", f, pos,
          f"{key[0]}/{key[1]}: {len(rest)} record(s) from CommitLog {int(rest[0]['commit_log_offset'])} "
          f"(queue offset {int(rest[0]['msg_base_offset'])}) have no BatchConsumeQueue unit yet; "
          "a broker's reput re-dispatches them on start; `rmqstore rebuild` writes them",
          queueOffset=int(rest[0]["msg_base_offset"]), count=len(rest))
