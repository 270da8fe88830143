"""Finding properties by name in many records at once, with numpy (spec §3.4).

Properties are never decoded per record. :class:`PropertyIndex` finds the ``0x02``
separators of every record's properties in one pass and matches a name only where a
segment starts; the values' Java hashes are :func:`rmqstore.format.hashing.span_hash`'s.
"""

from __future__ import annotations

import numpy as np

from ..format.hashing import span_rows

_CHUNK = 64 * 1024 * 1024  # bytes compared at a time when looking for separators


# --- property lookup (spec §3.4) -----------------------------------------------------------


_ROWS_MAX = 256  # properties up to this long are copied as matrix rows to find separators


def property_segments(u8: np.ndarray, props_pos: np.ndarray, props_len: np.ndarray):
    """(segment start, segment end, record index, first 4 bytes as a native int) of every
    ``0x02``-separated property segment of every record, in byte order."""
    has = props_len > 0
    if not has.any():
        z = np.zeros(0, np.int64)
        return z, z, z, z
    end = props_pos + props_len
    rec_has = np.flatnonzero(has)
    width = int(props_len.max())
    if width <= _ROWS_MAX and int(props_pos[rec_has[-1]]) + width <= len(u8):
        # Only the properties' bytes are searched (not bodies), as rows of a matrix.
        flat = np.flatnonzero(span_rows(u8, props_pos[rec_has], width) == 2)  # in byte order
        r, c = np.divmod(flat, width)
        keep = c < props_len[rec_has[r]]
        r, c = r[keep], c[keep]
        sep = props_pos[rec_has[r]] + c
    else:
        lo, hi = int(props_pos[rec_has[0]]), int(end[rec_has[-1]])
        seps = []
        for a in range(lo, hi, _CHUNK):
            b = min(hi, a + _CHUNK)
            seps.append(np.flatnonzero(u8[a:b] == 2) + a)
        sep = np.concatenate(seps) if seps else np.zeros(0, np.int64)
        rec = np.searchsorted(props_pos, sep, side="right") - 1
        inside = (rec >= 0) & (sep < end[np.maximum(rec, 0)])
        sep, rec = sep[inside], rec[inside]
        r = np.searchsorted(rec_has, rec)  # row of each separator's record
    # Merge record starts and separators (both in byte order) without sorting: row i's
    # first segment goes right before its separators, each separator starts a segment
    # and ends the one before it.
    nh, ns = len(rec_has), len(sep)
    cnt = np.bincount(r, minlength=nh)
    slot_first = np.arange(nh) + (np.cumsum(cnt) - cnt)
    slot_sep = np.arange(ns) + r + 1
    starts = np.empty(nh + ns, np.int64)
    owner = np.empty(nh + ns, np.int64)
    ends = np.empty(nh + ns, np.int64)
    starts[slot_first] = props_pos[rec_has]
    owner[slot_first] = rec_has
    starts[slot_sep] = sep + 1
    owner[slot_sep] = rec_has[r]
    ends[slot_first + cnt] = end[rec_has]  # each row's last segment ends with it
    ends[slot_sep - 1] = sep
    n4 = len(u8) - 3
    head = np.zeros(nh + ns, np.int64)
    if n4 > 0:
        v = np.ndarray(shape=(n4,), dtype="<i4", buffer=u8, offset=0, strides=(1,))
        head = v[np.minimum(starts, n4 - 1)]
    return starts, ends, owner, head


