"""Index hashes of keys (spec §7.2): ``abs(String.hashCode("topic#key"))`` as RocketMQ
computes it, for one key or many, without a Python loop over characters.

The Java hash is a base-31 polynomial mod 2**32, so ``h(a + b) = h(a) * 31**len(b) + h(b)``:
a topic's ``topic#`` hash (:func:`prefix_hash`) is computed once and every key of the topic
only adds its token. For an ASCII token, each code ``c = 31 * (c // 31) + c % 31`` splits
into two base-31 digits, so ``h(token) = 31 * int(q, 31) + int(r, 31)``: two C-level parses
(:func:`token_hash`). Many tokens at once are one matrix product per token length
(:func:`token_hashes`), and keys of any text one per UTF-16 length (:func:`index_hashes`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .codec import index_hash, java_hash

FAST_KEY_MAX = 256  # longer tokens take the general hash
_POW_N = [pow(31, n, 1 << 32) for n in range(FAST_KEY_MAX + 1)]
_POW_ROWS = [tuple(pow(31, n - 1 - i, 1 << 32) for i in range(n)) for n in range(FAST_KEY_MAX + 1)]
_DIGITS31 = b"0123456789abcdefghijklmnopqrstu"
_Q31 = bytes(_DIGITS31[c // 31] if c < 128 else 48 for c in range(256))
_R31 = bytes(_DIGITS31[c % 31] if c < 128 else 48 for c in range(256))


def _pow31(n: int) -> np.ndarray:
    p = np.ones(max(n, 1), dtype=np.uint64)
    for k in range(1, n):
        p[k] = (int(p[k - 1]) * 31) & 0xFFFFFFFF
    return p


_POW = _pow31(256)


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
        if h & 0x80000000:  # negative as int32: Math.abs, and MIN_VALUE becomes 0
            h = 0 if h == 0x80000000 else 0x100000000 - h
        return h
    return index_hash(f"{topic}#{token}")


def token_hashes(prefix: int, tokens: Sequence[str]) -> np.ndarray | None:
    """Index hashes of ``topic#token`` for many ASCII tokens of one topic, vectorised per
    token length; None when a token is not ASCII or longer than FAST_KEY_MAX."""
    joined = "".join(tokens)
    if not joined.isascii():
        return None
    n = len(tokens)
    lens = np.fromiter(map(len, tokens), dtype=np.int64, count=n)
    if n and int(lens.max()) > FAST_KEY_MAX:
        return None
    units = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).astype(np.uint64)
    starts = np.cumsum(lens) - lens
    h = np.empty(n, dtype=np.uint64)
    for length in np.unique(lens).tolist():
        sel = np.flatnonzero(lens == length)
        pows = np.array(_POW_ROWS[length], dtype=np.uint64)
        part = (units[starts[sel, None] + np.arange(length)] * pows).sum(axis=1) if length \
            else np.zeros(len(sel), dtype=np.uint64)
        h[sel] = (part + np.uint64(prefix * _POW_N[length] & 0xFFFFFFFF)) & np.uint64(0xFFFFFFFF)
    return _java_abs(h)


def index_hashes(keys: Sequence[str]) -> np.ndarray:
    """Index hashes of many whole keys (``topic#token``, any text): Java
    ``String.hashCode`` as one matrix product per distinct UTF-16 length."""
    global _POW
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
    if int(lens.max()) > len(_POW):
        _POW = _pow31(int(lens.max()))
    h = np.zeros(n, dtype=np.uint64)
    for length in np.unique(lens).tolist():
        if length == 0:
            continue
        sel = np.flatnonzero(lens == length)
        mat = units[starts[sel, None] + np.arange(length)]
        # Each product is < 2**48, so the row sums cannot overflow 64 bits for keys
        # shorter than 65536 units; the mod 2**32 is taken once at the end.
        h[sel] = (mat * _POW[length - 1::-1]).sum(axis=1) & np.uint64(0xFFFFFFFF)
    return _java_abs(h)


def _java_abs(h: np.ndarray) -> np.ndarray:
    """Math.abs of the int32 view of 32-bit hashes; MIN_VALUE stays negative in Java and
    RocketMQ then uses 0."""
    out = np.abs(h.astype(np.uint32).view(np.int32).astype(np.int64))
    out[out == 2**31] = 0
    return out
