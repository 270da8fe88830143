"""Rebuild's scan: each byte range's ConsumeQueue units grouped per queue by the worker.

``verify`` needs every field of every record, merged per segment
(:func:`rmqstore.rebuild.scan_commitlog`). A rebuild needs only what dispatch writes, so
here a worker hands back, for its range:

- what decides validity (sizes, the §3.9 size rule, CRC results), from which the parent
  finds the end of valid data exactly as :func:`~rmqstore.redispatch.store_scan` does;
- its CQ units grouped per queue (a stable sort on a small key keeps CommitLog order
  within each queue), with the record each came from, so a cut is a binary search;
- its index puts (hash, PHYSICALOFFSET, STORETIMESTAMP) in put order.

The parent joins each queue's groups range by range: no whole-log columns are merged,
sorted or gathered in the one process that runs alone after the workers finish.
"""

from __future__ import annotations

import numpy as np

from . import layout as L
from .redispatch import SegmentDispatch, split_dispatch, store_scan


def grouped_split(split, check_crc: bool = True, delay_millis=None, keys: bool = True) -> tuple:
    """A worker's task: (boundary, grouped part) of one byte range."""
    return split_dispatch(split, check_crc, delay_millis, keys, pack_grouped)


def pack_grouped(p: SegmentDispatch) -> dict:
    """What a rebuild needs of one range's records (see the module docstring)."""
    n = len(p)
    d = {"start": p.start, "limit": p.limit, "chain_end": p.chain_end, "stop": p.stop,
         "n": n, "first": int(p.offset[0]) if n else 0, "size": p.size.astype(np.int32),
         "consistent": p.consistent, "crc_ok": p.crc_ok, "groups": []}
    z32, z64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
    d.update(rec=z32, qo=None, qo_dense=False, phy=z64, usize=z32, tags=z32,
             key_rec=z32, key_hash=z32, key_phy=z64, key_ts=z64)
    if not n:
        return d
    good = n if p.consistent.all() else int(np.argmin(p.consistent))
    tx = p.sys_flag[:good] & L.SYSFLAG_TRANSACTION_MASK
    cq = np.flatnonzero((tx == L.TRANSACTION_NOT_TYPE) | (tx == L.TRANSACTION_COMMIT))
    if len(cq):
        qid = p.queue_id[cq]
        qmin = int(qid.min())
        span = int(qid.max()) - qmin + 1
        nkeys = len(p.topics) * span
        key = p.topic_id[cq] * span + (qid - qmin)
        # A small key sorts by radix, and stably: CommitLog order is kept per queue.
        key = key.astype(np.int16 if nkeys < 2**15 else np.int64)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        cuts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1], True])
        for k, a, b in zip(ks[cuts[:-1]].tolist(), cuts[:-1].tolist(), cuts[1:].tolist()):
            t, q = divmod(k, span)
            d["groups"].append((p.topics[t], q + qmin, a, b))
        rec = cq[order]
        qo, tags = p.queue_offset[rec], p.tags_code[rec]
        # Hand-over is pickled, so it is kept small: queue offsets as each group's first
        # when every group counts up by one (the usual case), tags codes as 32-bit ints
        # unless delivery times (delay topic) need 64.
        step = np.ones(len(qo), bool)
        step[1:] = qo[1:] == qo[:-1] + 1
        step[cuts[:-1]] = True
        d.update(rec=rec.astype(np.int32),
                 qo=qo[cuts[:-1]] if step.all() else qo, qo_dense=bool(step.all()),
                 phy=p.physical_offset[rec], usize=p.size[rec].astype(np.int32),
                 tags=tags.astype(np.int32) if _fits32(tags) else tags)
    kr = p.key_record
    if len(kr):
        d.update(key_rec=kr.astype(np.int32), key_hash=p.key_hash.astype(np.int32),
                 key_phy=p.physical_offset[kr], key_ts=p.store_timestamp[kr])
    return d


def _fits32(a: np.ndarray) -> bool:
    return not len(a) or (int(a.min()) >= -2**31 and int(a.max()) < 2**31)


