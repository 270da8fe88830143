"""The bulk scan in DLedger framing (design-14 D1): the records inside the entries DLedger's
recovery keeps, as the same per-file dispatch data the plain scan gives
(:class:`~rmqstore.scan.dispatch.SegmentDispatch`, one per data file), so verify's
ConsumeQueue and IndexFile checks and rebuild's writers run on it unchanged.

Only the framing differs: the entry chain (:meth:`rmqstore.files.dledger.DLedgerLog.runs`)
gives every record start position (entry pos + 48) and where the log ends; the columns,
the §3.9 checks, the CRC and what dispatch derives are the plain scan's
(:func:`~rmqstore.scan.dispatch.fill_at`: the compiled pass, or numpy). A record that fails
its frame (TOTALSIZE != body size, not a message magic, PHYSICALOFFSET != pos + 48) or the §3.9 size rule is
left out of the parts and listed in :attr:`DLedgerScan.bad`: the entry framing gives the
next record exactly, so nothing after it is lost. A body failing its CRC stays (``damaged``),
as in the plain scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..files.ends import ValidEnd
from .dispatch import SegmentDispatch, StoreScan, fill_at
from .records import columns, consistent


@dataclass
class BadRecord:
    """A record inside a kept entry that RocketMQ's reput would not dispatch."""

    offset: int  # its CommitLog offset (entry pos + 48)
    path: str  # the data file
    position: int  # its position in that file
    why: str


@dataclass
class DLedgerScan(StoreScan):
    """A :class:`StoreScan` of a DLedger log: ``parts`` has one entry per data file walked
    (records that fail their frame left out), ``chain`` is DLedger's own conclusion
    (:class:`~rmqstore.files.dledger_chain.ChainEnd`), ``bad`` the records left out."""

    chain: object = None
    bad: list[BadRecord] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # data file of each part
    #: Every kept entry, in order: absolute pos, size, index, term (int64 columns).
    entries: dict = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return self.valid_end.reason


def _why(frame_ok: bool, fits: bool) -> str:
    if not frame_ok:
        return ("the record does not fit its entry (TOTALSIZE != body size, not a message "
                "magic, or PHYSICALOFFSET != entry pos + 48)")
    return "the record's length fields do not add up to its TOTALSIZE (spec §3.9)"


def dledger_scan(log, *, check_crc: bool = True, delay_millis=None,
                 keys: bool = True) -> DLedgerScan:
    """Dispatch data of every record in the entries ``log`` (a
    :class:`~rmqstore.files.dledger.DLedgerLog`) keeps, per data file, in entry order."""
    parts: list[SegmentDispatch] = []
    paths: list[str] = []
    bad: list[BadRecord] = []
    damaged: list[int] = []
    ecols: list[tuple[np.ndarray, ...]] = []
    for run in log.runs():
        ecols.append((run.entry_pos + run.start, run.size, run.index, run.term))
        limit = len(run.u8)
        last = run.start + (int(run.entry_pos[-1] + run.size[-1]) if len(run) else 0)
        out = SegmentDispatch(run.start, limit, last, "end")
        if len(run):
            frame = run.record_ok()
            fits = consistent(columns(run.u8, run.record_pos, run.start))
            ok = frame & fits
            starts = run.record_pos
            if not ok.all():
                for i in np.flatnonzero(~ok).tolist():
                    p = int(run.record_pos[i])
                    bad.append(BadRecord(run.start + p, str(run.path), p,
                                         _why(bool(frame[i]), bool(fits[i]))))
                starts = starts[ok]
            fill_at(out, run.u8, starts, check_crc, delay_millis, keys)
            if len(out):
                damaged.extend(out.offset[~out.crc_ok].tolist())
        parts.append(out)
        paths.append(str(run.path))
    end = log.walk()
    kept = [len(p) for p in parts]
    segs = log.data_files
    end_seg = -1
    if segs:
        starts = [s.start for s in segs]
        end_seg = max(0, int(np.searchsorted(starts, end.offset, side="right")) - 1)
        end_seg = min(end_seg, max(len(parts) - 1, 0))
    names = ("pos", "size", "index", "term")
    entries = {n: (np.concatenate([e[j] for e in ecols]) if ecols else np.zeros(0, np.int64))
               for j, n in enumerate(names)}
    return DLedgerScan(parts, kept, ValidEnd(end.offset, end.reason, sum(kept)), end_seg,
                       damaged, chain=end, bad=bad, paths=paths, entries=entries)


def dledger_dispatch(log, from_offset: int = 0, index_from: int | None = None, *,
                     delay_millis=None, keys: bool = True):
    """(scan, Dispatched for the ConsumeQueues from ``from_offset``, Dispatched for the
    IndexFiles from ``index_from``) of a DLedger log: what rebuild writes (design-14 §1.8)."""
    from .per_queue import dispatched

    scan = dledger_scan(log, delay_millis=delay_millis, keys=keys)
    index_from = from_offset if index_from is None else index_from
    d = dispatched(scan, from_offset)
    return scan, d, (d if index_from == from_offset else dispatched(scan, index_from))