def lookup(u8: np.ndarray, segs, n: int, name: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(value start, value length) of property ``name`` per record; start -1 when absent.

    A segment counts when its text before the first ``0x01`` is ``name`` and the value is
    not empty; when a name repeats, the later value wins (spec §3.4)."""
    starts, ends, owner = segs[:3]
    m = len(name)
    pattern = name + b"\x01"
    if m >= 4 and len(segs) > 3:
        cand = np.flatnonzero(segs[3] == int.from_bytes(pattern[:4], "little", signed=True))
        cand = cand[ends[cand] - starts[cand] >= m + 2]
        rest = enumerate(pattern[4:], 4)
    else:
        cand = np.flatnonzero(ends - starts >= m + 2)
        rest = enumerate(pattern)
    for k, byte in rest:
        if not len(cand):
            break
        cand = cand[u8[starts[cand] + k] == byte]
    vpos = np.full(n, -1, np.int64)
    vlen = np.zeros(n, np.int64)
    if len(cand):
        rec = owner[cand]
        last = np.ones(len(cand), bool)
        last[:-1] = rec[1:] != rec[:-1]  # segments are in byte order: the last one wins
        cand, rec = cand[last], rec[last]
        vpos[rec] = starts[cand] + m + 1
        vlen[rec] = ends[cand] - vpos[rec]
    return vpos, vlen


class PropertyIndex:
    """Look property names up in every record's properties at once (spec §3.4).

    Properties up to ``_ROWS_MAX`` bytes are copied as rows of a matrix; separators
    (``0x02``) are found once, and a name is matched only where a segment starts (each row's
    first byte and the byte after each separator) by its first four bytes as one int.
    Wider properties use :func:`property_segments` and :func:`lookup`.
    """

    def __init__(self, u8: np.ndarray, props_pos: np.ndarray, props_len: np.ndarray):
        self.u8, self.n = u8, len(props_pos)
        self.props_pos = props_pos
        self._segs = None
        self._rec = np.flatnonzero(props_len > 0)
        if not len(self._rec):
            return
        width = int(props_len.max())
        stride = width + 4  # room to read 4 bytes at any segment start
        last = int(props_pos[self._rec[-1]])
        if width > _ROWS_MAX or last + stride > len(u8):
            self._segs = property_segments(u8, props_pos, props_len)
            return
        k = len(self._rec)
        m = span_rows(u8, props_pos[self._rec], stride)
        self._m, self._stride = m.reshape(-1), stride
        self._plen = props_len[self._rec]
        flat = np.flatnonzero(m[:, :width] == 2)
        r, c = np.divmod(flat, width)
        keep = c < self._plen[r]
        self._sep_row, self._sep_col = r[keep], c[keep]
        count = np.bincount(self._sep_row, minlength=k)
        self._first_sep = np.cumsum(count) - count  # index of each row's first separator
        heads = np.ndarray(shape=(k * stride - 3,), dtype="<i4", buffer=self._m, strides=(1,))
        self._head0 = heads[np.arange(k, dtype=np.int64) * stride]
        self._head_sep = heads[self._sep_row * stride + self._sep_col + 1]

    def lookup(self, name: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(value start, value length) of property ``name`` per record; start -1 when
        absent. The text before a segment's first ``0x01`` must be ``name`` and the value
        must not be empty; when a name repeats, the later value wins (as :func:`lookup`)."""
        if self._segs is not None:
            return lookup(self.u8, self._segs, self.n, name)
        vpos = np.full(self.n, -1, np.int64)
        vlen = np.zeros(self.n, np.int64)
        if not len(self._rec):
            return vpos, vlen
        pattern = name + b"\x01"
        key = int.from_bytes(pattern[:4].ljust(4, b"\0"), "little", signed=True)
        sr, sc = self._sep_row, self._sep_col
        nsep = len(sr)
        for head, at_sep in ((self._head0, False), (self._head_sep, True)):
            if len(pattern) >= 4:
                i = np.flatnonzero(head == key)
            else:
                i = np.flatnonzero((head & (1 << 8 * len(pattern)) - 1) == key)
            if at_sep:
                r, c = sr[i], sc[i] + 1
            else:
                r, c = i, np.zeros(len(i), np.int64)
            ok = c + len(pattern) < self._plen[r]  # at least one value byte
            i, r, c = i[ok], r[ok], c[ok]
            base = r * self._stride + c
            for j in range(4, len(pattern)):
                ok = self._m[base + j] == pattern[j]
                i, r, c, base = i[ok], r[ok], c[ok], base[ok]
            # the value runs to the next separator of its row, or to the row's end
            nxt = i + 1 if at_sep else self._first_sep[r]
            inside = nxt < nsep
            same = np.zeros(len(nxt), bool)
            same[inside] = sr[nxt[inside]] == r[inside]
            end = np.where(same, sc[np.minimum(nxt, max(nsep - 1, 0))] if nsep else 0,
                           self._plen[r])
            start = c + len(pattern)
            ok = end > start
            r, start, end = r[ok], start[ok], end[ok]
            if len(r):
                # Separator matches come in byte order and after a row's col-0 match, so
                # writing col 0 first and then the last match of each row: the later wins.
                last = np.ones(len(r), bool)
                last[:-1] = r[1:] != r[:-1]
                rec = self._rec[r[last]]
                vpos[rec] = self.props_pos[rec] + start[last]
                vlen[rec] = (end - start)[last]
        return vpos, vlen


def sorted_isin(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin`` for a sorted ``sorted_set`` by binary search (no hashing or sorting).
    Values in non-decreasing order (an IndexFile's offsets: a record's keys sit side by
    side) are searched once per run of equal values."""
    if not len(sorted_set):
        return np.zeros(len(values), bool)
    n = len(values)
    if n > 1024:
        step = values[1:] != values[:-1]
        if not (values[1:] < values[:-1]).any():
            starts = np.flatnonzero(np.concatenate(([True], step)))
            if len(starts) * 2 < n:  # runs: search each distinct value once
                return np.repeat(sorted_isin(values[starts], sorted_set),
                                 np.diff(np.append(starts, n)))
    i = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[i] == values
