"""The numba kernel behind :meth:`rmqstore.files.index.IndexFile.put_many`: the broker's
putKey (spec §7.4) for many entries in one compiled loop, straight into the file's map.

Imported only by :mod:`rmqstore.files.index`, lazily (through :mod:`rmqstore.files.jit`):
importing this module imports numba and loads (or compiles) the kernel. Where every field
sits and how wide it is comes in as an argument (:func:`geometry`), from
:mod:`rmqstore.format.layout`; the rules (slot = hash % slots, a head that is no earlier
entry starts a new chain, timeDiff in seconds clamped to an int32, the first put sets the
begin fields) are :meth:`IndexFile.put`'s, which with the numpy form of ``put_many`` is the
definition; tests hold all three to the same bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..format import layout as L

# Indices into the geometry vector (see :func:`geometry`).
G_SLOTS_AT, G_SLOT_W, G_ENTRY_SIZE, G_KH_AT, G_KH_W, G_PHY_AT, G_PHY_W, G_TD_AT, G_TD_W, \
    G_PREV_AT, G_PREV_W, G_TD_MAX = range(12)


def geometry() -> np.ndarray:
    """Header size, slot width, entry size, (offset, width) of each entry field and the
    largest timeDiff, from :mod:`rmqstore.format.layout`."""
    fields = L.INDEX_ENTRY_DTYPE.fields
    at = [x for name in ("key_hash", "phy_offset", "time_diff", "prev_index")
          for x in (fields[name][1], fields[name][0].itemsize)]
    return np.array([L.index_slot_position(0), L.INDEX_SLOT_SIZE, L.INDEX_ENTRY_SIZE, *at,
                     L.INT32_MAX], np.int64)


@njit(cache=True, nogil=True, inline="always")
def _get(mm, p, w):
    """The signed big-endian integer of ``w`` (< 8) bytes at ``p``."""
    v = np.int64(0)
    for k in range(w):
        v = (v << 8) | np.int64(mm[p + k])
    if v >= np.int64(1) << (8 * w - 1):
        v -= np.int64(1) << (8 * w)
    return v


@njit(cache=True, nogil=True, inline="always")
def _put(mm, p, v, w):
    """The low ``w`` bytes of ``v``, big-endian, at ``p`` (two's complement, as numpy's
    cast to the field's type keeps them)."""
    for k in range(w - 1, -1, -1):
        mm[p + k] = np.uint8(v & 0xFF)
        v >>= 8


@njit(cache=True, nogil=True)
def put_entries(mm, g, slot_num, entries_start, count, cap, begin_ts, begin_phy, key_hashes,
                phy, ts):
    """putKey for each entry in order while ``count`` (the header's indexCount) is below
    ``cap``: (entries put, indexCount, new slots used, beginTimestamp, beginPhyOffset).
    The caller writes the header."""
    new = 0
    n = len(key_hashes)
    slots_at, slot_w, esize = g[G_SLOTS_AT], g[G_SLOT_W], g[G_ENTRY_SIZE]
    td_max = g[G_TD_MAX]
    for j in range(n):
        if count >= cap:
            return j, count, new, begin_ts, begin_phy
        kh = key_hashes[j]
        sp = slots_at + (kh % slot_num) * slot_w  # Python's %, as numpy's and put's
        head = _get(mm, sp, slot_w)
        if head <= 0 or head > count:
            head = 0
            new += 1
        t = ts[j]
        if begin_ts <= 0 or t < begin_ts:  # compared first: no int64 wrap-round
            td = np.int64(0)
        else:
            td = min((t - begin_ts) // 1000, td_max)
        e = entries_start + count * esize
        _put(mm, e + g[G_KH_AT], kh, g[G_KH_W])
        _put(mm, e + g[G_PHY_AT], phy[j], g[G_PHY_W])
        _put(mm, e + g[G_TD_AT], td, g[G_TD_W])
        _put(mm, e + g[G_PREV_AT], head, g[G_PREV_W])
        _put(mm, sp, count, slot_w)
        if count <= 1:
            begin_phy = phy[j]
            begin_ts = t
        count += 1
    return n, count, new, begin_ts, begin_phy
