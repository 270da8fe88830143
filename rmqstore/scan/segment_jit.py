"""The numba kernels behind :mod:`rmqstore.scan.segment_pass`: one pass over a segment's
records that does what the numpy path does in many (scan/records, scan/properties,
format/crc, format/hashing, scan/dispatch).

Imported only by :mod:`rmqstore.scan.segment_pass`, lazily: importing this module imports
numba and loads (or compiles) the kernels. Every number they need about the record layout
comes in as an argument (:func:`geometry`), so the one definition stays in
:mod:`rmqstore.format.layout`. A kernel never decides a hard case: it reports it
(``FALLBACK``) and the caller takes the numpy path for the whole range.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..format import layout as L
from ..format.crc import BODY_CRC_MASK

# Indices into the geometry vector (see :func:`geometry`).
G_MIN, G_MAGIC1, G_MAGIC2, G_AT_MAGIC, G_AT_CRC, G_AT_QID, G_AT_QOFF, G_AT_PHY, G_AT_SYS, \
    G_BORN6, G_STORE6, G_TXMASK, G_ROLLBACK, G_CRCMASK = range(14)

#: What :func:`records` says when it stops early.
DONE, KEYS_FULL, FALLBACK_RECORD, FALLBACK_TOPICS = 0, 1, 2, 3

TOPIC_SLOTS = 8192  # open-addressing table (a power of 2); more topics than half: fall back
MAX_TOPICS = TOPIC_SLOTS // 2


def geometry() -> tuple[np.ndarray, np.ndarray]:
    """(scalars, per host-width combination [store_timestamp at, body_length at, fixed
    size]) from :mod:`rmqstore.format.layout`; combination index = born_v6 * 2 + store_v6
    as in :mod:`rmqstore.scan.records`."""
    head = L.RECORD_FIXED_OFFSETS[False, False]
    g = np.array([L.MIN_RECORD_SIZE, L.MAGIC_V1, L.MAGIC_V2, head["magic"][0],
                  head["body_crc"][0], head["queue_id"][0], head["queue_offset"][0],
                  head["physical_offset"][0], head["sys_flag"][0], L.SYSFLAG_BORNHOST_V6,
                  L.SYSFLAG_STOREHOST_V6, L.SYSFLAG_TRANSACTION_MASK, L.TRANSACTION_ROLLBACK,
                  BODY_CRC_MASK], np.int64)
    combos = [(False, False), (False, True), (True, False), (True, True)]
    tab = np.array([[L.RECORD_FIXED_OFFSETS[c]["store_timestamp"][0],
                     L.RECORD_FIXED_OFFSETS[c]["body_length"][0], L.RECORD_FIXED_SIZE[c]]
                    for c in combos], np.int64)
    return g, tab


def crc_tables() -> np.ndarray:
    """Slicing-by-8 tables of the reflected CRC-32 polynomial (zlib's)."""
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        for i in range(256):
            t[k, i] = (t[k - 1, i] >> 8) ^ t[0, t[k - 1, i] & 0xFF]
    return t


@njit(cache=True, nogil=True, inline="always")
def _be32(b, p):
    v = (np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16) | (np.int64(b[p + 2]) << 8) \
        | np.int64(b[p + 3])
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


@njit(cache=True, nogil=True, inline="always")
def _be64(b, p):
    v = np.uint64(0)
    for k in range(8):
        v = (v << np.uint64(8)) | np.uint64(b[p + k])
    return np.int64(v)


@njit(cache=True, nogil=True, inline="always")
def _be16(b, p):
    v = (np.int64(b[p]) << 8) | np.int64(b[p + 1])
    return v - 65536 if v >= 32768 else v


@njit(cache=True, nogil=True)
def _crc32(b, a, n, T):
    c = np.uint32(0xFFFFFFFF)
    i = a
    end = a + n
    while i + 8 <= end:
        w = np.uint32(b[i]) | (np.uint32(b[i + 1]) << 8) | (np.uint32(b[i + 2]) << 16) \
            | (np.uint32(b[i + 3]) << 24)
        w ^= c
        c = T[7, w & 0xFF] ^ T[6, (w >> 8) & 0xFF] ^ T[5, (w >> 16) & 0xFF] ^ T[4, w >> 24] \
            ^ T[3, b[i + 4]] ^ T[2, b[i + 5]] ^ T[1, b[i + 6]] ^ T[0, b[i + 7]]
        i += 8
    while i < end:
        c = T[0, (c ^ b[i]) & 0xFF] ^ (c >> 8)
        i += 1
    return np.int64(c ^ np.uint32(0xFFFFFFFF))


@njit(cache=True, nogil=True, inline="always")
def _java_hash(b, a, n):
    """(Java hash of the bytes as ASCII text, as uint32 in an int64; any byte >= 0x80)."""
    # mod 2^64 arithmetic, cut to 32 bits once (2^32 divides 2^64); four bytes a step, so
    # the multiplications do not wait on each other (31^2, 31^3, 31^4 below)
    h = np.uint64(0)
    hi = np.uint8(0)
    i = a
    end = a + n
    while i + 4 <= end:
        b0, b1, b2, b3 = b[i], b[i + 1], b[i + 2], b[i + 3]
        h = h * np.uint64(923521) + np.uint64(b0) * np.uint64(29791) \
            + np.uint64(b1) * np.uint64(961) + np.uint64(b2) * np.uint64(31) + np.uint64(b3)
        hi |= b0 | b1 | b2 | b3
        i += 4
    while i < end:
        h = h * np.uint64(31) + np.uint64(b[i])
        hi |= b[i]
        i += 1
    return np.int64(h & np.uint64(0xFFFFFFFF)), hi >= 0x80


@njit(cache=True, nogil=True, inline="always")
def _named(b, s, e, name):
    """Does the property segment [s, e) start with ``name`` and 0x01 and hold a value?"""
    m = len(name)
    if e - s < m + 2:
        return False
    for k in range(m):
        if b[s + k] != name[k]:
            return False
    return b[s + m] == 1


@njit(cache=True, nogil=True)
def walk(b, pos, end, limit, g, starts):
    """Record starts along the TOTALSIZE chain from ``pos`` while below ``end`` (magic a
    message magic, size from the minimum up to the bytes left to ``limit``): (count, where
    the chain stopped). The vector walk in scan/records is the definition."""
    stop = min(end, limit - 7)
    n = 0
    while pos < stop:
        size = _be32(b, pos)
        if size < g[G_MIN] or size > limit - pos:
            break
        magic = _be32(b, pos + g[G_AT_MAGIC])
        if magic != g[G_MAGIC1] and magic != g[G_MAGIC2]:
            break
        starts[n] = pos
        n += 1
        pos += size
    return n, pos


@njit(cache=True, nogil=True)
def records(b, starts, n, i0, nk0, nt0, check_crc, want_keys, g, tab, T, tags, keys, uniq,
            size_o, qid_o, qoff_o, phy_o, sys_o, ts_o, crc_o, tag_o, tag_bad, tid_o,
            slot, t_pos, t_len, t_hash, t_first,
            k_rec, k_pos, k_len, k_h, k_bad, zcrc, zmin):
    """Fill the per-record outputs for records ``i0..n`` and the key outputs from ``nk0``
    (topic table from ``nt0``). Returns (status, next record, keys, topics): DONE, or
    KEYS_FULL (grow the key arrays and call again from that record), or a FALLBACK."""
    limit = len(b)
    nk = nk0
    nt = nt0
    cap = len(k_rec)
    nslots = len(slot)
    for i in range(i0, n):
        pos = starts[i]
        size = _be32(b, pos)
        sf = _be32(b, pos + g[G_AT_SYS])
        combo = (2 if (sf & g[G_BORN6]) != 0 else 0) + (1 if (sf & g[G_STORE6]) != 0 else 0)
        fixed = tab[combo, 2]
        if pos + fixed > limit:
            return FALLBACK_RECORD, i, nk, nt
        blen = max(_be32(b, pos + tab[combo, 1]), 0)
        tlp = pos + fixed + blen
        if _be32(b, pos + g[G_AT_MAGIC]) == g[G_MAGIC2]:
            if tlp + 2 > limit:
                return FALLBACK_RECORD, i, nk, nt
            tlen = _be16(b, tlp)
            tp = tlp + 2
        else:
            if tlp + 1 > limit:
                return FALLBACK_RECORD, i, nk, nt
            tlen = np.int64(np.int8(b[tlp]))
            tp = tlp + 1
        if tlen < 0 or tp + tlen + 2 > limit:
            return FALLBACK_RECORD, i, nk, nt
        pp = tp + tlen + 2
        plen = max(_be16(b, tp + tlen), 0)
        if pp + plen != pos + size:  # not a whole record (spec §3.9): numpy decides
            return FALLBACK_RECORD, i, nk, nt
        keyed = want_keys and (sf & g[G_TXMASK]) != g[G_ROLLBACK]
        nk_rec = nk  # where this record's keys start, should the key arrays be full
        # topic id: by bytes, in order of first appearance (the caller renumbers)
        # a cheap hash (length, first and last bytes): a collision only costs a probe
        th = np.uint64(tlen) * np.uint64(0x9E3779B97F4A7C15)
        for q in range(tp, min(tp + 8, tp + tlen)):
            th = (th ^ np.uint64(b[q])) * np.uint64(1099511628211)
        for q in range(max(tp + 8, tp + tlen - 8), tp + tlen):
            th = (th ^ np.uint64(b[q])) * np.uint64(1099511628211)
        s = np.int64((th >> np.uint64(32)) & np.uint64(nslots - 1))  # nslots: a power of 2
        while True:
            t = slot[s]
            if t < 0:
                if nt >= MAX_TOPICS:
                    return FALLBACK_TOPICS, i, nk, nt
                t = nt
                nt += 1
                slot[s] = t
                t_pos[t], t_len[t], t_hash[t], t_first[t] = tp, tlen, th, i
                break
            if t_hash[t] == th and t_len[t] == tlen:
                same = True
                a = t_pos[t]
                for q in range(tlen):
                    if b[a + q] != b[tp + q]:
                        same = False
                        break
                if same:
                    break
            s = (s + 1) & (nslots - 1)
        # properties: a name counts only at a segment start, the later value wins, an
        # empty value is absent (spec §3.4; scan/properties is the definition)
        tag_s = np.int64(-1)
        tag_e = np.int64(-1)
        key_s = np.int64(-1)
        key_e = np.int64(-1)
        uq_s = np.int64(-1)
        uq_e = np.int64(-1)
        pe = pp + plen
        a = pp
        while a < pe:
            e = a
            while e < pe and b[e] != 2:
                e += 1
            if _named(b, a, e, tags):
                tag_s, tag_e = a + len(tags) + 1, e
            elif _named(b, a, e, keys):
                key_s, key_e = a + len(keys) + 1, e
            elif _named(b, a, e, uniq):
                uq_s, uq_e = a + len(uniq) + 1, e
            a = e + 1
        code = np.int64(0)
        bad = False
        if tag_s >= 0:
            h, bad = _java_hash(b, tag_s, tag_e - tag_s)
            code = h - (np.int64(1) << 32) if h >= (np.int64(1) << 31) else h
        if keyed:
            if uq_s >= 0:
                if nk >= cap:
                    return KEYS_FULL, i, nk_rec, nt
                h, kb = _java_hash(b, uq_s, uq_e - uq_s)
                k_rec[nk], k_len[nk], k_h[nk], k_bad[nk] = i, uq_e - uq_s, h, kb
                if kb:  # the caller rehashes these; other pages of k_pos stay untouched
                    k_pos[nk] = uq_s
                nk += 1
            if key_s >= 0:
                a = key_s
                for q in range(key_s, key_e + 1):
                    if q == key_e or b[q] == 0x20:  # tokens split on single spaces
                        if q > a:
                            if nk >= cap:
                                return KEYS_FULL, i, nk_rec, nt
                            h, kb = _java_hash(b, a, q - a)
                            k_rec[nk], k_len[nk], k_h[nk], k_bad[nk] = i, q - a, h, kb
                            if kb:
                                k_pos[nk] = a
                            nk += 1
                        a = q + 1
        ok = True
        if check_crc and blen > 0:
            if zcrc is not None and blen >= zmin:  # format/crc.native_crc32
                c = np.int64(zcrc(0, b.ctypes.data + pos + fixed, blen))
            else:
                c = _crc32(b, pos + fixed, blen, T)
            ok = (c & g[G_CRCMASK]) == _be32(b, pos + g[G_AT_CRC])
        size_o[i] = size
        qid_o[i] = _be32(b, pos + g[G_AT_QID])
        qoff_o[i] = _be64(b, pos + g[G_AT_QOFF])
        phy_o[i] = _be64(b, pos + g[G_AT_PHY])
        sys_o[i] = sf
        ts_o[i] = _be64(b, pos + tab[combo, 0])
        crc_o[i] = ok
        tag_o[i] = code
        tag_bad[i] = bad
        tid_o[i] = t
    return DONE, n, nk, nt


@njit(cache=True, nogil=True)
def renumber(ids, new):
    """``ids[i] = new[ids[i]]``, in place."""
    for i in range(len(ids)):
        ids[i] = new[ids[i]]


@njit(cache=True, nogil=True)
def index_hashes(topic_hash, tid, k_rec, k_h, k_units, pow31):
    """IndexFile hash of ``topic#key`` per key from the parts' Java hashes (the numpy form,
    format/hashing.index_hash_from, is the definition): abs, MIN_VALUE as 0. Written over
    ``k_h``, which is returned."""
    m = len(k_rec)
    out = k_h
    for j in range(m):
        prefix = (np.uint64(topic_hash[tid[k_rec[j]]]) * np.uint64(31) + np.uint64(35)) \
            & np.uint64(0xFFFFFFFF)  # 35: '#'
        h = np.int64((prefix * pow31[k_units[j]] + np.uint64(k_h[j])) & np.uint64(0xFFFFFFFF))
        s = h - (np.int64(1) << 32) if h >= (np.int64(1) << 31) else h
        out[j] = 0 if s == -(np.int64(1) << 31) else abs(s)
    return out
