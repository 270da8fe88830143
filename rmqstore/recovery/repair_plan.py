"""The plan of a repair: what a broker's recovery would do (spec §10), as explicit steps.

``plan_repair(root)`` runs :func:`rmqstore.recovery.verify.verify` and turns its problems into
:class:`~rmqstore.recovery.repair_steps.Step` objects (data; ``rmqstore repair --dry-run``
prints them): CommitLog steps here, ConsumeQueue steps from
:mod:`rmqstore.recovery.repair_queues`, IndexFile steps here, then the checkpoint and
``abort``. Only steps that resolve their finding are planned; the rest is listed in
``RepairPlan.unfixed`` with the reason, and steps that would remove valid data in
``RepairPlan.refused`` (:mod:`rmqstore.recovery.repair_refusals`).
:mod:`rmqstore.recovery.repair` runs the plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RefusedError
from ..files import checkpoint as ckpt
from ..files.config import StoreConfig, config_for
from ..files.index import list_index_files
from ..files.listing import offset_name
from ..format import layout as L
from .findings import ERROR
from .guard import refused_error
from .repair_bcq import BatchQueuePlan
from .repair_queues import QueuePlan, queue_of
from .repair_refusals import refused_steps
from .repair_steps import Step
from .verify import VerifyReport, verify

_INDEX_DROP = {"index-file", "index-header", "index-chain", "index-orphan", "index-beyond-end",
               "index-bad-pointer", "index-gap"}


@dataclass
class RepairPlan:
    store: str
    steps: list[Step]
    report: VerifyReport
    unfixed: list = field(default_factory=list)  # (finding, why): problems no step addresses
    #: (step, why) for each step that would remove valid data or act without evidence:
    #: :func:`~rmqstore.recovery.repair.repair` refuses the plan unless ``allow_data_loss`` (``--allow-data-loss``).
    refused: list = field(default_factory=list)

    def refusal(self) -> RefusedError | None:
        """The error :func:`~rmqstore.recovery.repair.repair` raises for this plan without the override."""
        if not self.refused:
            return None
        return refused_error(f"repair of {self.store}",
                             [f"{s.action} {s.path}: {why}" for s, why in self.refused])


def plan_repair(root: str | os.PathLike, *, config: StoreConfig | None = None,
                report: VerifyReport | None = None, processes: int | None = None,
                backup: bool = True) -> RepairPlan:
    """The steps :func:`~rmqstore.recovery.repair.repair` would take, from a fresh verify unless one is given.

    Only steps whose execution resolves their finding are planned (so a second run has
    nothing to do); what no step can fix is in ``unfixed`` with the reason, and steps
    that would remove valid data are listed in ``refused`` (see :mod:`rmqstore.recovery.guard`);
    without a ``backup`` that includes every step deleting CRC-valid records."""
    from ..files.storekind import require_writable

    root = Path(root)
    cfg = config_for(root, config)
    require_writable(cfg, "repair")  # a plan from guessed geometry would destroy data
    rep = report or verify(root, config=cfg, processes=processes)
    steps: list[Step] = []
    unfixed: list = []
    by_code: dict[str, list] = {}
    for f in rep.findings:
        by_code.setdefault(f.code, []).append(f)
    queues = QueuePlan(root, cfg, rep, by_code, unfixed)
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
    steps += BatchQueuePlan(root, cfg, rep, by_code, unfixed).steps()
    idx_steps = _index_steps(root, cfg, rep, by_code)
    steps += idx_steps
    steps = _without_guessed_geometry(root, cfg, rep, steps, unfixed)
    _lmq_determined(root, cfg, steps)
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
    refused = refused_steps(root, cfg, rep, steps, backup)
    from . import repair_dledger as DL  # a DLedger store: never dledger-*/ (design-14 D3)

    if DL.is_dledger(rep):  # the guard's plain-framing evidence says nothing of these
        refused = [(s, w) for s, w in refused if s.action in DL.STEPS] + DL.refused(rep, steps)
    unfixed += DL.unfixed(rep)
    return RepairPlan(str(root), steps, rep, unfixed, refused)


def _lmq_determined(root: Path, cfg, steps: list[Step]) -> None:
    """Refuse queue steps when a record carries ``INNER_MULTI_QUEUE_OFFSET`` but neither
    ``consumequeue/%LMQ%*`` nor broker.conf says whether the broker dispatched it: the
    LMQ queues would be left out or made up (design-14 D6, as ``rebuild`` refuses)."""
    from ..errors import ConfigError
    from ..files.storekind_profile import profile
    from ..scan.dispatch_5x import lmq_undetermined, store_queue_kinds

    if not any(s.action in _WRITES_CQ for s in steps):
        return
    kinds = store_queue_kinds(root, cfg)
    if kinds.lmq_evidence or profile(root, cfg.commit_log_dirs).family == "4.9":
        return  # the rule rebuild applies (rebuild_5x.kinds_for_rebuild)
    where = lmq_undetermined(cfg, kinds)
    if where is not None:
        raise ConfigError(
            "repair refused: a record carries INNER_MULTI_QUEUE_OFFSET (LMQ, "
            f"{where}) and neither consumequeue/%LMQ%* nor broker.conf says whether the "
            "broker dispatched it: pass --config with enableMultiDispatch (and enableLmq) "
            "as the broker had them (nothing was changed)", root)


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
            q = queue_of(f.file) if f.file else None
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
    "prop-crc-missing": "adding a __CRC32# property would move every later record; run the "
                        "broker without forceVerifyPropCRC to keep these messages",
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
    for f in by_code.get("prop-crc-mismatch", []):
        if f.severity == ERROR:  # forceVerifyPropCRC: the broker would cut the log here
            steps.append(Step("fix-prop-crc", f.file, "the __CRC32# property CRC does not match "
                              "the record: rewrite its digits so a broker with "
                              "forceVerifyPropCRC keeps every later message (the record's "
                              "bytes stay as they are)", f.offset, L.PROP_CRC_ENTRY_SIZE,
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


def _index_steps(root: Path, cfg, rep: VerifyReport, by_code) -> list[Step]:
    if not cfg.message_index_enable:
        return []
    names = [p.name for p in list_index_files(root / "index")]
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
