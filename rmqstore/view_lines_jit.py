"""The numba kernel behind :mod:`rmqstore.view_lines`: the message JSON of many records as
JSON Lines text, written straight from the segment's bytes in one compiled loop.

Imported only by :mod:`rmqstore.view_lines`, lazily (through :mod:`rmqstore.files.jit`):
importing this module imports numba and loads (or compiles) the kernel. Every JSON key and
literal comes in as a piece of ``pool`` (made by ``view_lines`` from the key names); the
kernel knows only JSON punctuation and escaping. The definition is the per-record path
(:func:`rmqstore.view.message_dicts` encoded by :func:`rmqstore.json_lines.json_line`):
a record this kernel does not render exactly that way is left to it (``ok[r] = 0``):
compressed bodies, properties the object cannot reproduce (duplicate names, malformed
pairs: they need ``propertiesText``), more than :data:`MAX_PAIRS` pairs, and text that is
not valid UTF-8 (Python's strict decoder's rules; the per-record path replaces such bytes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .format import layout as L

# Columns of the per-record table ``recs`` (int64), made by view_lines.
(C_PHYS, C_SIZE, C_V2, C_CRC, C_QID, C_FLAG, C_QOFF, C_SYSF, C_BORN_TS, C_BORN, C_STORE_TS,
 C_STORE, C_RECON, C_PREP, C_TOPIC, C_PREFIX, C_BODY_POS, C_BODY_LEN, C_PROPS_POS,
 C_PROPS_LEN, C_CRC_OK, C_NMONTH, C_M0) = range(23)
MONTHS = 3  # month starts per record from C_M0 on (rmqstore.uniqkey.month_starts)
NCOLS = C_M0 + MONTHS

# Pieces of ``pool`` (``at[k]:at[k + 1]``), in this order; view_lines makes each one.
PIECES = ("open", "size", "magic", "v1", "v2", "crc", "qid", "flag", "qoff", "sysf",
          "born_ts", "born", "store_ts", "store", "recon", "prep", "topic", "props", "tags",
          "keys", "uniq", "msgid", "body", "enc_base64", "enc_hex", "enc_text", "crc_ok",
          "true", "false", "null", "info", "ip", "pid", "loader", "time", "counter", "extra",
          "name_tags", "name_keys", "name_uniq", "base64_alphabet", "hex_lower", "hex_upper")
(P_OPEN, P_SIZE, P_MAGIC, P_V1, P_V2, P_CRC, P_QID, P_FLAG, P_QOFF, P_SYSF, P_BORN_TS, P_BORN,
 P_STORE_TS, P_STORE, P_RECON, P_PREP, P_TOPIC, P_PROPS, P_TAGS, P_KEYS, P_UNIQ, P_MSGID,
 P_BODY, P_ENC_B64, P_ENC_HEX, P_ENC_TEXT, P_CRC_OK, P_TRUE, P_FALSE, P_NULL, P_INFO, P_IP,
 P_PID, P_LOADER, P_TIME, P_COUNTER, P_EXTRA, N_TAGS, N_KEYS, N_UNIQ, A_B64, A_HEXL,
 A_HEXU) = range(len(PIECES))

# Body modes.
B_BASE64, B_HEX, B_NONE, B_TEXT = range(4)
MAX_PAIRS = 64  # properties pairs a record may have here (more: the per-record path)

# JSON punctuation and escapes (RFC 8259).
_QUOTE, _BSLASH, _COLON, _COMMA = 0x22, 0x5C, 0x3A, 0x2C
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _NL, _MINUS, _ZERO = 0x7B, 0x7D, 0x5B, 0x5D, 0x0A, 0x2D, 0x30
_SEP_PAIR, _SEP_NAME = ord(L.PROPERTY_SEPARATOR), ord(L.PROPERTY_NAME_VALUE_SEPARATOR)  # §3.4
_SPACE = 0x20  # between KEYS tokens (format.message.split_keys)
# Bytes a JSON string holds as they are (0): printable ASCII but the quote and backslash.
_PLAIN = np.ones(256, np.uint8)
_PLAIN[0x20:0x7F] = 0
_PLAIN[[_QUOTE, _BSLASH]] = 1
# The two-character escapes json writes (\" \\ \n \r \t \b \f): the letter after the backslash.
_SHORT = np.zeros(128, np.uint8)
for _c, _e in ((_QUOTE, _QUOTE), (_BSLASH, _BSLASH), (0x0A, 0x6E), (0x0D, 0x72), (0x09, 0x74),
               (0x08, 0x62), (0x0C, 0x66)):
    _SHORT[_c] = _e
# Array indices go through U (uint64): numba checks a signed index for a negative value
# on every access, which costs more than the copy itself (5x on a piece's bytes).
U = np.uint64


@njit(cache=True, nogil=True)
def _piece(out, o, pool, at, k):
    """Piece ``k`` of ``pool``."""
    for i in range(at[U(k)], at[U(k + 1)]):
        out[U(o)] = pool[U(i)]
        o += 1
    return o


@njit(cache=True, nogil=True, inline="always")
def _byte(out, o, b):
    out[U(o)] = b
    return o + 1


@njit(cache=True, nogil=True)
def _int(out, o, v):
    """``v`` (int64) in decimal, as Python's ``str(int)``."""
    if v < 0:
        out[U(o)] = _MINUS
        o += 1
        u = U(-(v + 1)) + U(1)  # also right for the smallest int64
    else:
        u = U(v)
    n = 1  # digits: compared with powers of ten, no division
    p = U(10)
    while n < 20 and u >= p:
        n += 1
        p *= U(10)
    k = o + n - 1
    while u >= U(10):
        q = u // U(10)
        out[U(k)] = np.uint8(u - q * U(10)) + _ZERO
        u = q
        k -= 1
    out[U(k)] = np.uint8(u) + _ZERO
    return o + n


