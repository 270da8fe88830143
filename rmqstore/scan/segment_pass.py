"""A segment's dispatch data in one compiled pass, when numba is there: the fast form of
:func:`rmqstore.scan.dispatch.segment_dispatch` (and of each range of
:func:`~rmqstore.scan.dispatch.split_dispatch`).

The numpy path stays the definition of every rule (scan/records, scan/properties,
format/crc, format/hashing, scan/dispatch); :func:`dispatch_range` gives the same fields,
dtypes and order, or None, and then the caller takes the numpy path for the range. None
when: the switch is off (``RMQSTORE_NO_JIT=1``, or numba does not import), no records,
any record not whole (spec §3.9 size rule: which later records count is numpy's rule),
the delay topic when the caller gives no rule for it, two topics the numpy topic table would
merge, or very many topics. Values with non-ASCII bytes (tags, keys) are hashed by
:func:`rmqstore.format.hashing.span_hash` itself, for those values only.

numba is imported on the first bulk scan only, never by lookups; compiled kernels are
cached in ``$NUMBA_CACHE_DIR``, by default the user's cache directory (never the store).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..files import jit
from ..format.crc import native_crc32
from ..format.hashing import java_hash, pow31, signed_int32, span_hash
from ..format.rules import SCHEDULE_TOPIC
from .records import chain_stop, columns

#: How often each path ran in this process: "kernel", "off" (switched off or no numba),
#: or "fallback: <why>". Tests read it to prove the kernel is used.
used: Counter = Counter()

#: The SegmentDispatch fields (but start and limit) :func:`dispatch_range` makes.
FIELDS = frozenset(("chain_end", "stop", "offset", "size", "consistent", "crc_ok", "queue_id",
                    "queue_offset", "physical_offset", "sys_flag", "store_timestamp", "topics",
                    "topic_id", "tags_code", "key_record", "key_hash"))

_kernels = None  # the loaded kernel module and its tables, or False when numba is missing


def enabled() -> bool:
    """Is the compiled pass on (numba imports, ``RMQSTORE_NO_JIT`` is not 1)? The first
    call loads the kernels."""
    return _load() is not None


def warm() -> bool:
    """:func:`enabled`, and each kernel run once on a one-record segment, so its compiled
    code is in memory: forked workers then inherit it instead of loading it each."""
    if not enabled():
        return False
    from ..format.message import Message
    from ..format.record import encode_record

    one = encode_record(Message(topic="T", body=b"b", properties_text="KEYS\x01k\x02UNIQ_KEY\x01u"))
    dispatch_range(one, 0, len(one), len(one), 0, check_crc=True, keys=True)
    return True


def _load():
    global _kernels
    if jit.switched_off():
        return None
    if _kernels is None:
        K = jit.load(__package__ + ".segment_jit")
        if K is None:
            _kernels = False
        else:
            g, tab = K.geometry()
            _kernels = (K, g, tab, K.crc_tables(), np.frombuffer(b"TAGS", np.uint8),
                        np.frombuffer(b"KEYS", np.uint8), np.frombuffer(b"UNIQ_KEY", np.uint8),
                        *native_crc32())
    return _kernels or None


def dispatch_range(buf, first: int, end: int, limit: int, base: int, *, check_crc: bool,
                   keys: bool, fields: frozenset = FIELDS, delay_codes=None) -> dict | None:
    """The :class:`~rmqstore.scan.dispatch.SegmentDispatch` fields of the records from
    ``first`` on the TOTALSIZE chain, starting below ``end``, in ``buf[:limit]`` (as
    ``walk_range`` then ``fill_dispatch`` make them), or None: take the numpy path. ``fields``
    (what the caller's fill makes) must be :data:`FIELDS`: a field this pass does not
    know is never left at its default. ``delay_codes(code, u8, starts, records, store
    timestamps)`` sets the tagsCode of the delay topic's records (numpy's rule, spec
    §6.1); without it a range holding that topic takes the numpy path."""
    if fields != FIELDS:
        return _fallback("fields " + ", ".join(sorted(fields ^ FIELDS)))
    loaded = _load()
    if loaded is None:
        used["off"] += 1
        return None
    K, g = loaded[0], loaded[1]
    u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
    starts = np.empty(max(limit - first, 0) // int(g[K.G_MIN]) + 1, np.int64)
    n, stop_pos = K.walk(u8, first, end, limit, g, starts)
    if n == 0:
        return _fallback("no records")
    # a view: the unused tail was never touched, so never mapped; made absolute in place
    out = _dispatch_at(loaded, u8, starts[:n], base, check_crc, keys, delay_codes)
    if out is None:
        return None
    out.update(chain_end=base + int(stop_pos), stop=chain_stop(buf, int(stop_pos), end, limit))
    assert out.keys() == FIELDS
    used["kernel"] += 1
    return out


def dispatch_at(u8: np.ndarray, starts: np.ndarray, base: int, *, check_crc: bool, keys: bool,
                delay_codes=None) -> dict | None:
    """:func:`dispatch_range`'s fields but ``chain_end`` and ``stop`` for records at
    ``starts`` (positions in ``u8`` of whole records that pass the §3.9 size rule: another
    framing found them, DLedger's entries), or None: take the numpy path."""
    loaded = _load()
    if loaded is None:
        used["off"] += 1
        return None
    if not len(starts):
        return _fallback("no records")
    out = _dispatch_at(loaded, u8, np.array(starts, np.int64), base, check_crc, keys, delay_codes)
    if out is not None:
        used["kernel"] += 1
    return out


def _dispatch_at(loaded, u8, starts, base, check_crc, keys, delay_codes) -> dict | None:
    """The compiled pass over the records at ``starts`` (which it makes absolute)."""
    K, g, tab, T, tags, keys_name, uniq, zcrc, zmin = loaded
    n = len(starts)
    i64 = [np.empty(n, np.int64) for _ in range(7)]
    size, qid, qoff, phy, sysf, ts, code = i64
    crc_ok, tag_bad, tid = np.empty(n, bool), np.empty(n, bool), np.empty(n, np.int64)
    slot = np.full(K.TOPIC_SLOTS, -1, np.int64)
    t_pos, t_len = np.empty(K.MAX_TOPICS, np.int64), np.empty(K.MAX_TOPICS, np.int64)
    t_hash, t_first = np.empty(K.MAX_TOPICS, np.uint64), np.empty(K.MAX_TOPICS, np.int64)
    cap = 2 * n + 16
    kr, kp, kl, kh = (np.empty(cap, np.int64) for _ in range(4))
    kb = np.empty(cap, bool)
    i = nk = nt = 0
    while True:
        status, i, nk, nt = K.records(u8, starts, n, i, nk, nt, check_crc, keys, g, tab, T,
                                      tags, keys_name, uniq, size, qid, qoff, phy, sysf, ts,
                                      crc_ok, code, tag_bad, tid, slot, t_pos, t_len, t_hash,
                                      t_first, kr, kp, kl, kh, kb, zcrc, zmin)
        if status != K.KEYS_FULL:
            break
        cap *= 2
        kr, kp, kl, kh = (np.resize(a, cap) for a in (kr, kp, kl, kh))
        kb = np.resize(kb, cap)
    if status == K.FALLBACK_RECORD:
        return _fallback("record not whole")
    if status == K.FALLBACK_TOPICS:
        return _fallback("many topics")
    # Topics numbered as RecordColumns.topic_table numbers them (its own order): ask it,
    # for one record of each distinct topic.
    names, rank = columns(u8, starts[t_first[:nt]], base).topic_table()
    if len(names) != nt:
        return _fallback("topic hash collision")
    if SCHEDULE_TOPIC in names and delay_codes is None:
        return _fallback("delay topic")
    K.renumber(tid, rank)
    bad = np.flatnonzero(tag_bad)
    if len(bad):  # non-ASCII TAGS: the general hash, for those records only
        tpos, tlen = _value_spans(u8, starts[bad], b"TAGS")
        code[bad] = signed_int32(span_hash(u8, tpos, tlen)[0])
    if SCHEDULE_TOPIC in names:
        delay_codes(code, u8, starts, np.flatnonzero(tid == names.index(SCHEDULE_TOPIC)), ts)
    offset = starts  # the positions are not needed any more: made absolute in place
    offset += base
    out = dict(offset=offset, size=size, consistent=np.ones(n, bool), crc_ok=crc_ok,
               queue_id=qid, queue_offset=qoff, physical_offset=phy, sys_flag=sysf,
               store_timestamp=ts, topics=names, topic_id=tid, tags_code=code)
    if not keys:
        out["key_record"] = out["key_hash"] = np.zeros(0, np.int64)
    else:
        kr, kp, units, kh, kb = kr[:nk], kp[:nk], kl[:nk], kh[:nk], kb[:nk]
        odd = np.flatnonzero(kb)
        if len(odd):  # non-ASCII keys: the general hash (UTF-16 units of 'replace' text)
            h, u = span_hash(u8, kp[odd], units[odd])
            kh[odd], units[odd] = h, u
        th = np.array([java_hash(t) & 0xFFFFFFFF for t in names], np.int64)
        pw = pow31(int(units.max()) + 1 if nk else 1)
        out["key_record"] = kr
        out["key_hash"] = K.index_hashes(th, tid, kr, kh, units, pw)
    return out


def _fallback(why: str) -> None:
    used["fallback: " + why] += 1
    return None


def _value_spans(u8, starts, name: bytes):
    """(value start, length) of property ``name`` of the records at ``starts`` (a few),
    by the numpy lookup."""
    from .properties import PropertyIndex

    cols = columns(u8, starts)
    return PropertyIndex(u8, cols.props_pos, cols.props_len).lookup(name)
