"""Store layouts and broker features rmqstore does not handle (yet), found in one place.

A store that uses one of them must never be reported as empty or healthy (issue 11). Each
:class:`Feature` says how far rmqstore goes with it:

* ``unsupported``: every command refuses the store (exit 2), naming the feature.
* ``partial``: reads work and warn about what they do not cover (or, when they cover it
  all, note it); the commands in ``refuses`` refuse, because they would leave the feature's
  files inconsistent or would not check it. A DLedger CommitLog, for one, is read through
  :class:`~rmqstore.files.dledger.DLedgerCommitLog`; verify and the writers refuse it.
* ``supported``: nothing to say (issue 14 moves features here as it implements them).

Evidence comes from the files (spec §1.1) and from broker.conf keys (spec §1.2).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError, UnsupportedStoreError
from ..format.crc import ends_in_prop_crc
from .dledger_files import find_ledger_dirs
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
    reads_complete: bool = False  # reads cover it fully: a note, not a warning

    @property
    def verified(self) -> bool:
        """verify checks it fully (no ``store-feature`` warning)."""
        return self.status == SUPPORTED or (self.reads_complete and "verify" not in self.refuses)

    @property
    def supported_text(self) -> str:
        """What works on it, for the note: "reads are", "reads, verify and rebuild are"."""
        ops = ["reads"] + (["verify"] if self.verified else []) + (
            ["rebuild"] if self.reads_complete and not {"rebuild --consumequeue",
                                                        "rebuild --index"} & set(self.refuses) else []) + (
            ["repair"] if self.reads_complete and "repair" not in self.refuses else [])
        return (_join(ops) + (" are" if len(ops) > 1 or ops == ["reads"] else " is"))


FEATURES = {f.key: f for f in (
    # Reads (dump, get, query-key, stats), verify, rebuild and repair are supported
    # (design-14 WP C, D1, G: repair never writes dledger-*/); append refuses (entries
    # need the Raft group's term and index, D3).
    Feature("dledger", "a DLedger CommitLog", PARTIAL, ("append",), reads_complete=True),
    Feature("rocksdb-cq", "a RocksDB consume queue", UNSUPPORTED),
    Feature("store-plugin", "a message store plug-in (tiered storage)", UNSUPPORTED),
    # Read, verified and rebuilt (design-14 WP E, D2); append writes BCQ and LMQ units
    # (WP F: engine/load.queue_kinds, Dispatcher.configure_5x); repair refuses until WP G.
    # The Spark jobs (WP D1) neither unwrap inner batches nor know BCQ/LMQ units: refused.
    Feature("batch-cq", "BatchConsumeQueue topics", PARTIAL, ("repair", "spark"),
            reads_complete=True),
    Feature("lmq", "LMQ multi-dispatch queues", PARTIAL, ("repair", "spark"),
            reads_complete=True),
    Feature("cq-ext", "ConsumeQueue extensions", PARTIAL,
            _CQ_WRITES, "consumequeue_ext/ is not read; units that point into it carry an ext "
            "address as tagsCode"),
    # verify checks every record's __CRC32# (recovery/verify_prop_crc); append writes it
    # (engine/prepare, CommitLogAppender._encode); repair keeps it matching.
    Feature("prop-crc", "full-record CRCs (enabledAppendPropCRC)", SUPPORTED,
            reads_complete=True),
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
        if f.status == SUPPORTED:
            return f"the store uses {f.what} ({self.evidence}): supported"
        if f.reads_complete:
            return (f"the store uses {f.what} ({self.evidence}): {f.supported_text} supported; "
                    f"{_join(f.refuses)} " + ("refuses" if len(f.refuses) == 1 else "refuse")
                    + " (not supported yet)")
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
    for d in find_ledger_dirs(root):
        add("dledger", f"{_shown(d.name)}/")
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
    from .config import SEGMENT_NAME

    segs = [p for _, p in sorted((int(p.name), p) for d in dirs if Path(d).is_dir()
                                 for p in Path(d).iterdir() if SEGMENT_NAME.match(p.name))]
    got = _newest_first_record(segs, 0)
    if got is not None and ends_in_prop_crc(got[2]):
        p = got[0]
        return f"{p.parent.name}/{p.name}: records carry __CRC32#"
    return None


def refuse_unsupported(found: list[Detected], root) -> None:
    """Raise :class:`UnsupportedStoreError` for the first unsupported feature."""
    for d in found:
        if d.feature.status == UNSUPPORTED:
            raise UnsupportedStoreError(d.message, root)


def refuse_operation(cfg, operation: str) -> None:
    """Refuse ``operation`` (``verify``, ``spark`` or one of :data:`WRITES`) when a feature of the store
    at ``cfg`` is unsupported or refuses it: one line naming the feature, nothing changed."""
    root = cfg.root
    for d in cfg.features:
        f = d.feature
        if f.status == UNSUPPORTED or (f.status == PARTIAL and operation in f.refuses):
            if f.reads_complete:
                raise UnsupportedStoreError(
                    f"{operation} refused: the store uses {f.what} ({d.evidence}); rmqstore "
                    f"reads it (dump, get, query-key, stats; {f.supported_text} supported), "
                    f"{operation} is not supported "
                    "on it yet (nothing was changed)", root)
            raise UnsupportedStoreError(
                f"{operation} refused: the store uses {f.what} ({d.evidence}), which "
                f"rmqstore cannot keep consistent yet (nothing was changed)", root)


def require_writable(cfg, operation: str) -> None:
    """Refuse ``operation`` (one of :data:`WRITES`) on the store ``cfg`` describes when a
    feature would be left inconsistent, when the CommitLog may be incomplete, or when
    geometry it needs is a guess rather than what the files say."""
    assert operation in WRITES, operation
    root = cfg.root
    refuse_operation(cfg, operation)
    for why in cfg.write_blockers + (cfg.append_blockers if operation == "append" else []):
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

# --- the store's kind and version, from the files (design-14 §8) -----------------------------

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


def _first_record_props(path: Path, at: int) -> tuple[str, bytes] | None:
    """(properties text, record tail) of the record at ``at`` in a data file, or None when
    there is none there (zeros, a blank) or it does not decode: no evidence."""
    from ..format.record import decode_record

    try:
        with open_regular(path) as f:
            f.seek(at)
            head = f.read(8)
            if len(head) < 8 or head[:4] == bytes(4):
                return None
            size = int.from_bytes(head[:4], "big", signed=True)
            if not 0 < size <= 64 << 20:
                return None
            buf = head + f.read(size - 8)
        msg = decode_record(buf, 0)
    except Exception:  # noqa: BLE001 - unreadable or not a record: no evidence
        return None
    return msg.properties_text or "", buf


def _newest_first_record(files: list[Path], at: int) -> tuple[Path, str, bytes] | None:
    """The first record of the newest data file holding one (``at``: 0 for CommitLog
    segments, 48 for DLedger entries, whose record follows the entry header)."""
    for p in reversed(files):
        got = _first_record_props(p, at)
        if got is not None:
            return (p, *got)
    return None


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
        prof.evidence.append(f"{_shown(ledgers[0].name)}/data/ beside commitlog/ segments")
    elif ledgers:
        prof = StoreProfile("dledger")
        prof.evidence.append(f"{_shown(ledgers[0].name)}/data/ holds {len(data)} DLedger "
                             "data file(s)")
    else:
        prof = StoreProfile("plain")
    if ledgers:
        prof.dledger = {"selfId": ledgers[0].name[len("dledger-"):],
                        "folders": [_shown(d.name) for d in ledgers], "dataFiles": len(data)}
    # 5-only files (R5 MixAll#string2File, CompactionPositionMgr, StoreCheckpoint#flush)
    five = []
    if (root / "abort.bak").exists():
        five.append("abort.bak exists (5.x writes it when it creates abort)")
    try:
        text = (root / "abort").read_bytes()[:32] if _nonempty(root / "abort") else b""
    except OSError:
        text = b""
    if text.isdigit():
        five.append(f"abort holds a PID ({text.decode()}): a 5.x broker did not shut down")
    if (root / "compaction" / "position-checkpoint").exists():
        five.append("compaction/position-checkpoint exists")
    if _nonempty(root / "checkpoint"):
        try:
            cp = read_checkpoint(root)
            if cp.master_flushed_offset or cp.confirm_phy_offset:
                five.append("the checkpoint's 5.x fields (masterFlushedOffset, confirmPhyOffset) "
                            "are set")
        except Exception:  # noqa: BLE001 - verify reports an unreadable checkpoint
            pass
    bcq = _entries(root / "batchconsumequeue")
    if bcq:
        why = f"batchconsumequeue/{_shown(bcq[0])} exists"
        prof._feature("batch-cq", why)
        five.append(why)
    elif _mentions(root / "config" / "topics.json", '"BatchCQ"'):
        why = "config/topics.json has queue.type=BatchCQ"
        prof._feature("batch-cq", why)
        five.append(why)
    elif _mentions(root / "config" / "topics.json", '"attributes"'):
        five.append("config/topics.json has topic attributes (5.x)")
    lmq = [n for n in _entries(root / "consumequeue") if n.startswith("%LMQ%")]
    if lmq:
        prof._feature("lmq", f"consumequeue/{_shown(lmq[0])} exists (LMQ dispatch)")
    for why in five:
        if why not in prof.evidence:
            prof.evidence.append(why)
    prof.five += five
    newest = _newest_first_record(data, DLEDGER_BODY_OFFSET) if data else None
    if newest is None and segments:
        newest = _newest_first_record(segments, 0)
    if newest is not None:
        path, props, buf = newest
        try:
            where = _shown(path.relative_to(root).as_posix())
        except ValueError:  # a storePathCommitLog elsewhere
            where = _shown(str(path))
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
    got = _first_record_props(p, 0)
    if got is not None and got[0]:
        prof.trailing = got[0].endswith("\x02")
        prof.evidence.append("properties keep the trailing 0x02 (<=4.9.0 or >=5.2)" if prof.trailing
                             else "properties have no trailing 0x02 (4.9.1 to 5.1)")
        if ends_in_prop_crc(got[1]):
            prof._feature("prop-crc", "the first record ends in a __CRC32# property (5.2+)")
            prof.five.append("prop-crc")
    prof._decide()
    return prof



__all__ = ["FEATURES", "Feature", "Detected", "detect", "detect_in_records", "refuse_unsupported",
           "refuse_operation", "require_writable", "StoreProfile", "profile", "UNSUPPORTED",
           "PARTIAL", "SUPPORTED", "WRITES", "profile_segment", "RECORD_FEATURES"]
