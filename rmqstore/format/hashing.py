"""Java ``String.hashCode`` in every form rmqstore needs (spec §0), and the IndexFile key
hash built on it (spec §7.2: ``abs(hash("topic#key"))``, ``Integer.MIN_VALUE`` mapped to 0).

* one string: :func:`java_hash`, :func:`index_hash`; many strings: :func:`java_hash_many`,
  :func:`index_hash_many`, :func:`index_hashes` (one matrix product per UTF-16 length);
* keys of one topic: the Java hash is a base-31 polynomial mod 2**32, so
  ``h(a + b) = h(a) * 31**len(b) + h(b)``: a topic's ``topic#`` hash (:func:`prefix_hash`)
  is computed once and every key only adds its token. For an ASCII token each code
  ``c = 31 * (c // 31) + c % 31`` splits into two base-31 digits, so
  ``h(token) = 31 * int(q, 31) + int(r, 31)``: two C-level parses (:func:`token_hash`);
  many tokens, of one topic or several, are one right-aligned matrix product
  (:func:`token_hashes`, or :func:`span_token_hashes` over an encoded buffer; KEYS
  values split into tokens in bulk by :func:`key_token_spans`);
* byte spans of a mapped buffer, read as text (:func:`span_hash`), and the index hash from
  the hashes of its parts (:func:`index_hash_from`).

Each fast form restates :func:`java_hash` for speed, from the one table of powers of 31
(:func:`pow31`), and ends in the one ``Math.abs`` rule (:func:`index_abs`,
:func:`index_abs_many`); the tests check every form against :func:`java_hash`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def java_hash(s: str) -> int:
    """Java ``String.hashCode``: over UTF-16 code units, as a signed int32 (spec §0)."""
    b = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(b), 2):
        h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


_POW31 = np.ones(1, dtype=np.uint64)


def pow31(n: int) -> np.ndarray:
    """``31**k mod 2**32`` for ``k < n``, as uint64 (grown and cached; do not write to it):
    the weights of Java's base-31 hash polynomial for every vector form here."""
    global _POW31
    if len(_POW31) < n:
        p = np.empty(max(n, 2 * len(_POW31)), dtype=np.uint64)
        p[0] = 1
        for k in range(1, len(p)):  # only grows to the longest key seen
            p[k] = (int(p[k - 1]) * 31) & 0xFFFFFFFF
        _POW31 = p
    return _POW31[:n]


def index_abs(h: int) -> int:
    """The IndexFile's ``Math.abs`` of a signed int32 Java hash: ``Integer.MIN_VALUE``, which
    ``Math.abs`` leaves negative, becomes 0 as RocketMQ makes it (spec §7.2)."""
    return 0 if h == -(2**31) else abs(h)


def index_abs_many(h: np.ndarray) -> np.ndarray:
    """:func:`index_abs` of many 32-bit hashes (any integer dtype, its low 32 bits read as
    int32), as int64."""
    out = np.abs(h.astype(np.uint32).view(np.int32).astype(np.int64))
    out[out == 2**31] = 0
    return out


