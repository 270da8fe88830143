"""Store configuration with RocketMQ's property names and defaults (spec §1.2).

The files on disk are the truth. Geometry (segment sizes, IndexFile slots and entries)
comes from the files wherever they determine it; a broker.conf or option value that
disagrees with them is a :class:`ConfigError`, never an override. Where the files do not
determine a value, a broker.conf or option supplies it, else the RocketMQ default (when
there are no files to contradict it) or a guess that ``cfg.undetermined`` records: reads
warn, writing commands refuse (:func:`rmqstore.files.storekind.require_writable`).

Paths: the store root is the one given (the STORE argument), never broker.conf's
``storePathRootDir``; :func:`commitlog_location` is the rule for ``storePathCommitLog``.
``cfg.sources`` says where each geometry value came from, ``cfg.notes``/``cfg.warnings``
what the CLI prints to stderr.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..format import layout as L
from ..format.rules import DEFAULT_DELAY_LEVELS, parse_delay_levels
from ..errors import ConfigError
from .listing import entries as list_entries

SEGMENT_NAME = re.compile(r"^\d{20}$")

# RocketMQ property name -> dataclass field. Only the names that shape files or writes.
_PROPERTY_FIELDS = {
    "storePathRootDir": "store_path_root_dir",
    "storePathCommitLog": "store_path_commit_log",
    "mappedFileSizeCommitLog": "mapped_file_size_commit_log",
    "mappedFileSizeConsumeQueue": "mapped_file_size_consume_queue",
    "maxHashSlotNum": "max_hash_slot_num",
    "maxIndexNum": "max_index_num",
    "messageIndexEnable": "message_index_enable",
    "messageIndexSafe": "message_index_safe",
    "maxMsgsNumBatch": "max_msgs_num_batch",
    "maxMessageSize": "max_message_size",
    "checkCRCOnRecover": "check_crc_on_recover",
    "flushDiskType": "flush_disk_type",
    "brokerRole": "broker_role",
    "flushIntervalCommitLog": "flush_interval_commit_log",
    "flushCommitLogLeastPages": "flush_commit_log_least_pages",
    "flushCommitLogThoroughInterval": "flush_commit_log_thorough_interval",
    "flushCommitLogTimed": "flush_commit_log_timed",
    "commitIntervalCommitLog": "commit_interval_commit_log",
    "commitCommitLogLeastPages": "commit_commit_log_least_pages",
    "commitCommitLogThoroughInterval": "commit_commit_log_thorough_interval",
    "syncFlushTimeout": "sync_flush_timeout",
    "flushIntervalConsumeQueue": "flush_interval_consume_queue",
    "flushConsumeQueueLeastPages": "flush_consume_queue_least_pages",
    "flushConsumeQueueThoroughInterval": "flush_consume_queue_thorough_interval",
    "transientStorePoolEnable": "transient_store_pool_enable",
    "transientStorePoolSize": "transient_store_pool_size",
    "messageDelayLevel": "message_delay_level",
    "duplicationEnable": "duplication_enable",
    "enableConsumeQueueExt": "enable_consume_queue_ext",
    "brokerIP1": "broker_ip1",
    "listenPort": "listen_port",
    "brokerClusterName": "broker_cluster_name",
    "regionId": "region_id",
    "traceOn": "trace_on",
    "brokerVersion": "broker_version",
    "enabledAppendPropCRC": "enabled_append_prop_crc",
    "forceVerifyPropCRC": "force_verify_prop_crc",
    # RocketMQ 5.x queues (design-14 §4, §5)
    "mapperFileSizeBatchConsumeQueue": "mapper_file_size_batch_consume_queue",
    "enableLmq": "enable_lmq",
    "enableMultiDispatch": "enable_multi_dispatch",
}
_FIELD_PROPERTIES = {v: k for k, v in _PROPERTY_FIELDS.items()}
#: Dataclass field -> RocketMQ property name, for messages.
PROPERTY_NAMES = _FIELD_PROPERTIES
GEOMETRY = ("mapped_file_size_commit_log", "mapped_file_size_consume_queue",
            "max_hash_slot_num", "max_index_num")
FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
BROKER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
BROKER_VERSIONS = ("4.9", "5")


@dataclass
class StoreConfig:
    """The settings rmqstore honours, named as RocketMQ names them (snake_case here)."""

    store_path_root_dir: str = str(Path.home() / "store")
    store_path_commit_log: str | None = None
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * L.CQ_UNIT_SIZE
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    message_index_enable: bool = True
    message_index_safe: bool = False
    max_msgs_num_batch: int = 64
    max_message_size: int = 4 * 1024 * 1024
    check_crc_on_recover: bool = True
    flush_disk_type: str = "ASYNC_FLUSH"
    broker_role: str = "ASYNC_MASTER"
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    flush_commit_log_timed: bool = True
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    sync_flush_timeout: int = 5000
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    duplication_enable: bool = False
    enable_consume_queue_ext: bool = False
    broker_ip1: str = "127.0.0.1"
    listen_port: int = 10911
    broker_cluster_name: str = "DefaultCluster"
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    #: 5.2+: records end in a __CRC32# property CRC (spec §3.8); the broker checks it on
    #: recovery only when forced.
    enabled_append_prop_crc: bool = False
    force_verify_prop_crc: bool = False
    #: rmqstore's own setting: which broker's on-disk conventions a writer follows (§13).
    broker_version: str = "4.9"
    #: BatchConsumeQueue file size (5.x; not rounded to whole 46-byte units, design-14 §4.1).
    mapper_file_size_batch_consume_queue: int = 300_000 * L.BCQ_UNIT_SIZE
    #: LMQ: ``%LMQ%`` queues use queue id 0 (enableLmq); dispatch writes their units
    #: (enableMultiDispatch). Design-14 §5, decision D6.
    enable_lmq: bool = False
    enable_multi_dispatch: bool = False
    #: Where each geometry value came from: "default", "broker.conf", "option", "files: …".
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: Filled by :func:`load_config`: what was decided and what reads may miss.
    notes: list[str] = field(default_factory=list, compare=False, repr=False, init=False)
    warnings: list[str] = field(default_factory=list, compare=False, repr=False, init=False)
    #: Features of :mod:`rmqstore.files.storekind` the store uses (partial ones; unsupported raise).
    features: list = field(default_factory=list, compare=False, repr=False, init=False)
    #: Geometry field -> why the files do not determine it (the value in use is a guess).
    undetermined: dict[str, str] = field(default_factory=dict, compare=False, repr=False, init=False)
    #: Why writing commands must not run (for example: a CommitLog directory is missing).
    write_blockers: list[str] = field(default_factory=list, compare=False, repr=False, init=False)
    #: Why ``append`` must not run (the broker version the files show, design-14 §8).
    append_blockers: list[str] = field(default_factory=list, compare=False, repr=False, init=False)

    # --- derived -------------------------------------------------------------------------

    def __post_init__(self) -> None:
        self.validate()

    @property
    def root(self) -> Path:
        return Path(self.store_path_root_dir)

    @property
    def commit_log_dirs(self) -> list[Path]:
        if self.store_path_commit_log:
            return [Path(p) for p in self.store_path_commit_log.split(",") if p.strip()]
        return [self.root / "commitlog"]

    @property
    def consume_queue_dir(self) -> Path:
        return self.root / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    @property
    def checkpoint_path(self) -> Path:
        return self.root / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.root / "abort"

    @property
    def lock_path(self) -> Path:
        return self.root / "lock"

    @property
    def cq_file_size(self) -> int:
        """CQ segment size, rounded up to whole units as the broker does (spec §1.2)."""
        n = self.mapped_file_size_consume_queue
        return -(-n // L.CQ_UNIT_SIZE) * L.CQ_UNIT_SIZE

    @property
    def index_file_size(self) -> int:
        return L.index_file_size(self.max_hash_slot_num, self.max_index_num)

    @property
    def delay_millis(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def trailing_separator(self) -> bool:
        """5.2+ brokers end properties with 0x02; 4.9.1+ do not (spec §3.4)."""
        return self.broker_version != "4.9"

    def validate(self) -> None:
        for name in GEOMETRY + ("max_message_size", "transient_store_pool_size",
                                "mapper_file_size_batch_consume_queue"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{_FIELD_PROPERTIES[name]} must be positive, got {getattr(self, name)}")
        if self.mapped_file_size_commit_log > 2**31 - 1:
            raise ConfigError("mappedFileSizeCommitLog must fit a Java int (< 2 GiB)")
        if self.flush_disk_type not in FLUSH_TYPES:
            raise ConfigError(f"flushDiskType must be one of {', '.join(FLUSH_TYPES)}, got {self.flush_disk_type!r}")
        if self.broker_role not in BROKER_ROLES:
            raise ConfigError(f"brokerRole must be one of {', '.join(BROKER_ROLES)}, got {self.broker_role!r}")
        if self.broker_version not in BROKER_VERSIONS:
            raise ConfigError(f"brokerVersion must be 4.9 or 5, got {self.broker_version!r}")
        parse_delay_levels(self.message_delay_level)

    def with_values(self, **values) -> "StoreConfig":
        out = dataclasses.replace(self, **values)
        out.sources = dict(self.sources)
        for name in ("notes", "warnings", "features", "write_blockers", "append_blockers"):
            setattr(out, name, list(getattr(self, name)))
        out.undetermined = dict(self.undetermined)
        return out


def parse_properties_file(text: str) -> dict[str, str]:
    """Java ``.properties`` text as ``java.util.Properties.load`` reads it (the broker loads
    broker.conf so): ``key=value``, ``key: value`` or ``key value``; ``#``/``!`` comments;
    backslash continuation lines (leading blanks of the next line dropped); escapes
    ``\\t \\n \\r \\f \\uXXXX``, any other escaped character stands for itself; the last of
    a repeated key wins. Parsed by the ``jproperties`` package; a malformed ``\\u`` escape
    is a :class:`ConfigError`."""
    from jproperties import ParseError, Properties

    props = Properties()
    try:
        props.load(text, "utf-8")
    except ParseError as e:
        raise ConfigError(f"broker.conf is not valid Java properties text: {e}") from None
    return {k: v.data for k, v in props.items()}


def _convert(name: str, raw: str, path) -> object:
    kind = type(getattr(StoreConfig(), name))
    if name == "store_path_commit_log":
        return raw
    if kind is bool:
        if raw.strip().lower() not in ("true", "false"):
            raise ConfigError(f"{_FIELD_PROPERTIES[name]} must be true or false, got {raw!r}", path)
        return raw.strip().lower() == "true"
    if kind is int:
        try:
            return int(raw.strip())
        except ValueError:
            raise ConfigError(f"{_FIELD_PROPERTIES[name]} must be a whole number, got {raw!r}", path) from None
    return raw.strip()


def read_broker_conf(path: str | os.PathLike) -> dict[str, str]:
    """Every key of a broker.conf, as text: unknown keys too, since some of them select
    storage rmqstore must refuse (:mod:`rmqstore.files.storekind`)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"cannot read broker.conf: {e.strerror}", path) from None
    return parse_properties_file(text)


