"""The message JSON of many records as JSON Lines text, a block at a time: what ``rmqstore
dump --format jsonl`` prints, without a dict per message.

The definition is the per-record path: :func:`rmqstore.view.message_dicts` encoded by
:func:`rmqstore.json_lines.json_line`. With numba (``rmqstore/view_lines_jit``, switched
by :mod:`rmqstore.files.jit`) the lines of a block are written by one compiled loop from
the segment's bytes and small per-block tables (topics, hosts, offsetMsgId prefixes, the
month starts UNIQ_KEY times need); a record the kernel does not render exactly as the
definition does (a compressed body, a lossy properties text, text that is not UTF-8) is
rendered by the definition in its place. tests/test_dump_lines.py holds both paths to the
same text on every fixture store and on hostile records.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator, Mapping

import numpy as np

from .files import jit
from .format import layout as L
from .format.message import HEX_DIGITS, offset_msg_id_prefix
from .json_lines import JsonLines, json_line, json_text
from .uniqkey import SLACK_MS, month_starts
from .view import message_dicts

_NUMBERS = 19  # integers in a line: 11 in the header, 8 in uniqKeyInfo (4 of them the IPv4)
#: Records rendered by one call of the kernel (and lines in one block).
BLOCK = 8192
#: Below this many records a block takes the per-record path when the kernel is not
#: loaded yet: loading numba (~0.2 s) costs more than rendering a few thousand lines.
MIN_KERNEL = 2048

#: How often each path ran in this process ("kernel", "records": the per-record path,
#: "fallback": records the kernel left to it). Tests read it to prove which path ran.
used: Counter = Counter()

_kernel = None  # the loaded kernel module, or False when numba is missing
_MODES = {"base64": 0, "raw": 0, "hex": 1, "none": 2, "text": 3}  # view_lines_jit.B_*
# The property names the message JSON takes tags, keys and uniqKey from (Message.tags ...).
_NAMES = ("TAGS", "KEYS", "UNIQ_KEY")


def _load():
    global _kernel
    if jit.switched_off():
        return None
    if _kernel is None:
        _kernel = jit.load(__package__ + ".view_lines_jit") or False
    return _kernel or None


def kernel_ready() -> bool:
    """Is the compiled path on (numba imports, ``RMQSTORE_NO_JIT`` is not 1)? Loads it."""
    return _load() is not None


def _suffix(extra: Mapping[str, Any] | None) -> str:
    return "".join("," + json_text(k) + ":" + json_text(v) for k, v in (extra or {}).items())


def _per_record(cols, idx, body, charset, tz, extra) -> bytes:
    rows = message_dicts(cols, body, idx, charset=charset, tz=tz)
    if extra:
        rows = ({**d, **extra} for d in rows)
    return "".join(map(json_line, rows)).encode("utf-8")


def message_lines(cols, indices=None, body: str = "base64", *, charset: str = "utf-8",
                  tz=None, extra: Mapping[str, Any] | None = None,
                  jit_: bool | None = None) -> Iterator[JsonLines]:
    """The JSON Lines of records ``indices`` of a :class:`~rmqstore.scan.records.RecordColumns`
    (all when None), in order, in blocks of at most :data:`BLOCK`: each line is
    ``json_line(d)`` of :func:`~rmqstore.view.message_dicts`' ``d`` (with ``extra``'s
    members last). ``jit_``: None picks (the kernel for blocks of :data:`MIN_KERNEL` or
    more, or when it is loaded already), True takes the kernel whenever it is on, False
    never."""
    idx = np.arange(len(cols)) if indices is None else np.asarray(indices)
    mode = _MODES.get(body)
    utf8 = charset.replace("_", "-").lower() == "utf-8"
    tables = None
    for a in range(0, len(idx), BLOCK):
        block = idx[a:a + BLOCK]
        want = jit_ if jit_ is not None else (len(block) >= MIN_KERNEL or bool(_kernel))
        K = _load() if want and mode is not None and (utf8 or body != "text") else None
        if K is None:
            used["records"] += len(block)
            yield JsonLines(_per_record(cols, block, body, charset, tz, extra), len(block))
            continue
        if tables is None:
            tables = _Tables(K, cols, extra)
        yield _kernel_block(K, tables, block, body, mode, charset, tz, extra)


class _Tables:
    """What the kernel reads besides the records, for one set of columns: ``pool`` (byte
    strings back to back, ``at[k]:at[k + 1]``: the constant pieces, then topics, hosts and
    offsetMsgId prefixes as met) and the output buffer, kept from block to block (its
    pages are written once: no page faults per block)."""

    def __init__(self, K, cols, extra):
        self.cols = cols
        self.parts: list[bytes] = _pieces(K, extra)
        self.fixed = sum(map(len, self.parts))
        names, self.tids = cols.topic_table()
        self.topic = np.array([self.add(json_text(n).encode()) for n in names] or [0], np.int64)
        self.keys = {w: cols.host_keys(w) for w in ("born_host", "store_host")}
        self.hosts: dict = {}  # (which, key) -> (pool number of the text, of the prefix)
        self.out = np.empty(0, np.uint8)
        self._arrays = None

    def add(self, b: bytes) -> int:
        self.parts.append(b)
        self._arrays = None
        return len(self.parts) - 1

    def host(self, which: str, block: np.ndarray, prefix: bool) -> np.ndarray:
        """Pool numbers of each record's host text (or of its offsetMsgId prefix)."""
        keys = self.keys[which][block]
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        got = np.empty(len(uniq), np.int64)
        for k, (key, i) in enumerate(zip(uniq.tolist(), block[first].tolist())):
            nums = self.hosts.get((which, key))
            if nums is None:
                host = self.cols.host(which, i)
                nums = self.hosts[which, key] = (
                    self.add(json_text(str(host)).encode()),
                    self.add(offset_msg_id_prefix(host).encode("ascii")))
            got[k] = nums[prefix]
        return got[inverse.reshape(-1)]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            at = np.zeros(len(self.parts) + 1, np.int64)
            at[1:] = np.cumsum([len(p) for p in self.parts])
            self._arrays = np.frombuffer(b"".join(self.parts), np.uint8), at
        return self._arrays

    def buffer(self, size: int) -> np.ndarray:
        if len(self.out) < size:
            self.out = np.empty(size, np.uint8)
        return self.out


