"""What kind and version of store the files show (design-14 §8): :class:`StoreProfile`
from :func:`profile` (a store root) or :func:`profile_segment` (a loose CommitLog
file), cheap enough for every command: listings, a few tiny files, one record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..format.crc import ends_in_prop_crc
from .dledger_files import find_ledger_dirs
from .storekind_detect import (first_record_props, mentions, names_in, newest_first_record,
                               nonempty, shown)

#: Record-level features a profile can name, in the order ``features`` lists them.
RECORD_FEATURES = ("batch-cq", "lmq", "prop-crc", "v2-magic")


@dataclass
class StoreProfile:
    """What the files say the store is (design-14 §8): ``log`` (plain, dledger,
    dledger-mixed, or segment for a loose CommitLog file), ``family`` (4.9, 5 or unknown:
    whose on-disk conventions it follows), ``features`` it uses (batch-cq, lmq, prop-crc,
    v2-magic) and the ``evidence`` for each conclusion, one line per fact.

    :func:`profile` looks only at listings, tiny files and the newest segment's first
    record; :meth:`add_records` adds what a pass over every record counted (``stats``)."""

    log: str
    family: str = "unknown"
    features: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    five: list[str] = field(default_factory=list)  # evidence only 5.x writes
    trailing: bool | None = None  # newest properties text ends in 0x02 (None: no text seen)
    dledger: dict | None = None

    def _feature(self, key: str, why: str) -> None:
        if key not in self.features:
            self.features.append(key)
            self.features.sort(key=RECORD_FEATURES.index)
        self.evidence.append(why)

    def _decide(self) -> None:
        """Family 5 on any 5-only evidence (an upgraded store is 5); else 4.9 when the
        newest properties text lacks the trailing 0x02 (4.9.1 to 5.1); else unknown."""
        if self.five:
            self.family = "5"
        elif self.trailing is False:
            self.family = "4.9"
        else:
            self.family = "unknown"

    def add_records(self, counts: Mapping[str, int]) -> "StoreProfile":
        """Fold in counts from a pass over every record: ``records``, ``v2`` (magic v2),
        ``propCrc`` (ends in a ``__CRC32#`` entry), ``innerBatch`` (sysFlag 0x40|0x80)."""
        n = counts.get("records", 0)
        if counts.get("v2"):
            why = f"{counts['v2']} of {n} records have magic v2 (RocketMQ 5.1+)"
            self._feature("v2-magic", why)
            self.five.append(why)
        if counts.get("propCrc") and "prop-crc" not in self.features:
            why = f"{counts['propCrc']} of {n} records end in a __CRC32# property (5.2+)"
            self._feature("prop-crc", why)
            self.five.append(why)
        if counts.get("innerBatch") and "batch-cq" not in self.features:
            why = f"{counts['innerBatch']} of {n} records are inner batches (sysFlag 0x40|0x80)"
            self._feature("batch-cq", why)
            self.five.append(why)
        self._decide()
        return self

    def as_dict(self) -> dict:
        out = {"log": self.log, "family": self.family, "features": list(self.features),
               "evidence": list(self.evidence)}
        if self.dledger is not None:
            out["dledger"] = dict(self.dledger)
        return out


def _numbered(d: Path) -> list[Path]:
    from .listing import offset_name

    found = [(offset_name(e.name), e.path) for e in _entries_of(d) if e.kind == "file"]
    return [p for o, p in sorted((o, p) for o, p in found if o is not None)]


def _entries_of(d: Path):
    from .listing import entries

    try:
        return entries(d) if d.is_dir() else []
    except OSError:
        return []


def profile(root: str | os.PathLike, commit_log_dirs=None) -> StoreProfile:
    """The store kind and version the files at ``root`` show (design-14 §8); cheap enough
    for every command: listings, a few tiny files, one record. Never raises for contents."""
    from ..format.dledger_layout import DLEDGER_BODY_OFFSET
    from .checkpoint import read_checkpoint

    root = Path(root)
    dirs = [Path(d) for d in (commit_log_dirs or [root / "commitlog"])]
    segments = [p for d in dirs for p in _numbered(d)]
    ledgers = find_ledger_dirs(root)
    data = [p for d in ledgers for p in _numbered(d / "data")]
    if ledgers and segments:
        prof = StoreProfile("dledger-mixed")
        prof.evidence.append(f"{shown(ledgers[0].name)}/data/ beside commitlog/ segments")
    elif ledgers:
        prof = StoreProfile("dledger")
        prof.evidence.append(f"{shown(ledgers[0].name)}/data/ holds {len(data)} DLedger "
                             "data file(s)")
    else:
        prof = StoreProfile("plain")
    if ledgers:
        prof.dledger = {"selfId": ledgers[0].name[len("dledger-"):],
                        "folders": [shown(d.name) for d in ledgers], "dataFiles": len(data)}
    # 5-only files (R5 MixAll#string2File, CompactionPositionMgr, StoreCheckpoint#flush)
    five = []
    if (root / "abort.bak").exists():
        five.append("abort.bak exists (5.x writes it when it creates abort)")
    try:
        text = (root / "abort").read_bytes()[:32] if nonempty(root / "abort") else b""
    except OSError:
        text = b""
    if text.isdigit():
        five.append(f"abort holds a PID ({text.decode()}): a 5.x broker did not shut down")
    if (root / "compaction" / "position-checkpoint").exists():
        five.append("compaction/position-checkpoint exists")
    if nonempty(root / "checkpoint"):
        try:
            cp = read_checkpoint(root)
            if cp.master_flushed_offset or cp.confirm_phy_offset:
                five.append("the checkpoint's 5.x fields (masterFlushedOffset, confirmPhyOffset) "
                            "are set")
        except Exception:  # noqa: BLE001 - verify reports an unreadable checkpoint
            pass
    bcq = names_in(root / "batchconsumequeue")
    if bcq:
        why = f"batchconsumequeue/{shown(bcq[0])} exists"
        prof._feature("batch-cq", why)
        five.append(why)
    elif mentions(root / "config" / "topics.json", '"BatchCQ"'):
        why = "config/topics.json has queue.type=BatchCQ"
        prof._feature("batch-cq", why)
        five.append(why)
    elif mentions(root / "config" / "topics.json", '"attributes"'):
        five.append("config/topics.json has topic attributes (5.x)")
    lmq = [n for n in names_in(root / "consumequeue") if n.startswith("%LMQ%")]
    if lmq:
        prof._feature("lmq", f"consumequeue/{shown(lmq[0])} exists (LMQ dispatch)")
    for why in five:
        if why not in prof.evidence:
            prof.evidence.append(why)
    prof.five += five
    newest = newest_first_record(data, DLEDGER_BODY_OFFSET) if data else None
    if newest is None and segments:
        newest = newest_first_record(segments, 0)
    if newest is not None:
        path, props, buf = newest
        try:
            where = shown(path.relative_to(root).as_posix())
        except ValueError:  # a storePathCommitLog elsewhere
            where = shown(str(path))
        if ends_in_prop_crc(buf):
            why = f"{where}: the first record ends in a __CRC32# property (5.2+)"
            prof._feature("prop-crc", why)
            prof.five.append(why)
        if props:
            prof.trailing = props.endswith("\x02")
            prof.evidence.append(
                f"{where}: the first record's properties " + (
                    "keep the trailing 0x02 (<=4.9.0 or >=5.2)" if prof.trailing
                    else "have no trailing 0x02 (4.9.1 to 5.1)"))
    prof._decide()
    return prof


def profile_segment(path: str | os.PathLike) -> StoreProfile:
    """The profile of a loose CommitLog segment file: only its first record speaks."""
    p = Path(path)
    prof = StoreProfile("segment")
    got = first_record_props(p, 0)
    if got is not None and got[0]:
        prof.trailing = got[0].endswith("\x02")
        prof.evidence.append("properties keep the trailing 0x02 (<=4.9.0 or >=5.2)" if prof.trailing
                             else "properties have no trailing 0x02 (4.9.1 to 5.1)")
        if ends_in_prop_crc(got[1]):
            prof._feature("prop-crc", "the first record ends in a __CRC32# property (5.2+)")
            prof.five.append("prop-crc")
    prof._decide()
    return prof


__all__ = ["RECORD_FEATURES", "StoreProfile", "profile", "profile_segment"]
