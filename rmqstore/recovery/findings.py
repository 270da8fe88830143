"""What offline checks report, in one vocabulary: the severities, every finding code with
what it means (:data:`CODES`, verify's), the ConsumeQueue kinds of the Spark audit
(:data:`CQ_AUDIT_KINDS`) beside the verify codes that report the same fact, and
:class:`Finding` with the :class:`Collector` that builds them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

ERROR, WARNING, INFO = "error", "warning", "info"

#: Every finding code, its severity and what it means (docs/playbook.md explains more).
CODES = {
    "commitlog-end": (INFO, "where valid CommitLog data ends (the 'ok up to' line)"),
    "commitlog-tail": (ERROR, "bytes after the end of valid data: a torn record or garbage"),
    "commitlog-debris": (INFO, "a record an earlier broker recovery cut off; ignored by brokers"),
    "commitlog-segment": (ERROR, "a segment file with a bad name, size or place (the broker refuses to load)"),
    "commitlog-gap": (ERROR, "a missing segment: everything after it is unreachable"),
    "commitlog-unreachable": (ERROR, "segments after the end of valid data that hold data"),
    "commitlog-preallocated": (INFO, "an all-zero segment after the end (preallocated; the broker deletes it)"),
    "record-body-crc": (ERROR, "a record inside the log whose body fails its CRC"),
    "prop-crc-mismatch": (WARNING, "a record whose __CRC32# property CRC does not match it "
                                   "(an error with forceVerifyPropCRC: the broker cuts the log there)"),
    "prop-crc-missing": (ERROR, "a record without __CRC32# where forceVerifyPropCRC makes the "
                                "broker require one"),
    "record-physical-offset": (WARNING, "a record whose PHYSICALOFFSET differs from its position"),
    "stray-file": (ERROR, "a file where the broker expects only segment or index files"),
    "symlink": (ERROR, "a symbolic link below commitlog/, consumequeue/ or index/: never followed, moved or deleted"),
    "special-file": (ERROR, "a FIFO, socket or device inside the store: never read, moved or deleted"),
    "record-topic-unsafe": (ERROR, "records whose topic cannot be a directory name ('/', '..', NUL, too long)"),
    "rebuild-leftover": (WARNING, "scratch directory of an interrupted rmqstore rebuild"),
    "repair-interrupted": (ERROR, "an rmqstore repair or restore did not finish (its marker is in the store root)"),
    "cq-segment": (ERROR, "a ConsumeQueue segment with a bad name, size or place"),
    "cq-hole": (ERROR, "units after an empty unit: the broker's load stops at the hole"),
    "cq-beyond-end": (WARNING, "units pointing at or past the CommitLog end"),
    "cq-stale-unit": (INFO, "a unit for the record an earlier recovery cut off (RocketMQ leaves its bytes)"),
    "cq-bad-pointer": (ERROR, "units pointing where no valid record starts"),
    "cq-mismatch": (ERROR, "units whose record has another size, topic, queue id or queue offset"),
    "cq-duplicate": (ERROR, "two units for the same record"),
    "cq-tags-mismatch": (WARNING, "units whose tagsCode differs from what dispatch computes"),
    "cq-missing": (ERROR, "records with no unit inside the queue's range"),
    "cq-missing-tail": (WARNING, "records at the queue's tail with no unit yet"),
    "bcq-segment": (ERROR, "a BatchConsumeQueue file with a bad name, size or place (5.x)"),
    "bcq-beyond-end": (WARNING, "BatchConsumeQueue units pointing at or past the CommitLog end"),
    "bcq-mismatch": (ERROR, "BatchConsumeQueue units that differ from what dispatch writes for the records"),
    "bcq-missing-tail": (WARNING, "records of a BatchCQ topic at the queue's tail with no unit yet"),
    "bcq-skipped": (WARNING, "an inner batch whose INNER_BASE/INNER_NUM give no unit (dispatch skips it)"),
    "lmq-dispatch": (WARNING, "a record whose LMQ properties RocketMQ's dispatch cannot use"),
    "index-file": (ERROR, "an IndexFile that cannot be read with the store's geometry"),
    "index-header": (ERROR, "an IndexFile header that disagrees with its entries"),
    "index-chain": (ERROR, "broken hash chains (bad slot heads, links forward or across slots)"),
    "index-orphan": (WARNING, "entries no slot chain reaches (queries never find them)"),
    "index-beyond-end": (WARNING, "entries pointing at or past the CommitLog end"),
    "index-bad-pointer": (ERROR, "entries pointing where no valid record starts"),
    "index-gap": (ERROR, "records between two IndexFiles whose keys are in neither"),
    "index-behind": (WARNING, "records after the last IndexFile's end whose keys are not indexed"),
    "index-missing-keys": (ERROR, "(deep) keys of messages the index does not hold"),
    "index-stray-entries": (ERROR, "(deep) entries whose record carries no key with that hash"),
    "index-duplicate": (INFO, "(deep) a record indexed twice by a re-dispatch (spec §14.7)"),
    # DLedger CommitLogs (design-14 §1.10; rmqstore.recovery.verify_dledger)
    "dledger-end": (INFO, "where DLedger's recovery ends the entry chain, and why"),
    "dledger-torn": (ERROR, "non-zero bytes after the end of the entry chain (a torn entry, or "
                            "data files DLedger's recovery deletes)"),
    "dledger-chain-break": (ERROR, "the entry chain breaks in a data file DLedger's recovery does "
                                   "not walk; readers skip the rest of that file"),
    "dledger-index-mismatch": (WARNING, "DLedger index units that differ from their entries"),
    "dledger-index-missing": (WARNING, "entries with no DLedger index unit"),
    "dledger-record-bad": (ERROR, "a record inside a kept entry that is not a valid record or "
                                  "whose body fails its CRC"),
    "dledger-uncommitted": (INFO, "entries after the committedIndex of dledger-*/checkpoint"),
    "dledger-files": (ERROR, "DLedger data/index/checkpoint files DLedger would refuse to load"),
    "checkpoint": (WARNING, "checkpoint missing, unreadable, behind or ahead of the data"),
    "abort-present": (WARNING, "the last broker run did not shut down cleanly (an error on a "
                               "DLedger store: its abnormal start loses index keys on 4.9)"),
    "store-locked": (WARNING, "a process (a broker?) holds the store lock; files may change"),
    "store-feature": (WARNING, "a broker feature rmqstore does not check yet; findings about its "
                               "queues may be wrong, and the writes it would break refuse"),
    "geometry-unknown": (WARNING, "geometry the files do not determine (pass --config); checks "
                                  "that need it are skipped or use a guess"),
}



#: The Spark audit's ConsumeQueue kinds (:func:`rmqstore.pipeline.audit.audit_queue`: the
#: units the CommitLog implies against the units on disk, one finding per unit): kind ->
#: (severity, meaning, the :data:`CODES` verify reports such a unit or record with). The audit
#: counts every kind but INFO as a problem. ``hole`` and ``duplicate`` share a word with
#: ``cq-hole`` and ``cq-duplicate`` but not their meaning (those are about units on disk).
CQ_AUDIT_KINDS = {
    "missing": (ERROR, "a record has no unit", ("cq-missing", "cq-missing-tail")),
    "extra": (ERROR, "a unit no record implies", ("cq-bad-pointer", "cq-mismatch")),
    "beyond-end": (ERROR, "a unit points at or past the end of valid CommitLog data (the "
                   "broker drops it on load, spec §10.4)", ("cq-beyond-end", "cq-stale-unit")),
    "mismatch": (ERROR, "same queue offset, wrong offset / size / tagsCode (detail says which)",
                 ("cq-mismatch", "cq-tags-mismatch")),
    "hole": (ERROR, "a gap in the queue offsets the CommitLog implies", ()),
    "duplicate": (ERROR, "a second record with a queue offset already taken (the first counts)",
                  ()),
    "expired": (INFO, "a unit pointing below the CommitLog minimum: deleted head (verify "
                "skips these units)", ()),
}


@dataclass(frozen=True)
class Finding:
    """One problem (or note): ``offset`` is a byte position inside ``file``."""

    code: str
    severity: str
    file: str | None
    offset: int | None
    explanation: str
    data: dict = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("data"))
        return d


class Collector:
    """Builds findings with paths relative to the store root."""

    def __init__(self, root: Path):
        self.root = root
        self.findings: list[Finding] = []

    def rel(self, path) -> str | None:
        if path is None:
            return None
        p = Path(path)
        try:
            return str(p.relative_to(self.root))
        except ValueError:
            return str(p)

    def add(self, code: str, path, offset: int | None, explanation: str, *,
            severity: str | None = None, **data) -> None:
        default = CODES[code][0]  # every code is in the vocabulary, even with a severity
        sev = severity or default
        self.findings.append(Finding(code, sev, self.rel(path), offset, explanation, data))
