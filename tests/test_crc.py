"""The vectorised CRC-32 gives zlib's value for every span, whatever its length or place."""

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqstore.format.crc import VEC_MAX, crc32_spans


def _zlib(buf: bytes, pos, length):
    return [zlib.crc32(buf[p:p + max(n, 0)]) for p, n in zip(pos, length)]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=2 * VEC_MAX + 64), st.data())
def test_spans_match_zlib(buf, data):
    k = data.draw(st.integers(0, 40))
    pos = [data.draw(st.integers(0, len(buf))) for _ in range(k)]
    # lengths cover empty, negative, every vectorised width class, the zlib path, and
    # spans running past the buffer's end (cut there, as slicing does)
    length = [data.draw(st.integers(-2, VEC_MAX + 80)) for _ in range(k)]
    u8 = np.frombuffer(buf, dtype=np.uint8)
    got = crc32_spans(u8, np.array(pos, dtype=np.int64), np.array(length, dtype=np.int64))
    assert got.tolist() == _zlib(buf, pos, length)


def test_many_equal_spans_and_chunks():
    # more spans than one numpy chunk, all one length (the common case: one width, no
    # per-row padding mask), read at unaligned places
    rng = np.random.default_rng(7)
    buf = rng.integers(0, 256, 3_000_000, dtype=np.uint8)
    pos = rng.integers(0, len(buf) - 200, 20_000)
    for n in (1, 3, 4, 100, 101, VEC_MAX, VEC_MAX + 1):
        length = np.full(len(pos), n)
        got = crc32_spans(buf, pos, length)
        assert got.tolist() == _zlib(buf.tobytes(), pos.tolist(), length.tolist())


def test_known_vector():
    # spec §12: BODYCRC is crc32 & 0x7FFFFFFF; crc32(b"123456789") is the CRC-32 check value
    u8 = np.frombuffer(b"xx123456789", dtype=np.uint8)
    assert int(crc32_spans(u8, np.array([2]), np.array([9]))[0]) == 0xCBF43926
