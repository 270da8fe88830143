"""The numba kernel behind :meth:`rmqstore.files.index.IndexFile.put_many`: the broker's
putKey (spec §7.4) for many entries in one compiled loop, straight into the file's map.

Imported only by :mod:`rmqstore.files.index`, lazily (through :mod:`rmqstore.files.jit`):
importing this module imports numba and loads (or compiles) the kernel. Where every field
sits and how wide it is comes in as an argument (:func:`geometry`), from
:mod:`rmqstore.format.layout`; the rules (slot = hash % slots, a head that is no earlier
entry starts a new chain, timeDiff in seconds clamped to an int32, the first put sets the
begin fields) are :meth:`IndexFile.put`'s, which with the numpy form of ``put_many`` is the
definition; tests hold all three to the same bytes.

The kernel stores whole 4-byte words (every IndexFile field is one or two, at a multiple of
4) through a native uint32 view of the map, byte-swapped to big-endian: it serves
little-endian hosts (:func:`geometry` says None elsewhere, and numpy does the work).
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

from ..format import layout as L

WORD = np.dtype(np.uint32).itemsize
# Indices into the geometry vector (see :func:`geometry`); positions and widths in words.
G_SLOTS_AT, G_SLOT_W, G_ENTRY_W, G_KH_AT, G_KH_W, G_PHY_AT, G_PHY_W, G_TD_AT, G_TD_W, \
    G_PREV_AT, G_PREV_W, G_TD_MAX = range(12)
BLOCK = 512  # entries whose slots are read ahead together


def geometry() -> np.ndarray | None:
    """First slot, slot width, entry size, (offset, width) of each entry field, all in
    words, and the largest timeDiff, from :mod:`rmqstore.format.layout`; None where the
    kernel cannot serve (a big-endian host, a field off the word grid)."""
    fields = L.INDEX_ENTRY_DTYPE.fields
    at = [x for name in ("key_hash", "phy_offset", "time_diff", "prev_index")
          for x in (fields[name][1], fields[name][0].itemsize)]
    nums = [L.index_slot_position(0), L.INDEX_SLOT_SIZE, L.INDEX_ENTRY_SIZE, *at]
    if sys.byteorder != "little" or any(x % WORD for x in nums) or L.INDEX_SLOT_SIZE != WORD:
        return None
    return np.array([x // WORD for x in nums] + [L.INT32_MAX], np.int64)


@njit(cache=True, nogil=True, inline="always")
def _swap(v):
    """A uint32's bytes reversed (LLVM makes it one bswap)."""
    return ((v >> 24) & 0xFF) | ((v >> 8) & 0xFF00) | ((v << 8) & 0xFF0000) \
        | ((v << 24) & 0xFF000000)


@njit(cache=True, nogil=True, inline="always")
def _put(m32, at, v, words):
    """The low ``words`` words of ``v``, big-endian, from word ``at`` (two's complement,
    as numpy's cast to the field's type keeps them)."""
    for k in range(words - 1, -1, -1):
        m32[at + k] = np.uint32(_swap(v & 0xFFFFFFFF))
        v >>= 32