def load_broker_conf(path: str | os.PathLike, props: dict[str, str] | None = None) -> dict[str, object]:
    """Known settings from a broker.conf, as dataclass field values. Unknown keys are ignored
    here, as the broker ignores keys that match no field."""
    props = read_broker_conf(path) if props is None else props
    values = {}
    for key, raw in props.items():
        name = _PROPERTY_FIELDS.get(key)
        if name:
            values[name] = _convert(name, raw, path)
    return values


# --- where the CommitLog is ----------------------------------------------------------------


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def config_for(root: str | os.PathLike, config: "StoreConfig | None" = None,
               conf: str | os.PathLike | None = None) -> "StoreConfig":
    """The settings a library call on the store at ``root`` uses: ``config`` rooted at
    ``root`` (the store argument is the root, as on the command line; a config made for
    another root would read that root's CommitLog beside this root's queues), or those
    :func:`load_config` finds for ``root``."""
    if config is None:
        return load_config(root, conf)
    if _same_dir(config.root, Path(root)):
        return config
    return config.with_values(store_path_root_dir=str(root))


def commitlog_location(root: Path, configured: str | None,
                       props: dict[str, str] | None = None) -> tuple[str | None, list[str], list[str]]:
    """Where the CommitLog of the store at ``root`` is, as (``storePathCommitLog`` value to
    use or None for ``root/commitlog``, notes, reasons writing must not run).

    The rule (docs/reading.md, "Which CommitLog is read"): the store argument is the root.

    1. No ``storePathCommitLog``: ``root/commitlog``.
    2. None of its directories (a comma-separated list, spec §1.1) exists here, as with a
       copy or a rescue mount of the store: it is ignored, with a note, and
       ``root/commitlog`` is read.
    3. Some exist: they are the CommitLog (a multi-path broker), provided ``root/commitlog``
       is absent or one of them; otherwise two CommitLogs compete and nothing is read
       (:class:`ConfigError`). Listed directories that are missing are noted, and writing
       commands refuse: the CommitLog may be incomplete.
    4. A store being created (``root`` holds no store files yet) keeps its CommitLog in
       ``root/commitlog`` whatever the broker.conf says.

    ``readOnlyCommitLogStorePaths`` that exist are refused (not supported yet); missing
    ones are ignored with a note.
    """
    from ..errors import UnsupportedStoreError

    notes: list[str] = []
    blockers: list[str] = []
    default = root / "commitlog"
    readonly = [p.strip() for p in (props or {}).get("readOnlyCommitLogStorePaths", "").split(",")
                if p.strip()]
    there = [p for p in readonly if Path(p).is_dir()]
    if there:
        raise UnsupportedStoreError(f"broker.conf readOnlyCommitLogStorePaths names {there[0]}: "
                                    "read-only CommitLog directories are not supported yet; "
                                    "nothing was read", root)
    if readonly:
        notes.append(f"broker.conf readOnlyCommitLogStorePaths={','.join(readonly)} does not "
                     "exist here; ignored")
    paths = [p.strip() for p in (configured or "").split(",") if p.strip()]
    if not paths:
        return None, notes, blockers
    existing = [p for p in paths if Path(p).is_dir()]
    missing = [p for p in paths if p not in existing]
    if existing and not any((root / m).exists() for m in ("commitlog", "consumequeue", "index",
                                                          "checkpoint")):
        # A store being created: its CommitLog goes under STORE, never into a directory
        # that may be another (live) store's.
        notes.append(f"broker.conf storePathCommitLog={','.join(paths)} is not used for a new "
                     f"store; its CommitLog is {default}")
        return None, notes, blockers
    if not existing:
        where = (f"the store's own {default} is read" if default.is_dir()
                 else f"{default} does not exist either, so the store has no CommitLog")
        notes.append(f"broker.conf storePathCommitLog={','.join(paths)} does not exist here "
                     f"(a copy of the store?); ignored: {where}")
        return None, notes, blockers
    if default.is_dir() and not any(_same_dir(default, Path(p)) for p in existing):
        raise ConfigError(f"two CommitLogs: the store's {default} and storePathCommitLog "
                          f"{','.join(existing)} from broker.conf; rmqstore will not guess which "
                          "one belongs to this store: drop storePathCommitLog from the broker.conf "
                          "given, or give the root whose commitlog/ that is", root)
    if missing:
        notes.append(f"broker.conf storePathCommitLog lists {','.join(missing)}, which does not "
                     f"exist here: only {','.join(existing)} is read, so the CommitLog may be "
                     "incomplete")
        blockers.append(f"storePathCommitLog directory {missing[0]} is missing, so the CommitLog "
                        "may be incomplete")
    return ",".join(existing), notes, blockers