def _pieces(K, extra) -> list[bytes]:
    """The constant pieces, in K.PIECES order: keys and literals as the JSON text of the
    message JSON's own names and values."""
    key = lambda name, first=False: ("{" if first else ",") + json_text(name) + ":"
    text = {
        "open": key("commitLogOffset", True), "size": key("storeSize"), "magic": key("magic"),
        "v1": json_text("v1"), "v2": json_text("v2"), "crc": key("bodyCRC"),
        "qid": key("queueId"), "flag": key("flag"), "qoff": key("queueOffset"),
        "sysf": key("sysFlag"), "born_ts": key("bornTimestamp"), "born": key("bornHost"),
        "store_ts": key("storeTimestamp"), "store": key("storeHost"),
        "recon": key("reconsumeTimes"), "prep": key("preparedTransactionOffset"),
        "topic": key("topic"), "props": key("properties"), "tags": key("tags"),
        "keys": key("keys"), "uniq": key("uniqKey"), "msgid": key("offsetMsgId"),
        "body": key("body"),
        **{f"enc_{e}": key("bodyEncoding") + json_text(e) for e in ("base64", "hex", "text")},
        "crc_ok": key("crcOk"), "true": json_text(True), "false": json_text(False),
        "null": json_text(None),
        "info": key("uniqKeyInfo"), "ip": key("ip", True), "pid": key("pid"),
        "loader": key("classLoaderHash"), "time": key("time"), "counter": key("counter"),
        "extra": _suffix(extra), "name_tags": _NAMES[0], "name_keys": _NAMES[1],
        "name_uniq": _NAMES[2],
        "base64_alphabet": b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        "hex_lower": b"0123456789abcdef", "hex_upper": HEX_DIGITS.tobytes(),
    }
    return [v.encode() if isinstance(v, str) else v for v in map(text.__getitem__, K.PIECES)]


