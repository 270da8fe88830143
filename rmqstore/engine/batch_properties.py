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
_SEP_B = _SEP.encode()


def _template(properties: Mapping[str, Any], trailing: bool):
    """(constant pieces, column names, columns, which columns are optional) so that
    ``text_i = (c0 + col1[i] + c1 + ... + colk[i] + ck)[1:]``: every pair is written with
    the separator before it (``\x02name\x01value``) and the text's first byte dropped,
    which is the join ``serialize_properties`` makes. A column holding None (an
    optional property, absent there) carries its whole pair in its values ("" where
    absent), so the constants around it hold for every record. None when an optional
    column holds a value that is not a str (the generic way then decides)."""
    consts, names, cols, optional, acc = [], [], [], [], ""
    for name, v in properties.items():
        pair = _SEP + name + _NV
        if isinstance(v, str):
            acc += pair + v
            continue
        if type(v) is list and v and type(v[0]) is str and v.count(v[0]) == len(v):
            acc += pair + v[0]  # the same value everywhere: a constant
            continue
        opt = isinstance(v, (list, tuple)) and None in v
        if opt:
            try:
                v = ["" if x is None else pair + x for x in v]
            except TypeError:
                return None
        else:
            acc += pair
        consts.append(acc)
        names.append(name)
        cols.append(v)
        optional.append(opt)
        acc = ""
    if properties and trailing:
        acc += _SEP
    consts.append(acc)
    return consts, names, cols, optional


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
    """One per-message property column as encoded, kept for dispatch: each value's
    encoded length; for a column of few distinct values (TAGS) ``codes`` into
    ``distinct``; for the others ``buf``, the encoded text the values sit in (value i
    is ``buf[ends[i] - lens[i]:ends[i]]``), ``ascii`` (every value is ASCII) and
    ``gap_space`` (a space between the values, in the constants)."""

    values: Sequence
    lens: np.ndarray
    codes: np.ndarray | None = None
    distinct: list | None = None
    buf: np.ndarray | None = None
    ends: np.ndarray | None = None
    ascii: bool = False
    gap_space: bool = True


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
            gap = len(cenc[j]) + 1  # the constant after each value, and a NUL
            lens = np.fromiter(map(len, parts), dtype=np.int64, count=n) - (gap - 1)
            ends = np.cumsum(lens + gap)
            ends -= gap
            infos.append(PropertyColumn(col, lens, None, parts,  # distinct: pieces, for now
                                        np.frombuffer(data, dtype=np.uint8), ends,
                                        text.isascii(), " " in tail))
    lead = 0
    while lead < len(infos) and infos[lead].codes is not None:
        lead += 1
    pieces = []
    j = lead + 1
    while j <= len(infos):
        info = infos[j - 1]
        if info.codes is None:
            pieces.append(info.distinct)
            info.distinct = None
            j += 1
            continue
        run = [j]  # consecutive categorical columns: one piece per record
        while run[-1] < len(infos) and infos[run[-1]].codes is not None:
            run.append(run[-1] + 1)
        got = _categorical_pieces([(infos[k - 1], cenc[k]) for k in run])
        if got is None:
            return None
        pieces.append(got)
        j = run[-1] + 1
    return pieces, lead, cenc, infos


def _categorical_pieces(cats: list[tuple[PropertyColumn, bytes]]) -> list[bytes] | None:
    """Per record, the values of consecutive categorical columns each with the constant
    after it, one bytes object per distinct combination."""
    if len(cats) == 1:
        info, cj = cats[0]
        table = [v.encode() + cj for v in info.distinct]
        return list(map(table.__getitem__, info.codes.tolist()))
    comb, span = 0, 1
    for info, _ in cats:
        span *= len(info.distinct)
        comb = comb * len(info.distinct) + info.codes
    if span >= 1 << 62:
        return None

    def piece(u: int) -> bytes:
        out = []
        for info, cj in reversed(cats):
            u, c = divmod(u, len(info.distinct))
            out.append(info.distinct[c].encode() + cj)
        return b"".join(reversed(out))

    return list(map(_Pieces(piece).__getitem__, comb.tolist()))


def _lead_pieces(tblocks: list[bytes], topic_codes, plens: np.ndarray, cenc0: bytes,
                 cats: list[tuple[PropertyColumn, bytes]], strip: int = 0) -> list[bytes] | None:
    """Per record: topic length + topic, properties length, the first constant and the
    leading categorical columns with their constants, the first ``strip`` bytes (the
    separator before the first pair, see :func:`_template`) dropped, one bytes object per
    distinct combination (a dict lookup per record). None if the combinations do not fit
    int64, or when a record's separator to drop is not in its lead piece."""
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
        lead = b"".join([cenc0, *reversed(tail)])
        if strip:
            if lead[:1] != _SEP_B:
                raise _NoLead  # the first present pair comes later: the generic way
            lead = lead[1:]
        return b"".join([tblocks[t], _PROPS_LEN.pack(pl), lead])

    try:
        return list(map(_Pieces(piece).__getitem__, comb.tolist()))
    except _NoLead:
        return None


class _NoLead(Exception):
    pass


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
        tpl = _template(batch.properties, trailing)
        if tpl is not None and n:
            consts, names, cols, optional = tpl
            enc = _encode_columns(consts, cols, n)
    if enc is not None:
        pieces, lead, cenc, infos = enc
        strip = len(_SEP_B) if batch.properties else 0
        plens = np.full(n, sum(map(len, cenc)) - strip, dtype=np.int64)
        for info in infos:
            plens += info.lens
        if int(plens.max()) > FAST_PROPS_MAX:
            return None
        cats = [(infos[j], cenc[j + 1]) for j in range(lead)]
        first = _lead_pieces(tblocks, topic_codes, plens, cenc[0], cats, strip)
        if first is not None:
            # an optional column's values hold its pair: dispatch reads the given column
            named = {k: info for k, info, opt in zip(names, infos, optional) if not opt}
            return [first] + pieces, plens, named, None
    if batch.properties_texts is not None:
        texts = list(batch.properties_texts)
        props_b = _encode_texts(texts)
    else:
        props_b = _encode_texts(_texts_generic(batch.properties, n, trailing))
    plens = np.fromiter(map(len, props_b), dtype=np.int64, count=n)
    if int(plens.max()) > FAST_PROPS_MAX:
        return None
    return [_lead_pieces(tblocks, topic_codes, plens, b"", []), props_b], plens, cols_info, texts
