"""Dispatch computed in bulk: what the broker's reput (spec §9) derives from each record,
for a whole segment at once, with numpy over the segment's bytes.

For the records of one segment, :func:`segment_dispatch` gives per record the fixed
fields dispatch uses, the ConsumeQueue tagsCode (§6.1: Java hash of ``TAGS``, or the
delivery time for the delay topic) and the IndexFile key hashes in put order (§7.3:
``topic#UNIQ_KEY`` then ``topic#token`` per KEYS token; ROLLBACK records get none).

Properties are never decoded per record. Separators (``0x02``) are found with one
vectorised pass, property segments whose name is ``TAGS``/``KEYS``/``UNIQ_KEY``/``DELAY``
are matched byte-wise, and Java's ``String.hashCode`` runs over the value bytes column by
column. Only values with non-ASCII bytes (UTF-16 units differ from bytes) and delay-topic
records take a per-record Python path; both are rare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import layout as L
from .codec import SCHEDULE_TOPIC, java_hash, parse_delay_levels, tags_code
from .scan import RecordColumns, columns, consistent, walk_chain, walk_range

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


# --- one segment -----------------------------------------------------------------------


@dataclass
class SegmentDispatch:
    """A segment's records as dispatch sees them, and how its valid chain ends."""

    start: int  # segment start offset
    limit: int  # readable bytes
    chain_end: int  # absolute offset where the TOTALSIZE chain stopped
    stop: str  # blank | end | zeros | bad magic | bad size | short (walk_chain reasons)
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    consistent: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # §3.9 size rule
    crc_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    queue_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    queue_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    physical_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sys_flag: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    store_timestamp: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    topics: list = field(default_factory=list)
    topic_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tags_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    key_record: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # record index
    key_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def cq_mask(self) -> np.ndarray:
        """Records that get a ConsumeQueue unit: NOT_TYPE and COMMIT (spec §6.1)."""
        tx = self.sys_flag & L.SYSFLAG_TRANSACTION_MASK
        return (tx == L.TRANSACTION_NOT_TYPE) | (tx == L.TRANSACTION_COMMIT)


def dispatch_records(cols: RecordColumns, delay_millis=None, *, keys: bool = True):
    """(topics, topic ids, tagsCode, key record index, key hash) for ``cols``."""
    n = len(cols)
    z = np.zeros(0, np.int64)
    if n == 0:
        return [], z, z, z, z
    u8 = cols.u8
    names, tid = cols.topic_table()
    segs = PropertyIndex(u8, cols.props_pos, cols.props_len)
    tpos, tlen = segs.lookup(b"TAGS")
    has = tpos >= 0
    code = np.zeros(n, np.int64)
    if has.any():
        h, _ = span_hash(u8, tpos[has], tlen[has])
        code[has] = _signed(h)
    if SCHEDULE_TOPIC in names:
        # Delivery time instead of the tag hash (spec §6.1); rare, so per record.
        delay = delay_millis if delay_millis is not None else parse_delay_levels()
        dpos, dlen = segs.lookup(b"DELAY")
        sched = np.flatnonzero((tid == names.index(SCHEDULE_TOPIC)) & (dpos >= 0))
        ts = cols.store_timestamp
        for i in sched.tolist():
            props = {"DELAY": u8[dpos[i]:dpos[i] + dlen[i]].tobytes().decode("utf-8", "replace")}
            if has[i]:
                props["TAGS"] = u8[tpos[i]:tpos[i] + tlen[i]].tobytes().decode("utf-8", "replace")
            code[i] = tags_code(SCHEDULE_TOPIC, props, int(ts[i]), delay)
    if not keys:
        return names, tid, code, z, z
    key_rec, key_hash = index_keys(cols, u8, segs, names, tid)
    return names, tid, code, key_rec, key_hash


