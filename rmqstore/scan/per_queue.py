"""What dispatch writes, as arrays: valid records' ConsumeQueue units grouped per queue,
and index puts (:class:`Dispatched`); one rule, two ways in.

The rule (spec §6.1, §7.3, §9): of the valid records at or after a start offset, in
CommitLog order, those that get a unit (NOT_TYPE, COMMIT) give one to their (topic,
queueId), in CommitLog order within the queue; every key of a record that gets keys
(not ROLLBACK) is one index put (hash, PHYSICALOFFSET, STORETIMESTAMP), in put order.
:func:`pack_grouped` groups one range's records per queue, :func:`join_groups` joins the groups
of consecutive ranges, cut at the end of valid data and at the start offsets.

- A rebuild's workers group their own ranges (:func:`grouped_split`) and hand back only
  what decides validity (sizes, the §3.9 size rule, CRC results), the grouped units and
  the index puts; the parent finds the end of valid data exactly as
  :func:`~rmqstore.scan.dispatch.store_scan` does and joins each queue's groups range by
  range (:func:`grouped_dispatch`): no whole-log columns are merged, sorted or gathered
  in the one process that runs alone after the workers finish.
- ``verify`` has every field of every record, merged per segment, and each range grouped
  per queue by its worker (:func:`verify_split`, through
  :func:`rmqstore.scan.runner.scan_dispatched`): :func:`dispatched` joins those groups;
  given a scan alone (:func:`rmqstore.scan.runner.scan_commitlog`), it groups each
  segment of it the same way and joins them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..format.rules import gets_cq_unit
from .parallel import arena
from .dispatch import SegmentDispatch, StoreScan, pack_columns, split_dispatch, store_scan
from .handover import flags, head, record_offsets


@dataclass
class Dispatched:
    """Valid records' CQ units per queue and index puts, in CommitLog order."""

    units: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    key_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key_timestamp: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    messages: int = 0
    bytes: int = 0
    last_cq_timestamp: int = 0  # store time of the last record given a CQ unit (§8.1)
    unit_count: int = 0  # units in ``units`` (set even when they were only counted)
    key_count: int = 0  # index puts (likewise)


# --- the rule: grouped per range, joined ------------------------------------------------


def grouped_split(split, check_crc: bool = True, delay_millis=None, keys: bool = True,
                  arena_key: int | None = None) -> tuple:
    """A worker's task: (boundary, grouped part) of one byte range; with ``arena_key``,
    the part's arrays are left in that shared :class:`~rmqstore.scan.parallel.Arena`."""
    b, d = split_dispatch(split, check_crc, delay_millis, keys, pack_grouped)
    shared = arena(arena_key)
    return b, (shared.put(split.split_id, d) if shared is not None else d)


def verify_split(split, check_crc: bool = True, delay_millis=None, keys: bool = True,
                 arena_key: int | None = None) -> tuple:
    """A verify worker's task: (boundary, part) of one byte range with both payloads,
    every column (:func:`~rmqstore.scan.dispatch.merge_splits` takes them) and the range
    grouped per queue (:func:`join_groups` takes those; their ``key_hash`` is the same
    array), so the parent never groups whole segments; with ``arena_key``, left in that
    shared :class:`~rmqstore.scan.parallel.Arena`."""
    b, d = split_dispatch(split, check_crc, delay_millis, keys,
                          lambda p: {**pack_columns(p), **pack_grouped(p)})
    shared = arena(arena_key)
    return b, (shared.put(split.split_id, d) if shared is not None else d)