@njit(cache=True, nogil=True)
def put_entries(m32, g, slot_num, entries_at, count, cap, begin_ts, begin_phy, key_hashes,
                phy, ts):
    """putKey for each entry in order while ``count`` (the header's indexCount) is below
    ``cap`` (``m32``: the map as native uint32; ``entries_at``: entry 0's word): (entries
    put, indexCount, new slots used, beginTimestamp, beginPhyOffset). The caller writes
    the header."""
    new = 0
    n = len(key_hashes)
    slots_at, sw, ew = g[G_SLOTS_AT], g[G_SLOT_W], g[G_ENTRY_W]  # sw: 1 (geometry)
    td_max = g[G_TD_MAX]
    at = np.empty(min(n, BLOCK), np.int64)
    ahead = np.empty(min(n, BLOCK), np.uint32)
    for j in range(n):
        if j % BLOCK == 0:
            # The slot table is large and read at random: this block's slots are first
            # read in a loop of independent loads (so their cache misses overlap), then
            # read again and updated in order below (a slot can take several entries).
            for k in range(j, min(n, j + BLOCK)):
                s = slots_at + key_hashes[k] % slot_num * sw  # Python's %, as put's
                at[k - j] = s
                ahead[k - j] = m32[s]  # kept only so that the load is not optimised away
        if count >= cap:
            return j, count, new, begin_ts, begin_phy
        s = at[j % BLOCK]
        head = np.int64(np.int32(_swap(m32[s])))
        if head <= 0 or head > count:
            head = 0
            new += 1
        t = ts[j]
        if begin_ts <= 0 or t < begin_ts:  # compared first: no int64 wrap-round
            td = np.int64(0)
        else:
            td = min((t - begin_ts) // 1000, td_max)
        e = entries_at + count * ew
        _put(m32, e + g[G_KH_AT], key_hashes[j], g[G_KH_W])
        _put(m32, e + g[G_PHY_AT], phy[j], g[G_PHY_W])
        _put(m32, e + g[G_TD_AT], td, g[G_TD_W])
        _put(m32, e + g[G_PREV_AT], head, g[G_PREV_W])
        _put(m32, s, count, sw)
        if count <= 1:
            begin_phy = phy[j]
            begin_ts = t
        count += 1
    return n, count, new, begin_ts, begin_phy


# --- verify's check of one file's entries ----------------------------------------------

#: What :func:`check_entries` reports: indices into its output vector.
(C_USED, C_BAD_HEADS, C_BAD_HEAD_SLOT, C_BAD_HEAD_VALUE, C_WRONG_SLOT, C_BAD, C_BAD_FIRST,
 C_MERGED, C_ORPHANS, C_ORPHAN_FIRST, C_BEYOND, C_BEYOND_FIRST, C_NOWHERE,
 C_NOWHERE_FIRST) = range(14)
CHECKS = 14


@njit(cache=True, nogil=True, inline="always")
def _get(m32, at, words):
    """The signed big-endian value of ``words`` (1 or 2) words from word ``at``."""
    v = np.int64(0)
    for k in range(words):
        v = (v << 32) | np.int64(_swap(m32[at + k]))
    if words == 1 and v >= np.int64(1) << 31:
        v -= np.int64(1) << 32
    return v


@njit(cache=True, nogil=True, inline="always")
def _seek(a, x, j):
    """``searchsorted(a, x)`` (``a`` sorted), galloping forward from ``j`` when ``a[:j]``
    lies below ``x`` (entries come in CommitLog order: the answer is usually at ``j``)."""
    n = len(a)
    if j > 0 and a[j - 1] >= x:
        return np.searchsorted(a, x)
    lo = j
    hi = j
    step = 1
    while hi < n and a[hi] < x:
        lo = hi + 1
        hi = lo + step
        step *= 2
    hi = min(hi, n)
    return lo + np.searchsorted(a[lo:hi], x)


@njit(cache=True, nogil=True, inline="always")
def _mod(v, n, inv):
    """``v % n`` as Python has it (the sign of ``n``), for |v|, n below 2**53, by a
    multiplication with ``inv = 1 / n``: a division costs ten times more, and the
    quotient it gives is off by at most one, which the two corrections put right."""
    r = v - np.int64(v * inv) * n
    if r < 0:
        r += n
    if r < 0:
        r += n
    if r >= n:
        r -= n
    if r >= n:
        r -= n
    return r


@njit(cache=True, nogil=True)
def check_chains(slots, ents, g, ic, slot_num, out):
    """The slot and chain facts verify reports about one IndexFile (``slots``, ``ents``:
    the slot table and the entries as stored words; ``ic``: indexCount, at most
    maxIndexNum) into ``out`` (:data:`CHECKS` int64s: the ``C_`` names up to
    ``C_ORPHAN_FIRST``). The numpy form in rmqstore.recovery.verify_index (``file_facts``)
    is the definition.

    Entries are read in order; what a check needs of another entry (its slot, whether a
    slot or another entry points at it) is kept in small per-entry arrays, so the 20-byte
    entries are never read at random."""
    ew, sw = g[G_ENTRY_W], g[G_SLOT_W]
    kh_at, kh_w = g[G_KH_AT], g[G_KH_W]
    td_at, td_w = g[G_TD_AT], g[G_TD_W]
    pv_at, pv_w = g[G_PREV_AT], g[G_PREV_W]
    inv = 1.0 / slot_num
    for k in range(C_ORPHAN_FIRST + 1):
        out[k] = 0
    for k in (C_BAD_HEAD_SLOT, C_BAD_FIRST, C_ORPHAN_FIRST):
        out[k] = -1
    m = max(ic, 1)
    headed = np.zeros(m, np.int32)  # 1 + the slot whose head the entry is (0: none)
    slot_of = np.empty(m, np.int32)  # each entry's slot, once read
    pointed = np.zeros(m, np.uint8)  # 1: some entry's predecessor, 2: more than one's
    for s in range(slot_num):
        head = _get(slots, s * sw, sw)
        if head > 0 and head < ic:
            out[C_USED] += 1
            if headed[head] == 0:
                headed[head] = s + 1
            elif _mod(_get(ents, head * ew + kh_at, kh_w), slot_num, inv) != s:
                out[C_WRONG_SLOT] += 1  # the head of two slots (damage): judged here
        elif head != 0:
            if out[C_BAD_HEADS] == 0:
                out[C_BAD_HEAD_SLOT] = s
                out[C_BAD_HEAD_VALUE] = head
            out[C_BAD_HEADS] += 1
    for k in range(1, ic):
        at = k * ew
        kh = _get(ents, at + kh_at, kh_w)
        prev = _get(ents, at + pv_at, pv_w)
        sk = _mod(kh, slot_num, inv)
        slot_of[k] = sk
        if headed[k] != 0 and headed[k] - 1 != sk:
            out[C_WRONG_SLOT] += 1
        bad = prev < 0 or prev >= k
        if not bad and prev > 0:  # linked: same slot, and no entry the predecessor of two
            if slot_of[prev] != sk:
                bad = True
            p = pointed[prev]
            if p == 1:
                out[C_MERGED] += 1
            if p < 2:
                pointed[prev] = p + 1
        if bad or kh < 0 or _get(ents, at + td_at, td_w) < 0:
            if out[C_BAD] == 0:
                out[C_BAD_FIRST] = k
            out[C_BAD] += 1
    for k in range(1, ic):
        if headed[k] == 0 and pointed[k] == 0:
            if out[C_ORPHANS] == 0:
                out[C_ORPHAN_FIRST] = k
            out[C_ORPHANS] += 1


@njit(cache=True, nogil=True)
def check_pointers(ents, g, ic, valid_off, odd, end, min_offset, out):
    """The pointer facts verify reports about one IndexFile's entries (``C_BEYOND`` on)
    into ``out``: entries at or past ``end`` that are no stored PHYSICALOFFSET (``odd``,
    sorted), entries from ``min_offset`` below ``end`` where no record starts
    (``valid_off``, sorted). ``file_facts`` in rmqstore.recovery.verify_index defines them."""
    ew = g[G_ENTRY_W]
    phy_at, phy_w = g[G_PHY_AT], g[G_PHY_W]
    out[C_BEYOND] = out[C_NOWHERE] = 0
    out[C_BEYOND_FIRST] = out[C_NOWHERE_FIRST] = -1
    jv = 0
    jo = 0
    for k in range(1, ic):
        phy = _get(ents, k * ew + phy_at, phy_w)
        if phy >= end:
            far = True
            if len(odd):
                jo = _seek(odd, phy, jo)
                far = not (jo < len(odd) and odd[jo] == phy)
            if far:
                if out[C_BEYOND] == 0:
                    out[C_BEYOND_FIRST] = k
                out[C_BEYOND] += 1
        elif phy >= min_offset:
            jv = _seek(valid_off, phy, jv)
            if not (jv < len(valid_off) and valid_off[jv] == phy):
                if out[C_NOWHERE] == 0:
                    out[C_NOWHERE_FIRST] = k
                out[C_NOWHERE] += 1