def index_keys(cols: RecordColumns, u8, segs, names, tid):
    """(record index, index hash) of every IndexFile put, in put order (spec §7.3)."""
    n = len(cols)
    upos, ulen = segs.lookup(b"UNIQ_KEY")
    kpos, klen = segs.lookup(b"KEYS")
    rollback = (cols.sys_flag & L.SYSFLAG_TRANSACTION_MASK) == L.TRANSACTION_ROLLBACK
    ur = np.flatnonzero((upos >= 0) & ~rollback)
    kr = np.flatnonzero((kpos >= 0) & ~rollback)
    # A KEYS value without a space is one token: hash it whole (and learn which have one).
    kh, kunits, spaced = span_hash(u8, kpos[kr], klen[kr], 0x20)
    single = ~spaced
    tok_rec, tok_h, tok_u = kr[single], kh[single], kunits[single]
    if spaced.any():
        # KEYS tokens: split the value on single spaces, dropping empty tokens.
        sr = kr[spaced]
        total = int(klen[sr].sum())
        base = np.repeat(kpos[sr] - np.concatenate(([0], np.cumsum(klen[sr])[:-1])), klen[sr])
        flat_pos = base + np.arange(total)
        owner = np.repeat(sr, klen[sr])
        sp = u8[flat_pos] == 0x20
        starts_flag = np.ones(total, bool)
        starts_flag[1:] = (owner[1:] != owner[:-1]) | sp[:-1]
        starts_flag &= ~sp
        st = np.flatnonzero(starts_flag)
        brk = np.flatnonzero(sp | np.r_[owner[1:] != owner[:-1], True])
        en = brk[np.searchsorted(brk, st, side="left")]
        en = np.where(sp[en], en, en + 1)
        h2, u2 = span_hash(u8, flat_pos[st], en - st)
        tok_rec = np.concatenate([tok_rec, owner[st]])
        tok_h = np.concatenate([tok_h, h2])
        tok_u = np.concatenate([tok_u, u2])
        order = np.argsort(tok_rec, kind="stable")  # tokens of one record stay in order
        tok_rec, tok_h, tok_u = tok_rec[order], tok_h[order], tok_u[order]
    if len(ur):
        uh, uu = span_hash(u8, upos[ur], ulen[ur])
        rec = np.concatenate([ur, tok_rec])
        hs = np.concatenate([uh, tok_h])
        us = np.concatenate([uu, tok_u])
        if len(tok_rec):
            # UNIQ_KEY comes before the KEYS tokens of its record (a stable merge).
            order = np.argsort(rec, kind="stable")
            rec, hs, us = rec[order], hs[order], us[order]
    else:
        rec, hs, us = tok_rec, tok_h, tok_u
    if not len(rec):
        return rec.astype(np.int64), np.zeros(0, np.int64)
    th = np.array([java_hash(t) & 0xFFFFFFFF for t in names], np.uint32)
    return rec, index_hash_from(th[tid[rec]], hs, us)


def scan_segment(buf, start: int, limit: int, *, check_crc: bool = True) -> tuple[RecordColumns, int, str]:
    """Records on the TOTALSIZE chain of one segment (magic and size sane), unfiltered."""
    u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
    starts, stop_pos, stop = walk_chain(buf, 0, limit)
    return columns(u8, starts, start), start + stop_pos, stop


def segment_dispatch(buf, start: int, limit: int, *, check_crc: bool = True,
                     delay_millis=None, keys: bool = True) -> SegmentDispatch:
    """Everything dispatch and verify need from one segment's bytes."""
    cols, chain_end, stop = scan_segment(buf, start, limit)
    return _fill(SegmentDispatch(start, limit, chain_end, stop), cols, check_crc,
                 delay_millis, keys)


def _fill(out: SegmentDispatch, cols: RecordColumns, check_crc: bool, delay_millis,
          keys: bool) -> SegmentDispatch:
    n = len(cols)
    if n == 0:
        return out
    ok = consistent(cols)
    out.consistent = ok
    # Records after the first inconsistent one are not trusted for anything else.
    good = int(np.argmin(ok)) if not ok.all() else n
    out.crc_ok = np.ones(n, bool)
    if check_crc and good:
        out.crc_ok[:good] = cols.take(slice(0, good)).crc_ok()
    out.offset = cols.offset
    out.size = cols.size.astype(np.int64)
    for name in ("queue_id", "queue_offset", "physical_offset", "sys_flag", "store_timestamp"):
        setattr(out, name, getattr(cols, name))
    sub = cols.take(slice(0, good)) if good < n else cols
    names, tid, code, krec, khash = dispatch_records(sub, delay_millis, keys=keys)
    out.topics = names
    out.topic_id = np.concatenate([tid, np.full(n - good, -1, np.int64)]) if good < n else tid
    out.tags_code = np.concatenate([code, np.zeros(n - good, np.int64)]) if good < n else code
    out.key_record, out.key_hash = krec, khash
    return out