@njit(cache=True, nogil=True, inline="always")
def _u_escape(out, o, cp, pool, hexl):
    """``\\uXXXX`` with lowercase hex digits, as json and json_safe write them."""
    out[U(o)] = _BSLASH
    out[U(o + 1)] = 0x75  # u
    for k in range(4):
        out[U(o + 2 + k)] = pool[U(hexl + ((cp >> (12 - 4 * k)) & 15))]
    return o + 6


@njit(cache=True, nogil=True, inline="always")
def _cont(src, i, lo, hi):
    c = src[U(i)]
    return lo <= c <= hi


@njit(cache=True, nogil=True)
def _utf8_len(src, i, b):
    """Bytes of the UTF-8 sequence starting at ``src[i]`` (>= 0x80), or 0 when Python's
    strict decoder refuses it (stray continuation, overlong, surrogate, > U+10FFFF, cut)."""
    c = src[U(i)]
    if 0xC2 <= c <= 0xDF:
        return 2 if i + 1 < b and _cont(src, i + 1, 0x80, 0xBF) else 0
    if 0xE0 <= c <= 0xEF:
        if i + 2 >= b:
            return 0
        lo, hi = 0x80, 0xBF
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
        return 3 if _cont(src, i + 1, lo, hi) and _cont(src, i + 2, 0x80, 0xBF) else 0
    if 0xF0 <= c <= 0xF4:
        if i + 3 >= b:
            return 0
        lo, hi = 0x80, 0xBF
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
        ok = _cont(src, i + 1, lo, hi) and _cont(src, i + 2, 0x80, 0xBF) \
            and _cont(src, i + 3, 0x80, 0xBF)
        return 4 if ok else 0
    return 0


@njit(cache=True, nogil=True)
def _string(out, o, src, a, b, pool, hexl):
    """``src[a:b]``, UTF-8 text, as a JSON string the way ``json.dumps(...,
    ensure_ascii=False)`` then ``json_safe`` write it: ``"`` and ``\\`` escaped, C0 controls
    as their short escapes or ``\\u00XX``, DEL, C1 controls and U+2028/9 as ``\\uXXXX``,
    other characters as their bytes. -1 when the text is not valid UTF-8."""
    out[U(o)] = _QUOTE
    o += 1
    i = a
    while i < b:
        c = src[U(i)]
        if _PLAIN[U(c)] == 0:
            out[U(o)] = c
            o += 1
            i += 1
            continue
        if c < 0x80:
            short = _SHORT[U(c)]
            if short:
                out[U(o)] = _BSLASH
                out[U(o + 1)] = short
                o += 2
            else:  # other C0 controls and DEL
                o = _u_escape(out, o, np.int64(c), pool, hexl)
            i += 1
            continue
        n = _utf8_len(src, i, b)
        if n == 0:
            return -1
        c1 = src[U(i + 1)]
        if n == 2 and c == 0xC2 and c1 <= 0x9F:  # U+0080..U+009F, the C1 controls
            o = _u_escape(out, o, np.int64(c1), pool, hexl)
        elif n == 3 and c == 0xE2 and c1 == 0x80 and (src[U(i + 2)] == 0xA8
                                                      or src[U(i + 2)] == 0xA9):
            o = _u_escape(out, o, np.int64(src[U(i + 2)]) + 0x2000 - 0x80, pool, hexl)
        else:
            for k in range(n):
                out[U(o + k)] = src[U(i + k)]
            o += n
        i += n
    out[U(o)] = _QUOTE
    return o + 1


