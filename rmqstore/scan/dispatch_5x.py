"""What RocketMQ 5.x dispatch writes beyond a 4.x store's ConsumeQueue units (design-14 D2):
BatchConsumeQueue units for BatchCQ topics (§4) and LMQ units for multi-dispatched records
(§5), derived from the bulk dispatch data (:class:`~rmqstore.scan.per_queue.Dispatched`).

:func:`store_queue_kinds` decides once per store which topics are BatchCQ and whether LMQ
dispatch is on (from the files, then broker.conf; design-14 D5, D6); a store with neither
never enters :func:`apply_5x`, so 4.x stores keep their bulk path untouched. The records
of BatchCQ topics and, with LMQ on, of the topics LMQ may dispatch are read one by one for
their properties (``INNER_NUM``/``INNER_BASE``, ``INNER_MULTI_*``); the rules themselves
are :mod:`rmqstore.format.rules`'.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files.batchconsumequeue import FOLDER as BCQ_FOLDER, bcq_units
from ..files.listing import entries, offset_name, open_regular
from ..format.record import is_inner_batch
from ..format.rules import (INNER_MULTI_QUEUE_OFFSET, LMQ_PREFIX, bcq_base_and_num,
                            lmq_targets, topic_allows_lmq)

_LMQ_KEY = INNER_MULTI_QUEUE_OFFSET.encode() + b"\x01"


@dataclass
class QueueKinds:
    """Which dispatch variants a store uses, decided once (design-14 D5, D6)."""

    batch_topics: dict[str, str] = field(default_factory=dict)  # topic -> evidence
    lmq: bool | None = False  # multi-dispatch on, off, or None: undetermined
    enable_lmq: bool = False  # %LMQ% names go to queue 0
    lmq_evidence: str = ""

    @property
    def any(self) -> bool:
        return bool(self.batch_topics) or bool(self.lmq)


def topic_queue_types(root: Path) -> tuple[str, dict[str, str]] | None:
    """(file name, {topic: queue.type}) from ``config/topics.json`` (or its ``.bak`` when the
    first is missing or unreadable, as the broker falls back): every topic the table lists,
    ``SimpleCQ`` when its attributes name no queue type (``TopicAttributes`` @5.x); None
    when neither file reads."""
    for name in ("topics.json", "topics.json.bak"):
        p = root / "config" / name
        try:
            if not p.is_file() or p.stat().st_size > 64 << 20:
                continue
            table = json.loads(p.read_text(encoding="utf-8", errors="replace"))["topicConfigTable"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: try the backup, as the broker does
        out = {}
        for topic, tc in table.items() if isinstance(table, dict) else ():
            attrs = tc.get("attributes") if isinstance(tc, dict) else None
            kind = attrs.get("queue.type") if isinstance(attrs, dict) else None
            out[topic] = kind if isinstance(kind, str) else "SimpleCQ"
        return name, out
    return None


def configured_batch_topics(root: Path) -> dict[str, str]:
    """Topics ``config/topics.json`` (or its ``.bak``) gives ``queue.type=BatchCQ``."""
    got = topic_queue_types(root)
    if got is None:
        return {}
    name, types = got
    return {t: f"config/{name} queue.type=BatchCQ" for t, k in types.items() if k == "BatchCQ"}


def store_queue_kinds(root: str | Path, cfg, scan=None) -> QueueKinds:
    """BatchCQ topics: ``batchconsumequeue/<topic>/`` exists, ``config/topics.json`` says so,
    or (with ``scan``) a valid record of the topic is an inner batch. LMQ dispatch: on when
    ``consumequeue/%LMQ%*`` exists, else as broker.conf's ``enableMultiDispatch`` says, else
    off (:func:`lmq_undetermined` tells whether the records say otherwise)."""
    root = Path(root)
    out = QueueKinds()
    for e in entries(root / BCQ_FOLDER) if (root / BCQ_FOLDER).is_dir() else []:
        if e.kind == "dir":
            out.batch_topics.setdefault(e.name, f"{BCQ_FOLDER}/{e.name}/ exists")
    for t, why in configured_batch_topics(root).items():
        out.batch_topics.setdefault(t, why)
    if scan is not None:
        for p, k in zip(scan.parts, scan.kept):
            if k and is_inner_batch(p.sys_flag[:k]).any():
                for i in np.unique(p.topic_id[:k][is_inner_batch(p.sys_flag[:k])]).tolist():
                    out.batch_topics.setdefault(p.topics[i], "its records are inner batches")
    cq = root / "consumequeue"
    lmq_dirs = [e.name for e in entries(cq) if e.kind == "dir" and e.name.startswith(LMQ_PREFIX)] \
        if cq.is_dir() else []
    given = cfg.sources.get("enable_multi_dispatch") is not None
    if lmq_dirs:
        out.lmq, out.enable_lmq = True, True
        out.lmq_evidence = f"consumequeue/{lmq_dirs[0]} exists"
    elif given:
        out.lmq = cfg.enable_multi_dispatch
        out.enable_lmq = cfg.enable_lmq
        out.lmq_evidence = f"broker.conf enableMultiDispatch={str(cfg.enable_multi_dispatch).lower()}"
    if cfg.sources.get("enable_lmq") is not None:
        out.enable_lmq = cfg.enable_lmq
    return out


def lmq_undetermined(cfg, kinds: QueueKinds) -> str | None:
    """Where a record carries ``INNER_MULTI_QUEUE_OFFSET`` while neither the files nor
    broker.conf say whether LMQ dispatch was on (design-14 D6): '<segment> @ <offset>', or
    None. ConsumeQueues without ``%LMQ%`` ones say off; only when ``consumequeue/`` is gone
    is the CommitLog searched (a byte search, no per-record work)."""
    if kinds.lmq is not None and (kinds.lmq or kinds.lmq_evidence):
        return None
    cq = Path(cfg.root) / "consumequeue"
    if cq.is_dir() and any(e.kind == "dir" for e in entries(cq)):
        return None  # queues without %LMQ% ones: the broker did not multi-dispatch
    for d in cfg.commit_log_dirs:
        for e in entries(d) if d.is_dir() else []:
            if e.kind != "file" or offset_name(e.name) is None or e.size == 0:
                continue
            with open_regular(e.path) as f:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    at = mm.find(_LMQ_KEY)
            if at >= 0:
                return f"{e.path} @ {at}"
    return None


@dataclass
class Variants:
    """The 5.x units of a store: BCQ units per queue, LMQ units added to ``d.units``."""

    bcq: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    bcq_skipped: list[tuple[int, str]] = field(default_factory=list)  # (offset, why)
    lmq_units: int = 0
    lmq_problems: list[tuple[int, str]] = field(default_factory=list)

    @property
    def bcq_count(self) -> int:
        return sum(len(u) for u in self.bcq.values())


def apply_5x(d, kinds: QueueKinds, read_at) -> Variants:
    """Move the units of BatchCQ topics out of ``d.units`` into BCQ units and add the LMQ
    units to ``d.units`` (in place; ``d.unit_count`` follows). ``read_at(offset)`` gives
    the decoded record there (:meth:`~rmqstore.files.commitlog.CommitLog.read_at`)."""
    out = Variants()
    for key in sorted(k for k in d.units if k[0] in kinds.batch_topics):
        qo, phy, size, tags = d.units.pop(key)
        d.unit_count -= len(qo)
        ts = np.zeros(len(qo), np.int64)
        base = np.zeros(len(qo), np.int64)
        num = np.zeros(len(qo), np.int64)
        for i, (q, off) in enumerate(zip(qo.tolist(), phy.tolist())):
            m = read_at(off)
            ts[i] = m.store_timestamp
            base[i], num[i] = bcq_base_and_num(m.properties, q)
            if base[i] < 0 or num[i] < 0:
                out.bcq_skipped.append((off, f"{key[0]}/{key[1]}: INNER_BASE/INNER_NUM "
                                        f"{m.properties.get('INNER_BASE')!r}/"
                                        f"{m.properties.get('INNER_NUM')!r} give no unit"))
        units = bcq_units(phy, size, tags, ts, base, num)
        if len(units):
            out.bcq[key] = units
    if kinds.lmq:
        extra: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        for (topic, qid), (qo, phy, size, tags) in list(d.units.items()):
            if not topic_allows_lmq(topic):
                continue
            for off, sz, tg in zip(phy.tolist(), size.tolist(), tags.tolist()):
                m = read_at(off)
                got = lmq_targets(topic, m.properties, qid, enable_lmq=kinds.enable_lmq)
                if got.problem:
                    out.lmq_problems.append((off, got.problem))
                for name, q, o in got:
                    extra.setdefault((name, q), []).append((off, o, sz, tg))
        for key, rows in extra.items():
            rows.sort()  # CommitLog order, as dispatch writes them
            phy = np.array([r[0] for r in rows], np.int64)
            keep = np.r_[True, phy[1:] > phy[:-1]]  # one unit per record per queue
            cols = [np.array([r[j] for r, k in zip(rows, keep) if k], np.int64) for j in range(4)]
            new = (cols[1], cols[0], cols[2].astype(np.int32), cols[3])
            if key in d.units:  # an LMQ name that is also a topic of its own: merged in order
                old = d.units[key]
                both = [np.concatenate([a.astype(np.int64), b.astype(np.int64)]) for a, b in zip(old, new)]
                order = np.argsort(both[1], kind="stable")
                new = tuple(x[order] for x in both)
            else:
                new = (new[0], new[1], new[2].astype(np.int64), new[3])
            d.units[key] = _like(new)
            out.lmq_units += int(keep.sum())
            d.unit_count += int(keep.sum())
    return out


def _like(cols):
    """(queue offsets, CommitLog offsets, sizes, tagsCodes) as the grouped dispatch gives them."""
    qo, phy, size, tags = cols
    return (qo.astype(np.int64), phy.astype(np.int64), size.astype(np.int32), tags.astype(np.int64))


__all__ = ["QueueKinds", "Variants", "store_queue_kinds", "apply_5x", "lmq_undetermined",
           "configured_batch_topics"]
