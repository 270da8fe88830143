"""Verify a store offline: findings as data, never a print (like diskcache's ``check``).

``verify(root)`` returns a :class:`VerifyReport` whose :class:`Finding` list says what is
wrong, where (file and byte position in that file), and why it matters. It reads only:
files are mapped ``ACCESS_READ`` and nothing is created, so it is safe on a live store
(a running broker is reported, since files may change underneath).

What is checked (each finding code is documented in :data:`CODES`):

* CommitLog (spec §2-§4, §10): segment names, sizes and gaps; the TOTALSIZE chain, magic,
  the §3.9 size rule and BODYCRC of every record; PHYSICALOFFSET == position (§10.5);
  BLANK records at segment ends; where valid data ends and what lies after it (zeros, a
  torn record, garbage), like redis-check-aof's "ok up to".
* ConsumeQueue (§6.1, :mod:`rmqstore.recovery.verify_cq`): every unit against the record it points
  at (size, topic, queue id, queue offset, tagsCode as dispatch computes it), holes,
  duplicates, units past the CommitLog end, units missing for records at the tail.
* IndexFile (§7, :mod:`rmqstore.recovery.verify_index`): headers against entries, chains (no
  cycles, nothing beyond indexCount), entries pointing at records, coverage; with
  ``deep=True`` every key of every message is looked up and every entry explained.
* checkpoint, abort and lock (§8, §10): what a broker would do on its next start.

Cost: one parallel bulk scan of the CommitLog (CRC included), the same one ``rebuild``
uses (its workers also group their ranges per queue), plus one pass over each
ConsumeQueue and IndexFile (compiled; big IndexFiles' slots and chains are checked beside
the scan); ``deep`` adds a sort of all index entries.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..files import checkpoint as ckpt
from ..format import layout as L
from ..format.record import head_store_timestamp
from ..files.commitlog import check_record
from ..files.config import SEGMENT_NAME, StoreConfig, config_for
from ..errors import NotAStoreError
from ..files.listing import entries, odd_entry
from ..scan.dispatch import StoreScan
from ..files.segments import SegmentQueue
from ..files.sparse import data_extents
from .findings import CODES, ERROR, INFO, WARNING, Collector, Finding
from .verify_prop_crc import check_prop_crc, uses_prop_crc

@dataclass
class Forecast:
    """What a broker would do on its next start (spec §10)."""

    mode: str  # "normal" (no abort file) or "abnormal"
    start_offset: int  # first segment its recovery scan reads
    cut_at: int  # its processOffset: where it would truncate the CommitLog
    index_files_deleted: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    store: str
    findings: list[Finding]
    min_offset: int
    end: int  # end of valid CommitLog data
    end_reason: str
    messages: int
    bytes: int
    forecast: Forecast | None
    seconds: float = 0.0
    scan: StoreScan | None = field(default=None, repr=False)
    #: What dispatch writes for the valid records (:class:`~rmqstore.scan.per_queue.Dispatched`),
    #: with the 5.x variants applied: BatchCQ topics' units moved out, LMQ units added
    #: (``variants``, a :class:`~rmqstore.scan.dispatch_5x.Variants`, or None without them).
    dispatch: object = field(default=None, repr=False)
    variants: object = field(default=None, repr=False)

    def dispatched(self):
        """:attr:`dispatch`, or made from :attr:`scan` for a report built without it."""
        if self.dispatch is None and self.scan is not None:
            from ..scan.per_queue import dispatched

            self.dispatch = dispatched(self.scan)
        return self.dispatch

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity != INFO]

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {"store": self.store, "ok": self.ok, "minOffset": self.min_offset,
                "validUpTo": self.end, "endReason": self.end_reason, "messages": self.messages,
                "bytes": self.bytes, "errors": sum(f.severity == ERROR for f in self.findings),
                "warnings": sum(f.severity == WARNING for f in self.findings),
                "nextStart": asdict(self.forecast) if self.forecast else None}


# --- CommitLog -----------------------------------------------------------------------------


def _tail(buf, pos: int, limit: int, path=None) -> tuple[str, str, int]:
    """(kind, description, bytes) of what follows valid data in a segment. With the
    segment's ``path`` only its data extents are read: the preallocated rest of a 1 GiB
    segment is a hole, zeros by definition (SEEK_DATA; the whole range where the file
    system cannot tell)."""
    u8 = np.frombuffer(buf, np.uint8, count=limit)
    extents = [(pos, limit)]
    if path is not None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            try:
                extents = list(data_extents(fd, pos, limit))
            except OSError:
                pass
            finally:
                os.close(fd)
    count, last = 0, 0
    for a, b in extents:
        nz = np.flatnonzero(u8[a:b])
        if len(nz):
            count += len(nz)
            last = a + int(nz[-1]) + 1 - pos
    if not count:
        return "zeros", f"{limit - pos} bytes of zeros", limit - pos
    if limit - pos >= 8:
        size, magic = L.BLANK_STRUCT.unpack_from(buf, pos)
        if magic in L.MESSAGE_MAGICS and 0 < size <= limit - pos:
            c = check_record(buf, pos, limit, check_crc=True)
            why = c.reason or c.status.value
            return "torn", f"a torn record (header says {size} bytes; {why})", last
    return "garbage", f"{count} non-zero bytes of garbage within the next {last} bytes", last


def check_commitlog(c: Collector, queue: SegmentQueue, scan: StoreScan, cp, abort: bool) -> dict:
    """CommitLog findings; returns facts later checks use (the debris rule)."""
    size = queue.segment_size
    facts = {"debris": None}
    for p in queue.problems:
        if p.code in ("symlink", "special-file"):
            c.add(p.code, p.path, None, p.detail)
            continue
        code = "stray-file" if p.code == "stray-file" else "commitlog-segment"
        c.add(code, p.path, None, f"{p.code}: {p.detail}" + (
            "; the broker cannot load a CommitLog holding it" if code == "stray-file" else ""))
    segs = queue.segments
    if not segs:
        return facts
    damaged = set(scan.damaged)
    for off in sorted(damaged):
        seg = segs[_seg_index(segs, off)]
        c.add("record-body-crc", seg.path, off - seg.start,
              f"record at CommitLog offset {off}: body fails its CRC, but valid records follow; "
              "a broker's recovery scanning here would cut the log at this record and drop every "
              "later message (repair accepts the damaged body by rewriting BODYCRC)",
              commitLogOffset=off)
    for p, k in zip(scan.parts, scan.kept):
        bad = np.flatnonzero(p.physical_offset[:k] != p.offset[:k])
        if len(bad):
            o = int(p.offset[bad[0]])
            seg = segs[_seg_index(segs, o)]
            c.add("record-physical-offset", seg.path, o - seg.start,
                  f"{len(bad)} record(s) in this segment store a PHYSICALOFFSET different from "
                  f"their position, first at {o} (stores {int(p.physical_offset[bad[0]])}); "
                  "stale or copied data (spec §10.5)", commitLogOffset=o, count=len(bad))
    end, i = scan.end, scan.end_segment
    seg = segs[i]
    c.add("commitlog-end", None, None,
          f"CommitLog valid from {queue.min_offset} up to {end} ({scan.count} messages); "
          f"stops: {scan.reason}", commitLogOffset=end)
    why = scan.valid_end.reason
    if why == "missing segment":
        nxt = segs[i + 1]
        c.add("commitlog-gap", nxt.path, 0,
              f"segment {seg.path.name} ends at {seg.end} but the next file starts at {nxt.start}: "
              f"the segment(s) in between are missing; everything from {end} on is unreachable")
    pos = end - seg.start
    if why not in ("blank", "end", "missing segment") and pos < seg.readable_size:
        buf = seg.buffer()
        kind, desc, nbytes = _tail(buf, pos, seg.readable_size, seg.path)
        if kind != "zeros":
            ts = head_store_timestamp(buf, pos, seg.readable_size) if kind == "torn" else None
            # Debris: RocketMQ's recovery cut this record and left its bytes (§10.4); after a
            # clean shutdown the checkpoint's logicsMsgTimestamp is the last dispatched
            # record's time, so a later record was never part of the store it served.
            # Only a checkpoint that describes this store tells that: its logicsMsgTimestamp
            # is at least the newest valid record's (a stale or bogus one says nothing, and
            # repair, rewriting it, would find the tail again: not idempotent).
            newest = int(scan.records("store_timestamp").max()) if scan.count else None
            if kind == "torn" and not abort and cp is not None and ts is not None \
                    and ts > cp.logics_msg_timestamp \
                    and (newest is None or cp.logics_msg_timestamp >= newest):
                facts["debris"] = (end, int.from_bytes(buf[pos:pos + 4], "big", signed=True))
                c.add("commitlog-debris", seg.path, pos,
                      f"valid data ends at {end}; after it: {desc}, stored after the checkpoint's "
                      "last dispatched message: left by an earlier recovery, ignored by brokers",
                      commitLogOffset=end)
            else:
                c.add("commitlog-tail", seg.path, pos,
                      f"valid data ends at {end}; after it: {desc}. A broker truncates here "
                      "(spec §10.5); repair zeroes these bytes after backing them up",
                      commitLogOffset=end, kind=kind, bytes=nbytes)
        if seg.readable_size < size:
            c.add("commitlog-segment", seg.path, seg.readable_size,
                  f"segment is {seg.readable_size} bytes, not {size}: truncated (the broker "
                  "refuses to load it; repair extends it with zeros)")
    for j in range(i + 1, len(segs)):
        s = segs[j]
        if why == "missing segment" or s.file_size == 0:
            pass
        u8 = np.frombuffer(s.buffer(), np.uint8, count=s.readable_size) if s.readable_size else np.zeros(0, np.uint8)
        nz = int(np.count_nonzero(u8))
        del u8
        if nz == 0:
            c.add("commitlog-preallocated", s.path, None,
                  "all-zero segment after the end of data (preallocated); the broker deletes it "
                  "on start, repair moves it to the backup")
        else:
            part = scan.parts[j] if j < len(scan.parts) else None
            n = len(part) if part is not None else 0
            c.add("commitlog-unreachable", s.path, 0,
                  f"segment after the end of valid data ({end}) holds {nz} non-zero bytes "
                  f"({n} well-formed record(s) on its chain); the broker deletes it on start; "
                  "repair moves it to the backup")
    return facts


def _seg_index(segs, off: int) -> int:
    starts = [s.start for s in segs]
    return max(0, int(np.searchsorted(starts, off, side="right")) - 1)


def check_topics(c: Collector, queue: SegmentQueue, scan: StoreScan) -> None:
    """Valid records whose topic cannot be a directory name (spec §6.1 makes it one). The
    topic is not covered by the CRC (§3.1): one flipped bit turns ``o`` into ``/``."""
    from ..files.names import shown, topic_problem
    from .rebuild import unsafe_topics

    for topic, off in unsafe_topics(scan):
        seg = queue.segments[_seg_index(queue.segments, off)]
        c.add("record-topic-unsafe", seg.path, off - seg.start,
              f"the record at CommitLog offset {off} has topic {shown(topic)}: "
              f"{topic_problem(topic)}; it cannot be a ConsumeQueue directory. The record is "
              "kept; rebuild refuses and repair leaves its queue unwritten (likely damage: "
              "topic bytes are not covered by the CRC)", commitLogOffset=off, topic=topic)


def stray_dirs(c: Collector, root: Path) -> None:
    from .rebuild import SCRATCH_PREFIX

    for e in entries(root):
        p = e.path
        if not e.name.startswith(SCRATCH_PREFIX):
            continue
        odd = odd_entry(e)
        if odd is not None:
            c.add(odd[0], p, None, odd[1])
        else:
            c.add("rebuild-leftover", p, None,
                  "left by an interrupted `rmqstore rebuild`; the store's own files are intact "
                  "(the swap had not happened); repair removes it")


def interrupted_repair(c: Collector, root: Path) -> None:
    from ..errors import RmqStoreError
    from ..files.repair_marker import MARKER, read_marker

    if not os.path.lexists(root / MARKER):
        return
    try:
        m = read_marker(root)
        where, op = m["journal"], m.get("operation", "repair")
    except RmqStoreError:
        where, op = None, "repair"
    undo = f" or `rmqstore restore {where}` to undo it" if where and op == "repair" else ""
    c.add("repair-interrupted", root / MARKER, None,
          f"an rmqstore {op} of this store did not finish (journal {where or 'unreadable'}); "
          f"the store may be half-repaired: run `rmqstore repair` to finish it{undo}")


# --- the whole store ---------------------------------------------------------------------


def verify(root: str | os.PathLike, *, deep: bool = False, config: StoreConfig | None = None,
           check_crc: bool = True, processes: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the store at ``root`` and return every finding. Read-only."""
    from ..files.dledger import ledger_for
    from ..files.storekind import refuse_operation
    from ..scan.runner import scan_dispatched
    from .verify_bcq import check_5x_queues
    from .verify_cq import check_consume_queues
    from .verify_dledger import verify_dledger
    from .verify_index import ChainCheck, check_index
    from .verify_state import check_state

    t0 = time.perf_counter()
    root = Path(root)
    if not root.is_dir() or not any((root / m).exists() for m in
                                    ("commitlog", "consumequeue", "index", "checkpoint")):
        raise NotAStoreError("not a RocketMQ store root (no commitlog, consumequeue, index "
                             "or checkpoint)", root)
    cfg = config_for(root, config)
    refuse_operation(cfg, "verify")
    c = Collector(root)
    for d in cfg.features:  # never a silent "ok" on what is not checked
        if not d.feature.verified:
            c.add("store-feature", None, None, d.message, feature=d.feature.key)
    for name, why in cfg.undetermined.items():
        if name != "max_index_num":  # one finding for the IndexFile pair
            c.add("geometry-unknown", None, None, why, setting=name)
    abort = ckpt.abort_exists(root)
    cp = None
    if (root / ckpt.CHECKPOINT).exists():
        try:
            cp = ckpt.read_checkpoint(root)
        except Exception as e:  # noqa: BLE001 - reported as a finding below
            c.add("checkpoint", root / ckpt.CHECKPOINT, 0, f"unreadable: {e}")
    log = ledger_for(cfg)
    if log is not None:  # a DLedger CommitLog: entry framing (design-14 §1.10)
        with log:
            scan, d, forecast, v = verify_dledger(c, root, cfg, log, cp, abort, deep=deep,
                                                  check_crc=check_crc, progress=progress)
            stray_dirs(c, root)
            interrupted_repair(c, root)
            return VerifyReport(str(root), c.findings, log.min_offset, scan.end, scan.reason,
                                d.messages, d.bytes, forecast, time.perf_counter() - t0, scan,
                                d, v)
    with ChainCheck(root, cfg, processes) as chains, SegmentQueue(
            cfg.commit_log_dirs, cfg.mapped_file_size_commit_log, kind="commitlog") as q:
        scan, d = scan_dispatched(cfg, check_crc=check_crc, processes=processes,
                                  progress=progress, queue=q)
        facts = check_commitlog(c, q, scan, cp, abort)
        if uses_prop_crc(cfg):
            check_prop_crc(c, q, scan, forced=cfg.force_verify_prop_crc and cfg.check_crc_on_recover)
        check_topics(c, q, scan)
        v = check_5x_queues(c, root, cfg, scan, d, q)  # BCQ and LMQ (design-14 D2)
        check_consume_queues(c, root, cfg, scan, d, q.min_offset, facts)
        check_index(c, root, cfg, scan, d, deep=deep, chains=chains)
        forecast = check_state(c, root, cfg, q, scan, d, cp, abort)
        stray_dirs(c, root)
        interrupted_repair(c, root)
        report = VerifyReport(str(root), c.findings, q.min_offset, scan.end, scan.reason,
                              d.messages, d.bytes, forecast, time.perf_counter() - t0, scan,
                              d, v)
    return report


def bench_verify(root: str | os.PathLike, *, deep: bool = False, processes: int | None = None) -> dict:
    """Time :func:`verify` (with CRC) on a store: messages, bytes, seconds (``rmqstore bench``)."""
    t0 = time.perf_counter()
    r = verify(root, deep=deep, processes=processes)
    secs = time.perf_counter() - t0
    return {"messages": r.messages, "bytes": r.bytes, "seconds": secs, "ok": r.ok}


__all__ = ["CODES", "Finding", "Forecast", "VerifyReport", "verify", "bench_verify",
           "ERROR", "WARNING", "INFO", "SEGMENT_NAME"]