@njit(cache=True, nogil=True)
def _base64(out, o, src, a, b, pool, alpha):
    """``"..."``: standard base64 with padding of ``src[a:b]``, as ``base64.b64encode``."""
    out[U(o)] = _QUOTE
    o += 1
    i = a
    end = b - (b - a) % 3
    while i < end:
        x = (np.int64(src[U(i)]) << 16) | (np.int64(src[U(i + 1)]) << 8) | np.int64(src[U(i + 2)])
        out[U(o)] = pool[U(alpha + ((x >> 18) & 63))]
        out[U(o + 1)] = pool[U(alpha + ((x >> 12) & 63))]
        out[U(o + 2)] = pool[U(alpha + ((x >> 6) & 63))]
        out[U(o + 3)] = pool[U(alpha + (x & 63))]
        o += 4
        i += 3
    rem = b - end
    if rem:
        x = np.int64(src[U(i)]) << 16
        if rem == 2:
            x |= np.int64(src[U(i + 1)]) << 8
        out[U(o)] = pool[U(alpha + ((x >> 18) & 63))]
        out[U(o + 1)] = pool[U(alpha + ((x >> 12) & 63))]
        out[U(o + 2)] = pool[U(alpha + ((x >> 6) & 63))] if rem == 2 else 0x3D  # =
        out[U(o + 3)] = 0x3D
        o += 4
    out[U(o)] = _QUOTE
    return o + 1


@njit(cache=True, nogil=True, inline="always")
def _same(x, a, b, y, c, d):
    """Do the bytes ``x[a:b]`` equal ``y[c:d]``?"""
    if b - a != d - c:
        return False
    for k in range(b - a):
        if x[U(a + k)] != y[U(c + k)]:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _hex_value(c):
    """The value of an ASCII hex digit (either case), or -1."""
    if 0x30 <= c <= 0x39:
        return np.int64(c - 0x30)
    if 0x41 <= c <= 0x46:
        return np.int64(c - 0x41 + 10)
    if 0x61 <= c <= 0x66:
        return np.int64(c - 0x61 + 10)
    return np.int64(-1)


@njit(cache=True, nogil=True)
def _hex_int(src, a, b):
    v = np.int64(0)
    for i in range(a, b):
        v = (v << 4) | _hex_value(src[U(i)])
    return v


@njit(cache=True, nogil=True)
def _uniq_info(out, o, src, a, b, rec, slack, pool, at):
    """``uniqKeyInfo`` of the UNIQ_KEY ``src[a:b]`` (rmqstore.uniqkey.uniq_key_info), or
    null when it is not 32 or 56 hex digits."""
    n = b - a
    good = n == 32 or n == 56
    if good:
        for i in range(a, b):
            if _hex_value(src[U(i)]) < 0:
                good = False
                break
    if not good:
        return _piece(out, o, pool, at, P_NULL)
    ip_len = (n - 12) // 2 - 6
    o = _piece(out, o, pool, at, P_IP)
    o = _byte(out, o, _QUOTE)
    hexl = at[A_HEXL]
    if ip_len == 4:
        for k in range(4):
            if k:
                o = _byte(out, o, 0x2E)  # .
            o = _int(out, o, _hex_int(src, a + 2 * k, a + 2 * k + 2))
    else:  # Java's Inet6Address text: eight groups, lowercase, no leading zeros
        for k in range(8):
            if k:
                o = _byte(out, o, _COLON)
            g = _hex_int(src, a + 4 * k, a + 4 * k + 4)
            started = False
            for sh in range(12, -4, -4):
                d = (g >> sh) & 15
                if d or started or sh == 0:
                    o = _byte(out, o, pool[U(hexl + d)])
                    started = True
    o = _byte(out, o, _QUOTE)
    p = a + 2 * ip_len
    loader = _hex_int(src, p + 4, p + 12)
    if loader >= 1 << 31:
        loader -= 1 << 32  # signed int32
    span = _hex_int(src, b - 12, b - 4)  # unsigned (spec §5.2)
    time = 0
    found = False
    for k in range(rec[C_NMONTH]):
        start = rec[C_M0 + k]
        if start + span <= rec[C_STORE_TS] + slack:
            time = start + span
            found = True
            break
    for k in range(4):
        o = _piece(out, o, pool, at, (P_PID, P_LOADER, P_TIME, P_COUNTER)[k])
        if k == 0:
            o = _int(out, o, _hex_int(src, p, p + 4))
        elif k == 1:
            o = _int(out, o, loader)
        elif k == 3:
            o = _int(out, o, _hex_int(src, b - 4, b))
        elif found:
            o = _int(out, o, time)
        else:
            o = _piece(out, o, pool, at, P_NULL)
    return _byte(out, o, _RBRACE)