def pack_grouped(p: SegmentDispatch) -> dict:
    """What a rebuild needs of one range's records (see the module docstring): the
    :mod:`~rmqstore.scan.handover` format with the GROUPED payload.

    The hand-over is pickled through a pipe, which costs about as much per byte as the
    scan itself, so it is kept small: what follows from the sizes (each record's offset,
    a unit's size, PHYSICALOFFSET while it equals the offset) is left out and recomputed
    by :func:`units` and :func:`keys`; all-true flags, queue offsets that count up by one
    in every group, 32-bit tags codes and timestamps close together travel compressed."""
    n = len(p)
    d = head(p)
    d["groups"] = []
    z32, z64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
    d.update(rec=z32, qo=None, qo_dense=False, phy=None, tags=z32,
             key_rec=z32, key_hash=z32, key_phy=None, key_ts=z64, key_ts0=0)
    if not n:
        return d
    good = n if p.consistent.all() else int(np.argmin(p.consistent))
    # PHYSICALOFFSET is left out only where it equals the offset the sizes give: records
    # one after the other (not so inside DLedger entries, whose headers lie between them).
    off = p.offset[:good]
    same = bool((p.physical_offset[:good] == off).all()) and \
        bool((off[1:] == off[:-1] + p.size[:max(good - 1, 0)]).all())
    cq = np.flatnonzero(gets_cq_unit(p.sys_flag[:good]))
    if len(cq):
        qid = p.queue_id[cq].astype(np.int64)  # int32 ids minus the smallest can overflow
        qmin = int(qid.min())
        span = int(qid.max()) - qmin + 1
        nkeys = len(p.topics) * span
        key = p.topic_id[cq].astype(np.int64) * span + (qid - qmin)
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
        step = np.ones(len(qo), bool)
        step[1:] = qo[1:] == qo[:-1] + 1
        step[cuts[:-1]] = True
        d.update(rec=rec.astype(np.int32),
                 qo=qo[cuts[:-1]] if step.all() else qo, qo_dense=bool(step.all()),
                 phy=None if same else p.physical_offset[rec],
                 tags=tags.astype(np.int32) if _fits32(tags) else tags)
    kr = p.key_record
    if len(kr):
        ts = p.store_timestamp[kr]
        ts0 = int(ts.min())
        delta = ts - ts0
        d.update(key_rec=kr.astype(np.int32), key_hash=p.key_hash.astype(np.int32),
                 key_phy=None if same else p.physical_offset[kr],
                 key_ts=delta.astype(np.int32) if _fits32(delta) else ts,
                 key_ts0=ts0 if _fits32(delta) else 0)
    return d


def _fits32(a: np.ndarray) -> bool:
    return not len(a) or (int(a.min()) >= -2**31 and int(a.max()) < 2**31)


