"""checkpoint, abort and lock checks for :func:`rmqstore.recovery.verify.verify` (spec §8, §10):
what a broker would do on its next start, and whether the checkpoint agrees with the data.
"""

from __future__ import annotations

from pathlib import Path

from ..files import checkpoint as ckpt
from ..format import layout as L
from ..files.index import IndexFile, IndexGeometry, list_index_files


def recovery_start(queue, cp, cfg, abort: bool) -> int:
    """Offset of the segment the broker's recovery scan starts at (spec §10.2, §10.3)."""
    segs = queue.segments
    if not segs:
        return 0
    if not abort:
        if cfg.broker_version == "4.9":
            return segs[max(0, len(segs) - 3)].start
        return segs[0].start  # 5.x walks back by the CQ max; the first segment bounds it
    limit = cp.min_timestamp if cp else 0
    if cp and cfg.message_index_enable and cfg.message_index_safe:
        limit = cp.min_timestamp_index
    for s in reversed(segs):
        if s.readable_size < 64:
            continue
        buf = s.buffer()
        magic = int.from_bytes(buf[4:8], "big", signed=True)
        sys_flag = int.from_bytes(buf[36:40], "big", signed=True)
        at = 48 + (20 if sys_flag & L.SYSFLAG_BORNHOST_V6 else 8)
        ts = int.from_bytes(buf[at:at + 8], "big", signed=True)
        if magic in L.MESSAGE_MAGICS and ts != 0 and ts <= limit:
            return s.start
    return segs[0].start


def index_files_deleted(root: Path, cfg, cp) -> list[str]:
    """Index files an abnormal start deletes: endTimestamp > indexMsgTimestamp (§7.5)."""
    g = IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num)
    limit = cp.index_msg_timestamp if cp else 0
    out = []
    d = root / "index"
    for p in list_index_files(d) if d.is_dir() else []:
        try:
            f = IndexFile(p, g)
        except Exception:  # noqa: BLE001 - unreadable files are reported by the index checks
            continue
        if f.header.end_timestamp > limit:
            out.append(p.name)
        f.close()
    return out


def check_state(c, root: Path, cfg, queue, scan, d, cp, abort: bool):
    from .verify import Forecast

    check_lock(c, root)
    start = recovery_start(queue, cp, cfg, abort)
    cut = min([o for o in scan.damaged if o >= start] + [scan.end])
    deleted = index_files_deleted(root, cfg, cp) if abort else []
    forecast = Forecast("abnormal" if abort else "normal", start, cut, deleted)
    if abort:
        c.add("abort-present", root / ckpt.ABORT, None,
              f"the last broker run did not shut down cleanly. On start a broker runs abnormal "
              f"recovery (spec §10.3): it rescans from segment {start}, re-dispatches every "
              f"record from there, truncates the CommitLog at {cut}"
              + (f", deletes index file(s) {', '.join(deleted)} (newer than the checkpoint's "
                 "indexMsgTimestamp) and re-indexes" if deleted else "")
              + ". `rmqstore repair` does the same offline, with a backup",
              startOffset=start, cutAt=cut, indexFilesDeleted=deleted)
    check_checkpoint(c, root, cfg, scan, d, cp, abort)
    return forecast


def check_lock(c, root: Path) -> None:
    """A process holding the store lock (a broker?). Our own lock (repair plans under it)
    is not a broker's."""
    if not ckpt.held_here(root / ckpt.LOCK) and ckpt.is_locked(root):
        c.add("store-locked", root / ckpt.LOCK, None,
              "another process holds the store lock (a running broker?): files may change while "
              "they are read, and repair/rebuild will refuse to run")


def check_checkpoint(c, root: Path, cfg, scan, d, cp, abort: bool) -> None:
    """The checkpoint against the data: missing, behind or ahead of the records."""
    if not scan.count:
        return
    path = root / ckpt.CHECKPOINT
    if cp is None:
        if not path.exists():
            c.add("checkpoint", path, None, "no checkpoint file: a broker creates an all-zero one, "
                  "and after a crash would rescan from the first segment")
        return
    last_ts = int(scan.records("store_timestamp").max())
    cq_ts = d.last_cq_timestamp
    notes = []
    if cp.physic_msg_timestamp > last_ts:
        notes.append(f"physicMsgTimestamp {cp.physic_msg_timestamp} is after the newest record "
                     f"({last_ts})")
    if cq_ts and cp.logics_msg_timestamp > last_ts:
        notes.append(f"logicsMsgTimestamp {cp.logics_msg_timestamp} is after the newest record "
                     f"({last_ts}): after a crash recovery would start too late")
    elif cq_ts and not abort and cp.logics_msg_timestamp < cq_ts:
        notes.append(f"logicsMsgTimestamp {cp.logics_msg_timestamp} is older than the last "
                     f"message in a ConsumeQueue ({cq_ts}), though the store was shut down "
                     "cleanly: the checkpoint is stale")
    full_end = _last_full_end(root, cfg)
    if cp.index_msg_timestamp > max(full_end or 0, 0) and cp.index_msg_timestamp > last_ts:
        notes.append(f"indexMsgTimestamp {cp.index_msg_timestamp} is after every index file: "
                     "after a crash the broker would keep a half-written index file")
    if notes:
        c.add("checkpoint", path, 0, "; ".join(notes) + " (repair rewrites it)",
              lastMessageTimestamp=last_ts, lastDispatchedTimestamp=cq_ts)


def _last_full_end(root: Path, cfg) -> int | None:
    from .rebuild import last_full_index_timestamp

    return last_full_index_timestamp(root / "index",
                                     IndexGeometry(cfg.max_hash_slot_num, cfg.max_index_num))
