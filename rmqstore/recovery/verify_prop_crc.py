"""The property CRC of every record (spec §3.8), for stores written with
``enabledAppendPropCRC``: the ``__CRC32#`` entry a record ends with must match the CRC of
the record before it. RocketMQ checks it on recovery only with ``forceVerifyPropCRC``, and
then a mismatch (or a record without the entry) ends the log there, like a bad BODYCRC."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..files.segments import SegmentQueue
from ..format.crc import prop_crc_checks, prop_crc_tails
from ..scan.dispatch import StoreScan
from .findings import ERROR, Collector

_LISTED = 100  # findings per code; the rest are counted in the last one


def uses_prop_crc(cfg) -> bool:
    """Whether the store's records carry the property CRC: the configuration says it is
    written or forced, or the files show it (decided once per store, so 4.x stores pay
    nothing)."""
    return bool(cfg.enabled_append_prop_crc or cfg.force_verify_prop_crc or any(
        d.feature.key == "prop-crc" for d in cfg.features))


def check_prop_crc(c: Collector, queue: SegmentQueue, scan: StoreScan, *, forced: bool) -> int:
    """Findings for records whose ``__CRC32#`` does not match (and, when ``forced``, records
    without one); returns how many records carry the entry."""
    carried = 0
    bad: list[tuple[str, object, int]] = []
    for part, kept in zip(scan.parts, scan.kept):
        if not kept:
            continue
        off = part.offset[:kept]
        seg, _ = queue.find(int(off[0]))
        u8 = np.frombuffer(seg.buffer(), dtype=np.uint8)
        starts = off - seg.start
        ends = starts + part.size[:kept]
        has = prop_crc_tails(u8, ends)
        carried += int(has.sum())
        ok = prop_crc_checks(u8, starts[has], ends[has])
        bad += [("prop-crc-mismatch", seg, int(o)) for o in off[has][~ok]]
        if forced:
            bad += [("prop-crc-missing", seg, int(o)) for o in off[~has]]
    total = Counter(code for code, _, _ in bad)
    shown: Counter = Counter()
    for code, seg, o in bad:
        shown[code] += 1
        if shown[code] > _LISTED:
            continue
        more = total[code] - _LISTED if shown[code] == _LISTED else 0
        tail = f" ({more} more like it)" if more > 0 else ""
        if code == "prop-crc-mismatch":
            why = (f"record at CommitLog offset {o}: its __CRC32# property does not match the "
                   "record" + ("; with forceVerifyPropCRC the broker's recovery cuts the log here"
                               if forced else " (checked by the broker only with forceVerifyPropCRC)"))
        else:
            why = (f"record at CommitLog offset {o} has no __CRC32# property; with "
                   "forceVerifyPropCRC the broker's recovery cuts the log here")
        c.add(code, seg.path, o - seg.start, why + tail, commitLogOffset=o,
              severity=ERROR if forced else None)
    return carried
