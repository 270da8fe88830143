"""Store configuration with RocketMQ's property names and defaults (spec §1.2).

The files on disk are the truth. Geometry (segment sizes, IndexFile slots and entries)
comes from the files wherever they determine it; a broker.conf or option value that
disagrees with them is a :class:`ConfigError`, never an override. Where the files do not
determine a value, a broker.conf or option supplies it, else the RocketMQ default (when
there are no files to contradict it) or a guess that ``cfg.undetermined`` records: reads
warn, writing commands refuse (:func:`rmqstore.storekind.require_writable`).

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
    #: Filled by :func:`load_config`: what was decided and what reads may miss.
    notes: list[str] = field(default_factory=list, compare=False, repr=False, init=False)
    warnings: list[str] = field(default_factory=list, compare=False, repr=False, init=False)
    #: Features of :mod:`rmqstore.storekind` the store uses (partial ones; unsupported raise).
    features: list = field(default_factory=list, compare=False, repr=False, init=False)
    #: Geometry field -> why the files do not determine it (the value in use is a guess).
    undetermined: dict[str, str] = field(default_factory=dict, compare=False, repr=False, init=False)
    #: Why writing commands must not run (for example: a CommitLog directory is missing).
    write_blockers: list[str] = field(default_factory=list, compare=False, repr=False, init=False)

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
        for name in ("notes", "warnings", "features", "write_blockers"):
            setattr(out, name, list(getattr(self, name)))
        out.undetermined = dict(self.undetermined)
        return out


def parse_properties_file(text: str) -> dict[str, str]:
    """Java ``.properties`` text: ``key=value`` / ``key: value``, ``#``/``!`` comments,
    backslash line continuation and escapes."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip()
        i += 1
        if not line or line[0] in "#!":
            continue
        while line.endswith("\\") and not line.endswith("\\\\") and i < len(lines):
            line = line[:-1] + lines[i].lstrip()
            i += 1
        m = re.match(r"((?:\\.|[^=:\s\\])*)\s*[=:\s]\s*(.*)$", line)
        key, value = (m.group(1), m.group(2)) if m else (line, "")
        unescape = lambda s: re.sub(r"\\(.)", lambda g: {"t": "\t", "n": "\n", "r": "\r"}.get(g.group(1), g.group(1)), s)
        out[unescape(key)] = unescape(value.rstrip())
    return out


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
    storage rmqstore must refuse (:mod:`rmqstore.storekind`)."""
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

    ``readOnlyCommitLogStorePaths`` that exist are refused (not supported yet); missing
    ones are ignored with a note.
    """
    from .errors import UnsupportedStoreError

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


# --- geometry from the files ---------------------------------------------------------------


@dataclass
class SizeDecision:
    """The segment size a queue's files show (``ambiguous``: they exist but disagree)."""

    value: int
    how: str
    ambiguous: bool
    example: Path
    largest: int


def segment_size(directories) -> SizeDecision | None:
    """The segment size the files of ``directories`` show (spec §2), None without files.

    Segment files are created full size, so one size decides it. A short file (a cut
    tail) does not spoil that when the largest size is shared by two files or equals
    the step between names; anything else is ambiguous (a guess: the largest size)."""
    from collections import Counter

    files: list[tuple[int, Path, int]] = []
    for d in directories:
        d = Path(d)
        try:
            names = list(d.iterdir()) if d.is_dir() else []
        except OSError:
            continue
        for p in names:
            if SEGMENT_NAME.match(p.name) and p.is_file():
                try:
                    files.append((int(p.name), p, p.stat().st_size))
                except OSError:
                    continue
    sized = [(s, p, n) for s, p, n in files if n > 0]
    if not sized:
        return None
    sizes = Counter(n for _, _, n in sized)
    largest = max(sizes)
    example = min((s, p) for s, p, n in sized if n == largest)[1]
    if len(sizes) == 1:
        return SizeDecision(largest, "segment file size", False, example, largest)
    starts = sorted({s for s, _, _ in files})
    steps = [b - a for a, b in zip(starts, starts[1:])]
    if sizes[largest] >= 2 or (steps and min(steps) == largest):
        return SizeDecision(largest, "largest segment file size (shorter files are cut short)",
                            False, example, largest)
    return SizeDecision(largest, f"segment files have sizes {sorted(sizes)}", True, example, largest)


def _queue_dirs(root: Path) -> list[Path]:
    base = root / "consumequeue"
    try:
        return [q for t in base.iterdir() if t.is_dir() for q in t.iterdir() if q.is_dir()] \
            if base.is_dir() else []
    except OSError:
        return []


