"""Store layouts and broker features rmqstore does not handle (yet), found in one place.

A store that uses one of them must never be reported as empty or healthy (issue 11). Each
:class:`Feature` says how far rmqstore goes with it:

* ``unsupported``: every command refuses the store (exit 2), naming the feature.
* ``partial``: reads work and warn about what they do not cover (or, when they cover it
  all, note it); the commands in ``refuses`` refuse, because they would leave the feature's
  files inconsistent or would not check it. A DLedger CommitLog, for one, is read through
  :class:`~rmqstore.files.dledger.DLedgerCommitLog`; verify and the writers refuse it.
* ``supported``: nothing to say (issue 14 moves features here as it implements them).

Evidence comes from the files (spec §1.1) and from broker.conf keys (spec §1.2):
:mod:`rmqstore.files.storekind_detect` finds which features a store uses,
:mod:`rmqstore.files.storekind_profile` what kind and version of store it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, UnsupportedStoreError

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
    # (WP F: engine/load.queue_kinds, Dispatcher.configure_5x); repair fixes them (WP G:
    # recovery/repair_bcq, the ConsumeQueue steps for LMQ queues).
    # The Spark jobs (WP D1) neither unwrap inner batches nor know BCQ/LMQ units: refused.
    Feature("batch-cq", "BatchConsumeQueue topics", PARTIAL, ("spark",),
            reads_complete=True),
    Feature("lmq", "LMQ multi-dispatch queues", PARTIAL, ("spark",),
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


__all__ = ["FEATURES", "Feature", "Detected", "refuse_unsupported", "refuse_operation",
           "require_writable", "UNSUPPORTED", "PARTIAL", "SUPPORTED", "WRITES", "GEOMETRY_ALL"]