def java_hash_many(strings: Sequence[str]) -> np.ndarray:
    """``java_hash`` of many strings at once (int32 array), without a per-unit loop."""
    n = len(strings)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    encoded = [s.encode("utf-16-be", "surrogatepass") for s in strings]
    lengths = np.fromiter((len(b) >> 1 for b in encoded), dtype=np.int64, count=n)
    units = np.frombuffer(b"".join(encoded), dtype=">u2").astype(np.uint64)
    if units.size == 0:
        return np.zeros(n, dtype=np.int32)
    ends = np.cumsum(lengths)
    owner = np.repeat(np.arange(n), lengths)
    exponent = ends[owner] - 1 - np.arange(units.size)
    terms = (units * pow31(int(lengths.max()))[exponent]) & np.uint64(0xFFFFFFFF)
    sums = np.zeros(n, dtype=np.uint64)
    np.add.at(sums, owner, terms)
    return (sums & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def index_hash(key: str) -> int:
    """Non-negative IndexFile hash of ``topic#key``; MIN_VALUE maps to 0 (spec §7.2)."""
    return index_abs(java_hash(key))


def index_hash_many(keys: Sequence[str]) -> np.ndarray:
    """:func:`index_hash` of many keys, as int32."""
    return index_abs_many(java_hash_many(keys)).astype(np.int32)


# --- keys of one topic (spec §7.2) -----------------------------------------------------

FAST_KEY_MAX = 256  # longer tokens take the general hash
_POW_N = pow31(FAST_KEY_MAX + 1).tolist()  # Python ints: the scalar fast form
_DIGITS31 = b"0123456789abcdefghijklmnopqrstu"
_Q31 = bytes(_DIGITS31[c // 31] if c < 128 else 48 for c in range(256))
_R31 = bytes(_DIGITS31[c % 31] if c < 128 else 48 for c in range(256))


def prefix_hash(topic: str) -> int:
    """The unsigned Java hash of ``topic#``, which every key of the topic starts from."""
    return java_hash(topic + "#") & 0xFFFFFFFF


def token_hash(prefix: int, topic: str, token: str) -> int:
    """The index hash of ``topic#token``, given ``prefix = prefix_hash(topic)``."""
    n = len(token)
    if 0 < n <= FAST_KEY_MAX and token.isascii():
        b = token.encode("ascii")
        h = (prefix * _POW_N[n] + 31 * int(b.translate(_Q31), 31)
             + int(b.translate(_R31), 31)) & 0xFFFFFFFF
        if h & 0x80000000:  # index_abs on the unsigned form (the single-put path)
            h = 0 if h == 0x80000000 else 0x100000000 - h
        return h
    return index_hash(f"{topic}#{token}")


def token_hashes(prefix, tokens: Sequence[str]) -> np.ndarray | None:
    """Index hashes (int64) of ``topic#token`` for many ASCII tokens, given
    ``prefix = prefix_hash(topic)``: an int for every token, or one per token (tokens of
    several topics). None when a token is not ASCII or longer than FAST_KEY_MAX: the
    caller then hashes the key strings (:func:`index_hashes`)."""
    spans = joined_spans(tokens)
    if spans is None:
        return None
    return span_token_hashes(prefix, *spans)


def joined_spans(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``values`` as ASCII bytes in one buffer (NUL between them), where each ends and its
    length; None when a value is not an ASCII str."""
    n = len(values)
    try:
        joined = "\x00".join(values)
    except TypeError:
        return None
    if not joined.isascii():
        return None
    buf = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    seps = np.flatnonzero(buf == 0)  # cheaper than measuring each value
    if len(seps) == n - 1:
        ends = np.empty(n, dtype=np.int64)
        ends[:-1] = seps
        ends[-1] = len(buf)
        lens = ends.copy()
        lens[1:] -= seps + 1
        return buf, ends, lens
    lens = np.fromiter(map(len, values), dtype=np.int64, count=n)  # a value holds a NUL
    ends = np.cumsum(lens + 1) - 1
    return buf, ends, lens


_POW31_N = pow31(FAST_KEY_MAX + 1).copy()
_POW31_F = _POW31_N.astype(np.float64)


def span_token_hashes(prefix, buf: np.ndarray, ends: np.ndarray,
                      lens: np.ndarray) -> np.ndarray | None:
    """Index hashes (int64) of ``topic#token`` for the ASCII tokens ``buf[ends - lens:ends]``
    given their topics' :func:`prefix_hash` (an int, or one per token): ``h(topic# + token)
    = h(topic#) * 31**len + h(token)`` mod 2**32, the tokens right-aligned into an
    (n, longest) matrix (bytes before a shorter token zeroed) and summed against powers
    of 31 (exact in float64: each sum is below 2**47). None for a token over
    FAST_KEY_MAX bytes."""
    width = int(lens.max()) if len(lens) else 0
    if width > FAST_KEY_MAX:
        return None
    # both factors are below 2**32: the product fits uint64 before the mod
    h = np.asarray(prefix, dtype=np.uint64) * _POW31_N[lens]
    if width:
        mat = _rows_ending(buf, ends, width)
        if int(lens.min()) < width:
            cols = np.arange(width)
            mat[cols < (width - lens)[:, None]] = 0  # bytes before the token
        h += (mat.astype(np.float64) @ _POW31_F[width - 1::-1]).astype(np.uint64)
    h &= np.uint64(0xFFFFFFFF)
    return index_abs_many(h)


def _rows_ending(buf: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """An (n, width) uint8 matrix: the ``width`` bytes before each of ``ends`` (zeros
    before the buffer's start), copied as one void item per row (:func:`span_rows`)."""
    if len(ends) and int(ends.min()) < width:
        padded = np.zeros(width + len(buf), dtype=np.uint8)
        padded[width:] = buf
        return span_rows(padded, ends, width)
    return span_rows(buf, ends - width, width)


def key_token_spans(buf: np.ndarray, ends: np.ndarray,
                    lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The KEYS tokens of the values ``buf[ends - lens:ends]`` (in order, no space in
    ``buf`` outside them) as the index sees them
    (:func:`rmqstore.format.message.split_keys`: split at spaces, empty tokens dropped):
    each token's value number, end and length, in order."""
    if not len(ends):
        return ends, ends, ends
    spaces = np.flatnonzero(buf == 32)
    if not len(spaces):  # one token a value (or none, when empty): the usual KEYS
        keep = np.flatnonzero(lens)
        return keep, ends[keep], lens[keep]
    # Every token ends at a cut: a space (the next token starts after it) or a value's
    # end (the next starts at the next value); at one position the value's end is first.
    pos = np.concatenate((ends, spaces))
    after = np.concatenate((ends - lens, spaces + 1))
    after[:len(ends) - 1] = after[1:len(ends)]
    is_end = np.zeros(len(pos), dtype=np.int64)
    is_end[:len(ends)] = 1
    order = np.argsort(pos * 2 + (1 - is_end), kind="stable")
    tok_end, after, is_end = pos[order], after[order], is_end[order]
    starts = np.empty_like(tok_end)
    starts[0] = ends[0] - lens[0]
    starts[1:] = after[:-1]
    value = np.cumsum(is_end) - is_end  # value ends before this cut
    lens = tok_end - starts
    keep = lens > 0
    return value[keep], tok_end[keep], lens[keep]


def index_hashes(keys: Sequence[str]) -> np.ndarray:
    """Index hashes of many whole keys (``topic#token``, any text): Java
    ``String.hashCode`` as one matrix product per distinct UTF-16 length."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    joined = "".join(keys).encode("utf-16-be", "surrogatepass")
    lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    if len(joined) != 2 * int(lens.sum()):
        # Characters outside the BMP count as two units: measure each key.
        lens = np.fromiter((len(k.encode("utf-16-be", "surrogatepass")) >> 1 for k in keys),
                           dtype=np.int64, count=n)
    units = np.frombuffer(joined, dtype=">u2").astype(np.uint64)
    starts = np.cumsum(lens) - lens
    pw = pow31(int(lens.max()))
    h = np.zeros(n, dtype=np.uint64)
    for length in np.unique(lens).tolist():
        if length == 0:
            continue
        sel = np.flatnonzero(lens == length)
        mat = units[starts[sel, None] + np.arange(length)]
        # Each product is < 2**48, so the row sums cannot overflow 64 bits for keys
        # shorter than 65536 units; the mod 2**32 is taken once at the end.
        h[sel] = (mat * pw[length - 1::-1]).sum(axis=1) & np.uint64(0xFFFFFFFF)
    return index_abs_many(h)


# --- Java String.hashCode over byte spans (spec §0) ----------------------------------------

_SPAN_FAST_MAX = 96  # values up to this many bytes are hashed vectorised
_SPAN_EXACT_MAX = 6  # up to this many distinct lengths are hashed one exact-width matrix each


def span_rows(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """An (n, width) uint8 matrix: the ``width`` bytes at each of ``pos`` (one copy per
    row; every ``pos + width`` must be within ``u8``)."""
    if width <= 0:
        return np.zeros((len(pos), 0), np.uint8)
    # One void item of ``width`` bytes at every byte: fancy indexing then copies whole
    # items, about twice as fast as gathering rows of a 2-d strided view.
    items = np.ndarray(shape=(max(len(u8) - width + 1, 0),), dtype=f"V{width}", buffer=u8,
                       offset=0, strides=(1,))
    return items[pos].view(np.uint8).reshape(len(pos), width)


_SPAN_POW = pow31(_SPAN_FAST_MAX + 2).astype(np.uint32)
# 31 is odd, so it has an inverse mod 2^32: trailing zero bytes can be divided back out.
_SPAN_INV31 = pow(31, -1, 2**32)
_SPAN_INVPOW = np.array([pow(_SPAN_INV31, k, 2**32) for k in range(_SPAN_FAST_MAX + 2)], np.uint32)


def span_hash(u8: np.ndarray, pos: np.ndarray, length: np.ndarray, flag: int | None = None):
    """Java hash (as uint32) of each byte span read as text, and its UTF-16 length (and,
    with ``flag``, whether the span holds that byte).

    ASCII spans up to ``_SPAN_FAST_MAX`` bytes are hashed vectorised: the spans are copied as
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
    fast = (length <= _SPAN_FAST_MAX) & (pos + _SPAN_FAST_MAX <= len(u8))
    slow = np.flatnonzero(~fast).tolist()
    fast = np.flatnonzero(fast)
    lengths = np.flatnonzero(np.bincount(length[fast], minlength=1)) if len(fast) else []
    if len(lengths) <= _SPAN_EXACT_MAX:
        # Few distinct lengths (tags, keys, UNIQ_KEYs usually share one): a matrix per
        # length, exactly as wide as its spans, needs no masking and no 31^pad division.
        groups = [(fast if len(lengths) == 1 else fast[length[fast] == n_], int(n_), False)
                  for n_ in lengths if n_]
    else:
        groups, lo = [], 0
        for hi in (8, 16, 32, 64, _SPAN_FAST_MAX):  # width classes: padding stays under 2x
            sel = fast[(length[fast] > lo) & (length[fast] <= hi)]
            lo = hi
            if len(sel):
                groups.append((sel, int(length[sel].max()), True))
    for sel, width, padded in groups:
        m = span_rows(u8, pos[sel], width)
        if padded:
            ln = length[sel]
            m[np.arange(width)[None, :] >= ln[:, None]] = 0
        hh = m.astype(np.uint32) @ _SPAN_POW[width - 1::-1]
        if padded:
            hh *= _SPAN_INVPOW[width - ln]
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


def signed_int32(h: np.ndarray) -> np.ndarray:
    """uint32 hashes as the int32 Java sees, widened to int64."""
    return h.astype(np.uint32).view(np.int32).astype(np.int64)


def index_hash_from(topic_hash: np.ndarray, key_hash: np.ndarray, key_units: np.ndarray) -> np.ndarray:
    """IndexFile hash of ``topic + "#" + key`` from the parts' Java hashes (spec §7.2):
    hash(a + b) = hash(a) * 31^len(b) + hash(b), all mod 2^32."""
    maxu = int(key_units.max()) if len(key_units) else 0
    pw = pow31(maxu + 2).astype(np.uint32)
    prefix = (topic_hash.astype(np.uint32) * np.uint32(31) + np.uint32(ord("#"))).astype(np.uint32)
    h = (prefix * pw[key_units] + key_hash.astype(np.uint32)).astype(np.uint32)
    return index_abs_many(h)


# --- Java HashMap iteration order (spec §14.3) -------------------------------------------


def hashmap_order(keys: list[str], initial_capacity: int = 16, max_size: int | None = None) -> list[str]:
    """``keys`` (insertion order) in the iteration order of a Java HashMap holding them.

    The capacity doubles while the largest size the map reached exceeds 0.75 x capacity;
    within a bucket, insertion order holds (no treeified bins below 8 per bucket).
    """
    cap = 1
    while cap < initial_capacity:
        cap <<= 1
    size = max(len(keys), max_size or 0)
    while size > cap * 3 // 4:
        cap <<= 1

    def bucket(k: str) -> int:
        h = java_hash(k) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (cap - 1)

    return [k for _, _, k in sorted((bucket(k), i, k) for i, k in enumerate(keys))]