@njit(cache=True, nogil=True)
def _record(out, o, src, rec, pool, at, mode, compressed, slack, sa, sm, sb, heads):
    """One record's line from ``out[o]``: its end, or -1 (the per-record path renders it)."""
    if rec[C_SYSF] & compressed:
        return -1
    # Properties (spec §3.4) as parse_properties reads them; any pair it would drop or
    # replace makes the object lossy (propertiesText): the per-record path then.
    pa = rec[C_PROPS_POS]
    pb = pa + rec[C_PROPS_LEN]
    npairs = 0
    tags = keys = uniq = -1
    s = pa
    while pa < pb:  # left by a break: the last pair, or the separator after it
        e = s
        while e < pb and src[U(e)] != _SEP_PAIR:
            e += 1
        if s == pb:  # the separator some versions end with
            break
        m = s
        while m < e and src[U(m)] != _SEP_NAME:
            m += 1
        if m == e or m == s or m == e - 1 or npairs == MAX_PAIRS:
            return -1
        for j in range(npairs):
            if _same(src, sa[j], sm[j], src, s, m):
                return -1  # a later pair replaces an earlier one
        sa[npairs], sm[npairs], sb[npairs] = s, m, e
        if _same(src, s, m, pool, at[N_TAGS], at[N_TAGS + 1]):
            tags = npairs
        elif _same(src, s, m, pool, at[N_KEYS], at[N_KEYS + 1]):
            keys = npairs
        elif _same(src, s, m, pool, at[N_UNIQ], at[N_UNIQ + 1]):
            uniq = npairs
        npairs += 1
        if e == pb:
            break
        s = e + 1
    hexl = at[A_HEXL]
    # The numbers up to storeHost, then the rest to topic: (piece, column) in ``heads``.
    for k in range(heads.shape[0]):
        piece, col = heads[k, 0], heads[k, 1]
        o = _piece(out, o, pool, at, piece)
        if col == C_V2:
            o = _piece(out, o, pool, at, P_V2 if rec[C_V2] else P_V1)
        elif col == C_BORN or col == C_STORE or col == C_TOPIC:
            o = _piece(out, o, pool, at, rec[col])
        else:
            o = _int(out, o, rec[col])
    o = _piece(out, o, pool, at, P_PROPS)
    o = _byte(out, o, _LBRACE)
    for q in range(2 * npairs):  # name, value, name, value ...
        j = q >> 1
        if q & 1:
            o = _byte(out, o, _COLON)
            a, b = sm[j] + 1, sb[j]
        else:
            if j:
                o = _byte(out, o, _COMMA)
            a, b = sa[j], sm[j]
        o = _string(out, o, src, a, b, pool, hexl)
        if o < 0:
            return -1
    o = _byte(out, o, _RBRACE)
    # tags, the KEYS tokens (split_keys: Java split(" "), empty tokens dropped), uniqKey:
    # one string writer in one loop, each string written before what follows it.
    o = _piece(out, o, pool, at, P_TAGS)
    a = b = -1
    if tags >= 0:
        a, b = sm[tags] + 1, sb[tags]
    else:
        o = _piece(out, o, pool, at, P_NULL)
    t = kb = 0
    if keys >= 0:
        t, kb = sm[keys] + 1, sb[keys]
    stage = 1  # after the pending string: 1 the keys, 2 uniqKey, 3 nothing
    opened = False
    while True:
        if a >= 0:
            o = _string(out, o, src, a, b, pool, hexl)
            if o < 0:
                return -1
            a = -1
        if stage == 3:
            break
        if stage == 1:
            if not opened:
                o = _piece(out, o, pool, at, P_KEYS)
                o = _byte(out, o, _LBRACKET)
            while t < kb and src[U(t)] == _SPACE:
                t += 1
            if t < kb:
                u = t
                while u < kb and src[U(u)] != _SPACE:
                    u += 1
                if opened:
                    o = _byte(out, o, _COMMA)
                opened = True
                a, b = t, u
                t = u
                continue
            o = _byte(out, o, _RBRACKET)
        o = _piece(out, o, pool, at, P_UNIQ)
        if uniq >= 0:
            a, b = sm[uniq] + 1, sb[uniq]
        else:
            o = _piece(out, o, pool, at, P_NULL)
        stage = 3
    o = _piece(out, o, pool, at, P_MSGID)
    o = _byte(out, o, _QUOTE)
    o = _piece(out, o, pool, at, rec[C_PREFIX])
    phys = U(rec[C_PHYS])  # the i64 as 16 uppercase hex digits (spec §5.1)
    hexu = at[A_HEXU]
    for d in range(16):
        out[U(o + d)] = pool[U(hexu) + ((phys >> U(60 - 4 * d)) & U(15))]
    o += 16
    o = _byte(out, o, _QUOTE)
    o = _piece(out, o, pool, at, P_BODY)
    ba = rec[C_BODY_POS]
    bb = ba + rec[C_BODY_LEN]
    if mode == B_NONE:
        o = _piece(out, o, pool, at, P_NULL)
    elif mode == B_HEX:
        o = _byte(out, o, _QUOTE)
        for i in range(ba, bb):
            c = src[U(i)]
            out[U(o)] = pool[U(hexl + (c >> 4))]
            out[U(o + 1)] = pool[U(hexl + (c & 15))]
            o += 2
        o = _byte(out, o, _QUOTE)
        o = _piece(out, o, pool, at, P_ENC_HEX)
    else:
        t = _string(out, o, src, ba, bb, pool, hexl) if mode == B_TEXT else -1
        if t >= 0:
            o = _piece(out, t, pool, at, P_ENC_TEXT)
        else:  # base64, and a text body that does not decode (view.render's rule)
            o = _base64(out, o, src, ba, bb, pool, at[A_B64])
            o = _piece(out, o, pool, at, P_ENC_B64)
    o = _piece(out, o, pool, at, P_CRC_OK)
    o = _piece(out, o, pool, at, P_TRUE if rec[C_CRC_OK] else P_FALSE)
    o = _piece(out, o, pool, at, P_INFO)
    if uniq >= 0:
        o = _uniq_info(out, o, src, sm[uniq] + 1, sb[uniq], rec, slack, pool, at)
    else:
        o = _piece(out, o, pool, at, P_NULL)
    o = _piece(out, o, pool, at, P_EXTRA)
    o = _byte(out, o, _RBRACE)
    return _byte(out, o, _NL)


