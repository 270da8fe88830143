"""Store layouts and broker features rmqstore does not handle (yet), found in one place.

A store that uses one of them must never be reported as empty or healthy (issue 11). Each
:class:`Feature` says how far rmqstore goes with it:

* ``unsupported``: every command refuses the store (exit 2), naming the feature. A DLedger
  CommitLog, for one, has no ``commitlog/`` at all, so a plain reader would see 0 messages.
* ``partial``: reads work and warn about what they do not cover; the writing commands in
  ``refuses`` refuse, because they would leave the feature's files inconsistent.
* ``supported``: nothing to say (issue 14 moves features here as it implements them).

Evidence comes from the files (spec §1.1) and from broker.conf keys (spec §1.2).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError, UnsupportedStoreError
from .listing import open_regular

UNSUPPORTED, PARTIAL, SUPPORTED = "unsupported", "partial", "supported"

#: The writing operations a feature can refuse.
WRITES = ("repair", "rebuild --consumequeue", "rebuild --index", "append")
_CQ_WRITES = ("repair", "rebuild --consumequeue", "append")


@dataclass(frozen=True)
class Feature:
    key: str
    what: str  # "a DLedger CommitLog"
    status: str
    refuses: tuple[str, ...] = ()  # for partial features
    missed: str = ""  # what reads do not cover, for the warning


FEATURES = {f.key: f for f in (
    Feature("dledger", "a DLedger CommitLog", UNSUPPORTED),
    Feature("rocksdb-cq", "a RocksDB consume queue", UNSUPPORTED),
    Feature("store-plugin", "a message store plug-in (tiered storage)", UNSUPPORTED),
    Feature("batch-cq", "BatchConsumeQueue topics", PARTIAL,
            _CQ_WRITES, "batchconsumequeue/ is not read or checked; its records get no ConsumeQueue "
            "unit, so verify reports them as missing"),
    Feature("lmq", "LMQ multi-dispatch queues", PARTIAL,
            _CQ_WRITES, "units of consumequeue/%LMQ%* point at records of other topics, so verify "
            "reports them as mismatches"),
    Feature("cq-ext", "ConsumeQueue extensions", PARTIAL,
            _CQ_WRITES, "consumequeue_ext/ is not read; units that point into it carry an ext "
            "address as tagsCode"),
    Feature("prop-crc", "full-record CRCs (enabledAppendPropCRC)", PARTIAL,
            ("append",), "the __CRC32# property CRC is not checked"),
    Feature("timer", "the timer-message store", PARTIAL,
            ("repair",), "timerlog/ and timerwheel are not read or checked"),
    Feature("compaction", "compacted topics", PARTIAL,
            ("repair",), "compaction/ is not read or checked"),
)}


@dataclass(frozen=True)
class Detected:
    """A feature in use, with the evidence: a file of the store or a broker.conf key."""

    feature: Feature
    evidence: str

    @property
    def message(self) -> str:
        f = self.feature
        if f.status == UNSUPPORTED:
            return (f"the store uses {f.what} ({self.evidence}), which rmqstore cannot read or "
                    "change yet; nothing was read")
        return (f"the store uses {f.what} ({self.evidence}), which rmqstore does not understand "
                f"yet: {f.missed}; {_join(f.refuses)} " + ("refuses" if len(f.refuses) == 1 else "refuse"))


def _join(ops) -> str:
    ops = list(ops)
    return ops[0] if len(ops) == 1 else ", ".join(ops[:-1]) + " and " + ops[-1]


def _true(props: Mapping[str, str], key: str) -> bool:
    return props.get(key, "").strip().lower() == "true"


def _entries(d: Path) -> list[str]:
    try:
        return sorted(os.listdir(d)) if d.is_dir() else []
    except OSError:
        return []


_ROCKSDB_FILE = re.compile(r"^(CURRENT|IDENTITY|MANIFEST-\d+|OPTIONS-\d+|\d+\.sst)$")
DLEDGER_DIR = re.compile(r"^dledger-.+$")


def dledger_dirs(root: Path) -> list[Path]:
    """``dledger-{selfId}`` directories of a store root holding DLedger's ``data/`` or
    ``index/`` (its default paths, fixtures README "DLedger on-disk layout")."""
    return [root / n for n in _entries(root) if DLEDGER_DIR.match(n)
            and ((root / n / "data").is_dir() or (root / n / "index").is_dir())]


def detect(root: Path | None, props: Mapping[str, str]) -> list[Detected]:
    """Every feature of :data:`FEATURES` the store at ``root`` or the broker.conf keys
    ``props`` show, unsupported ones first (records are looked at by
    :func:`detect_in_records`, once the CommitLog is found)."""
    found: list[Detected] = []

    def add(key: str, evidence: str) -> None:
        if not any(d.feature.key == key for d in found):
            found.append(Detected(FEATURES[key], evidence))

    # broker.conf keys (spec §1.2)
    if _true(props, "enableDLegerCommitLog"):
        add("dledger", "broker.conf enableDLegerCommitLog=true")
    if props.get("storePathDLedgerCommitLog", "").strip():
        add("dledger", "broker.conf storePathDLedgerCommitLog")
    store_type = props.get("storeType", "").strip()
    if store_type and store_type != "default":
        add("rocksdb-cq", f"broker.conf storeType={_shown(store_type)}")
    plugin = props.get("messageStorePlugIn", "").strip()
    if plugin:
        add("store-plugin", f"broker.conf messageStorePlugIn={_shown(plugin)}")
    for key in ("tieredBackendServiceProvider", "tieredStoreFilePath"):
        if props.get(key, "").strip():
            add("store-plugin", f"broker.conf {key}")
    for key in ("enableLmq", "enableMultiDispatch"):
        if _true(props, key):
            add("lmq", f"broker.conf {key}=true")
    if _true(props, "enableConsumeQueueExt"):
        add("cq-ext", "broker.conf enableConsumeQueueExt=true")
    if _true(props, "enabledAppendPropCRC"):
        add("prop-crc", "broker.conf enabledAppendPropCRC=true")
    if root is not None:
        _detect_files(Path(root), add)
    found.sort(key=lambda d: d.feature.status != UNSUPPORTED)
    return found


def _shown(name: str) -> str:
    """A name from disk or a setting, safe to print on a terminal (bytes are data)."""
    return name if name.isprintable() else ascii(name)


def _detect_files(root: Path, add) -> None:
    for d in dledger_dirs(root):
        add("dledger", f"{d.name}/")
    cq = root / "consumequeue"
    names = _entries(cq)
    rocks = [n for n in names if _ROCKSDB_FILE.match(n) and (cq / n).is_file()]
    if rocks:
        add("rocksdb-cq", f"consumequeue/{_shown(rocks[0])}")
    bcq = _entries(root / "batchconsumequeue")
    if bcq:
        add("batch-cq", f"batchconsumequeue/{_shown(bcq[0])}")
    elif _mentions(root / "config" / "topics.json", '"BatchCQ"'):
        add("batch-cq", "config/topics.json queue.type=BatchCQ")
    lmq = [n for n in names if n.startswith("%LMQ%")]
    if lmq:
        add("lmq", f"consumequeue/{_shown(lmq[0])}")
    ext = _entries(root / "consumequeue_ext")
    if ext:
        add("cq-ext", f"consumequeue_ext/{_shown(ext[0])}")
    timer = [n for n in _entries(root / "timerlog") if _nonempty(root / "timerlog" / n)]
    if timer:
        add("timer", f"timerlog/{_shown(timer[0])}")
    clog = _entries(root / "compaction" / "compactionLog")
    if clog:
        add("compaction", f"compaction/compactionLog/{_shown(clog[0])}")


def _nonempty(p: Path) -> bool:
    try:
        return p.is_file() and p.stat().st_size > 0
    except OSError:
        return False


def _mentions(p: Path, text: str, limit: int = 8 << 20) -> bool:
    """Whether a (not huge: it is read on every command) text file contains ``text``."""
    try:
        if not p.is_file() or p.stat().st_size > limit:
            return False
        return text in p.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def detect_in_records(found: list[Detected], commit_log_dirs) -> list[Detected]:
    """``found`` plus what the newest CommitLog record shows (full-record CRCs)."""
    crc = _prop_crc_record(commit_log_dirs)
    if crc and not any(d.feature.key == "prop-crc" for d in found):
        return found + [Detected(FEATURES["prop-crc"], crc)]
    return found


def _prop_crc_record(dirs) -> str | None:
    """The first record of the newest CommitLog segment that holds one, if its properties
    carry ``__CRC32#`` (spec §3.8): records written with enabledAppendPropCRC."""
    from ..format.record import decode_record
    from .config import SEGMENT_NAME

    segs = sorted((int(p.name), p) for d in dirs if Path(d).is_dir() for p in Path(d).iterdir()
                  if SEGMENT_NAME.match(p.name))
    for _, p in reversed(segs):
        try:
            with open_regular(p) as f:
                head = f.read(8)
                if len(head) < 8 or head[:4] == bytes(4):
                    continue
                size = int.from_bytes(head[:4], "big", signed=True)
                if not 0 < size <= 64 << 20:
                    return None
                buf = head + f.read(size - 8)
            msg = decode_record(buf, 0)
        except Exception:  # noqa: BLE001 - unreadable or not a record: no evidence
            return None
        if "__CRC32#" in (msg.properties_text or ""):
            return f"{p.parent.name}/{p.name}: records carry __CRC32#"
        return None
    return None