def _validity(chain: list[dict]) -> SegmentDispatch:
    """One segment's record offsets, sizes, size-rule and CRC results from its ranges."""
    last = chain[-1]
    out = SegmentDispatch(chain[0]["start"], last["limit"], last["chain_end"], last["stop"])
    parts = [d for d in chain if d["n"]]
    if not parts:
        return out
    size = np.concatenate([d["size"] for d in parts]).astype(np.int64)
    off = np.empty(len(size), np.int64)
    base = 0
    for d in parts:  # each range's records are contiguous from its first
        seg = off[base:base + d["n"]]
        seg[0] = d["first"]
        np.cumsum(d["size"][:-1], out=seg[1:])
        seg[1:] += d["first"]
        base += d["n"]
    out.offset, out.size = off, size
    out.consistent = np.concatenate([d["consistent"] for d in parts])
    out.crc_ok = np.concatenate([d["crc_ok"] for d in parts])
    if not out.consistent.all():
        out.crc_ok[int(np.argmin(out.consistent)):] = True  # untrusted: as merge_splits
    return out


def grouped_dispatch(chains: list[list[dict]], segment_size: int, from_offset: int = 0,
                     index_from: int | None = None, *, store_timestamp_at=None,
                     join: bool = True):
    """(StoreScan with validity fields only, Dispatched for the CQ, Dispatched for the
    index): what :func:`rmqstore.rebuild.dispatched` gives, from grouped parts. The index
    one starts at ``index_from`` (default ``from_offset``). ``store_timestamp_at(offset)``
    reads one record's STORETIMESTAMP (for ``last_cq_timestamp``; 0 without it). Without
    ``join`` the units and puts are counted (``unit_count``, ``key_count``), not gathered."""
    from .rebuild import Dispatched

    scan = store_scan([_validity(c) for c in chains], segment_size)
    cq, ix = Dispatched(), Dispatched()
    index_from = from_offset if index_from is None else index_from
    per_queue: dict[tuple[str, int], list] = {}
    keys = []
    last_cq = -1  # offset of the last record given a unit
    for p, k, chain in zip(scan.parts, scan.kept, chains):
        if not k:
            continue
        a_cq = int(np.searchsorted(p.offset[:k], from_offset)) if from_offset else 0
        a_ix = int(np.searchsorted(p.offset[:k], index_from)) if index_from else 0
        for out, a in ((cq, a_cq), (ix, a_ix)):
            if a < k:
                out.messages += k - a
                out.bytes += int(p.size[a:k].sum())
        base = 0
        for d in chain:
            n = d["n"]
            hi = min(k - base, n)
            lo_cq, lo_ix = max(a_cq - base, 0), max(a_ix - base, 0)
            if hi > lo_cq:
                last, count = _join_units(d, lo_cq, hi, n, per_queue if join else None, base, p)
                last_cq = max(last_cq, last)
                cq.unit_count += count
            if hi > lo_ix and len(d["key_rec"]):
                kr = d["key_rec"]
                i = int(np.searchsorted(kr, lo_ix)) if lo_ix else 0
                j = int(np.searchsorted(kr, hi)) if hi < n else len(kr)
                if j > i:
                    ix.key_count += j - i
                    if join:
                        keys.append((d["key_hash"][i:j], d["key_phy"][i:j], d["key_ts"][i:j]))
            base += n
            if base >= k:
                break
    cq.units = {key: tuple(np.concatenate(c) if len(c) > 1 else c[0] for c in zip(*parts))
                for key, parts in per_queue.items()}
    if last_cq >= 0 and store_timestamp_at is not None:
        cq.last_cq_timestamp = store_timestamp_at(last_cq)
    if keys:
        h, phy, ts = (np.concatenate(c) for c in zip(*keys))
        ix.key_hash, ix.key_offset, ix.key_timestamp = h.astype(np.int64), phy, ts
    return scan, cq, ix


def _join_units(d: dict, lo: int, hi: int, n: int, per_queue: dict | None, base: int,
                seg: SegmentDispatch) -> tuple[int, int]:
    """Append the units of records ``lo <= rec < hi`` of one range to their queues (only
    count them without ``per_queue``); returns (CommitLog offset of the last of them or
    -1, how many)."""
    rec, qo, dense = d["rec"], d["qo"], d["qo_dense"]
    best, count = -1, 0
    whole = lo == 0 and hi == n
    for g, (topic, qid, a, b) in enumerate(d["groups"]):
        a0 = a
        if not whole:
            r = rec[a:b]
            a, b = a + int(np.searchsorted(r, lo)), a + int(np.searchsorted(r, hi))
            if b <= a:
                continue
        count += b - a
        best = max(best, int(rec[b - 1]))
        if per_queue is None:
            continue
        q = np.arange(qo[g] + a - a0, qo[g] + b - a0, dtype=np.int64) if dense else qo[a:b]
        per_queue.setdefault((topic, qid), []).append(
            (q, d["phy"][a:b], d["usize"][a:b], d["tags"][a:b]))
    return (int(seg.offset[base + best]) if best >= 0 else -1), count
