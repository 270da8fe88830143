"""BODYCRC (spec §3.1, §3.2): zlib's CRC-32 of a body masked to 31 bits, for one body
(:func:`body_crc`) or many byte spans at once (:func:`crc32_spans`); and the 5.2+
property CRC over a whole record (spec §3.8: :func:`prop_crc_entry`, :func:`prop_crc_ok`,
and :func:`prop_crc_tails` for many records).

One ``zlib.crc32`` call per span costs ~0.25 µs in Python, which dominates bulk paths when
bodies are small. Here short spans are checksummed together, a column of 4 bytes per numpy
step for all spans at once (two 64 Ki-entry tables do the work of slicing-by-4). Two
facts make rows of different lengths share one matrix:

- a CRC register that starts at zero stays zero over zero bytes, so spans are right-aligned
  in a fixed-width row and the bytes in front of them zeroed;
- zlib's CRC starts from ``0xFFFFFFFF`` and inverts at the end, which is the zero-start
  CRC of the span XOR ``crc32(b"\\0" * length)`` (CRC is linear), one constant per length.

Spans longer than :data:`VEC_MAX` go to :data:`crc32` one by one, where its per-call cost
is small next to the bytes.

:data:`crc32` is zlib's CRC-32 (same values), computed by ISA-L (the ``isal`` wheel) where it
is installed: 4x zlib's speed on a 1 KiB body, 16 GB/s on long spans (docs/performance.md).
:func:`native_crc32` is the same function as a C pointer, for the compiled record walk.
"""

from __future__ import annotations

import zlib

import numpy as np

try:  # ISA-L: the same CRC-32 as zlib, several times faster (issue 15)
    from isal import isal_zlib as _isal
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    _isal = None

#: ``crc32(data, value=0)``: zlib's CRC-32, through ISA-L when it is installed.
crc32 = _isal.crc32 if _isal is not None else zlib.crc32

from . import layout as L

VEC_MAX = 256  # longer spans are cheaper through zlib one call each
_CHUNK = 8192  # spans per numpy step: keeps the working columns in cache
_WIDTHS = (32, 64, 128, 192, VEC_MAX)  # row widths (multiples of 4): padding stays small


#: BODYCRC keeps the low 31 bits of the CRC-32 (spec §3.2). Bulk paths mask zlib's values
#: with it themselves; one body at a time is :func:`body_crc`.
BODY_CRC_MASK = 0x7FFFFFFF


def body_crc(body: bytes) -> int:
    """BODYCRC: CRC-32 masked to 31 bits; 0 for an empty body (spec §0, §3.2)."""
    return crc32(body) & BODY_CRC_MASK if body else 0


def native_crc32():
    """``(crc, shortest)``: :data:`crc32` as a ctypes function ``crc(init, address,
    length)`` the compiled kernels can call, and the span length from which a call beats
    their own table walk. ISA-L's ``crc32_gzip_refl`` where ``isal`` is installed (5-10 ns
    a call up to 256 bytes against 25-190 ns for the table: every span), else the C
    library's zlib ``crc32`` (slower than the table below 256 bytes); ``(None, 0)`` where
    neither loads. Both give zlib's values (``init`` 0 starts a CRC)."""
    import ctypes
    import ctypes.util

    if _isal is not None:
        try:
            f = ctypes.CDLL(_isal.__file__).crc32_gzip_refl
        except (OSError, AttributeError):
            pass
        else:
            f.restype = ctypes.c_uint32
            f.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64]
            return f, 1
    for name in ("libz.so.1", "libz.dylib", ctypes.util.find_library("z")):
        if not name:
            continue
        try:
            f = ctypes.CDLL(name).crc32
        except (OSError, AttributeError):
            continue
        f.restype = ctypes.c_ulong
        f.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_uint]
        return f, 256
    return None, 0


_tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def _make_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, per-length constant): after XORing a little-endian word into the
    register, the register becomes ``low[r & 0xFFFF] ^ high[r >> 16]``."""
    global _tables
    if _tables is None:
        t = np.arange(256, dtype=np.uint32)
        for _ in range(8):  # the reflected polynomial, bit by bit
            t = np.where(t & 1, (t >> 1) ^ np.uint32(0xEDB88320), t >> 1).astype(np.uint32)
        # t_k[b]: byte b followed by k zero bytes (slicing-by-4)
        t1 = (t >> 8) ^ t[t & 0xFF]
        t2 = (t1 >> 8) ^ t[t1 & 0xFF]
        t3 = (t2 >> 8) ^ t[t2 & 0xFF]
        v = np.arange(65536, dtype=np.uint32)
        low = (t3[v & 0xFF] ^ t2[v >> 8]).astype(np.uint32)
        high = (t1[v & 0xFF] ^ t[v >> 8]).astype(np.uint32)
        zeros = np.array([zlib.crc32(bytes(n)) for n in range(VEC_MAX + 1)], dtype=np.uint32)
        _tables = low, high, zeros
    return _tables


def crc32_spans(u8: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``zlib.crc32(u8[pos[i]:pos[i] + length[i]])`` for every i, as uint32.

    Lengths below zero count as empty; a span running past the end of ``u8`` is cut
    there (as slicing would), which only damaged length fields ask for."""
    n = len(pos)
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out
    pos = np.clip(np.asarray(pos, dtype=np.int64), 0, len(u8))
    length = np.clip(np.asarray(length, dtype=np.int64), 0, len(u8) - pos)
    end = pos + length
    one = int(length[0])
    if 0 < one <= VEC_MAX and bool((length == one).all()) and int(end.min()) >= one + 3:
        # The usual case, one body length: whole chunks by slicing, no per-class picking.
        width = -(-one // 4) * 4
        for a in range(0, n, _CHUNK):
            out[a:a + _CHUNK] = _crc_rows(u8, end[a:a + _CHUNK], length[a:a + _CHUNK], width)
        return out
    # A row reads ``width`` bytes ending at the span's end: spans too close to the start
    # of ``u8`` for that, and long ones, take the zlib path.
    short = length <= VEC_MAX
    lo = 0
    rest = []
    for width in _WIDTHS:
        sel = np.flatnonzero(short & (length > lo) & (length <= width))
        lo = width
        if not len(sel):
            continue
        for a in range(0, len(sel), _CHUNK):
            part = sel[a:a + _CHUNK]
            w = -(-int(length[part].max()) // 4) * 4  # the class's widest span, in words
            near = end[part] < w
            if near.any():
                rest.append(part[near])
                part = part[~near]
            if len(part):
                out[part] = _crc_rows(u8, end[part], length[part], w)
    rest.append(np.flatnonzero(~short))
    rest = np.concatenate(rest)
    if len(rest):
        mv = memoryview(u8)
        out[rest] = [crc32(mv[p:e]) for p, e in zip(pos[rest].tolist(), end[rest].tolist())]
    return out


def _crc_rows(u8: np.ndarray, end: np.ndarray, length: np.ndarray, width: int) -> np.ndarray:
    low, high, zeros = _make_tables()
    items = np.ndarray(shape=(len(u8) - width + 1,), dtype=f"V{width}", buffer=u8,
                       offset=0, strides=(1,))
    # a copy: one right-aligned row per span (void items copy faster than strided rows)
    m = items[end - width].view(np.uint8).reshape(len(end), width)
    pad = width - length
    p0 = int(pad[0])
    if (pad == p0).all():
        m[:, :p0] = 0
    else:
        m[np.arange(width)[None, :] < pad[:, None]] = 0
    words = np.ascontiguousarray(m.view("<u4").T)  # (width / 4, spans): one word column a step
    crc = np.zeros(len(end), dtype=np.uint32)
    lo_idx, hi_idx, part = np.empty_like(crc), np.empty_like(crc), np.empty_like(crc)
    for w in words:
        crc ^= w
        np.bitwise_and(crc, 0xFFFF, out=lo_idx)
        np.right_shift(crc, 16, out=hi_idx)
        np.take(low, lo_idx, out=crc)
        np.take(high, hi_idx, out=part)
        crc ^= part
    crc ^= zeros[length]
    return crc


# --- the property CRC (spec §3.8, §12.7) --------------------------------------------------

_DIGITS = 10


def prop_crc_entry(crc: int) -> bytes:
    """The 20 bytes ``__CRC32#\\x01`` + ten digits least significant first + ``\\x02``
    a 5.2+ writer ends a record with (``MessageDecoder#createCrc32``)."""
    digits = bytearray()
    for _ in range(_DIGITS):
        digits.append(0x30 + crc % 10)
        crc //= 10
    return L.PropCrcEntry.build({"digits": bytes(digits)})


def prop_crc_value(tail) -> int | None:
    """The CRC a record's last 20 bytes carry, or None when they are not the entry."""
    tail = bytes(tail)
    if len(tail) != L.PROP_CRC_ENTRY_SIZE or not tail.startswith(L.PROP_CRC_PREFIX) \
            or tail[-1:] != L.PROPERTY_SEPARATOR.encode():
        return None
    digits = tail[len(L.PROP_CRC_PREFIX):-1]
    if not digits.isdigit() or not digits.isascii():
        return None
    return int(digits[::-1])


def ends_in_prop_crc(record) -> bool:
    """Whether a whole record ends in a ``__CRC32#`` entry (it was written with
    ``enabledAppendPropCRC``); :func:`prop_crc_tails` is the same rule for many records."""
    n = len(record)
    return n >= L.PROP_CRC_ENTRY_SIZE and prop_crc_value(
        memoryview(record)[n - L.PROP_CRC_ENTRY_SIZE:]) is not None


def record_prop_crc(record) -> int:
    """The property CRC of a whole record: CRC-32 of all but its last 20 bytes, 31 bits."""
    return crc32(memoryview(record)[:len(record) - L.PROP_CRC_ENTRY_SIZE]) & BODY_CRC_MASK


def prop_crc_ok(record) -> bool | None:
    """Whether a whole record's ``__CRC32#`` entry matches it; None when it has none."""
    if len(record) < L.PROP_CRC_ENTRY_SIZE:
        return None
    want = prop_crc_value(memoryview(record)[len(record) - L.PROP_CRC_ENTRY_SIZE:])
    return None if want is None else want == record_prop_crc(record)


_PREFIX_U8 = np.frombuffer(L.PROP_CRC_PREFIX, dtype=np.uint8)


def prop_crc_tails(u8: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The vector form of "ends in a ``__CRC32#`` entry": for records ending at ``ends``
    (exclusive) in ``u8``, True where the last 20 bytes have the entry's shape (name,
    separator, ten digits, separator)."""
    ends = np.asarray(ends, dtype=np.int64)
    ok = ends >= L.PROP_CRC_ENTRY_SIZE
    if not ok.any():
        return ok
    at = np.where(ok, ends - L.PROP_CRC_ENTRY_SIZE, 0)
    cols = at[:, None] + np.arange(L.PROP_CRC_ENTRY_SIZE)
    tail = u8[np.minimum(cols, len(u8) - 1)]
    n = len(_PREFIX_U8)
    ok &= (tail[:, :n] == _PREFIX_U8).all(axis=1)
    digits = tail[:, n:n + _DIGITS]
    ok &= ((digits >= 0x30) & (digits <= 0x39)).all(axis=1)
    ok &= tail[:, -1] == ord(L.PROPERTY_SEPARATOR)
    return ok & (ends <= len(u8))


_POW10 = 10 ** np.arange(_DIGITS, dtype=np.int64)


def prop_crc_checks(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The vector form of :func:`prop_crc_ok` for records ``[starts, ends)`` of ``u8`` that
    end in an entry (:func:`prop_crc_tails`): True where the digits match the record."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if len(ends) == 0:
        return np.zeros(0, bool)
    at = ends - L.PROP_CRC_ENTRY_SIZE + len(L.PROP_CRC_PREFIX)
    digits = u8[at[:, None] + np.arange(_DIGITS)].astype(np.int64) - 0x30
    want = digits @ _POW10  # least significant digit first
    got = crc32_spans(u8, starts, ends - L.PROP_CRC_ENTRY_SIZE - starts).astype(np.int64)
    return (got & BODY_CRC_MASK) == want
