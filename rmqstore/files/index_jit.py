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
