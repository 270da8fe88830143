"""ConsumeQueue audit for one queue: existing units against what the CommitLog implies.

Plain numpy; the Spark ``audit`` job calls :func:`audit_queue` once per (store, topic,
queue) group, and a non-Spark caller can do the same. Rules (spec §6.1, §9;
spark-notes "ConsumeQueue rebuild and audit"):

The kinds, their meanings and the verify codes that correspond are
:data:`rmqstore.recovery.findings.CQ_AUDIT_KINDS`:

* implied units come from NOT_TYPE and COMMIT records only; of records sharing a queue
  offset the first in CommitLog order counts and the others are ``duplicate``;
* a gap inside the implied queue offsets is a ``hole`` (a queue need not start at 0);
* placeholder units (offset 0, size ``CQ_PLACEHOLDER_SIZE``) are the broker's pre-fill, not data;
* a unit with no record is ``expired`` when it points below the CommitLog minimum (head
  deletion: not an error), ``beyond-end`` when it points at or past the end of valid
  data, else ``extra``; a record with no unit is ``missing``; a unit that disagrees in
  offset, size or tagsCode is ``mismatch``.
"""

from __future__ import annotations

import numpy as np

from ..format import layout as L
from ..recovery.findings import CQ_AUDIT_KINDS, INFO as _INFO

PROBLEMS = tuple(k for k, (sev, _, _) in CQ_AUDIT_KINDS.items() if sev != _INFO)
INFO = tuple(k for k, (sev, _, _) in CQ_AUDIT_KINDS.items() if sev == _INFO)
FINDING_FIELDS = ("kind", "queueOffset", "expectedOffset", "expectedSize", "expectedTagsCode",
                  "actualOffset", "actualSize", "actualTagsCode", "detail")


def _finding(kind, qo, exp=None, act=None, detail=""):
    if kind not in CQ_AUDIT_KINDS:
        raise ValueError(f"not a ConsumeQueue audit kind: {kind!r}")
    e = exp if exp is not None else (None, None, None)
    a = act if act is not None else (None, None, None)
    return {"kind": kind, "queueOffset": qo, "expectedOffset": e[0], "expectedSize": e[1],
            "expectedTagsCode": e[2], "actualOffset": a[0], "actualSize": a[1],
            "actualTagsCode": a[2], "detail": detail}


def audit_queue(existing_qo, existing_off, existing_size, existing_tags,
                implied_qo, implied_off, implied_size, implied_tags,
                cl_min: int, cl_end: int) -> list[dict]:
    """Findings for one queue. ``implied_*`` may come in any order (sorted here by
    CommitLog offset); ``existing_*`` are the CQ's units as the broker loads them."""
    f: list[dict] = []
    iq = np.asarray(implied_qo, np.int64)
    io = np.asarray(implied_off, np.int64)
    isz = np.asarray(implied_size, np.int64)
    it = np.asarray(implied_tags, np.int64)
    order = np.lexsort((io, iq))  # by queue offset, then CommitLog order
    iq, io, isz, it = iq[order], io[order], isz[order], it[order]
    first = np.r_[True, iq[1:] != iq[:-1]] if len(iq) else np.zeros(0, bool)
    for k in np.flatnonzero(~first):
        f.append(_finding("duplicate", int(iq[k]), (int(io[k]), int(isz[k]), int(it[k])),
                          detail="another record holds this queue offset earlier in the CommitLog"))
    iq, io, isz, it = iq[first], io[first], isz[first], it[first]
    if len(iq) > 1:
        gap = np.flatnonzero(np.diff(iq) > 1)
        for k in gap:
            a, b = int(iq[k]) + 1, int(iq[k + 1]) - 1
            f.append(_finding("hole", a, detail=f"no record for queue offsets {a}..{b}"))
    eq = np.asarray(existing_qo, np.int64)
    eo = np.asarray(existing_off, np.int64)
    es = np.asarray(existing_size, np.int64)
    et = np.asarray(existing_tags, np.int64)
    real = ~((es == L.CQ_PLACEHOLDER_SIZE) & (eo == 0))
    eq, eo, es, et = eq[real], eo[real], es[real], et[real]
    common, ii, ei = np.intersect1d(iq, eq, assume_unique=True, return_indices=True)
    diff = (io[ii] != eo[ei]) | (isz[ii] != es[ei]) | (it[ii] != et[ei])
    for k in np.flatnonzero(diff):
        a, b = ii[k], ei[k]
        what = [n for n, x, y in (("offset", io[a], eo[b]), ("size", isz[a], es[b]),
                                  ("tagsCode", it[a], et[b])) if x != y]
        f.append(_finding("mismatch", int(iq[a]), (int(io[a]), int(isz[a]), int(it[a])),
                          (int(eo[b]), int(es[b]), int(et[b])), "wrong " + ", ".join(what)))
    only_i = np.setdiff1d(np.arange(len(iq)), ii)
    for a in only_i:
        f.append(_finding("missing", int(iq[a]), (int(io[a]), int(isz[a]), int(it[a])),
                          detail="record has no ConsumeQueue unit"))
    only_e = np.setdiff1d(np.arange(len(eq)), ei)
    for b in only_e:
        off = int(eo[b])
        kind = "expired" if off < cl_min else ("beyond-end" if off >= cl_end else "extra")
        detail = {"expired": "points below the CommitLog minimum (deleted head)",
                  "beyond-end": f"points at or past the end of valid CommitLog data ({cl_end})",
                  "extra": "no record implies this unit"}[kind]
        f.append(_finding(kind, int(eq[b]), act=(off, int(es[b]), int(et[b])), detail=detail))
    f.sort(key=lambda x: (x["queueOffset"], x["kind"]))
    return f


def read_units(root: str, topic: str, queue_id: int, file_size: int):
    """(queue offsets, offsets, sizes, tagsCodes) of a queue as the broker loads it."""
    from pathlib import Path

    from ..files.consumequeue import ConsumeQueue
    from ..files.names import is_safe_topic

    z = np.zeros(0, np.int64)
    if not is_safe_topic(topic):
        return z, z, z, z  # a topic from a record that cannot be a directory: no queue
    path = Path(root) / "consumequeue" / topic / str(queue_id)
    if path.parent.is_symlink() or path.is_symlink() or not path.is_dir():
        return z, z, z, z  # links inside the store are never read through
    with ConsumeQueue(path, file_size) as cq:
        u = cq.units
        qo = cq.base_offset + np.arange(len(u), dtype=np.int64)
        return (qo, u["commit_log_offset"].astype(np.int64), u["size"].astype(np.int64),
                u["tags_code"].astype(np.int64))
