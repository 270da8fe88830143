"""Byte offsets, widths and masks are written once, in ``rmqstore/format/`` (issue #13).

Hand-written copies of the format's numbers drift apart silently: a ``& 0xC`` here, a
``* 20`` there, a ``">i"`` struct or ``buf[pos + 36:pos + 40]`` that restates where a
field sits. Outside ``rmqstore/format/`` code names them (``layout.CQ_UNIT_SIZE``,
``rules.gets_cq_unit``, ``crc.BODY_CRC_MASK``, the structs and offsets ``layout`` derives).
:data:`ALLOWED` lists the copies that remain; it may only shrink: a new copy fails the
first test, and a copy removed without taking it off the list fails the second.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PATTERNS = {
    "transaction mask": re.compile(r"&\s*0xC\b"),
    "31-bit mask": re.compile(r"0x7FFFFFFF"),
    "20-byte width": re.compile(r"(?<!\*)\*\s*20\b|\b20\s*\*(?!\*)"),
    "big-endian struct": re.compile(r"""["'][>!][bhilqBHILQ?]+["']"""),
    "numeric buffer slice": re.compile(r"\[\s*\w+\s*\+\s*\d+\s*:\s*\w+\s*\+\s*\d+\s*\]"),
    # offsetMsgId text (spec §5.1) is spelled by format.message alone: uppercase hex of
    # packed bytes, a 16-digit offset, an id cut back to its host prefix, a digit table.
    "uppercase hex id": re.compile(r"\.hex\(\)\.upper\(\)|:0?16X\b|\[:-16\]|0123456789ABCDEF"),
}

#: (file, pattern) -> how many copies remain, with why. Only shrinks.
ALLOWED: dict[tuple[str, str], int] = {}


def scan(root: Path = REPO) -> Counter:
    out: Counter = Counter()
    for base in ("rmqstore", "cli"):
        for p in sorted((root / base).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if rel.startswith("rmqstore/format/"):
                continue
            text = p.read_text(encoding="utf-8")
            for name, pat in PATTERNS.items():
                n = len(pat.findall(text))
                if n:
                    out[(rel, name)] += n
    return out


def test_no_new_hand_written_format_numbers():
    found = scan()
    new = {k: v for k, v in found.items() if v > ALLOWED.get(k, 0)}
    assert not new, ("format numbers written by hand outside rmqstore/format/ (name them "
                     f"from layout, rules or crc instead): {new}")


def test_the_allow_list_only_shrinks():
    found = scan()
    stale = {k: (v, found.get(k, 0)) for k, v in ALLOWED.items() if found.get(k, 0) < v}
    assert not stale, f"copies gone: lower ALLOWED to what remains (allowed, found): {stale}"


def test_the_patterns_see_what_they_are_for(tmp_path):
    pkg = tmp_path / "rmqstore"
    (pkg / "format").mkdir(parents=True)
    (tmp_path / "cli").mkdir()
    (pkg / "x.py").write_text(
        "a = sys_flag & 0xC\nb = crc & 0x7FFFFFFF\nc = queue_offset * 20\nd = 20 * n\n"
        "e = struct.Struct('>i')\nf = buf[pos + 36:pos + 40]\ng = 2**20\nh = 1 << 20\n"
        "i = raw.hex().upper()\nj = f'{p}{o:016X}'\nk = mid[:-16]\nl = b'0123456789ABCDEF'\n"
        "m = raw.hex()\n")
    (pkg / "format" / "layout.py").write_text("a = x & 0xC\n")
    found = scan(tmp_path)
    assert found == Counter({("rmqstore/x.py", "transaction mask"): 1,
                             ("rmqstore/x.py", "31-bit mask"): 1,
                             ("rmqstore/x.py", "20-byte width"): 2,
                             ("rmqstore/x.py", "big-endian struct"): 1,
                             ("rmqstore/x.py", "numeric buffer slice"): 1,
                             ("rmqstore/x.py", "uppercase hex id"): 4})
