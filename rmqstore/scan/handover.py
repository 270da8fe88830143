"""The one format in which a scan worker hands back the results of its byte range.

A part is a dict of plain values and numpy arrays: it is pickled through a pipe or its
arrays are left in a shared :class:`~rmqstore.scan.parallel.Arena`, and both take a dict.
Pickling costs about as much per byte as the scan itself, so what follows from other
fields is left out and recomputed here.

Every part starts with the same :data:`HEAD`: the range's segment and how the chain
stopped (``start``, ``limit``, ``chain_end``, ``stop``: :class:`~rmqstore.scan.dispatch.
SegmentDispatch`'s), then the records' validity: ``n`` records, the first one's offset
``first``, each TOTALSIZE as int32 ``size`` (every record's offset follows, the chain
being contiguous: :func:`record_offsets`), and the §3.9 size-rule and CRC results
``consistent`` and ``crc_ok``, None when all true (:func:`flags`). Then one payload:

- :data:`COLUMNS`, every field verify needs, per record
  (:func:`rmqstore.scan.dispatch.dispatch_split`);
- :data:`GROUPED`, only what a rebuild writes: CQ units grouped per queue and index puts
  (:func:`rmqstore.scan.per_queue.grouped_split`, whose docstring says how they are packed).
"""

from __future__ import annotations

import numpy as np

HEAD = ("start", "limit", "chain_end", "stop", "n", "first", "size", "consistent", "crc_ok")
COLUMNS = ("topics", "queue_id", "sys_flag", "topic_id", "key_record", "key_hash",
           "queue_offset", "store_timestamp", "tags_code", "physical_offset")
GROUPED = ("groups", "rec", "qo", "qo_dense", "phy", "tags", "key_rec", "key_hash",
           "key_phy", "key_ts", "key_ts0")


def head(p) -> dict:
    """The :data:`HEAD` of a part, from a range's :class:`SegmentDispatch` ``p``."""
    n = len(p)
    return {"start": p.start, "limit": p.limit, "chain_end": p.chain_end, "stop": p.stop,
            "n": n, "first": int(p.offset[0]) if n else 0, "size": p.size.astype(np.int32),
            "consistent": None if p.consistent.all() else p.consistent,
            "crc_ok": None if p.crc_ok.all() else p.crc_ok}


def record_offsets(d: dict) -> np.ndarray:
    """CommitLog offset of each record of a part (the chain is contiguous)."""
    off = d.get("_offsets")
    if off is None:
        size = d["size"]
        off = np.empty(len(size), np.int64)
        if len(size):
            off[0] = d["first"]
            np.cumsum(size[:-1], out=off[1:])
            off[1:] += d["first"]
        d["_offsets"] = off
    return off


def flags(d: dict, name: str) -> np.ndarray:
    """``consistent`` or ``crc_ok`` of every record (sent only when not all true)."""
    v = d[name]
    return np.ones(d["n"], bool) if v is None else v