def dispatch_split(split, check_crc: bool = True, delay_millis=None, keys: bool = True):
    """(boundary, dispatch data) of the records starting in one byte range of a segment
    (:mod:`rmqstore.splits`): a worker's task. The chain walk stops at the range end;
    :func:`merge_splits` checks that consecutive ranges continue each other's chain."""
    return split_dispatch(split, check_crc, delay_millis, keys, _pack)


def split_dispatch(split, check_crc: bool, delay_millis, keys: bool, pack):
    """(boundary, ``pack(SegmentDispatch)``) of one byte range of a segment."""
    from .splits import Boundary, Window, resync

    w = Window(split)
    try:
        base = split.file_start
        if w.size == 0:
            return (Boundary(split.split_id, 0, 0, "zeros", 0, True),
                    pack(SegmentDispatch(base, 0, base, "zeros")))
        forced = split.start is not None or split.begin == 0
        first = (split.start if split.start is not None else split.begin) if forced \
            else resync(w, split.begin, split.end)
        if first is None:
            starts, stop_pos, stop = np.zeros(0, np.int64), split.begin, "none"
        else:
            starts, stop_pos, stop = walk_range(w.buf, first, split.end, w.size)
        u8 = np.frombuffer(w.buf, dtype=np.uint8, count=w.size)
        out = SegmentDispatch(base, w.size, base + stop_pos, stop)
        _fill(out, columns(u8, starts, base), check_crc, delay_millis, keys)
        return Boundary(split.split_id, first, stop_pos, stop, len(starts), forced), pack(out)
    finally:
        w.close()


# What a split's part carries back to the parent, narrowed: offsets follow from the sizes
# (the chain is contiguous), PHYSICALOFFSET is sent only when it differs from them, and
# 32-bit fields travel as 32-bit ints. Pickling is most of a worker's hand-over cost.
_NARROW = {"size": np.int32, "queue_id": np.int32, "sys_flag": np.int32,
           "topic_id": np.int32, "key_record": np.int32, "key_hash": np.int32}
_WIDE = ("queue_offset", "store_timestamp", "tags_code", "consistent", "crc_ok")


def _pack(p: SegmentDispatch) -> dict:
    d = {"start": p.start, "limit": p.limit, "chain_end": p.chain_end, "stop": p.stop,
         "topics": p.topics, "n": len(p), "first": int(p.offset[0]) if len(p) else 0}
    for name, dt in _NARROW.items():
        d[name] = getattr(p, name).astype(dt)
    for name in _WIDE:
        d[name] = getattr(p, name)
    same = len(p) == 0 or bool((p.physical_offset == p.offset).all())
    d["physical_offset"] = None if same else p.physical_offset
    return d


def _unpack(d: dict) -> SegmentDispatch:
    out = SegmentDispatch(d["start"], d["limit"], d["chain_end"], d["stop"])
    n = d["n"]
    if not n:
        return out
    size = d["size"].astype(np.int64)
    off = np.empty(n, np.int64)
    off[0] = d["first"]
    np.cumsum(size[:-1], out=off[1:])
    off[1:] += d["first"]
    out.offset, out.size = off, size
    for name in _NARROW:
        if name != "size":  # 32-bit fields stay 32-bit: every consumer widens as needed
            setattr(out, name, d[name])
    for name in _WIDE:
        setattr(out, name, d[name])
    phy = d["physical_offset"]
    out.physical_offset = off if phy is None else phy
    out.topics = d["topics"]
    return out


_PART_FIELDS = ("offset", "size", "consistent", "crc_ok", "queue_id", "queue_offset",
                "physical_offset", "sys_flag", "store_timestamp", "tags_code")


