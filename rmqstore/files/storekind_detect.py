"""Which features of :data:`rmqstore.files.storekind.FEATURES` a store uses, from the
evidence: broker.conf keys (spec §1.2), listings and tiny files (spec §1.1), and the first
record of the newest CommitLog segment. The probes here (names in a folder, a tiny file's
text, the newest first record) never raise for what they find; names from disk are shown
safely (:func:`shown`). Nothing here writes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

from ..format.crc import ends_in_prop_crc
from .dledger_files import find_ledger_dirs
from .listing import open_regular
from .storekind import FEATURES, UNSUPPORTED, Detected


def _true(props: Mapping[str, str], key: str) -> bool:
    return props.get(key, "").strip().lower() == "true"


def names_in(d: Path) -> list[str]:
    """The sorted names in directory ``d`` (none when it is not one or cannot be listed)."""
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
        add("rocksdb-cq", f"broker.conf storeType={shown(store_type)}")
    plugin = props.get("messageStorePlugIn", "").strip()
    if plugin:
        add("store-plugin", f"broker.conf messageStorePlugIn={shown(plugin)}")
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


def shown(name: str) -> str:
    """A name from disk or a setting, safe to print on a terminal (bytes are data)."""
    return name if name.isprintable() else ascii(name)


def _detect_files(root: Path, add) -> None:
    for d in find_ledger_dirs(root):
        add("dledger", f"{shown(d.name)}/")
    cq = root / "consumequeue"
    names = names_in(cq)
    rocks = [n for n in names if _ROCKSDB_FILE.match(n) and (cq / n).is_file()]
    if rocks:
        add("rocksdb-cq", f"consumequeue/{shown(rocks[0])}")
    bcq = names_in(root / "batchconsumequeue")
    if bcq:
        add("batch-cq", f"batchconsumequeue/{shown(bcq[0])}")
    elif mentions(root / "config" / "topics.json", '"BatchCQ"'):
        add("batch-cq", "config/topics.json queue.type=BatchCQ")
    lmq = [n for n in names if n.startswith("%LMQ%")]
    if lmq:
        add("lmq", f"consumequeue/{shown(lmq[0])}")
    ext = names_in(root / "consumequeue_ext")
    if ext:
        add("cq-ext", f"consumequeue_ext/{shown(ext[0])}")
    timer = [n for n in names_in(root / "timerlog") if nonempty(root / "timerlog" / n)]
    if timer:
        add("timer", f"timerlog/{shown(timer[0])}")
    clog = names_in(root / "compaction" / "compactionLog")
    if clog:
        add("compaction", f"compaction/compactionLog/{shown(clog[0])}")


def nonempty(p: Path) -> bool:
    try:
        return p.is_file() and p.stat().st_size > 0
    except OSError:
        return False


def mentions(p: Path, text: str, limit: int = 8 << 20) -> bool:
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
    got = newest_first_record(segs, 0)
    if got is not None and ends_in_prop_crc(got[2]):
        p = got[0]
        return f"{p.parent.name}/{p.name}: records carry __CRC32#"
    return None


def first_record_props(path: Path, at: int) -> tuple[str, bytes] | None:
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


def newest_first_record(files: list[Path], at: int) -> tuple[Path, str, bytes] | None:
    """The first record of the newest data file holding one (``at``: 0 for CommitLog
    segments, 48 for DLedger entries, whose record follows the entry header)."""
    for p in reversed(files):
        got = first_record_props(p, at)
        if got is not None:
            return (p, *got)
    return None