def infer_geometry(root: Path) -> tuple[dict[str, int], dict[str, str]]:
    """Geometry values the files of ``root`` determine, and a note on each (see
    :func:`load_config`, which also checks broker.conf values against them)."""
    cfg = load_config(root)
    values = {k: getattr(cfg, k) for k in GEOMETRY
              if cfg.sources.get(k, "").startswith("files") and k not in cfg.undetermined}
    return values, {k: v for k, v in cfg.sources.items() if k in GEOMETRY}


def _round_units(n: int) -> int:
    return -(-n // L.CQ_UNIT_SIZE) * L.CQ_UNIT_SIZE


class _Reconcile:
    """Geometry for one store: files first, claims (broker.conf, options) checked."""

    def __init__(self, root: Path, claims: dict[str, tuple[object, str]], conf):
        self.root, self.claims, self.conf = root, claims, conf
        self.values: dict[str, object] = {}
        self.sources: dict[str, str] = {}
        self.undetermined: dict[str, str] = {}
        self.warnings: list[str] = []

    def _disagree(self, name: str, value, evidence: str) -> ConfigError:
        _, src = self.claims[name]
        given = "in broker.conf" if src == "broker.conf" else "given as an option"
        return ConfigError(f"{_FIELD_PROPERTIES[name]}={value} {given} disagrees with the store: "
                           f"{evidence}; the files are the truth: fix or drop the setting",
                           self.conf if src == "broker.conf" else self.root)

    def _claimed(self, name: str):
        return self.claims[name][0] if name in self.claims else None

    def _use(self, name: str, value, source: str) -> None:
        self.values[name] = value
        self.sources[name] = source

    def segments(self, name: str, what: str, directories, effective=lambda n: n) -> None:
        d = segment_size(directories)
        claim = self._claimed(name)
        src = self.claims[name][1] if claim is not None else None
        if d is None:
            if claim is not None:
                self._use(name, claim, src)
            return
        if not d.ambiguous:
            if claim is not None and effective(claim) != d.value:
                raise self._disagree(name, claim, f"its {what} segment files are {d.value} bytes "
                                     f"({d.example})")
            self._use(name, d.value, f"files: {what} {d.how}"
                      + (f" ({src} agrees)" if claim is not None else ""))
            return
        if claim is not None:
            if effective(claim) < d.largest:
                raise self._disagree(name, claim, f"{d.example} is {d.largest} bytes, larger "
                                     "than a segment")
            self._use(name, claim, f"{src} ({what} files do not decide: {d.how})")
            return
        why = f"the {what} files do not determine {_FIELD_PROPERTIES[name]} ({d.how})"
        self.undetermined[name] = why
        self.warnings.append(f"{why}; reading with {d.largest}, the largest (pass --config to "
                             "choose)")
        self._use(name, d.largest, f"guess: {d.how}")

    def index(self, index_enabled: bool) -> None:
        from .index_geometry import IndexFiles, entries_for, slots_for

        s_name, n_name = "max_hash_slot_num", "max_index_num"
        slots, entries = self._claimed(s_name), self._claimed(n_name)
        view = IndexFiles(self.root / "index")
        if not view.sizes:
            for name, v in ((s_name, slots), (n_name, entries)):
                if v is not None:
                    self._use(name, v, self.claims[name][1])
            return
        if slots is None and entries is None:
            d = view.decide()
            if d is not None and not d.ambiguous:
                self._use(s_name, d.slots, f"files: {d.how}")
                self._use(n_name, d.entries, f"files: {d.how}")
                return
            why = f"the IndexFiles do not determine maxHashSlotNum and maxIndexNum ({d.how})"
            if index_enabled:
                self.undetermined[s_name] = self.undetermined[n_name] = why
                self.warnings.append(f"{why}; key lookups and index checks need --config with "
                                     "both")
            self.sources[s_name] = self.sources[n_name] = f"unknown: {d.how}"
            return
        size, example = view.size, view.example
        if size is None:  # files of several sizes: the claim must fit one of them
            size = max(view.sizes)
            example = self.root / "index"
        name = s_name if slots is not None else n_name
        if slots is not None and entries is not None:
            if L.index_file_size(slots, entries) != size:
                raise self._disagree(name, slots if name == s_name else entries,
                                     f"with {_FIELD_PROPERTIES[s_name]}={slots} and "
                                     f"{_FIELD_PROPERTIES[n_name]}={entries} an IndexFile is "
                                     f"{L.index_file_size(slots, entries)} bytes, but {example} "
                                     f"is {size}")
            self._use(s_name, slots, self.claims[s_name][1])
            self._use(n_name, entries, self.claims[n_name][1])
        elif slots is not None:
            entries = entries_for(size, slots)
            if entries is None:
                raise self._disagree(s_name, slots, f"no maxIndexNum fits it to {example}, "
                                     f"which is {size} bytes")
            self._use(s_name, slots, self.claims[s_name][1])
            self._use(n_name, entries, f"files: IndexFile size with maxHashSlotNum from "
                                       f"{self.claims[s_name][1]}")
        else:
            slots = slots_for(size, entries)
            if slots is None:
                raise self._disagree(n_name, entries, f"no maxHashSlotNum fits it to {example}, "
                                     f"which is {size} bytes")
            self._use(n_name, entries, self.claims[n_name][1])
            self._use(s_name, slots, f"files: IndexFile size with maxIndexNum from "
                                     f"{self.claims[n_name][1]}")
        if view.size is not None:
            agree, contra, bad = view.verdicts(slots)
            if contra and not agree:
                d = view.decide()
                if d is not None and not d.ambiguous and d.slots != slots:
                    raise self._disagree(name, self.values[name],
                                         f"its IndexFile entries fit maxHashSlotNum={d.slots}, "
                                         f"maxIndexNum={d.entries} ({d.how}; {bad})")


def load_config(root: str | os.PathLike | None = None, conf: str | os.PathLike | None = None,
                overrides: dict[str, object] | None = None, infer: bool = True) -> StoreConfig:
    """Settings for the store at ``root`` (see the module docstring for the rules).

    ``conf`` is a broker.conf, ``overrides`` option values (None = not given). With no
    ``root``, broker.conf's ``storePathRootDir`` names it. Raises :class:`ConfigError`
    when a setting disagrees with the files, and
    :class:`~rmqstore.errors.UnsupportedStoreError` for a store rmqstore cannot handle.
    ``infer=False`` skips everything that looks at the files (a loose segment file)."""
    from . import storekind

    props = read_broker_conf(conf) if conf else {}
    conf_values = load_broker_conf(conf, props) if conf else {}
    claims: dict[str, tuple[object, str]] = {k: (v, "broker.conf") for k, v in conf_values.items()}
    for k, v in (overrides or {}).items():
        if v is not None:
            claims[k] = (v, "option")
    notes: list[str] = []
    if root is None:
        root = claims.get("store_path_root_dir", (None, ""))[0]
    elif "store_path_root_dir" in conf_values and not _same_dir(Path(conf_values["store_path_root_dir"]), Path(root)):
        notes.append(f"broker.conf storePathRootDir={conf_values['store_path_root_dir']} is not "
                     f"the store given; {root} is read")
    values = {k: v for k, (v, _) in claims.items()}
    if root is not None:
        values["store_path_root_dir"] = str(root)
    try:
        StoreConfig(**values)  # settings are valid before they are compared with files
    except TypeError as e:
        raise ConfigError(str(e), conf) from None
    sources = {k: src for k, (_, src) in claims.items() if k in GEOMETRY}
    undetermined: dict[str, str] = {}
    warnings: list[str] = []
    blockers: list[str] = []
    if root is not None and infer:
        rootp = Path(root)
        clog, more, blockers = commitlog_location(rootp, values.get("store_path_commit_log"), props)
        notes += more
        values["store_path_commit_log"] = clog
        dirs = [Path(p) for p in clog.split(",")] if clog else [rootp / "commitlog"]
        features = storekind.detect(rootp, props, dirs)
        storekind.refuse_unsupported(features, rootp)
        r = _Reconcile(rootp, claims, conf)
        r.segments("mapped_file_size_commit_log", "CommitLog", dirs)
        r.segments("mapped_file_size_consume_queue", "ConsumeQueue", _queue_dirs(rootp),
                   effective=_round_units)
        r.index(bool(values.get("message_index_enable", True)))
        values.update(r.values)
        sources.update(r.sources)
        undetermined, warnings = r.undetermined, r.warnings
    else:
        features = storekind.detect(None, props)
        storekind.refuse_unsupported(features, conf)
    cfg = StoreConfig(**values)
    for name in GEOMETRY:
        sources.setdefault(name, "default")
    cfg.sources = sources
    cfg.notes = notes
    cfg.features = features
    cfg.warnings = [d.message for d in features] + warnings
    cfg.undetermined = undetermined
    cfg.write_blockers = blockers
    return cfg
