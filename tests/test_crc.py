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


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=5000), st.integers(0, 2**32 - 1))
def test_the_fast_crc32_and_its_c_pointer_give_zlibs_values(buf, start):
    # format/crc.crc32 (ISA-L where installed) and native_crc32 (what the compiled walk
    # calls) must be zlib's CRC-32 exactly, continued from any value
    import ctypes

    from rmqstore.format.crc import crc32, native_crc32

    assert crc32(buf) == zlib.crc32(buf)
    assert crc32(buf, start) == zlib.crc32(buf, start)
    f, shortest = native_crc32()
    assert f is not None and shortest >= 1
    b = ctypes.create_string_buffer(buf, len(buf) + 1)
    assert f(0, ctypes.addressof(b), len(buf)) == zlib.crc32(buf)


def test_isal_is_the_crc_where_installed():
    # the dependency is declared (pyproject): the fast path must be the one in use
    from isal import isal_zlib

    from rmqstore.format import crc

    assert crc.crc32 is isal_zlib.crc32
    assert crc.native_crc32()[0].__name__ == "crc32_gzip_refl"
