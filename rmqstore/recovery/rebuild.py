"""Rebuild ConsumeQueue and IndexFile from the CommitLog (re-dispatch, spec §9).

``rebuild(root)`` scans the CommitLog in parallel worker processes, each segment cut into
32 MiB byte ranges (:func:`rmqstore.scan.runner.scan_chains` over
:mod:`rmqstore.scan.splits`: resync, chain, §3.9 size rule, body CRC, tagsCode and index key hashes, all vectorised in
:mod:`rmqstore.scan.dispatch`; a range that does not continue the previous one's chain is
re-read from where the chain says). Each worker hands back its range's units already
grouped per queue (:mod:`rmqstore.scan.per_queue`), and as the ranges join the chain, in
order, the parent writes their units and index puts into new files in a scratch directory
*inside* the store (:mod:`rmqstore.recovery.rebuild_writers`), with the same bytes as the
broker's dispatch. When the end of valid data is known, the files are kept if they hold
exactly the valid records' units and puts, else written again in bulk
(:func:`~rmqstore.files.consumequeue_writer.build_consume_queue`,
:func:`~rmqstore.files.index_service.build_index`).
The new directories are then swapped in by rename: until the swap the old files are
untouched, so a crash mid-rebuild leaves a usable store (and a scratch directory that
``verify`` reports and ``repair`` removes).

With ``from_offset`` only records at or after it are re-dispatched: ConsumeQueue units
pointing there or later are cut first, and index files that reach it are rebuilt from the
end of the last index file before it (the §7.3 ``offset < endPhyOffset`` skip applies).

``verify`` uses :func:`rmqstore.scan.runner.scan_dispatched`: the same workers, handing back
every field of every record, merged per segment, and their ranges grouped per queue.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files import checkpoint as ckpt
from ..format import layout as L
from ..format.rules import gets_cq_unit
from ..files.config import StoreConfig, config_for
from ..files.consumequeue import UNIT, ConsumeQueue, list_queues
from ..files.consumequeue_writer import ConsumeQueueWriter, build_consume_queue
from ..errors import NotAStoreError, RmqStoreError, StoreIOError, UnsafePathError
from ..files.mapped import io_error
from ..files.index import IndexFile, IndexGeometry, list_index_files
from ..files.index_service import IndexService
from ..files.listing import entries, offset_name
from .rebuild_writers import Live, finish_index
from .rebuild_5x import apply_for_rebuild, kinds_for_rebuild, write_batch_queues
from ..files.names import is_safe_topic, queue_dir, shown, topic_problem
from ..scan.parallel import Child, Done
from ..scan.per_queue import Dispatched, grouped_dispatch, grouped_split
from ..scan.dispatch import StoreScan
from ..scan.runner import Progress, scan_chains, store_timestamp_at
from ..files.segments import SegmentQueue

SCRATCH_PREFIX = ".rmqstore-rebuild-"
#: Shared memory reserved per byte of CommitLog for a grouped part (~24 bytes a record
#: of at least 91 bytes, plus room for records with many keys).
GROUPED_SHARE = 0.4
#: From this many index puts on, the IndexFiles are built in a child beside the queues.
PARALLEL_MIN_KEYS = 200_000

def unsafe_topics(scan: StoreScan) -> list[tuple[str, int]]:
    """(topic, CommitLog offset of its first record) of each topic that cannot be a
    directory name (:func:`rmqstore.files.names.topic_problem`) among the valid records that
    get a ConsumeQueue unit, in CommitLog order."""
    out: dict[str, int] = {}
    for p, k in zip(scan.parts, scan.kept):
        bad = [i for i, t in enumerate(p.topics) if not is_safe_topic(t) and t not in out]
        if not k or not bad:
            continue
        cq = gets_cq_unit(p.sys_flag[:k])
        for i in bad:
            hit = np.flatnonzero((p.topic_id[:k] == i) & cq)
            if len(hit):
                out[p.topics[i]] = int(p.offset[hit[0]])
    return sorted(out.items(), key=lambda x: x[1])


def record_file(cfg: StoreConfig, offset: int) -> tuple[Path, int]:
    """(segment file, position in it) of a CommitLog offset, for messages."""
    size = cfg.mapped_file_size_commit_log
    name = f"{offset - offset % size:020d}"
    dirs = cfg.commit_log_dirs
    path = next((d / name for d in dirs if (d / name).is_file()), dirs[0] / name)
    return path, offset % size


def _refuse_unsafe_topics(cfg: StoreConfig, d: Dispatched) -> None:
    """A rebuild writes every queue: a topic that cannot be a directory name stops it
    before anything is swapped in (spec §6.1 makes topics directory names)."""
    bad = sorted((int(u[1][0]), t) for (t, _), u in d.units.items() if not is_safe_topic(t))
    if bad:
        off, topic = bad[0]
        path, pos = record_file(cfg, off)
        raise UnsafePathError(
            f"the record at CommitLog offset {off} has topic {shown(topic)}: "
            f"{topic_problem(topic)}, so its ConsumeQueue cannot be written"
            + (f" ({len(bad)} such topics)" if len(bad) > 1 else "")
            + "; rebuild refuses (`rmqstore verify` lists them; `repair` leaves them)",
            path, pos)


def _refuse_unit_loss(root: Path, cfg: StoreConfig, scan: StoreScan, ledger=None) -> None:
    """RefusedError when the rebuilt queues would drop units the evidence does not
    condemn (:func:`rmqstore.recovery.guard.unit_loss`): no unit of a rebuilt queue points at or
    past the verified end, so every existing one there is dropped. On a DLedger log
    (``ledger``) any such unit refuses: the survivor search knows no entry framing yet."""
    from ..scan.survivors import find_survivors
    from .guard import refused_error, unit_loss, units_from

    offs = []
    for ref in list_queues(root).queues:
        try:
            offs.append(units_from(ref.path, cfg.cq_file_size, scan.end)[1])
        except RmqStoreError:
            continue  # a queue that cannot be read holds no unit anyone could use
    offs = np.unique(np.concatenate(offs)) if offs else np.zeros(0, np.int64)
    if not len(offs):
        return
    if ledger is not None:
        raise refused_error(f"rebuild of {root}", [
            f"the rebuilt ConsumeQueues would drop {len(offs)} unit(s) pointing at or past the "
            f"end of the DLedger entry chain {scan.end} (DLedger's recovery cuts there); "
            "--allow-data-loss drops them as the broker would"])
    with SegmentQueue(cfg.commit_log_dirs, cfg.mapped_file_size_commit_log,
                      kind="commitlog") as q:
        why = unit_loss(q, find_survivors(q, scan.end, cfg.max_message_size + 65536), offs,
                        scan.end)
    if why:
        raise refused_error(f"rebuild of {root}", [
            f"the rebuilt ConsumeQueues would drop {len(offs)} unit(s) pointing at or past the "
            f"end of valid data {scan.end}: {why}"])


# --- writing ----------------------------------------------------------------------------


def write_consume_queues(cq_dir: Path, d: Dispatched, file_size: int, *, fsync: bool = True) -> int:
    """One directory per queue under ``cq_dir``, built in bulk; returns units written."""
    n = 0
    for (topic, qid), (qo, phy, size, tags) in sorted(d.units.items()):
        n += build_consume_queue(queue_dir(cq_dir, topic, qid, offset=int(phy[0])), qo, phy,
                                 size, tags, file_size, fsync=fsync)
    return n


@dataclass
class RebuildResult:
    messages: int
    bytes: int
    units: int
    index_entries: int
    end: int  # CommitLog end of valid data the rebuild stopped at
    index_files: list[str]
    seconds: float


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    rc = fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    return rc == 0


def swap_in(new: Path, target: Path, old: Path) -> None:
    """Put directory ``new`` at ``target``; the previous ``target`` ends up at ``old``."""
    if target.exists():
        if not _exchange(new, target):
            os.rename(target, old)  # fallback: a short window with no ``target``
            os.rename(new, target)
            return
        os.rename(new, old)  # ``new`` now holds the old files
    else:
        os.rename(new, target)


def _fsync_dir(p: Path) -> None:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rebuild(root: str | os.PathLike, *, consume_queue: bool = True, index: bool = True,
            from_offset: int | None = None, config: StoreConfig | None = None,
            processes: int | None = None, progress: Progress | None = None,
            clock=None, fsync: bool = True, allow_data_loss: bool = False) -> RebuildResult:
    """Re-dispatch ConsumeQueue and/or IndexFile from the CommitLog and swap them in.

    Takes the store lock (:class:`~rmqstore.errors.StoreLockedError` while a broker runs).
    Refuses (:class:`~rmqstore.errors.RefusedError`, before anything is swapped in) when
    the rebuilt queues would drop units that point at CRC-valid records after a break in
    the record chain, at offsets no segment file holds, or at anything while the CommitLog
    holds no valid record (:mod:`rmqstore.recovery.guard`), unless ``allow_data_loss``; and
    (:class:`~rmqstore.errors.UnsafePathError`) when a topic cannot be a directory name or
    ``consumequeue/``/``index/`` is a symbolic link (the swap would replace the link).
    """
    root = Path(root)
    from ..files.dledger import find_ledger_dirs, ledger_for

    if not (root / "commitlog").is_dir() and config is None and not find_ledger_dirs(root):
        raise NotAStoreError("not a RocketMQ store root (no commitlog/)", root)
    cfg = config_for(root, config)
    from ..files.storekind import require_writable

    for op, wanted in (("rebuild --consumequeue", consume_queue), ("rebuild --index", index)):
        if wanted:
            require_writable(cfg, op)
    for name, wanted in (("consumequeue", consume_queue), ("batchconsumequeue", consume_queue),
                         ("index", index)):
        if wanted and (root / name).is_symlink():
            raise UnsafePathError(
                f"a symbolic link (to {os.readlink(root / name)}): rebuild swaps in a whole new "
                "directory by rename, which would replace the link and leave the new files "
                "outside the disk it points to; rebuild refuses. `rmqstore repair` works in "
                "place, or mount the disk at this path", root / name)
    t0 = time.perf_counter()
    ledger = ledger_for(cfg)  # a DLedger CommitLog: its entries are the log (design-14 §1.8)
    try:
        return _rebuild(root, cfg, ledger, consume_queue, index, from_offset, processes,
                        progress, clock, fsync, allow_data_loss, t0)
    finally:
        if ledger is not None:
            ledger.close()


def _rebuild(root: Path, cfg: StoreConfig, ledger, consume_queue: bool, index: bool,
             from_offset: int | None, processes, progress, clock, fsync: bool,
             allow_data_loss: bool, t0: float) -> RebuildResult:
    with ckpt.hold_lock(root):
        from ..files.repair_marker import refuse_if_unfinished

        refuse_if_unfinished(root, "rebuild")
        start = from_offset or 0
        scratch = root / f"{SCRATCH_PREFIX}{os.getpid()}"
        if scratch.exists():
            shutil.rmtree(scratch)
        scratch.mkdir()
        units = entries = 0
        names: list[str] = []
        job = live = None
        swapped: list[str] = []
        try:
            want_index = index and cfg.message_index_enable
            # BatchCQ topics, LMQ dispatch (design-14 D2): decided once, before the scan
            kinds = kinds_for_rebuild(root, cfg, start, dledger=ledger is not None) \
                if consume_queue else None
            index_from = _kept_index_end(root, cfg, start) if index and start else start
            built_cq = built = None
            if ledger is not None:  # DLedger framing: the entries give the record starts
                from ..scan.dledger_scan import dledger_dispatch

                scan, d, d_index = dledger_dispatch(ledger, start, index_from,
                                                    delay_millis=cfg.delay_millis, keys=index)
            else:
                if not start:  # the files are built while the scan runs (rebuild_writers)
                    live = Live(scratch, cfg, clock, queues=consume_queue and not kinds.any,
                                index=want_index)
                task = functools.partial(grouped_split, delay_millis=cfg.delay_millis, keys=index)
                chains = scan_chains(cfg, task, processes=processes, progress=progress,
                                     on_part=live, shared=GROUPED_SHARE)
                dispatch = functools.partial(grouped_dispatch, chains,
                                             cfg.mapped_file_size_commit_log, start, index_from,
                                             store_timestamp_at=store_timestamp_at(cfg))
                # With the files built live, the units and puts need only be counted.
                scan, d, d_index = dispatch(join=live is None)
            if live is not None:
                built_cq, built = live.finish(d, d_index, fsync)
                live = None
                if (consume_queue and built_cq is None) or (want_index and built is None):
                    scan, d, d_index = dispatch()  # the bulk build needs the arrays
            if want_index:
                if built is not None:
                    job = Done(lambda: built)
                else:
                    build = functools.partial(_build_index, root, scratch, d_index, cfg, start,
                                              clock, fsync)
                    # Big enough to pay for a fork: the index is built beside the queues.
                    both = consume_queue and len(d_index.key_hash) >= PARALLEL_MIN_KEYS
                    job = Child(build) if both else Done(build)
            if consume_queue:
                if not allow_data_loss:
                    _refuse_unit_loss(root, cfg, scan, ledger)
                if built_cq is None:
                    _refuse_unsafe_topics(cfg, d)
                variants = apply_for_rebuild(root, cfg, kinds, scan, d)
                units = built_cq if built_cq is not None else \
                    _build_cq(root, scratch, d, cfg, start, fsync)
                if variants is not None and (variants.bcq or (root / "batchconsumequeue").is_dir()):
                    units += write_batch_queues(scratch, cfg, variants, fsync)
                    _swap(scratch, root, "batchconsumequeue")
                _swap(scratch, root, "consumequeue")
                swapped.append("ConsumeQueues")
            if job is not None:
                entries, names = job.result()
                job = None
                _swap(scratch, root, "index")
                swapped.append("IndexFiles")
            _update_checkpoint(root, cfg, d, consume_queue and not start, ledger is not None)
        except BaseException as e:
            _clean_up(live, job, scratch)
            if isinstance(e, (StoreIOError, OSError)):
                raise _stopped(e, scratch, swapped) from None
            raise
        _clean_up(live, job, scratch)
    return RebuildResult(d.messages, d.bytes, units, entries, scan.end, names,
                         time.perf_counter() - t0)


def _clean_up(live, job, scratch: Path) -> None:
    if live is not None:
        live.close()
    if job is not None:
        try:
            job.result()  # reap the child before its files go
        except Exception:  # noqa: BLE001 - the first error is the one raised
            pass
    shutil.rmtree(scratch, ignore_errors=True)


def _stopped(e: OSError | StoreIOError, scratch: Path, swapped: list[str]) -> StoreIOError:
    """A full disk or an I/O error as one line saying what the store holds now: the old
    files (a rebuild swaps new ones in only once they are complete), and whether the
    scratch directory is gone."""
    if not isinstance(e, StoreIOError):
        e = io_error(e, None, "rebuild")
    kept = "; the ConsumeQueues and IndexFiles are as they were" if not swapped else (
        f"; the rebuilt {' and '.join(swapped)} were swapped in, the rest is as it was")
    left = f"; remove the scratch directory {scratch} (repair does)" if scratch.exists() \
        else ""
    return StoreIOError(f"rebuild stopped: {e.message}{kept}{left}", e.path, e.offset,
                        errno=e.errno)


def _swap(scratch: Path, root: Path, name: str) -> None:
    """Swap ``scratch/name`` in for ``root/name`` (the old one ends up in ``scratch``)."""
    new = scratch / name
    _fsync_dir(new)
    swap_in(new, root / name, scratch / f"{name}.old")
    _fsync_dir(root)


def _build_cq(root: Path, scratch: Path, d: Dispatched, cfg: StoreConfig, start: int,
              fsync: bool) -> int:
    new = scratch / "consumequeue"
    new.mkdir()
    if start:
        # Keep units before ``start`` (truncateDirtyLogicFiles, §10.4), then append.
        for ref in list_queues(root).queues:
            dst = new / ref.topic / str(ref.queue_id)
            shutil.copytree(ref.path, dst, symlinks=True)  # links are copied, never followed
            _cut_queue(dst, cfg.cq_file_size, start)
        n = 0
        for (topic, qid), (qo, phy, size, tags) in sorted(d.units.items()):
            with ConsumeQueueWriter(queue_dir(new, topic, qid, offset=int(phy[0])),
                                    cfg.cq_file_size) as w:
                n += w.put_many(qo, phy, size, tags)
                if fsync:
                    w.flush()
    else:
        n = write_consume_queues(new, d, cfg.cq_file_size, fsync=fsync)
    return n


def _cut_queue(qdir: Path, file_size: int, phy: int) -> None:
    """Zero every unit from the first one pointing at or past ``phy`` (dropping whole
    segments that start there), so the queue's end of data is before ``phy``."""
    with ConsumeQueue(qdir, file_size) as cq:
        units = cq.units
        cut = np.flatnonzero((units["commit_log_offset"] >= phy)
                             & (units["size"] != L.CQ_PLACEHOLDER_SIZE))
        first_q = cq.base_offset + int(cut[0]) if len(cut) else None
    if first_q is None:
        return
    byte = first_q * UNIT
    for e in entries(qdir):  # segment files only: nothing else here is the queue's
        s = offset_name(e.name) if e.kind == "file" else None
        if s is None:
            continue
        p = e.path
        if s >= byte:
            p.unlink()
        elif s + file_size > byte:
            with open(p, "r+b") as f:
                f.seek(byte - s)
                f.write(b"\0" * (s + file_size - byte))