@njit(cache=True, nogil=True)
def room(fixed, props_len, body_len):
    """The most bytes a record's line takes: every properties byte escaped six-fold in the
    object and again in tags, keys or uniqKey, with the quotes, colons and commas of pairs
    (a pair is three bytes or more) and tokens; every body byte six-fold (text, escaped);
    ``fixed`` for the rest (pieces, tables' longest entries, numbers, uniqKeyInfo)."""
    return fixed + 16 * props_len + 6 * body_len + 8


@njit(cache=True, nogil=True)
def render(out, src, recs, pool, at, mode, compressed, slack, fixed, ends, ok):
    """Each record of ``recs`` as one line into ``out``; ``ends[r]`` is where record r's
    line ends, ``ok[r]`` 0 when it was left to the per-record path (its line is then
    empty). A line takes at most :func:`room` bytes (``fixed``: the caller's bound of the
    part that does not grow with the properties and body); a record that might not fit in
    what is left of ``out`` is left to the per-record path too, so no write goes past the
    end whatever the caller sized. Returns the bytes written."""
    sa = np.empty(MAX_PAIRS, np.int64)
    sm = np.empty(MAX_PAIRS, np.int64)
    sb = np.empty(MAX_PAIRS, np.int64)
    heads = np.array([[P_OPEN, C_PHYS], [P_SIZE, C_SIZE], [P_MAGIC, C_V2], [P_CRC, C_CRC],
                      [P_QID, C_QID], [P_FLAG, C_FLAG], [P_QOFF, C_QOFF], [P_SYSF, C_SYSF],
                      [P_BORN_TS, C_BORN_TS], [P_BORN, C_BORN], [P_STORE_TS, C_STORE_TS],
                      [P_STORE, C_STORE], [P_RECON, C_RECON], [P_PREP, C_PREP],
                      [P_TOPIC, C_TOPIC]], np.int64)
    o = 0
    for r in range(recs.shape[0]):
        rec = recs[r]
        e = -1
        if o + room(fixed, rec[C_PROPS_LEN], rec[C_BODY_LEN]) <= out.shape[0]:
            e = _record(out, o, src, rec, pool, at, mode, compressed, slack, sa, sm, sb, heads)
        if e < 0:
            ok[r] = 0
        else:
            ok[r] = 1
            o = e
        ends[r] = o
    return o