#: The record columns the kernel reads, by its column number's name.
_COLUMNS = (("C_PHYS", "physical_offset"), ("C_SIZE", "size"), ("C_CRC", "body_crc"),
            ("C_QID", "queue_id"), ("C_FLAG", "flag"), ("C_QOFF", "queue_offset"),
            ("C_SYSF", "sys_flag"), ("C_BORN_TS", "born_timestamp"),
            ("C_STORE_TS", "store_timestamp"), ("C_RECON", "reconsume_times"),
            ("C_PREP", "prepared_transaction_offset"), ("C_BODY_POS", "body_pos"),
            ("C_BODY_LEN", "body_len"), ("C_PROPS_POS", "props_pos"),
            ("C_PROPS_LEN", "props_len"))


def _kernel_block(K, t: _Tables, block, body, mode, charset, tz, extra) -> JsonLines:
    cols = t.cols
    n = len(block)
    recs = np.empty((n, K.NCOLS), np.int64)
    for c, name in _COLUMNS:
        recs[:, getattr(K, c)] = getattr(cols, name)[block]
    recs[:, K.C_V2] = cols.magic[block] == L.MAGIC_V2
    recs[:, K.C_BORN] = t.host("born_host", block, False)
    recs[:, K.C_STORE] = t.host("store_host", block, False)
    recs[:, K.C_PREFIX] = t.host("store_host", block, True)
    recs[:, K.C_TOPIC] = t.topic[t.tids[block]]
    recs[:, K.C_CRC_OK] = cols.crc_ok(block)
    starts, count = month_starts(recs[:, K.C_STORE_TS], tz)
    recs[:, K.C_M0:K.C_M0 + K.MONTHS] = starts
    recs[:, K.C_NMONTH] = count
    pool, at = t.arrays()
    # The part of a line that does not grow with its properties and body, at its longest:
    # every constant piece, four table entries (topic, hosts, prefix), the numbers (the
    # header's and uniqKeyInfo's) at their longest, and 128 for the rest (the offset's 16
    # hex digits, a 39-character IPv6 text, brackets, quotes, the newline).
    fixed = t.fixed + 4 * int(np.diff(at).max()) + _NUMBERS * len(str(-2**63)) + 128
    # The kernel's room() of every record, summed (room is linear in its arguments).
    out = t.buffer(n * K.room(fixed, 0, 0) + K.room(0, int(recs[:, K.C_PROPS_LEN].sum()),
                                                    int(recs[:, K.C_BODY_LEN].sum())) - K.room(0, 0, 0))
    ends = np.empty(n, np.int64)
    ok = np.empty(n, np.uint8)
    K.render(out, cols.u8, recs, pool, at, mode, L.SYSFLAG_COMPRESSED, SLACK_MS, fixed, ends, ok)
    used["kernel"] += n
    bad = np.flatnonzero(ok == 0)
    if not len(bad):
        return JsonLines(out[:int(ends[-1])].tobytes(), n)
    used["fallback"] += len(bad)
    parts = []
    was = 0
    for i in bad.tolist():
        start = int(ends[i])
        parts.append(out[was:start].tobytes())
        parts.append(_per_record(cols, block[i:i + 1], body, charset, tz, extra))
        was = start
    parts.append(out[was:int(ends[-1])].tobytes())
    return JsonLines(b"".join(parts), n)


__all__ = ["BLOCK", "MIN_KERNEL", "kernel_ready", "message_lines", "used"]