def units(d: dict, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(PHYSICALOFFSET, size, tagsCode) of a grouped part's units ``a:b``."""
    rec = d["rec"][a:b]
    phy = record_offsets(d)[rec] if d["phy"] is None else d["phy"][a:b]
    return phy, d["size"][rec], d["tags"][a:b]


def keys(d: dict, i: int, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(index hash, PHYSICALOFFSET, STORETIMESTAMP) of a grouped part's puts ``i:j``."""
    kr = d["key_rec"][i:j]
    phy = record_offsets(d)[kr] if d["key_phy"] is None else d["key_phy"][i:j]
    return d["key_hash"][i:j], phy, d["key_ts"][i:j].astype(np.int64) + d["key_ts0"]


def _validity(chain: list[dict]) -> SegmentDispatch:
    """One segment's record offsets, sizes, size-rule and CRC results from its ranges."""
    last = chain[-1]
    out = SegmentDispatch(chain[0]["start"], last["limit"], last["chain_end"], last["stop"])
    parts = [d for d in chain if d["n"]]
    if not parts:
        return out
    out.size = np.concatenate([d["size"] for d in parts]).astype(np.int64)
    out.offset = np.concatenate([record_offsets(d) for d in parts])
    out.consistent = np.concatenate([flags(d, "consistent") for d in parts])
    out.crc_ok = np.concatenate([flags(d, "crc_ok") for d in parts])
    if not out.consistent.all():
        out.crc_ok[int(np.argmin(out.consistent)):] = True  # untrusted: as merge_splits
    return out


def grouped_dispatch(chains: list[list[dict]], segment_size: int, from_offset: int = 0,
                     index_from: int | None = None, *, store_timestamp_at=None,
                     join: bool = True):
    """(StoreScan with validity fields only, Dispatched for the CQ, Dispatched for the
    index) from the grouped parts of every range (:func:`grouped_split`), a chain per
    segment. The index one starts at ``index_from`` (default ``from_offset``).
    ``store_timestamp_at(offset)`` reads one record's STORETIMESTAMP (for
    ``last_cq_timestamp``; 0 without it). Without ``join`` the units and puts are counted
    (``unit_count``, ``key_count``), not gathered."""
    scan = store_scan([_validity(c) for c in chains], segment_size)
    index_from = from_offset if index_from is None else index_from
    cq, ix = join_groups(scan, chains, from_offset, index_from, store_timestamp_at, join)
    return scan, cq, ix


def dispatched(scan: StoreScan, from_offset: int = 0,
               chains: list[list[dict]] | None = None) -> Dispatched:
    """The units per queue and the index puts of ``scan``'s valid records at or after
    ``from_offset`` (spec §6.1, §7.3), each segment grouped by :func:`pack_grouped`, or
    from ``chains``: per segment, its ranges' grouped parts (:func:`verify_split`)."""
    if chains is None:
        chains = [[pack_grouped(p)] if k and int(p.offset[k - 1]) >= from_offset else []
                  for p, k in zip(scan.parts, scan.kept)]

    def store_timestamp_at(offset: int) -> int:
        for p, k in zip(scan.parts, scan.kept):
            if k and int(p.offset[0]) <= offset <= int(p.offset[k - 1]):
                return int(p.store_timestamp[int(np.searchsorted(p.offset[:k], offset))])
        raise ValueError(offset)

    # verify and repair read whole-log columns as int64, as the records' fields are
    out, ix = join_groups(scan, chains, from_offset, from_offset, store_timestamp_at, True,
                          wide=True)
    out.key_hash, out.key_offset, out.key_timestamp = ix.key_hash, ix.key_offset, ix.key_timestamp
    out.key_count = ix.key_count
    return out


def join_groups(scan: StoreScan, chains: list[list[dict]], from_offset: int, index_from: int,
          store_timestamp_at, join: bool, *, wide: bool = False) -> tuple[Dispatched, Dispatched]:
    """(units, index puts) of the kept records of ``scan`` (whose ``parts`` are the
    segments the ``chains`` of grouped parts cover), from ``from_offset`` and
    ``index_from``: each queue's groups joined range by range (every column int64 with
    ``wide``)."""
    cq, ix = Dispatched(), Dispatched()
    per_queue: dict[tuple[str, int], list] = {}
    puts = []
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
            if n and "_offsets" not in d and len(p.offset) >= base + n:
                # The records' offsets are the segment's (merged from these parts), so a
                # view of them, not a copy per part (handover.record_offsets).
                d["_offsets"] = p.offset[base:base + n]
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
                        puts.append((d, i, j))
            base += n
            if base >= k:
                break
    cq.units = {key: _gathered(jobs, _group_units, wide) for key, jobs in per_queue.items()}
    if last_cq >= 0 and store_timestamp_at is not None:
        cq.last_cq_timestamp = store_timestamp_at(last_cq)
    if puts:
        ix.key_hash, ix.key_offset, ix.key_timestamp = _gathered(puts, keys, True)
    return cq, ix


def _group_units(d: dict, g: int, a: int, b: int) -> tuple:
    """(queue offset, PHYSICALOFFSET, size, tagsCode) of units ``a:b`` of group ``g``."""
    qo, a0 = d["qo"], d["groups"][g][2]
    q = np.arange(qo[g] + a - a0, qo[g] + b - a0, dtype=np.int64) if d["qo_dense"] else qo[a:b]
    return (q, *units(d, a, b))


def _gathered(jobs: list[tuple], make, wide: bool) -> tuple:
    """The columns of ``make(*job)`` for each job, each joined as ``np.concatenate`` joins it.
    With ``wide`` each job's columns are made only as they are copied into the int64
    arrays made once, so no job's temporaries outlive it (verify's peak memory)."""
    if not wide:
        parts = [make(*j) for j in jobs]
        return tuple(np.concatenate(c) if len(c) > 1 else c[0] for c in zip(*parts))
    m = sum(j[-1] - j[-2] for j in jobs)  # a job ends with (first, end)
    cols: list[np.ndarray] = []
    at = 0
    for j in jobs:
        part = make(*j)
        if not cols:
            cols = [np.empty(m, np.int64) for _ in part]
        n = len(part[0])
        for col, v in zip(cols, part):
            col[at:at + n] = v
        at += n
    assert at == m
    return tuple(cols)


def _join_units(d: dict, lo: int, hi: int, n: int, per_queue: dict | None, base: int,
                seg: SegmentDispatch) -> tuple[int, int]:
    """Append the units of records ``lo <= rec < hi`` of one range to their queues (only
    count them without ``per_queue``); returns (CommitLog offset of the last of them or
    -1, how many)."""
    rec = d["rec"]
    best, count = -1, 0
    whole = lo == 0 and hi == n
    for g, (topic, qid, a, b) in enumerate(d["groups"]):
        if not whole:
            r = rec[a:b]
            a, b = a + int(np.searchsorted(r, lo)), a + int(np.searchsorted(r, hi))
            if b <= a:
                continue
        count += b - a
        best = max(best, int(rec[b - 1]))
        if per_queue is not None:
            per_queue.setdefault((topic, qid), []).append((d, g, a, b))
    return (int(seg.offset[base + best]) if best >= 0 else -1), count
