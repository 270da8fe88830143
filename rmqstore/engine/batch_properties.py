"""The properties texts of a columnar batch (spec §3.4), encoded without a dict per
message: one C-level join of the template's constant pieces and the columns' values,
encoded once and split back per record (the separator is checked to occur nowhere
else), with each record's leading pieces (topic field, PROPERTIESLENGTH, leading
categorical values) made once per distinct combination. The texts are those
:func:`rmqstore.format.message.serialize_properties` makes of each message's dict."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..format import layout as L
from ..format.message import serialize_properties
from .prepare import FAST_PROPS_MAX

_PROPS_LEN = L.RECORD_PROPERTIES_LENGTH_STRUCT
_SEP = L.PROPERTY_SEPARATOR
_NV = L.PROPERTY_NAME_VALUE_SEPARATOR


def _template(properties: Mapping[str, Any], trailing: bool):
    """(constant pieces, column names, columns) so that text_i = c0 + col1[i] + c1 + ...
    + colk[i] + ck, valid when no column holds None."""
    consts, names, cols, acc, first = [], [], [], "", True
    for name, v in properties.items():
        acc += ("" if first else _SEP) + name + _NV
        first = False
        if isinstance(v, str):
            acc += v
        else:
            consts.append(acc)
            names.append(name)
            cols.append(v)
            acc = ""
    if not first and trailing:
        acc += _SEP
    consts.append(acc)
    return consts, names, cols


def _texts_generic(properties: Mapping[str, Any], n: int, trailing: bool) -> list[str]:
    """Per message, exactly as put_batch serialises a properties dict (None skipped)."""
    names = list(properties)
    cols = [itertools.repeat(v, n) if isinstance(v, str) else v for v in properties.values()]
    return [serialize_properties(zip(names, row), trailing)
            for row in (zip(*cols) if cols else itertools.repeat((), n))]


def _encode_texts(texts: list[str]) -> list[bytes]:
    try:
        return list(map(str.encode, texts))
    except UnicodeEncodeError:
        return [t.encode("utf-8", "replace") for t in texts]


@dataclass(slots=True)
class PropertyColumn:
    """One per-message property column as encoded, kept for dispatch.

    Categorical (few distinct values): ``codes`` index ``distinct``. Free: ``buf`` holds
    the values UTF-8 encoded, each followed by the template's next constant and a NUL;
    value i is ``buf[ends[i] - lens[i]:ends[i]]``; ``ascii`` says every value is ASCII.
    """

    values: Sequence
    lens: np.ndarray
    codes: np.ndarray | None = None
    distinct: list | None = None
    buf: np.ndarray | None = None
    ends: np.ndarray | None = None
    ascii: bool = False
    spaces: int = -1  # free: spaces inside the values (not the constants between them)


def _categorical(col, n: int) -> bool:
    """Few distinct values in the first 64 (then a dict code per message pays off)."""
    try:
        sample = set(col[:64]) if n > 64 else set(col)
    except TypeError:
        return False  # unhashable values: the join refuses them
    return len(sample) <= max(1, min(n, 64) // 4)


def _encode_columns(consts: list[str], cols: list, n: int):
    """(per-record piece lists after the lead piece, the leading categorical columns,
    encoded constants, PropertyColumn per column) or None when the template way does not apply
    (a None or non-str value, a NUL, an unencodable character)."""
    # A None (or any non-str) value fails the join or the type check below.
    try:
        cenc = [c.encode() for c in consts]
    except UnicodeEncodeError:
        return None
    if any(b"\x00" in c for c in cenc):
        return None
    infos: list[PropertyColumn] = []
    for j, col in enumerate(cols, start=1):
        tail = consts[j]
        if _categorical(col, n):
            idx = _Pieces(lambda v, d=None: len(idx))  # codes in order of first appearance
            try:
                codes = np.fromiter(map(idx.__getitem__, col), dtype=np.int64, count=n)
            except TypeError:
                return None  # an unhashable value
            distinct = list(idx)
            if not all(type(v) is str for v in distinct):
                return None
            try:
                enc = [v.encode() for v in distinct]
            except UnicodeEncodeError:
                return None
            lens = np.array([len(e) for e in enc], dtype=np.int64)[codes]
            infos.append(PropertyColumn(col, lens, codes, distinct))
        else:
            try:
                text = (tail + "\x00").join(col) + tail
                data = text.encode()
            except (TypeError, UnicodeEncodeError):
                return None
            parts = data.split(b"\x00")
            if len(parts) != n:
                return None  # a value holds a NUL
            buf = np.frombuffer(data, dtype=np.uint8)
            ends = np.empty(n, dtype=np.int64)
            ends[:-1] = np.flatnonzero(buf == 0)
            ends[-1] = len(data)
            starts = np.empty(n, dtype=np.int64)
            starts[0] = 0
            starts[1:] = ends[:-1] + 1
            ends -= len(cenc[j])
            spaces = text.count(" ") - n * tail.count(" ")
            infos.append(PropertyColumn(col, ends - starts, buf=buf, ends=ends, ascii=text.isascii(),
                              codes=None, distinct=parts, spaces=spaces))  # distinct: pieces, for now
    lead = 0
    while lead < len(infos) and infos[lead].codes is not None:
        lead += 1
    pieces = []
    for j, info in enumerate(infos, start=1):
        if j <= lead:
            continue
        if info.codes is not None:
            table = [v.encode() + cenc[j] for v in info.distinct]
            pieces.append(list(map(table.__getitem__, info.codes.tolist())))
        else:
            pieces.append(info.distinct)
            info.distinct = None
    return pieces, lead, cenc, infos


def _lead_pieces(tblocks: list[bytes], topic_codes, plens: np.ndarray, cenc0: bytes,
                 cats: list[tuple[PropertyColumn, bytes]]) -> list[bytes] | None:
    """Per record: topic length + topic, properties length, the first constant and the
    leading categorical columns with their constants, one bytes object per distinct
    combination (a dict lookup per record). None if the combinations do not fit int64."""
    comb = plens if topic_codes is None else plens + topic_codes * (FAST_PROPS_MAX + 1)
    span = (FAST_PROPS_MAX + 1) * len(tblocks)
    for info, _ in cats:
        d = len(info.distinct)
        span *= d
        if span >= 1 << 62:
            return None
        comb = comb * d + info.codes
    def piece(u: int) -> bytes:
        rest, tail = u, []
        for info, cj in reversed(cats):
            rest, c = divmod(rest, len(info.distinct))
            tail.append(info.distinct[c].encode() + cj)
        t, pl = divmod(rest, FAST_PROPS_MAX + 1)
        return b"".join([tblocks[t], _PROPS_LEN.pack(pl), cenc0, *reversed(tail)])

    return list(map(_Pieces(piece).__getitem__, comb.tolist()))


class _Pieces(dict):
    """A dict that makes a missing value with ``make(key)`` (once per distinct key)."""

    __slots__ = ("make",)

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        v = self[key] = self.make(key)
        return v


def encode_properties(batch, n: int, trailing: bool, tblocks: list[bytes],
                       topic_codes):
    """(pieces per record after the body, properties lengths, {name: PropertyColumn}, texts) or
    None when some text exceeds the fast limit. ``texts`` is the stored-texts column (then
    dispatch parses them), else None."""
    cols_info: dict[str, PropertyColumn] = {}
    texts = None
    enc = None
    if batch.properties_texts is None:
        consts, names, cols = _template(batch.properties, trailing)
        enc = _encode_columns(consts, cols, n) if n else None
    if enc is not None:
        pieces, lead, cenc, infos = enc
        plens = np.full(n, sum(map(len, cenc)), dtype=np.int64)
        for info in infos:
            plens += info.lens
        if int(plens.max()) > FAST_PROPS_MAX:
            return None
        cats = [(infos[j], cenc[j + 1]) for j in range(lead)]
        first = _lead_pieces(tblocks, topic_codes, plens, cenc[0], cats)
        if first is not None:
            return [first] + pieces, plens, dict(zip(names, infos)), None
    if batch.properties_texts is not None:
        texts = list(batch.properties_texts)
        props_b = _encode_texts(texts)
    else:
        props_b = _encode_texts(_texts_generic(batch.properties, n, trailing))
    plens = np.fromiter(map(len, props_b), dtype=np.int64, count=n)
    if int(plens.max()) > FAST_PROPS_MAX:
        return None
    return [_lead_pieces(tblocks, topic_codes, plens, b"", []), props_b], plens, cols_info, texts
