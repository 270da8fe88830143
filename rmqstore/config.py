"""Store configuration with RocketMQ's property names and defaults (spec §1.2).

Geometry comes from ``broker.conf`` when given, else from the files themselves where that
is unambiguous (:func:`infer_geometry`); every inferred value says where it came from.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import layout as L
from .codec import DEFAULT_DELAY_LEVELS, parse_delay_levels
from .errors import ConfigError

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
}
_FIELD_PROPERTIES = {v: k for k, v in _PROPERTY_FIELDS.items()}
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
    #: rmqstore's own setting: which broker's on-disk conventions a writer follows (§13).
    broker_version: str = "4.9"
    #: Where each geometry value came from: "default", "broker.conf", "option", "files: …".
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

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
        for name in GEOMETRY + ("max_message_size", "transient_store_pool_size"):
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


def load_broker_conf(path: str | os.PathLike) -> dict[str, object]:
    """Known settings from a broker.conf, as dataclass field values. Unknown keys are ignored,
    as the broker ignores keys that match no field."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"cannot read broker.conf: {e.strerror}", path) from None
    values = {}
    for key, raw in parse_properties_file(text).items():
        name = _PROPERTY_FIELDS.get(key)
        if name:
            values[name] = _convert(name, raw, path)
    return values


def _segment_size(directories: list[Path]) -> tuple[int | None, str]:
    """The segment size the files of a queue agree on, and how it was decided.

    All sizes equal decides it; otherwise the most common size must also be the step
    between consecutive names (a truncated or odd file is then a problem to report,
    not a reason to fall back to the default)."""
    from collections import Counter

    sizes: Counter[int] = Counter()
    starts: list[int] = []
    for d in directories:
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if SEGMENT_NAME.match(p.name) and p.is_file():
                size = p.stat().st_size
                if size > 0:
                    sizes[size] += 1
                starts.append(int(p.name))
    if not sizes:
        return None, ""
    if len(sizes) == 1:
        return next(iter(sizes)), "segment file size"
    common, _ = sizes.most_common(1)[0]
    starts.sort()
    steps = {b - a for a, b in zip(starts, starts[1:]) if b > a}
    if steps and min(steps) == common:
        return common, "most common segment file size, matching the step between names"
    return None, f"ambiguous: segment files have sizes {sorted(sizes)}"


def infer_geometry(root: Path) -> tuple[dict[str, int], dict[str, str]]:
    """Geometry values the files of ``root`` determine, and a note on each.

    A CommitLog or ConsumeQueue segment size is known when all its files agree. An
    IndexFile size gives slots and entries when it matches the defaults or the default
    ratio maxIndexNum = 4 x maxHashSlotNum; otherwise it is ambiguous and left out.
    """
    values: dict[str, int] = {}
    notes: dict[str, str] = {}
    size, how = _segment_size([root / "commitlog"])
    if size:
        values["mapped_file_size_commit_log"] = size
    if how:
        notes["mapped_file_size_commit_log"] = f"files: commitlog {how}"
    base = root / "consumequeue"
    qdirs = [q for t in base.iterdir() if t.is_dir() for q in t.iterdir()] if base.is_dir() else []
    size, how = _segment_size(qdirs)
    if size:
        values["mapped_file_size_consume_queue"] = size
    if how:
        notes["mapped_file_size_consume_queue"] = f"files: consumequeue {how}"
    idx = root / "index"
    isizes = {p.stat().st_size for p in idx.iterdir() if p.is_file()} if idx.is_dir() else set()
    if len(isizes) == 1:
        size = isizes.pop()
        default = StoreConfig.__dataclass_fields__
        d_slots, d_index = default["max_hash_slot_num"].default, default["max_index_num"].default
        if size == L.index_file_size(d_slots, d_index):
            slots, entries = d_slots, d_index
        elif (size - L.INDEX_HEADER_SIZE) % (L.INDEX_SLOT_SIZE + 4 * L.INDEX_ENTRY_SIZE) == 0:
            slots = (size - L.INDEX_HEADER_SIZE) // (L.INDEX_SLOT_SIZE + 4 * L.INDEX_ENTRY_SIZE)
            entries = 4 * slots
        else:
            slots = entries = 0
        if slots > 0:
            values["max_hash_slot_num"], values["max_index_num"] = slots, entries
            notes["max_hash_slot_num"] = notes["max_index_num"] = (
                "files: index file size, assuming maxIndexNum = 4 x maxHashSlotNum")
        else:
            notes["max_hash_slot_num"] = notes["max_index_num"] = (
                f"ambiguous: index file size {size} fits no default ratio; pass --config")
    return values, notes


def load_config(root: str | os.PathLike | None = None, conf: str | os.PathLike | None = None,
                overrides: dict[str, object] | None = None, infer: bool = True) -> StoreConfig:
    """Settings for the store at ``root``: options > broker.conf > files > defaults."""
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    conf_values = load_broker_conf(conf) if conf else {}
    if root is None:
        root = conf_values.get("store_path_root_dir")
    if root is not None:
        values["store_path_root_dir"] = str(root)
        if infer:
            inferred, notes = infer_geometry(Path(root))
            sources.update(notes)
            for k, v in inferred.items():
                values[k] = v
    for k, v in conf_values.items():
        if k == "store_path_root_dir" and root is not None:
            continue
        values[k] = v
        sources[k] = "broker.conf"
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k] = v
            sources[k] = "option"
    try:
        cfg = StoreConfig(**values)
    except TypeError as e:
        raise ConfigError(str(e), conf) from None
    for name in GEOMETRY:
        sources.setdefault(name, "default")
    cfg.sources = sources
    return cfg
