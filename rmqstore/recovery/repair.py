"""Repair: what a broker's recovery would do (spec §10), as an explicit plan, then done
offline with a backup of every byte changed. Each step is saved and journaled before it
runs (:mod:`rmqstore.recovery.journal`, :mod:`rmqstore.recovery.repair_steps`), so a repair cut short is
undone by the next one, which plans afresh, and a finished one can be undone
(:mod:`rmqstore.recovery.undo`).

``plan_repair(root)`` runs :func:`rmqstore.recovery.verify.verify` and turns its problems into
:class:`Step` objects (data; ``rmqstore repair --dry-run`` prints them). ``repair(root)``
executes the plan under the store lock (:class:`~rmqstore.errors.StoreLockedError`
while a broker holds it), after creating ``abort`` so that a crash mid-repair makes the
next broker start run its own full recovery (§8.2):

1. leftovers of an interrupted rebuild and stray files are moved to the backup;
2. CommitLog: a record inside the log whose body fails its CRC gets its BODYCRC rewritten
   (the broker would otherwise cut the log there and drop every later message); the
   segment holding the end of valid data is extended to full size if truncated and its
   bytes after the end are zeroed; later segments are moved to the backup (§10.4);
3. ConsumeQueue: units at or past the CommitLog end are cut, a queue with holes, wrong or
   duplicate units is rebuilt from the CommitLog, and units missing at the tail are
   dispatched with the broker's write rules (§6.1);
4. IndexFile: files the broker's abnormal start deletes (newer than the checkpoint's
   indexMsgTimestamp, §7.5) and files with broken chains or entries past the end are
   moved to the backup, with every later file; keys are re-dispatched from the end of the
   last file kept (the broker's ``offset < endPhyOffset`` rule, §7.3);
5. checkpoint rewritten to agree with the data; ``abort`` removed.

Nothing verify calls valid is dropped; a second run finds nothing to do: only steps that
resolve their finding are planned, the rest is listed in ``RepairPlan.unfixed`` with the
reason (symbolic links, unsafe topics, queues whose records disagree). Steps that would
remove CRC-valid records found after the verified end, or units pointing at them or at
missing files, are listed in ``RepairPlan.refused``; :func:`repair` then changes nothing
and raises :class:`~rmqstore.errors.RefusedError` unless ``allow_data_loss``
(:mod:`rmqstore.recovery.guard`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ..files import checkpoint as ckpt
from ..files.config import StoreConfig, load_config
from ..errors import RefusedError, RmqStoreError, StoreIOError
from ..scan.survivors import find_survivors
from .guard import refused_error, unit_loss, units_from
from ..files.index import _list_index_files
from ..files.listing import offset_name
from ..files.segments import SegmentQueue
from ..scan.properties import sorted_isin
from .verify import VerifyReport, verify

_QUEUE_REBUILD = {"cq-hole", "cq-mismatch", "cq-bad-pointer", "cq-duplicate", "cq-missing",
                  "cq-segment"}
_INDEX_DROP = {"index-file", "index-header", "index-chain", "index-orphan", "index-beyond-end",
               "index-bad-pointer", "index-gap"}


@dataclass
class Step:
    """One explicit change. ``path`` is relative to the store; ``offset``/``length`` a byte
    range in it when the step rewrites part of a file."""

    action: str
    path: str | None
    explanation: str
    offset: int | None = None
    length: int | None = None
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("data"))
        return d


@dataclass
class RepairPlan:
    store: str
    steps: list[Step]
    report: VerifyReport
    unfixed: list = field(default_factory=list)  # (finding, why): problems no step addresses
    #: (step, why) for each step that would remove valid data or act without evidence:
    #: :func:`repair` refuses the plan unless ``allow_data_loss`` (``--allow-data-loss``).
    refused: list = field(default_factory=list)

    def refusal(self) -> RefusedError | None:
        """The error :func:`repair` raises for this plan without the override."""
        if not self.refused:
            return None
        return refused_error(f"repair of {self.store}",
                             [f"{s.action} {s.path}: {why}" for s, why in self.refused])


@dataclass
class RepairResult:
    plan: RepairPlan
    executed: bool
    backup_dir: str | None  # the backup actually used
    seconds: float
    resumed: object = None  # journal_state.Interrupted: an unfinished repair found (and dealt with) first
    steps: list[Step] = field(default_factory=list)  # what ran: the plan + create/remove-abort


def default_backup_dir(root: Path) -> Path:
    """``{store}.rmqstore-backup-<timestamp>``, beside (outside) the store; ``-2``, ``-3``
    … when that exists already."""
    root = Path(root).resolve()
    p = root.parent / f"{root.name}.rmqstore-backup-{time.strftime('%Y%m%d-%H%M%S')}"
    return _unused(p) if os.path.lexists(p) else p


# --- planning ----------------------------------------------------------------------------


def plan_repair(root: str | os.PathLike, *, config: StoreConfig | None = None,
                report: VerifyReport | None = None, processes: int | None = None,
                backup: bool = True) -> RepairPlan:
    """The steps :func:`repair` would take, from a fresh verify unless one is given.

    Only steps whose execution resolves their finding are planned (so a second run has
    nothing to do); what no step can fix is in ``unfixed`` with the reason, and steps
    that would remove valid data are listed in ``refused`` (see :mod:`rmqstore.recovery.guard`);
    without a ``backup`` that includes every step deleting CRC-valid records."""
    from ..files.storekind import require_writable

    root = Path(root)
    cfg = config or load_config(root)
    require_writable(cfg, "repair")  # a plan from guessed geometry would destroy data
    rep = report or verify(root, config=cfg, processes=processes)
    steps: list[Step] = []
    unfixed: list = []
    by_code: dict[str, list] = {}
    for f in rep.findings:
        by_code.setdefault(f.code, []).append(f)
    queues = _QueuePlan(root, cfg, rep, by_code, unfixed)
    for f in by_code.get("rebuild-leftover", []):
        steps.append(Step("remove-leftover", f.file, "scratch directory of an interrupted "
                          "rebuild; moved to the backup"))
    for f in by_code.get("stray-file", []):
        if queues.absorbs(f.file):
            continue  # inside a queue that is rebuilt: removed (and backed up) with it
        steps.append(Step("move-stray", f.file, "not a store file where the broker expects "
                          "only its own; moved to the backup"))
    steps += _commitlog_steps(root, cfg, rep, by_code)
    steps += queues.steps()
    idx_steps = _index_steps(root, cfg, rep, by_code)
    steps += idx_steps
    steps = _without_guessed_geometry(root, cfg, rep, steps, unfixed)
    touched = bool(steps)
    if touched or "checkpoint" in by_code or "abort-present" in by_code:
        steps.append(Step("write-checkpoint", ckpt.CHECKPOINT,
                          "logicsMsgTimestamp = the last message with a ConsumeQueue unit, "
                          "physicMsgTimestamp no later than the newest record, "
                          "indexMsgTimestamp = the last full IndexFile's endTimestamp (§8.1)"))
    if "abort-present" in by_code:
        steps.append(Step("remove-abort", ckpt.ABORT, "the store is consistent again: the next "
                          "broker start runs normal recovery (§8.2)"))
    for f in rep.problems:
        why = _UNFIXED.get(f.code)
        if why:
            unfixed.append((f, why))
    refused = _guard(root, cfg, rep, steps, backup)
    return RepairPlan(str(root), steps, rep, unfixed, refused)


#: Steps that write ConsumeQueue or IndexFile bytes in files of the configured size.
_WRITES_CQ = ("rebuild-queue", "dispatch-queue")
_GUESS = ("no {what} is left to tell {names}, and no broker.conf says {it}: repair will not "
          "create {what}s of a guessed size ({default}, the broker's default) that a broker "
          "configured otherwise would misread; pass --config with the broker's broker.conf")


def _without_guessed_geometry(root: Path, cfg, rep: VerifyReport, steps: list[Step],
                              unfixed: list) -> list[Step]:
    """Drop the steps that would create ConsumeQueue or IndexFile files whose size no file
    and no setting determines (the store kept none of them: a deleted consumequeue/ or
    index/): the defaults are a guess, and a file of the wrong geometry is worse than
    none (the broker rebuilds missing ones from the CommitLog with its own settings).
    What they would have fixed goes to ``unfixed`` with the reason."""
    src = cfg.sources
    drop_cq = src.get("mapped_file_size_consume_queue") == "default"
    drop_ix = "default" in (src.get("max_hash_slot_num"), src.get("max_index_num"))
    if not (drop_cq or drop_ix):
        return steps
    kept, dropped_cq, dropped_ix = [], [], False
    for s in steps:
        if drop_cq and s.action in _WRITES_CQ:
            dropped_cq.append(s.path)
        elif drop_ix and s.action == "reindex":
            dropped_ix = True
        else:
            kept.append(s)
    if dropped_cq:
        why = _GUESS.format(what="ConsumeQueue file", names="mappedFileSizeConsumeQueue",
                            it="it", default=f"{cfg.mapped_file_size_consume_queue:,} bytes")
        for f in rep.problems:
            q = _queue_of(f.file) if f.file else None
            if q in dropped_cq and f.code.startswith("cq-"):
                unfixed.append((f, why))
    if dropped_ix:
        why = _GUESS.format(what="IndexFile", names="maxHashSlotNum and maxIndexNum",
                            it="them", default=f"{cfg.max_hash_slot_num:,} slots and "
                            f"{cfg.max_index_num:,} entries")
        for f in rep.problems:
            if f.code.startswith("index-"):
                unfixed.append((f, why))
    return kept


#: Problems repair leaves as they are, and why.
_UNFIXED = {
    "record-physical-offset": "stale or copied records are kept as they are",
    "cq-tags-mismatch": "a broker's recovery keeps existing units; `rmqstore rebuild "
                        "--consumequeue` rewrites them from the records",
    "store-locked": "repair refuses to run while the lock is held",
    "symlink": "repair never follows, moves or deletes a symbolic link or its target; "
               "remove or replace it by hand",
    "special-file": "repair never reads, moves or deletes a FIFO, socket or device (one "
                    "standing where it must write checkpoint or abort goes to the backup, "
                    "as it is)",
    "record-topic-unsafe": "the record is kept; no ConsumeQueue is written for a topic that "
                           "cannot be a directory name",
}


def _commitlog_steps(root: Path, cfg, rep: VerifyReport, by_code) -> list[Step]:
    steps = []
    size = cfg.mapped_file_size_commit_log
    for f in by_code.get("record-body-crc", []):
        steps.append(Step("fix-body-crc", f.file, "body fails its CRC inside the log: rewrite "
                          "BODYCRC to match the damaged body, so a broker keeps every later "
                          "message (this message's body stays damaged)", f.offset + 8, 4,
                          {"commitLogOffset": f.data.get("commitLogOffset")}))
    for f in by_code.get("commitlog-segment", []):
        if f.offset is not None and f.offset < size and rep.scan is not None:
            p = root / f.file
            start = offset_name(p.name)
            if start is not None and p.is_file() and not p.is_symlink() \
                    and p.stat().st_size < size and start <= rep.end < start + size:
                steps.append(Step("extend-segment", f.file, f"truncated segment: extend it with "
                                  f"zeros to {size} bytes (the broker refuses other sizes)",
                                  p.stat().st_size, size - p.stat().st_size))
    for f in by_code.get("commitlog-tail", []):
        steps.append(Step("zero-tail", f.file, f"zero the {f.data.get('kind')} bytes after the end "
                          f"of valid data ({rep.end}); the bytes are saved in the backup",
                          f.offset, int(f.data.get("bytes", 0))))
    moved = set()
    for code in ("commitlog-preallocated", "commitlog-unreachable", "commitlog-gap"):
        for f in by_code.get(code, []):
            if f.file not in moved:  # the segment after a gap is also "unreachable"
                moved.add(f.file)
                steps.append(Step("move-segment", f.file, "segment after the end of valid "
                                  "data: the broker deletes it (§10.4); moved to the backup"))
    return steps


def _queue_of(rel: str | None) -> str | None:
    """``consumequeue/{topic}/{queueId}`` of a path at or inside a queue directory."""
    if not rel:
        return None
    parts = Path(rel).parts
    if len(parts) >= 3 and parts[0] == "consumequeue":
        return str(Path(*parts[:3]))
    return None


class _QueuePlan:
    """ConsumeQueue steps: one per queue directory, and only those that converge.

    A queue is rebuilt (or its tail dispatched) only when the records give a consistent
    queue: their queue offsets count up by one and their PHYSICALOFFSET is their position
    (dispatch writes units densely, so any other records would be misplaced again, and a
    second run would find the same problem). A queue directory holding a symbolic link or
    special file gets no step at all."""

    def __init__(self, root: Path, cfg, rep: VerifyReport, by_code, unfixed: list):
        self.root, self.cfg, self.rep, self.by_code, self.unfixed = root, cfg, rep, by_code, unfixed
        self._d = self._valid = None
        self.odd = [f.file for code in ("symlink", "special-file")
                    for f in by_code.get(code, []) if f.file]
        self.rebuild: dict[str, object] = {}
        for code in sorted(_QUEUE_REBUILD):
            for f in by_code.get(code, []):
                q = _queue_of(f.file)
                if q and q not in self.rebuild:
                    self.rebuild[q] = f
        # A stray inside a queue directory goes with a rebuild of that queue.
        self.strays = {}
        for f in by_code.get("stray-file", []):
            q = _queue_of(f.file)
            if q and q != f.file:
                self.strays.setdefault(q, f)
        for q, f in self.strays.items():
            if q in self.rebuild or self._units(q) is not None:  # else: just move the stray
                self.rebuild.setdefault(q, f)
        self.ok_rebuild = {q for q in self.rebuild if self._rebuildable(q, self.rebuild[q])}

    @property
    def d(self):
        """What dispatch would write for the valid records (made only when a queue needs it)."""
        if self._d is None and self.rep.scan is not None:
            from ..scan.per_queue import dispatched

            self._d = dispatched(self.rep.scan)
        return self._d

    @property
    def valid(self) -> np.ndarray:
        if self._valid is None:
            scan = self.rep.scan
            self._valid = scan.records("offset") if scan is not None else np.zeros(0, np.int64)
        return self._valid

    def blocked(self, q: str) -> bool:
        """Is a link or special file at, inside or above queue directory ``q``?"""
        return any(p == q or p.startswith(q + "/") or q.startswith(p + "/") for p in self.odd)

    def absorbs(self, rel: str | None) -> bool:
        q = _queue_of(rel)
        return q is not None and q != rel and q in self.ok_rebuild

    def _units(self, q: str):
        parts = Path(q).parts
        try:
            key = (parts[1], int(parts[2]))
        except (IndexError, ValueError):
            return None
        return self.d.units.get(key) if self.d is not None else None

    def _consistent(self, q: str, qo, phy, first: int | None) -> str | None:
        """Why units built from these records would not make a consistent queue."""
        if first is not None and len(qo) and int(qo[0]) != first:
            return (f"the next record (CommitLog {int(phy[0])}) has queue offset {int(qo[0])}, "
                    f"but the queue ends at {first}")
        jump = np.flatnonzero(np.diff(qo) != 1)
        if len(jump):
            i = int(jump[0])
            return (f"records disagree on queue offsets: CommitLog {int(phy[i])} has queue "
                    f"offset {int(qo[i])}, the next one ({int(phy[i + 1])}) {int(qo[i + 1])}")
        stray = ~sorted_isin(np.asarray(phy, np.int64), self.valid)
        if stray.any():
            return (f"a record stores PHYSICALOFFSET {int(phy[stray][0])}, not its position: "
                    "its unit would point elsewhere")
        return None

    def _rebuildable(self, q: str, f) -> bool:
        if self.blocked(q):
            self.unfixed.append((f, f"{q} is, holds or lies under a symbolic link or special "
                                    "file; repair leaves it"))
            return False
        units = self._units(q)
        if units is not None:
            why = self._consistent(q, units[0], units[1], None)
            if why:
                self.unfixed.append((f, f"{why}; rebuilding {q} would not give a consistent "
                                        "queue, so its units are left as they are"))
                return False
        return True

    def steps(self) -> list[Step]:
        out = []
        for q in sorted(self.ok_rebuild):
            f = self.rebuild[q]
            why = f.code if f.code != "stray-file" else "a stray file inside it"
            what = ("rebuild this queue from the records" if self._units(q) is not None else
                    "no valid record belongs to this queue: its units go to the backup and "
                    "its directory stays, empty (a broker's recovery truncates a queue, "
                    "never deletes it, §10.4)")
            out.append(Step("rebuild-queue", q, f"units disagree with the CommitLog ({why}): "
                            f"{what}"))
        for f in self.by_code.get("cq-beyond-end", []):
            q = _queue_of(f.file)
            if q and q not in self.rebuild and not self.blocked(q):
                out.append(Step("cut-queue", q, f"cut {f.data.get('count')} unit(s) from queue "
                                f"offset {f.data.get('queueOffset')}: they point at or past the "
                                f"CommitLog end {self.rep.end} (truncateDirtyLogicFiles, §10.4)",
                                data={"queueOffset": f.data.get("queueOffset")}))
            elif q and self.blocked(q):
                self.unfixed.append((f, f"{q} is, holds or lies under a symbolic link or "
                                        "special file; repair leaves it"))
        for f in self.by_code.get("cq-missing-tail", []):
            q = _queue_of(f.file)
            if not q or q in self.rebuild:
                continue
            if self.blocked(q):
                self.unfixed.append((f, f"{q} is, holds or lies under a symbolic link or "
                                        "special file; repair leaves it"))
                continue
            why = self._tail_problem(q, f)
            if why:
                self.unfixed.append((f, why))
                continue
            out.append(Step("dispatch-queue", q, f"dispatch {f.data.get('count')} missing "
                            f"unit(s) from queue offset {f.data.get('queueOffset')} (§6.1 "
                            "write rules)", data={"queueOffset": f.data.get("queueOffset")}))
        return out

    def _tail_problem(self, q: str, f) -> str | None:
        from ..files.consumequeue import ConsumeQueue

        units = self._units(q)
        if units is None:
            return None
        p = self.root / q
        have = 0
        if p.is_dir():
            try:
                with ConsumeQueue(p, self.cfg.cq_file_size) as cq:
                    have = cq.max_offset if cq.segments else None
            except RmqStoreError as e:
                return f"the queue cannot be read ({e.message})"
        sel = units[0] >= (have or 0)
        why = self._consistent(q, units[0][sel], units[1][sel], have)
        if why:
            return f"{why}; dispatching would not give a consistent queue"
        return None


#: Steps that delete or zero bytes of files that may hold records; without a backup
#: nothing keeps those bytes.
_LOSSY_WITHOUT_BACKUP = ("move-stray", "remove-leftover", "move-segment", "zero-tail")


def _guard(root: Path, cfg, rep: VerifyReport, steps: list[Step],
           backup: bool = True) -> list[tuple[Step, str]]:
    """The steps that would remove more than the damage justifies (:mod:`rmqstore.recovery.guard`):

    1. ``zero-tail``/``move-segment`` over CRC-valid records found after the verified end
       (a chain break before intact data, not a torn write);
    2. ``cut-queue``/``rebuild-queue`` dropping units that point at such records, or at
       offsets no segment file holds, or any unit at all when no CommitLog segment holds
       a byte (a missing or empty commitlog/);
    3. without a backup, any step of :data:`_LOSSY_WITHOUT_BACKUP` over bytes holding a
       CRC-valid record wherever it stands (a segment renamed or copied to a stray name
       or place, records whose PHYSICALOFFSET is not their position): with a backup
       they are kept there, without one they are gone.
    """
    refused = _guard_evidence(root, cfg, rep, steps)
    if not backup:
        done = {id(s) for s, _ in refused}
        for s in steps:
            if s.action in _LOSSY_WITHOUT_BACKUP and id(s) not in done:
                why = _no_backup_loss(root, cfg, s)
                if why:
                    refused.append((s, why))
    return refused


def _no_backup_loss(root: Path, cfg, s: Step) -> str | None:
    from ..scan.survivors import first_record_in

    if not s.path:
        return None
    p = Path(s.path) if os.path.isabs(s.path) else root / s.path
    start, stop = (s.offset or 0, (s.offset or 0) + (s.length or 0)) \
        if s.action == "zero-tail" else (0, None)
    hit = first_record_in(p, cfg.max_message_size + 65536, start, stop)
    if hit is None:
        return None
    f, pos = hit
    where = f.relative_to(root) if f.is_relative_to(root) else f
    return (f"{where} holds CRC-valid records (the first at byte {pos}) and without a "
            "backup nothing keeps what this step removes: repair with a backup (the "
            "default), or check the file by hand")


def _guard_evidence(root: Path, cfg, rep: VerifyReport, steps: list[Step]) -> list[tuple[Step, str]]:
    """Rules 1 and 2 of :func:`_guard`."""
    risky = [s for s in steps if s.action in ("zero-tail", "move-segment", "cut-queue",
                                              "rebuild-queue")]
    if not risky:
        return []
    refused = []
    size = cfg.mapped_file_size_commit_log
    with SegmentQueue(cfg.commit_log_dirs, size, kind="commitlog") as q:
        surv = find_survivors(q, rep.end, cfg.max_message_size + 65536)
        for s in risky:
            why = None
            if s.action in ("zero-tail", "move-segment"):
                start = offset_name(Path(s.path).name)
                if start is None:
                    continue
                lo = start + (s.offset or 0) if s.action == "zero-tail" else start
                hi = lo + s.length if s.action == "zero-tail" else start + size
                n, first = surv.within(lo, hi)
                if n:
                    why = (f"it holds {n} CRC-valid record(s) after the end of valid data "
                           f"{rep.end} (first at CommitLog offset {first}): the record chain "
                           "breaks before them (RocketMQ refuses to load such a CommitLog)")
            else:
                qdir = root / s.path
                if qdir.is_dir():
                    try:
                        _, offs = units_from(qdir, cfg.cq_file_size, rep.end)
                    except RmqStoreError:
                        continue
                    why = unit_loss(q, surv, offs, rep.end)
            if why:
                refused.append((s, why))
    return refused


def _index_steps(root: Path, cfg, rep: VerifyReport, by_code) -> list[Step]:
    if not cfg.message_index_enable:
        return []
    names = [p.name for p in _list_index_files(root / "index")]
    drop_from = len(names)
    if rep.forecast and rep.forecast.index_files_deleted:
        drop_from = min(drop_from, names.index(rep.forecast.index_files_deleted[0]))
    for code in _INDEX_DROP:
        for f in by_code.get(code, []):
            n = Path(f.file).name if f.file else ""
            if n in names:
                drop_from = min(drop_from, names.index(n))
    need = drop_from < len(names) or "index-behind" in by_code or "index-missing-keys" in by_code
    if not need:
        return []
    steps = [Step("remove-index", f"index/{n}", "IndexFile the broker would delete or that "
                  "holds bad entries (with every later file); moved to the backup")
             for n in names[drop_from:]]
    steps.append(Step("reindex", "index", "re-dispatch index keys from the end of the last "
                      "IndexFile kept (records there are indexed again, like the broker, §14.7)"))
    return steps


# --- execution ---------------------------------------------------------------------------


def _backup_target(root: Path, requested, resumed) -> Path:
    """The backup directory to use: outside the store, new (or empty)."""
    from .journal import abandoned_begin

    if requested is None:
        return default_backup_dir(root)
    p = _outside(root, Path(requested).resolve())
    if os.path.lexists(p):
        if resumed is not None and Path(resumed.journal).resolve() == p:
            return _unused(p)  # the same --backup as the run just undone: keep that one
        if p.is_dir() and not p.is_symlink() and abandoned_begin(p, root):
            # A run killed before it changed anything: its manifest goes, the folder stays.
            for n in os.listdir(p):
                os.unlink(p / n)
            return p
        if not (p.is_dir() and not p.is_symlink() and not any(p.iterdir())):
            raise RefusedError("already exists and is not empty: choose a new directory for "
                               "the backup", p)
    return p


def _reload(root: Path, cfg: StoreConfig) -> StoreConfig:
    """``cfg`` again after an undo: geometry it took from the files (or defaults) is read
    again, what came from broker.conf or options (or a config made in code) is kept."""
    from ..files.config import GEOMETRY

    def given(name: str) -> bool:
        src = cfg.sources.get(name)
        return name not in GEOMETRY or src is None or src in ("broker.conf", "option")

    keep = {f.name: getattr(cfg, f.name) for f in fields(cfg)
            if f.init and f.name not in ("sources", "store_path_root_dir") and given(f.name)}
    return load_config(root, overrides=keep)


def _outside(root: Path, p: Path) -> Path:
    if p == root or root in p.parents:
        raise RefusedError("the backup directory must be outside the store (repair would "
                           "take it for stray files)", p)
    return p


def _unused(p: Path) -> Path:
    n = 2
    while os.path.lexists(p.with_name(f"{p.name}-{n}")):
        n += 1
    return p.with_name(f"{p.name}-{n}")


def repair(root: str | os.PathLike, *, dry_run: bool = False, backup_dir: str | os.PathLike | None = None,
           backup: bool = True, config: StoreConfig | None = None, clock=None,
           plan: RepairPlan | None = None, processes: int | None = None,
           progress=None, conf: str | os.PathLike | None = None,
           allow_data_loss: bool = False) -> RepairResult:
    """Plan and (unless ``dry_run``) execute the repair of the store at ``root``.

    Under the store lock: an unfinished earlier repair is undone from its backup first
    (:func:`rmqstore.recovery.undo.resume`; ``result.resumed`` says what was found), then the
    store is planned afresh (``plan`` is only used by a dry run), the space checked
    (:func:`~rmqstore.recovery.repair_steps.preflight`), and every step run journaled
    (:mod:`rmqstore.recovery.journal`). ``progress(done, total)`` sees steps as they finish.

    ENOSPC, EIO and other errors of the operating system give :class:`StoreIOError`
    naming the file; the store is then left mid-repair, with its marker, and the next
    ``repair`` finishes the job (or ``rmqstore restore BACKUP`` undoes it).

    Without ``config`` the settings come from ``conf`` (a broker.conf) and the files, read
    after any undo: a half-done store can mislead what the files say.

    A plan with refused steps (``RepairPlan.refused``: they would remove valid data or act
    without evidence) raises :class:`~rmqstore.errors.RefusedError` before anything is
    changed, unless ``allow_data_loss`` (the CLI's ``--allow-data-loss``).
    """
    from . import journal as J
    from .journal_state import find_interrupted
    from . import repair_steps as R
    from ..scan.per_queue import dispatched
    from .undo import resume

    t0 = time.perf_counter()
    root = Path(root).resolve()
    if dry_run:
        cfg = config or load_config(root, conf)
        plan = plan or plan_repair(root, config=cfg, processes=processes, backup=backup)
        return RepairResult(plan, False, None, time.perf_counter() - t0,
                            resumed=find_interrupted(root))
    if backup_dir is not None and backup:
        _outside(root, Path(backup_dir).resolve())  # refused before the lock is taken
    lock_before = J.lock_state(root)
    with ckpt.hold_lock(root):
        # Planned under the lock, so no broker can change the store in between.
        resumed = resume(root, progress=progress)
        cfg = config or load_config(root, conf)
        if config is not None and resumed is not None and resumed.outcome == "undone":
            cfg = _reload(root, config)
        plan = plan_repair(root, config=cfg, processes=processes, backup=backup)
        if not plan.steps:
            return RepairResult(plan, False, None, time.perf_counter() - t0, resumed=resumed)
        if plan.refused and not allow_data_loss:
            raise plan.refusal()
        where = _backup_target(root, backup_dir, resumed) if backup else None
        steps = R.with_abort_steps(plan.steps, ckpt.abort_exists(root))
        ctx = R.StepContext(root, cfg, plan.report, dispatched(plan.report.scan), clock)
        space = R.preflight(ctx, steps, where)
        manifest = {"config": cfg, "lock": lock_before, "space": space,
                    "verify": plan.report.summary(),
                    "unfixed": [{"code": f.code, "file": f.file, "why": why} for f, why in plan.unfixed],
                    "steps": [s.as_dict() for s in steps]}
        j = J.Journal.begin(root, where, manifest)
        try:
            _run_steps(j, ctx, steps, where, progress)
        finally:
            j.close()
    return RepairResult(plan, True, str(where) if where else None, time.perf_counter() - t0,
                        resumed=resumed, steps=steps)


def _forget(j, root: Path) -> bool:
    """No step started: the marker can go, the store is as it was."""
    from .journal import remove_marker

    try:
        j.close()
        remove_marker(root)
        return True
    except RmqStoreError:
        return False


def _run_steps(j, ctx, steps: list[Step], where: Path | None, progress) -> None:
    from . import repair_steps as R

    all_items: list[dict] = []
    k, phase, s = 0, "start", None
    try:
        for k, s in enumerate(steps, 1):
            phase = "save to the backup"
            items = j.start(k, s.action, s.path, R.scope(s, ctx))
            phase = "write"
            R.run(s, ctx, items, j)
            phase = "sync"
            j.done(k, items)
            all_items += items
            if progress:
                progress(k, len(steps))
        phase = "finish"
        j.end(all_items)
    except (OSError, RmqStoreError) as e:
        at = f"in repair step {k} of {len(steps)}, {s.action} {s.path or ''}".rstrip() if s \
            else "in the repair"
        if isinstance(e, OSError):
            err: RmqStoreError = StoreIOError(f"cannot {phase} ({e.strerror or e}) {at}",
                                              e.filename or ctx.root / (s.path or ""), errno=e.errno)
        else:
            e.message = f"{e.message} ({at})"
            err = e
        j.failed(k, str(err))
        if k == 1 and phase == "save to the backup" and _forget(j, ctx.root):
            err.message += "; nothing was changed"
        else:
            err.message += ("; the store is mid-repair: fix the cause, then run `rmqstore "
                            "repair` again to finish it" + (f", or `rmqstore restore {where}` "
                                                             "to undo it" if where else ""))
        raise err from None
    except BaseException as e:  # an interrupt or a bug: leave the journal saying so
        j.failed(k, f"{type(e).__name__}: {e}")
        raise
