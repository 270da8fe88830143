"""Where dispatch stands when a store is opened for writing, and where its reput starts.

:func:`queue_state` reads every ConsumeQueue's end (the next queue offset per queue, the
furthest CommitLog byte any unit covers and the record of that unit), as the broker does
after recovery (spec §9, §10.6). :func:`keys_behind` answers the one question the
ConsumeQueue cannot: after a crash, which records may have index keys that never reached
the IndexFile. The synchronous dispatcher lets the keys of recent records wait to be put
together (:data:`~rmqstore.engine.index_keys.DEFER_BYTES` bounds how far back they can reach), so a
store that was not closed cleanly is re-indexed from there; the §7.3 endPhyOffset rule and
the ConsumeQueue's own skip of units it holds make the overlap harmless.
"""

from __future__ import annotations

from pathlib import Path

from ..files.batchconsumequeue import BatchConsumeQueue, list_batch_queues
from ..files.consumequeue import ConsumeQueue, list_queues


def queue_state(root: Path, cq_file_size: int, bcq_file_size: int | None = None
                ) -> tuple[dict[tuple[str, int], int], int, int | None]:
    """(next queue offset per (topic, queueId), max physical end over all queues, CommitLog
    offset of the record whose unit ends there); max end -1 and None with no units.
    BatchConsumeQueues (5.x) count too: their next offset is the last unit's base +
    batchNum (design-14 §4.2); LMQ queues are ConsumeQueues ``(%LMQ%name, 0)``, so their
    offsets come back with the others (§5.4)."""
    offsets: dict[tuple[str, int], int] = {}
    max_phy, last = -1, None
    for ref in list_queues(root).queues:
        with ConsumeQueue(ref.path, cq_file_size) as cq:
            offsets[(ref.topic, ref.queue_id)] = cq.max_offset
            if cq.max_physic_offset > max_phy:
                max_phy, last = cq.max_physic_offset, cq.last_unit_offset
    if (Path(root) / "batchconsumequeue").is_dir():
        for ref in list_batch_queues(root).queues:
            with BatchConsumeQueue(ref.path, bcq_file_size) as q:
                offsets[(ref.topic, ref.queue_id)] = q.max_offset
                if q.max_physic_end > max_phy:
                    max_phy, last = q.max_physic_end, q.last_unit_offset
    return offsets, max_phy, last


def first_unit_from(root: Path, cq_file_size: int, low: int) -> int | None:
    """The smallest CommitLog offset at or after ``low`` that some ConsumeQueue unit
    points at (a record boundary), or None."""
    found = []
    for ref in list_queues(root).queues:
        with ConsumeQueue(ref.path, cq_file_size) as cq:
            at = cq.first_physic_offset_from(low)
            if at is not None:
                found.append(at)
    return min(found, default=None)


def keys_behind(root: Path, cq_file_size: int, index, cq_end: int, size_at,
                window: int) -> int | None:
    """After a crash: the first record offset whose index keys may be missing, or None.

    Keys can only be missing for records that start at most ``window`` bytes before the
    ConsumeQueues' end ``cq_end`` and after the last record the index holds (whose
    offset is the last file's endPhyOffset; ``size_at(offset)`` gives its size, or None
    when it cannot be read).
    """
    low = first_unit_from(root, cq_file_size, max(0, cq_end - window))
    if low is None:
        return None
    indexed = [f for f in index.files if f.header.index_count > 1]
    if indexed:
        last = indexed[-1].header.end_phy_offset
        size = size_at(last)
        after = last + size if size else last
        low = max(low, after)
    return low if low < cq_end else None