def refuse_unsupported(found: list[Detected], root) -> None:
    """Raise :class:`UnsupportedStoreError` for the first unsupported feature."""
    for d in found:
        if d.feature.status == UNSUPPORTED:
            raise UnsupportedStoreError(d.message, root)


def require_writable(cfg, operation: str) -> None:
    """Refuse ``operation`` (one of :data:`WRITES`) on the store ``cfg`` describes when a
    feature would be left inconsistent, when the CommitLog may be incomplete, or when
    geometry it needs is a guess rather than what the files say."""
    assert operation in WRITES, operation
    root = cfg.root
    for d in cfg.features:
        if d.feature.status == UNSUPPORTED or (d.feature.status == PARTIAL
                                               and operation in d.feature.refuses):
            raise UnsupportedStoreError(
                f"{operation} refused: the store uses {d.feature.what} ({d.evidence}), which "
                f"rmqstore cannot keep consistent yet (nothing was changed)", root)
    for why in cfg.write_blockers:
        raise ConfigError(f"{operation} refused: {why} (nothing was changed)", root)
    needs = {"repair": GEOMETRY_ALL, "append": GEOMETRY_ALL,
             "rebuild --consumequeue": ("mapped_file_size_commit_log", "mapped_file_size_consume_queue"),
             "rebuild --index": ("mapped_file_size_commit_log", "max_hash_slot_num", "max_index_num"),
             }[operation]
    for name in needs:
        if name in cfg.undetermined:
            raise ConfigError(f"{operation} refused: {cfg.undetermined[name]}; pass --config "
                              "with the broker.conf the store was written with (nothing was "
                              "changed)", root)


GEOMETRY_ALL = ("mapped_file_size_commit_log", "mapped_file_size_consume_queue",
                "max_hash_slot_num", "max_index_num")

__all__ = ["FEATURES", "Feature", "Detected", "detect", "detect_in_records", "refuse_unsupported",
           "require_writable", "dledger_dirs", "UNSUPPORTED", "PARTIAL", "SUPPORTED", "WRITES"]