def _build_index(root: Path, scratch: Path, d: Dispatched, cfg: StoreConfig, start: int,
                 clock, fsync: bool) -> tuple[int, list[str]]:
    geometry = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
    new = scratch / "index"
    new.mkdir()
    h, phy, ts = d.key_hash, d.key_offset, d.key_timestamp
    if start:
        for p in _kept_index_files(root, geometry, start):
            shutil.copy2(p, new / p.name)
    svc = IndexService(new, geometry, clock=clock, flush_full_files=False)
    try:
        svc.put_hashes(h, phy, ts, skip_stale=bool(start))
    except BaseException:
        svc.close()
        raise
    return finish_index(svc, fsync)


def _kept_index_files(root: Path, geometry: IndexGeometry, start: int) -> list[Path]:
    """Index files, oldest first, up to the first one that reaches ``start``."""
    out = []
    d = root / "index"
    for p in list_index_files(d) if d.is_dir() else []:
        f = IndexFile(p, geometry)
        end = f.header.end_phy_offset
        f.close()
        if end >= start:
            break
        out.append(p)
    return out


def _kept_index_end(root: Path, cfg: StoreConfig, start: int) -> int:
    """Where index re-dispatch starts for ``from_offset=start``: the end of the last kept
    file (its last record is indexed again, as the broker's re-dispatch does, §14.7)."""
    g = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
    kept = _kept_index_files(root, g, start)
    if not kept:
        return 0
    f = IndexFile(kept[-1], g)
    end = f.header.end_phy_offset
    f.close()
    return end


