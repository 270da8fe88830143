"""verify on a DLedger store (design-14 §1.5, §1.7, §1.10): the entry chain as DLedger's
recovery walks it, the entry index against the data, the record inside each entry, and
what the next start of RocketMQ on DLedger would do. The ConsumeQueue and IndexFile checks
are the plain store's (:mod:`rmqstore.recovery.verify_cq`, :mod:`rmqstore.recovery.verify_index`),
run on the bulk scan in DLedger framing (:mod:`rmqstore.scan.dledger_scan`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files import checkpoint as ckpt
from ..files.dledger_chain import CLEAN_ENDS
from ..files.index import IndexFile, IndexGeometry, list_index_files
from ..format import layout as L
from ..format.dledger_layout import DLEDGER_BODY_OFFSET, DLEDGER_MAGIC
from ..format.record import head_store_timestamp
from .findings import ERROR
from ..scan.dledger_scan import DLedgerScan, dledger_scan


def verify_dledger(c, root: Path, cfg, log, cp, abort: bool, *, deep: bool, check_crc: bool,
                   progress=None):
    """Every DLedger finding of the store at ``root`` into ``c``; returns (scan,
    dispatched, forecast, 5.x variants) for :class:`~rmqstore.recovery.verify.VerifyReport`."""
    from ..scan.per_queue import dispatched
    from .verify import check_topics
    from .verify_bcq import check_5x_queues
    from .verify_cq import check_consume_queues
    from .verify_index import check_index
    from .verify_prop_crc import check_prop_crc, uses_prop_crc
    from .verify_state import check_checkpoint, check_lock

    scan = dledger_scan(log, check_crc=check_crc, delay_millis=cfg.delay_millis)
    if progress:
        total = sum(s.readable_size for s in log.data_files)
        progress(total, total)
    check_ledger(c, log, scan)
    if uses_prop_crc(cfg):  # the records inside are CommitLog records (spec §3.8)
        check_prop_crc(c, log.files.data, scan,
                       forced=cfg.force_verify_prop_crc and cfg.check_crc_on_recover)
    check_topics(c, log.files.data, scan)
    d = dispatched(scan)
    # BatchConsumeQueues and LMQ units, as on a plain store (design-14 §4, §5): the
    # records are read by their offsets inside the entries.
    v = check_5x_queues(c, root, cfg, scan, d, log, read_at=log.message_at)
    check_consume_queues(c, root, cfg, scan, d, log.min_offset, {"debris": None})
    check_index(c, root, cfg, scan, d, deep=deep)
    check_lock(c, root)
    forecast = forecast_dledger(c, root, cfg, log, scan, d, cp, abort)
    check_checkpoint(c, root, cfg, scan, d, cp, abort)
    return scan, d, forecast, v


# --- the DLedger files --------------------------------------------------------------------


def check_ledger(c, log, scan: DLedgerScan) -> None:
    """Files, entry chain, tail, index units and records of one DLedger log."""
    end = scan.chain
    for p in log.files.problems:
        code = p.code if p.code in ("symlink", "special-file") else "dledger-files"
        c.add(code, p.path, None, f"{p.code}: {p.detail}"
              + ("; DLedger refuses to load the folder" if p in log.files.refusing_problems else ""))
    for why in end.refuses_start:
        c.add("dledger-files", log.ledger_dir, None, why)
    for state in (log.checkpoint, log.currterm):
        for why in state.problems:
            c.add("dledger-files", state.path, None, why)
    if log.checkpoint.tmp_left:
        c.add("dledger-files", log.checkpoint.path.with_name("checkpoint.tmp"), None,
              "left by a crash while DLedger rewrote its checkpoint; DLedger ignores it",
              severity="info")
    reason = "clean" if end.reason in CLEAN_ENDS else end.reason
    c.add("dledger-end", end.path, end.position if end.path else None,
          f"DLedger log valid from {log.min_offset} up to {end.offset} ({end.entries} entries, "
          f"indexes {end.begin_index}..{end.end_index}, {scan.count} records); stops: "
          f"{end.reason} ({end.detail}); DLedger's recovery starts in the data file at "
          f"{end.recovery_start}", commitLogOffset=end.offset, reason=reason,
          entries=end.entries, endIndex=end.end_index)
    for e in end.damage:
        c.add("dledger-chain-break", e.path, _pos(log, e.offset), e.message,
              commitLogOffset=e.offset)
    _tail(c, log, end)
    _index(c, log, scan)
    _records(c, log, scan)
    ck = end.checkpoint_index
    if end.end_index >= 0 and end.committed_index < end.end_index:
        c.add("dledger-uncommitted", log.checkpoint.path, None,
              f"committedIndex {ck} ({log.checkpoint.path.name}) is behind the last entry "
              f"{end.end_index}: after a restart RocketMQ serves and dispatches up to "
              f"committedPos {end.committed_pos} until the node is leader again; in a group "
              "of several nodes a new leader may truncate entries after the quorum-committed "
              "index (offline unknowable: reported, never acted on)",
              committedIndex=end.committed_index, endIndex=end.end_index,
              committedPos=end.committed_pos, servedEndAfterLoad=end.max_offset)


def _pos(log, offset: int | None) -> int | None:
    if offset is None:
        return None
    return offset % log.file_size


def _tail(c, log, end) -> None:
    """Bytes after the end of the entry chain (its file, later files): DLedger cuts them."""
    if end.path is not None and not end.tail_clean:
        seg = next(s for s in log.data_files if s.path == end.path)
        u8 = np.frombuffer(seg.buffer(), np.uint8, count=seg.readable_size)
        nz = np.flatnonzero(u8[end.position:])
        last = int(nz[-1]) + 1 if len(nz) else 0
        c.add("dledger-torn", end.path, end.position,
              f"the entry chain ends at {end.offset} ({end.reason}) but {len(nz)} non-zero "
              f"byte(s) follow within the next {last}: a torn or damaged entry. DLedger's "
              "recovery cuts the log here (the bytes stay; later data files are deleted)",
              commitLogOffset=end.offset, bytes=last)
    for p in end.files_after_end:
        seg = next(s for s in log.data_files if s.path == p)
        nz = int(np.count_nonzero(np.frombuffer(seg.buffer(), np.uint8, count=seg.readable_size))) \
            if seg.readable_size else 0
        c.add("dledger-torn", p, 0,
              f"data file after the end of the entry chain ({end.offset}) holding {nz} non-zero "
              "byte(s): DLedger's recovery deletes it", commitLogOffset=seg.start, bytes=nz)


def _index(c, log, scan: DLedgerScan) -> None:
    """Every kept entry against its unit in the DLedger index (unit ``i`` at ``i * 32``)."""
    e = scan.entries
    idx = e["index"]
    if not len(idx):
        return
    mism, missing = [], []
    # Contiguous index runs (a skipped span before the recovery start breaks the run).
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(idx)]):
        lo, hi = int(lo), int(hi)
        units = log.index_units(int(idx[lo]), hi - lo)
        n = len(units)
        if n:
            same = ((units["magic"] == DLEDGER_MAGIC) & (units["pos"] == e["pos"][lo:lo + n])
                    & (units["size"] == e["size"][lo:lo + n])
                    & (units["index"] == idx[lo:lo + n]) & (units["term"] == e["term"][lo:lo + n]))
            mism.extend((lo + np.flatnonzero(~same)).tolist())
        missing.extend(range(lo + n, hi))
    rewrite = scan.chain.index_rewrite_from
    fix = (f"; DLedger truncates the index at entry {rewrite} and rewrites it from the data "
           "on its next start" if rewrite is not None else
           "; DLedger's recovery does not compare these (they lie before its start file)")
    index_file_size = log.files.index_file_size
    for code, rows, what in (("dledger-index-mismatch", mism, "differ from their entries"),
                             ("dledger-index-missing", missing, "are missing")):
        if not rows:
            continue
        first = int(idx[rows[0]])
        at = first * 32
        c.add(code, log.ledger_dir / "index" / f"{at - at % index_file_size:020d}",
              at % index_file_size,
              f"{len(rows)} index unit(s) {what}, first for entry {first} (at "
              f"{int(e['pos'][rows[0]])})" + fix, entryIndex=first, count=len(rows))


def _records(c, log, scan: DLedgerScan) -> None:
    """Records inside kept entries that RocketMQ would not dispatch, or whose body fails
    its CRC (neither DLedger nor RocketMQ's DLedger reput checks it)."""
    for b in scan.bad:
        c.add("dledger-record-bad", b.path, b.position,
              f"the record at CommitLog offset {b.offset} is not a valid record: {b.why}. "
              "DLedger keeps the entry; RocketMQ's reput skips the rest of the data file "
              f"{Path(b.path).name} from here, so later messages of that file never reach a "
              "ConsumeQueue (rmqstore rebuild dispatches every valid record)",
              commitLogOffset=b.offset)
    for off in scan.damaged:
        c.add("dledger-record-bad", _file_of(log, off), _pos(log, off),
              f"the record at CommitLog offset {off}: body fails its CRC. Neither DLedger nor "
              "RocketMQ's reput checks it: consumers get the damaged body",
              commitLogOffset=off, crc=False)


def _file_of(log, offset: int):
    try:
        return log.locate(offset)[0].path
    except Exception:  # noqa: BLE001 - a path is only a convenience here
        return log.ledger_dir


# --- the next start ----------------------------------------------------------------------


def _family(root: Path, cfg) -> str:
    if cfg.sources.get("broker_version", "default") != "default":
        return "5" if cfg.broker_version != "4.9" else "4.9"
    from ..files.storekind_profile import profile

    return "5" if profile(root).family == "5" else "4.9"


def rescan_start(log, cp, cfg) -> int:
    """5.x ``DLedgerCommitLog#dledgerRecoverAbnormally``: the newest data file whose first
    record (at +48) has magic v1 and ``0 < STORETIMESTAMP <= checkpoint.minTimestamp``
    (``minTimestampIndex`` with messageIndexSafe); else the first file (design-14 §1.6)."""
    segs = log.data_files
    if not segs:
        return 0
    limit = cp.min_timestamp if cp else 0
    if cp and cfg.message_index_enable and cfg.message_index_safe:
        limit = cp.min_timestamp_index
    at = DLEDGER_BODY_OFFSET  # the first record of a data file
    for s in reversed(segs):
        if s.readable_size < at + L.OFFSET_OF["magic"] + 4:
            continue
        buf = s.buffer()
        magic = L.HEAD_FIELD_STRUCT["magic"].unpack_from(buf, at + L.OFFSET_OF["magic"])[0]
        ts = head_store_timestamp(buf, at, s.readable_size)
        if magic == L.MAGIC_V1 and ts is not None and 0 < ts <= limit:
            return s.start
    return segs[0].start


def _index_loss(root: Path, cfg, deleted: list[str], keyed: np.ndarray) -> int:
    """Keyed records no index file that survives covers (4.9 never re-indexes)."""
    g = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
    d = root / "index"
    kept_end = -1
    for p in list_index_files(d) if d.is_dir() else []:
        if p.name in deleted:
            continue
        try:
            f = IndexFile(p, g)
        except Exception:  # noqa: BLE001 - unreadable files are the index checks' finding
            continue
        kept_end = max(kept_end, f.header.end_phy_offset)
        f.close()
    return int((keyed > kept_end).sum())


def forecast_dledger(c, root: Path, cfg, log, scan: DLedgerScan, d, cp, abort: bool):
    """What RocketMQ on DLedger does on its next start (design-14 §1.6, §1.7, §1.10)."""
    from .verify import Forecast
    from .verify_state import index_files_deleted

    end = scan.chain
    deleted = index_files_deleted(root, cfg, cp) if abort else []
    forecast = Forecast("abnormal" if abort else "normal", end.recovery_start, end.offset, deleted)
    if not abort:
        return forecast
    ko = d.key_offset
    keyed = np.unique(ko) if len(ko) else ko
    # An error, not the plain store's warning (design-14 §1.10): the start that follows
    # is DLedger's and RocketMQ's abnormal one, which 4.9 survives with keys lost.
    if _family(root, cfg) == "4.9":
        lost = _index_loss(root, cfg, deleted, keyed) if deleted else 0
        c.add("abort-present", root / ckpt.ABORT, None,
              "the last broker run did not shut down cleanly. On start RocketMQ 4.9 on DLedger "
              f"recovers the entry chain (kept up to {end.offset}) and re-dispatches nothing "
              "(DLedgerCommitLog#recover)"
              + (f"; it deletes index file(s) {', '.join(deleted)} and re-indexes nothing: "
                 f"keys of {lost} records become unfindable (the files are newer than the "
                 "checkpoint's indexMsgTimestamp; `rmqstore repair` removes the same files "
                 "and re-indexes, with a backup)" if deleted else ""),
              severity=ERROR, startOffset=end.recovery_start, cutAt=end.offset,
              indexFilesDeleted=deleted, reindexed=False, keyedRecordsLost=lost)
    else:
        start = rescan_start(log, cp, cfg)
        forecast.start_offset = start
        c.add("abort-present", root / ckpt.ABORT, None,
              "the last broker run did not shut down cleanly. On start RocketMQ 5 on DLedger "
              f"recovers the entry chain (kept up to {end.offset}), rescans from data file "
              f"{_data_file_name(c, log, start)} and re-dispatches every record from there"
              + (f"; it deletes index file(s) {', '.join(deleted)} (newer than the checkpoint's "
                 "indexMsgTimestamp) and re-indexes them" if deleted else ""),
              severity=ERROR, startOffset=start, cutAt=end.offset, indexFilesDeleted=deleted,
              reindexed=True, keyedRecordsLost=0)
    return forecast


def _data_file_name(c, log, start: int) -> str:
    """The data file starting at ``start``, as a path below the store root."""
    for s in log.data_files:
        if s.start == start:
            return c.rel(s.path)
    return f"{start:020d}"
