"""Text work over many byte spans at once, with numpy: finding properties by name
(spec §3.4) and Java's ``String.hashCode`` of spans (spec §0, §6.1, §7.2).

Properties are never decoded per record. :class:`PropertyIndex` finds the ``0x02``
separators of every record's properties in one pass and matches a name only where a
segment starts; :func:`span_hash` hashes values column by column. Only values with
non-ASCII bytes (UTF-16 units differ from bytes) take a per-value Python path.
"""

from __future__ import annotations

import numpy as np

from .codec import java_hash

_CHUNK = 64 * 1024 * 1024  # bytes compared at a time when looking for separators
_FAST_MAX = 96  # values up to this many bytes are hashed vectorised
_EXACT_MAX = 6  # up to this many distinct lengths are hashed one exact-width matrix each


def rows(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """An (n, width) uint8 matrix: the ``width`` bytes at each of ``pos`` (one copy per
    row; every ``pos + width`` must be within ``u8``)."""
    if width <= 0:
        return np.zeros((len(pos), 0), np.uint8)
    # One void item of ``width`` bytes at every byte: fancy indexing then copies whole
    # items, about twice as fast as gathering rows of a 2-d strided view.
    items = np.ndarray(shape=(max(len(u8) - width + 1, 0),), dtype=f"V{width}", buffer=u8,
                       offset=0, strides=(1,))
    return items[pos].view(np.uint8).reshape(len(pos), width)


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
        flat = np.flatnonzero(rows(u8, props_pos[rec_has], width) == 2)  # in byte order
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
        m = rows(u8, props_pos[self._rec], stride)
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


# --- Java String.hashCode over byte spans (spec §0) ----------------------------------------


def _pow31(n: int) -> np.ndarray:
    p, v = np.ones(n + 1, np.uint32), 1
    for k in range(1, n + 1):
        v = v * 31 & 0xFFFFFFFF
        p[k] = v
    return p


_POW = _pow31(_FAST_MAX + 1)
# 31 is odd, so it has an inverse mod 2^32: trailing zero bytes can be divided back out.
_INV31 = pow(31, -1, 2**32)
_INVPOW = np.array([pow(_INV31, k, 2**32) for k in range(_FAST_MAX + 2)], np.uint32)


def span_hash(u8: np.ndarray, pos: np.ndarray, length: np.ndarray, flag: int | None = None):
    """Java hash (as uint32) of each byte span read as text, and its UTF-16 length (and,
    with ``flag``, whether the span holds that byte).

    ASCII spans up to ``_FAST_MAX`` bytes are hashed vectorised: the spans are copied as
    rows of a matrix and Horner's rule becomes one dot product with powers of 31. Spans of
    one length share a matrix of exactly that width; with many lengths, rows of a width
    class are zeroed past each span's end and the trailing zeros' factor 31^pad is divided
    back out (31 is invertible mod 2^32). Others are decoded (UTF-8, malformed input replaced, as the
    broker decodes) and hashed in Python."""
    n = len(pos)
    h = np.zeros(n, np.uint32)
    units = length.astype(np.int64).copy()
    has = np.zeros(n, bool) if flag is not None else None
    if n == 0:
        return (h, units) if flag is None else (h, units, has)
    fast = (length <= _FAST_MAX) & (pos + _FAST_MAX <= len(u8))
    slow = np.flatnonzero(~fast).tolist()
    fast = np.flatnonzero(fast)
    lengths = np.flatnonzero(np.bincount(length[fast], minlength=1)) if len(fast) else []
    if len(lengths) <= _EXACT_MAX:
        # Few distinct lengths (tags, keys, UNIQ_KEYs usually share one): a matrix per
        # length, exactly as wide as its spans, needs no masking and no 31^pad division.
        groups = [(fast if len(lengths) == 1 else fast[length[fast] == n_], int(n_), False)
                  for n_ in lengths if n_]
    else:
        groups, lo = [], 0
        for hi in (8, 16, 32, 64, _FAST_MAX):  # width classes: padding stays under 2x
            sel = fast[(length[fast] > lo) & (length[fast] <= hi)]
            lo = hi
            if len(sel):
                groups.append((sel, int(length[sel].max()), True))
    for sel, width, padded in groups:
        m = rows(u8, pos[sel], width)
        if padded:
            ln = length[sel]
            m[np.arange(width)[None, :] >= ln[:, None]] = 0
        hh = m.astype(np.uint32) @ _POW[width - 1::-1]
        if padded:
            hh *= _INVPOW[width - ln]
        h[sel] = hh
        if flag is not None:
            has[sel] = (m == flag).any(axis=1)
        if int(m.max()) >= 0x80:
            slow.extend(sel[(m >= 0x80).any(axis=1)].tolist())
    for i in slow:
        raw = u8[int(pos[i]):int(pos[i] + length[i])].tobytes()
        s = raw.decode("utf-8", "replace")
        h[i] = java_hash(s) & 0xFFFFFFFF
        units[i] = len(s.encode("utf-16-be", "surrogatepass")) // 2
        if flag is not None:
            has[i] = flag in raw
    return (h, units) if flag is None else (h, units, has)


def sorted_isin(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin`` for a sorted ``sorted_set`` by binary search (no hashing or sorting)."""
    if not len(sorted_set):
        return np.zeros(len(values), bool)
    i = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[i] == values


def _signed(h: np.ndarray) -> np.ndarray:
    return h.astype(np.uint32).view(np.int32).astype(np.int64)


def index_hash_from(topic_hash: np.ndarray, key_hash: np.ndarray, key_units: np.ndarray) -> np.ndarray:
    """IndexFile hash of ``topic + "#" + key`` from the parts' Java hashes (spec §7.2):
    hash(a + b) = hash(a) * 31^len(b) + hash(b), all mod 2^32."""
    maxu = int(key_units.max()) if len(key_units) else 0
    pw = _pow31(maxu + 1)
    prefix = (topic_hash.astype(np.uint32) * np.uint32(31) + np.uint32(ord("#"))).astype(np.uint32)
    h = (prefix * pw[key_units] + key_hash.astype(np.uint32)).astype(np.uint32)
    s = h.view(np.int32).astype(np.int64)
    s = np.abs(s)
    s[s == 2**31] = 0  # Math.abs(MIN_VALUE) stays negative; the broker maps it to 0
    return s