def _update_checkpoint(root: Path, cfg: StoreConfig, d: Dispatched, cq_full: bool,
                       dledger: bool = False) -> None:
    """logicsMsgTimestamp follows the last CQ write; indexMsgTimestamp the last full
    index file (spec §8.1). Other fields are kept, but for a DLedger store the CQ
    dispatch also sets physicMsgTimestamp (design-14 §1.6, §1.8)."""
    path = root / ckpt.CHECKPOINT
    cp = ckpt.read_checkpoint(path) if path.exists() else ckpt.Checkpoint()
    if cq_full and d.last_cq_timestamp:
        cp.logics_msg_timestamp = d.last_cq_timestamp
    elif d.last_cq_timestamp:
        cp.logics_msg_timestamp = max(cp.logics_msg_timestamp, d.last_cq_timestamp)
    if dledger and d.last_cq_timestamp:
        cp.physic_msg_timestamp = cp.logics_msg_timestamp
    full_end = last_full_index_timestamp(root / "index", IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num))
    if full_end is not None:
        cp.index_msg_timestamp = full_end
    ckpt.write_checkpoint(root, cp, version="4.9" if cfg.broker_version == "4.9" else "5.x")


def last_full_index_timestamp(index_dir: Path, geometry: IndexGeometry) -> int | None:
    """endTimestamp of the newest write-full index file, or None when none is full."""
    out = None
    for p in list_index_files(index_dir) if index_dir.is_dir() else []:
        try:
            f = IndexFile(p, geometry)
        except Exception:  # noqa: BLE001 - a broken file is verify's business, not ours
            continue
        if f.is_write_full:
            out = f.header.end_timestamp
        f.close()
    return out


def bench_rebuild(root: str | os.PathLike, *, processes: int | None = None) -> dict:
    """Time a full re-dispatch (body CRC checked, CQ + IndexFile written, page cache, no
    fsync) of the store at ``root``: messages, bytes, seconds (``rmqstore bench rebuild``)."""
    t0 = time.perf_counter()
    r = rebuild(root, processes=processes, fsync=False)
    return {"messages": r.messages, "bytes": r.bytes, "seconds": time.perf_counter() - t0}