def merge_splits(parts: list[SegmentDispatch]) -> SegmentDispatch:
    """One segment's :class:`SegmentDispatch` from its ranges' parts, in order (the last
    one says where and why the chain stopped)."""
    parts = [_unpack(p) if isinstance(p, dict) else p for p in parts]
    last = parts[-1]
    out = SegmentDispatch(parts[0].start, last.limit, last.chain_end, last.stop)
    parts = [p for p in parts if len(p)]
    if not parts:
        return out
    for name in _PART_FIELDS:
        setattr(out, name, np.concatenate([getattr(p, name) for p in parts]))
    topics: dict[str, int] = {}
    tids, krecs, khashes = [], [], []
    base = 0
    for p in parts:
        remap = np.array([topics.setdefault(t, len(topics)) for t in p.topics] + [-1], np.int64)
        tids.append(remap[p.topic_id])  # -1 (untrusted) maps to the trailing -1
        krecs.append(p.key_record + base)
        khashes.append(p.key_hash)
        base += len(p)
    out.topics = list(topics)
    out.topic_id = np.concatenate(tids)
    out.key_record = np.concatenate(krecs)
    out.key_hash = np.concatenate(khashes)
    n = len(out)
    if not out.consistent.all():
        # As for one whole segment: nothing after the first inconsistent record is trusted.
        good = int(np.argmin(out.consistent))
        out.crc_ok[good:] = True
        out.topic_id[good:] = -1
        out.tags_code[good:] = 0
        keep = out.key_record < good
        out.key_record, out.key_hash = out.key_record[keep], out.key_hash[keep]
    assert len(out.topic_id) == n
    return out


def dispatch_file(path: str, start: int, limit: int, check_crc: bool = True,
                  delay_millis=None, keys: bool = True) -> SegmentDispatch:
    """:func:`segment_dispatch` of a segment file, opened read-only (a worker's task)."""
    import mmap
    import os

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        limit = min(limit, size)
        if limit <= 0:
            return SegmentDispatch(start, 0, start, "zeros")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return segment_dispatch(mm, start, limit, check_crc=check_crc,
                                    delay_millis=delay_millis, keys=keys)
        finally:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views are gone with the result; the map closes with them


# --- the whole CommitLog ------------------------------------------------------------------


@dataclass
class StoreScan:
    """Every segment's dispatch data, and where valid data ends for the whole log.

    ``kept[i]`` is how many leading records of ``parts[i]`` are valid. Valid means on the
    TOTALSIZE chain from the first segment, passing the §3.9 size rule, and not part of a
    trailing run of records whose body fails its CRC (a torn tail, spec §10.5). A record
    whose body fails its CRC but is followed by valid records stays (``damaged``): the
    broker's recovery would cut the log there and lose everything after it.
    """

    parts: list[SegmentDispatch]
    kept: list[int]
    end: int  # first byte after valid data
    end_segment: int  # index of the segment holding ``end`` (-1: no segments)
    reason: str  # why valid data stops: blank/end (the last segment), zeros, torn, gap, ...
    damaged: list[int]  # offsets of kept records whose body fails its CRC

    def records(self, field_name: str) -> np.ndarray:
        arrs = [getattr(p, field_name)[:k] for p, k in zip(self.parts, self.kept)]
        return np.concatenate(arrs) if arrs else np.zeros(0, np.int64)

    @property
    def count(self) -> int:
        return sum(self.kept)


def store_scan(parts: list[SegmentDispatch], segment_size: int) -> StoreScan:
    """Walk the per-segment results in order, as recovery's shared scan does (§10.1)."""
    kept = [0] * len(parts)
    damaged: list[int] = []
    if not parts:
        return StoreScan(parts, kept, 0, -1, "no segments", damaged)
    end, end_seg, reason = parts[0].start, 0, ""
    for i, p in enumerate(parts):
        reason = ""
        if i and p.start != parts[i - 1].start + segment_size:
            reason = "gap"
            break
        n = len(p)
        good = int(np.argmin(p.consistent)) if n and not p.consistent.all() else n
        bad_crc = np.flatnonzero(~p.crc_ok[:good])
        full = p.stop in ("blank", "end") and good == n and p.limit == segment_size
        if not full and len(bad_crc):
            # A run of CRC failures right before the end of the chain is a torn tail.
            k = good
            while k > 0 and not p.crc_ok[k - 1]:
                k -= 1
            if k < good:
                good = k
                bad_crc = bad_crc[bad_crc < good]
                reason = "torn"
        damaged.extend(p.offset[bad_crc].tolist())
        kept[i] = good
        end_seg = i
        if good < n:
            end = int(p.offset[good])
            reason = reason or "torn"
            break
        if full:
            end = p.start + segment_size if p.stop == "blank" else p.chain_end
            reason = p.stop
            continue
        end = int(p.offset[good - 1] + p.size[good - 1]) if good else p.start
        if reason != "torn":
            reason = p.stop if p.limit == segment_size else "short file"
        break
    return StoreScan(parts, kept, end, end_seg, reason, damaged)
