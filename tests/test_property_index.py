"""Bulk property lookup gives, for every record, the value RocketMQ's own parse gives
(spec §3.4: split on 0x02, name before the first 0x01, empty values ignored, later names
win), whether the properties fit the row matrix or take the wide fallback."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqstore.scan import properties as R
from rmqstore.format.message import parse_properties

NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "K", "TA", "TAGSX", "AGS"]
# Names, values and noise that collide with the names above in every way that matters.
_piece = st.sampled_from(NAMES + ["", "\x01", "\x02", "x", "T", "TAGS\x01", "\x01\x02"])
_segment = st.one_of(
    st.tuples(st.sampled_from(NAMES), st.text(alphabet="ab \x01", max_size=6)).map(
        lambda kv: f"{kv[0]}\x01{kv[1]}"),
    st.lists(_piece, max_size=4).map("".join),
)
_props = st.lists(_segment, max_size=6).map("\x02".join)


def _expected(text: str, name: str):
    return parse_properties(text).get(name)


def _check(texts: list[str], pad: int):
    # records laid out one after another with ``pad`` junk bytes between them; the junk
    # is 0x02/0x01/name bytes, so reading past a record's end would show
    junk = b"\x02TAGS\x01z\x02"[:pad]
    buf, pos, ln = bytearray(), [], []
    for t in texts:
        b = t.encode()
        buf += b"\x02" * 3
        pos.append(len(buf))
        ln.append(len(b))
        buf += b + junk
    buf += b"\x02TAGS\x01tail" * 40  # bytes after the last record, for the row copy
    u8 = np.frombuffer(bytes(buf), dtype=np.uint8)
    pos, ln = np.array(pos, np.int64), np.array(ln, np.int64)
    fast = R.PropertyIndex(u8, pos, ln)
    wide = R.property_segments(u8, pos, ln)
    for name in NAMES:
        vpos, vlen = fast.lookup(name.encode())
        opos, olen = R.lookup(u8, wide, len(texts), name.encode())
        assert np.array_equal(vpos, opos) and np.array_equal(vlen, olen)
        for i, t in enumerate(texts):
            want = _expected(t, name)
            got = None if vpos[i] < 0 else bytes(u8[vpos[i]:vpos[i] + vlen[i]]).decode()
            assert got == want, (t, name)


@settings(max_examples=300, deadline=None)
@given(st.lists(_props, min_size=1, max_size=12), st.integers(0, 8))
def test_lookup_matches_the_broker_parse(texts, pad):
    _check(texts, pad)


def test_wide_properties_take_the_fallback_and_agree():
    texts = ["TAGS\x01a\x02" + "P\x01" + "v" * 400 + "\x02KEYS\x01k1 k2", "KEYS\x01x", ""]
    u8 = np.frombuffer(("".join(t + "\x02\x02" for t in texts) + "pad" * 200).encode(), np.uint8)
    assert R.PropertyIndex(u8, np.array([0]), np.array([len(texts[0])]))._segs is not None
    _check(texts, 2)


# --- Java String.hashCode over byte spans -------------------------------------------------

_text = st.text(alphabet=st.sampled_from("abcXYZ019 #_-é中\U0001F600"), max_size=120)


@settings(max_examples=200, deadline=None)
@given(st.lists(_text, min_size=1, max_size=40), st.booleans())
def test_span_hash_is_java_hash(texts, one_length):
    from rmqstore.format.hashing import java_hash, span_hash

    if one_length:  # the exact-width path: every span one length
        n = len(texts[0].encode())
        texts = [(t.encode()[:n].ljust(n, b"a")).decode("utf-8", "replace") for t in texts]
    raw = [t.encode("utf-8", "replace") for t in texts]
    buf = b"".join(b"\x00" + r for r in raw) + b"z" * 200
    pos, at = [], 0
    for r in raw:
        pos.append(at + 1)
        at += 1 + len(r)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    h, units, has = span_hash(u8, np.array(pos), np.array([len(r) for r in raw]), 0x20)
    for i, r in enumerate(raw):
        s = r.decode("utf-8", "replace")
        assert int(h[i]) == java_hash(s) & 0xFFFFFFFF, s
        assert int(units[i]) == len(s.encode("utf-16-be", "surrogatepass")) // 2
        assert bool(has[i]) == (b" " in r)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30))
def test_topic_span_hash_tells_spans_apart(spans):
    """scan's 64-bit span hash (used to tell topics apart) is equal exactly for equal
    spans here, including spans that end at the very end of the buffer."""
    from rmqstore.scan.records import _span_hash

    buf = b"".join(b"\xff" + s for s in spans)
    pos, at = [], 0
    for s in spans:
        pos.append(at + 1)
        at += 1 + len(s)
    h = _span_hash(np.frombuffer(buf, np.uint8), np.array(pos), np.array([len(s) for s in spans]))
    for i, a in enumerate(spans):
        for j, b in enumerate(spans):
            assert (h[i] == h[j]) == (a == b)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 60), max_size=40), st.lists(st.integers(0, 60), max_size=300),
       st.integers(1, 40), st.booleans())
def test_sorted_isin_is_isin(members, values, repeat, sort):
    # sorted_isin searches runs of equal values once when they come in order (an IndexFile's
    # offsets): every form gives np.isin's answer; `repeat` makes long runs past the
    # threshold where that path starts
    s = np.unique(np.array(members, np.int64))
    v = np.repeat(np.array(values, np.int64), repeat)
    if sort:
        v = np.sort(v)
    assert R.sorted_isin(v, s).tolist() == np.isin(v, s).tolist()