def load_config(root: str | os.PathLike | None = None, conf: str | os.PathLike | None = None,
                overrides: dict[str, object] | None = None, infer: bool = True) -> StoreConfig:
    """Settings for the store at ``root`` (see the module docstring for the rules).

    ``conf`` is a broker.conf, ``overrides`` option values (None = not given). With no
    ``root``, broker.conf's ``storePathRootDir`` names it. Raises :class:`ConfigError`
    when a setting disagrees with the files, and
    :class:`~rmqstore.errors.UnsupportedStoreError` for a store rmqstore cannot handle.
    ``infer=False`` skips everything that looks at the files (a loose segment file)."""
    from .dledger_files import find_ledger_dirs
    from .geometry import Reconcile, queue_dirs, round_units
    from .storekind import refuse_unsupported
    from .storekind_detect import detect, detect_in_records

    props = read_broker_conf(conf) if conf else {}
    conf_values = load_broker_conf(conf, props) if conf else {}
    claims: dict[str, tuple[object, str]] = {k: (v, "broker.conf") for k, v in conf_values.items()}
    for k, v in (overrides or {}).items():
        if v is not None:
            claims[k] = (v, "option")
    notes: list[str] = []
    if root is None:
        root = claims.get("store_path_root_dir", (None, ""))[0]
    elif "store_path_root_dir" in conf_values and not _same_dir(
            Path(conf_values["store_path_root_dir"]), Path(root)):
        notes.append(f"broker.conf storePathRootDir={conf_values['store_path_root_dir']} is not "
                     f"the store given; {root} is read")
    values = {k: v for k, (v, _) in claims.items()}
    if root is not None:
        values["store_path_root_dir"] = str(root)
    try:
        StoreConfig(**values)  # settings are valid before they are compared with files
    except TypeError as e:
        raise ConfigError(str(e), conf) from None
    sources = {k: src for k, (_, src) in claims.items()
               if k in GEOMETRY or k in ("mapper_file_size_batch_consume_queue", "enable_lmq",
                                         "enable_multi_dispatch")}
    undetermined: dict[str, str] = {}
    warnings: list[str] = []
    blockers: list[str] = []
    append_blockers: list[str] = []
    if root is not None and infer:
        rootp = Path(root)
        features = detect(rootp, props)
        refuse_unsupported(features, rootp)  # before anything else is looked at
        clog, more, blockers = commitlog_location(rootp, values.get("store_path_commit_log"), props)
        notes += more
        values["store_path_commit_log"] = clog
        dirs = [Path(p) for p in clog.split(",")] if clog else [rootp / "commitlog"]
        features = detect_in_records(features, dirs)
        r = Reconcile(rootp, claims, conf)
        # DLedger mode: its data files are the CommitLog's files, mappedFileSizeCommitLog
        # their size (DLedgerCommitLog sets mappedFileSizeForEntryData from it, design-14 §1.1).
        ledgers = [d / "data" for d in find_ledger_dirs(rootp)]
        r.segments("mapped_file_size_commit_log", "CommitLog",
                   ledgers if ledgers and not any(d.is_dir() for d in dirs) else dirs)
        r.segments("mapped_file_size_consume_queue", "ConsumeQueue", queue_dirs(rootp),
                   effective=round_units)
        r.index(bool(values.get("message_index_enable", True)))
        values.update(r.values)
        sources.update(r.sources)
        undetermined, warnings = r.undetermined, r.warnings
        append_blockers += _broker_version_from_files(rootp, dirs, values, sources)
    else:
        features = detect(None, props)
        refuse_unsupported(features, conf)
    if "enabled_append_prop_crc" not in values and any(
            d.feature.key == "prop-crc" for d in features):
        # The newest records carry __CRC32# (spec §3.8): a writer keeps doing so unless
        # broker.conf says the broker stopped (a setting the files cannot contradict).
        values["enabled_append_prop_crc"] = True
    if values.get("enabled_append_prop_crc") and values.get("broker_version", "4.9") == "4.9":
        append_blockers.append("enabledAppendPropCRC=true is a 5.2+ setting, and the store "
                               "follows 4.9's conventions (pass --broker-version 5 for a 5.x store)")
    cfg = StoreConfig(**values)
    for name in GEOMETRY:
        sources.setdefault(name, "default")
    cfg.sources = sources
    cfg.notes = notes
    cfg.features = features
    # A feature reads fully cover is a note; one they miss something of, a warning.
    cfg.notes += [d.message for d in features if d.feature.reads_complete]
    cfg.warnings = [d.message for d in features if not d.feature.reads_complete] + warnings
    cfg.undetermined = undetermined
    cfg.write_blockers = blockers
    cfg.append_blockers = append_blockers
    return cfg


def _broker_version_from_files(root: Path, dirs, values: dict, sources: dict) -> list[str]:
    """Which broker's conventions the store's files follow (design-14 §8), as
    ``broker_version`` when no option or broker.conf names one; returns why an append
    must not run: the files contradict the version given, or they cannot tell and none
    was given (a record written the other way would not be what that broker writes)."""
    from .storekind_profile import profile

    prof = profile(root, dirs)
    family = prof.family if prof.family in BROKER_VERSIONS else None
    given = values.get("broker_version")
    why = "; ".join(prof.five[:2]) if prof.five else next(
        (e for e in prof.evidence if "0x02" in e), "no record shows it")
    if given is None:
        if family is not None:
            values["broker_version"] = family
            sources["broker_version"] = f"files: {why}"
        elif prof.trailing is not None:  # records exist, and say nothing certain
            return [f"the files do not show which broker version wrote the store ({why}); "
                    "pass --broker-version 4.9 or 5"]
        return []
    if family is not None and given != family:
        return [f"--broker-version {given} (or brokerVersion) but the files were written by a "
                f"{family} broker ({why})"]
    return []
