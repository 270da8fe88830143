"""ConsumeQueue checks for :func:`rmqstore.recovery.verify.verify` (spec §6.1, §9, §10.4).

Each queue's units (up to the end the broker's load finds) are matched, vectorised,
against the units dispatch would write for the valid CommitLog records
(:func:`rmqstore.scan.per_queue.dispatched`): by CommitLog offset, then size, queue offset
and tagsCode. One finding per queue and kind, naming the first unit concerned.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..format import layout as L
from ..files.consumequeue import UNIT, ConsumeQueue, list_queues
from ..errors import RmqStoreError
from ..files.listing import entries, offset_name
from ..files.names import is_safe_topic
from ..scan.properties import sorted_isin

_EMPTY = np.zeros(0, np.int64)


def _where(ref_path: Path, file_size: int, qo: int) -> tuple[Path, int]:
    byte = qo * UNIT
    start = byte - byte % file_size
    return ref_path / f"{start:020d}", byte - start


def _raw_nonzero_after(cq: ConsumeQueue, qdir: Path, file_size: int) -> int | None:
    """Queue offset of the first non-zero unit after the recovered end, if any (a hole:
    the broker's load stops at the first empty unit and never sees what follows)."""
    end_byte = cq.max_offset * UNIT
    for e in entries(qdir):
        start = offset_name(e.name) if e.kind == "file" else None
        if start is None:
            continue
        p = e.path
        if start + file_size <= end_byte:
            continue
        data = np.fromfile(p, dtype=np.uint8)
        skip = max(0, end_byte - start)
        nz = np.flatnonzero(data[skip:])
        if len(nz):
            return (start + skip + int(nz[0])) // UNIT
    return None


def check_consume_queues(c, root: Path, cfg, scan, d, min_offset: int, facts: dict) -> None:
    fs = cfg.cq_file_size
    end = scan.end
    listing = list_queues(root)
    for p in listing.problems:
        if p.code in ("symlink", "special-file"):
            c.add(p.code, p.path, None, p.detail)
        else:
            c.add("stray-file", p.path, None, f"{p.code}: {p.detail} (under consumequeue/)")
    # Every valid record's offset, made only for a queue with units that miss (the whole
    # log's offsets: a sound store never needs them here).
    valid_off = functools.cache(lambda: scan.records("offset"))
    debris = facts.get("debris")
    # The broker's reput after a start begins at the largest unit end over all queues,
    # once units past the CommitLog end are cut (spec §9, §10.2).
    tails = {}
    state = {}
    for ref in listing.queues:
        try:
            cq = ConsumeQueue(ref.path, fs)
        except RmqStoreError as e:
            c.add("cq-segment", ref.path, None, str(e.message))
            continue
        with cq:
            for p in cq.problems:
                if p.code in ("symlink", "special-file"):
                    c.add(p.code, p.path, None, p.detail)
                elif p.code == "stray-file":
                    c.add("stray-file", p.path, None, f"{p.detail} (in a ConsumeQueue directory)")
                elif p.code != "beyond-end":
                    c.add("cq-segment", p.path, None, f"{p.code}: {p.detail}")
            hole = _raw_nonzero_after(cq, ref.path, fs)
            if hole is not None:
                f, pos = _where(ref.path, fs, hole)
                c.add("cq-hole", f, pos,
                      f"{ref.topic}/{ref.queue_id}: units from queue offset {hole} lie after an "
                      f"empty unit at {cq.max_offset}; the broker's load stops at the empty one, "
                      "so consumers never see them", queueOffset=hole)
            u = cq.units
            off = u["commit_log_offset"].astype(np.int64)
            size = u["size"].astype(np.int64)
            # Every queue is held until the reput start is known: as its 20-byte units,
            # widened one queue at a time when it is checked.
            state[ref.topic, ref.queue_id] = (ref, cq.max_offset, cq.base_offset, u)
            live = ~((size == L.CQ_PLACEHOLDER_SIZE) & (off == 0)) & (off < end)
            if live.any():
                k = np.flatnonzero(live)[-1]
                tails[ref.topic, ref.queue_id] = int(off[k] + size[k])
    reput_from = max([min_offset, *tails.values()]) if tails else min_offset
    for key in sorted(set(state) | set(d.units)):
        if not is_safe_topic(key[0]):
            continue  # never a directory: verify reports the records (record-topic-unsafe)
        exp = d.units.get(key, (_EMPTY,) * 4)
        if key not in state:
            eqo, ephy = exp[0], exp[1]
            sel = ephy >= min_offset
            if sel.any():
                _missing_tail(c, root / "consumequeue" / key[0] / str(key[1]), fs, key,
                              eqo[sel], ephy[sel], reput_from)
            continue
        _check_queue(c, fs, key, state.pop(key), exp, valid_off, end, min_offset, debris,
                     reput_from)


def _check_queue(c, fs, key, st, exp, valid_off, end, min_offset, debris, reput_from) -> None:
    ref, max_offset, base_offset, u = st
    qo = base_offset + np.arange(len(u), dtype=np.int64)
    off, size, tags = (u[f].astype(np.int64) for f in ("commit_log_offset", "size", "tags_code"))
    del u, st  # the 20-byte units: only the widened columns from here
    name = f"{key[0]}/{key[1]}"
    eqo, ephy, esize, etags = exp
    real = ~((size == L.CQ_PLACEHOLDER_SIZE) & (off == 0)) & (off >= min_offset)
    beyond = real & (off >= end)
    if beyond.any():
        b = np.flatnonzero(beyond)
        stale = np.zeros(len(b), bool)
        if debris is not None:
            stale = (off[b] == debris[0]) & (size[b] == debris[1])
        for mask, code, why in (
                (stale, "cq-stale-unit", "left by an earlier recovery that cut that record "
                 "(RocketMQ keeps dropped units' bytes, §10.4); brokers cut it again on load"),
                (~stale, "cq-beyond-end", "a broker cuts them on load (§10.4); offline readers "
                 "would read garbage; repair zeroes them")):
            if mask.any():
                first = int(qo[b[mask][0]])
                f, pos = _where(ref.path, fs, first)
                c.add(code, f, pos, f"{name}: {int(mask.sum())} unit(s) from queue offset "
                      f"{first} point at or past the CommitLog end {end}: {why}",
                      queueOffset=first, count=int(mask.sum()))
    inside = np.flatnonzero(real & ~beyond)
    idx = _positions(ephy, off[inside])
    hit = idx < len(ephy)
    hit[hit] = ephy[idx[hit]] == off[inside][hit]
    miss = inside[~hit]
    if len(miss):
        known = sorted_isin(off[miss], valid_off())
        for mask, code, why in ((known, "cq-mismatch", "point at valid records of another queue "
                                 "or at records that get no unit (PREPARED/ROLLBACK)"),
                                (~known, "cq-bad-pointer", "point where no valid record starts")):
            if mask.any():
                first = int(qo[miss[mask][0]])
                f, pos = _where(ref.path, fs, first)
                c.add(code, f, pos, f"{name}: {int(mask.sum())} unit(s) {why}; first at queue "
                      f"offset {first} -> CommitLog {int(off[miss[mask][0]])}",
                      queueOffset=first, count=int(mask.sum()))
    hi, hr = inside[hit], idx[hit]
    wrong = (size[hi] != esize[hr]) | (qo[hi] != eqo[hr])
    if wrong.any():
        w = np.flatnonzero(wrong)[0]
        f, pos = _where(ref.path, fs, int(qo[hi[w]]))
        c.add("cq-mismatch", f, pos, f"{name}: {int(wrong.sum())} unit(s) disagree with their "
              f"record; first: queue offset {int(qo[hi[w]])} has size {int(size[hi[w]])}, the "
              f"record at {int(off[hi[w]])} is {int(esize[hr[w]])} bytes with queue offset "
              f"{int(eqo[hr[w]])}", queueOffset=int(qo[hi[w]]), count=int(wrong.sum()))
    bad_tags = ~wrong & (tags[hi] != etags[hr])
    if bad_tags.any():
        w = np.flatnonzero(bad_tags)[0]
        f, pos = _where(ref.path, fs, int(qo[hi[w]]))
        c.add("cq-tags-mismatch", f, pos, f"{name}: {int(bad_tags.sum())} unit(s) carry a "
              f"tagsCode dispatch would not write; first: queue offset {int(qo[hi[w]])} has "
              f"{int(tags[hi[w]])}, the record gives {int(etags[hr[w]])} (tag filters misroute "
              "it; `rmqstore rebuild --consumequeue` rewrites units from the records)",
              queueOffset=int(qo[hi[w]]), count=int(bad_tags.sum()))
    # Units in queue order point forward, so a strictly increasing hr (one pass) has no
    # duplicate; only otherwise is it worth a sort.
    if len(hr) > 1 and not (hr[1:] > hr[:-1]).all() and len(np.unique(hr)) != len(hr):
        s = np.sort(hr)
        dup = s[1:][s[1:] == s[:-1]]
        first = int(qo[hi][np.flatnonzero(hr == dup[0])[1]])
        f, pos = _where(ref.path, fs, first)
        c.add("cq-duplicate", f, pos, f"{name}: {len(dup)} record(s) have more than one unit; "
              f"first at queue offset {first} (CommitLog {int(ephy[dup[0]])})", queueOffset=first)
    have = np.zeros(len(ephy), bool)
    have[hr] = True
    lost = ~have & (ephy >= min_offset)
    mid = lost & (eqo < max_offset)
    if mid.any():
        m = np.flatnonzero(mid)
        f, pos = _where(ref.path, fs, int(eqo[m[0]]))
        c.add("cq-missing", f, pos, f"{name}: {len(m)} record(s) inside the queue's range have "
              f"no unit pointing at them; first: queue offset {int(eqo[m[0]])} (CommitLog "
              f"{int(ephy[m[0]])}); consumers skip them", queueOffset=int(eqo[m[0]]), count=len(m))
    tail = lost & (eqo >= max_offset)
    if tail.any():
        _missing_tail(c, ref.path, fs, key, eqo[tail], ephy[tail], reput_from)


def _positions(ephy: np.ndarray, off: np.ndarray) -> np.ndarray:
    """``np.searchsorted(ephy, off)``: where each unit's offset is (or would be) among the
    expected units' offsets. In a sound queue the units are the expected ones from some
    point, in order: where the expected offsets strictly increase (not so when stored
    PHYSICALOFFSETs repeat), that is a run of positions, found by one search and two
    comparisons."""
    m = len(off)
    if m:
        a = int(np.searchsorted(ephy, off[0]))
        if a + m <= len(ephy) and np.array_equal(ephy[a:a + m], off) \
                and bool((ephy[1:] > ephy[:-1]).all()):
            return np.arange(a, a + m, dtype=np.intp)
    return np.searchsorted(ephy, off)


def _missing_tail(c, qdir: Path, fs: int, key, eqo, ephy, reput_from: int) -> None:
    f, pos = _where(qdir, fs, int(eqo[0]))
    restored = bool(ephy[0] >= reput_from)
    c.add("cq-missing-tail", f, pos,
          f"{key[0]}/{key[1]}: {len(eqo)} record(s) from queue offset {int(eqo[0])} (CommitLog "
          f"{int(ephy[0])}) have no unit yet; " + (
              "a broker's reput re-dispatches them on start" if restored else
              f"a 4.9 broker's reput starts at {reput_from} and never adds them; repair does"),
          severity="warning" if restored else "error",
          queueOffset=int(eqo[0]), count=len(eqo))
