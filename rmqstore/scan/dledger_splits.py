"""Splits of a DLedger log (design-14 D1): the driver walks the entry chain once (through
the DLedger index, vectorised: :meth:`rmqstore.files.dledger.DLedgerLog.runs`) and cuts each
data file at entry starts, so a task never resyncs: it walks entries from a known start,
checks each header as DLedger's recovery does, and hands back the records inside as the
same columns a plain split gives. The last split of a file carries why the file's valid
entries end (``stop_hint``), which the driver's stitch (:mod:`rmqstore.scan.split_stitch`)
reads as it reads a plain file's stop: a blank continues with the next file, the end of
the chain ends the store's valid data.

Local stores only: a remote store is listed by its ``commitlog/`` files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import RecordError
from ..files.dledger_chain import EntryRun
from ..format.dledger_layout import (DLEDGER_BODY_OFFSET, DLEDGER_HEADER_SIZE, DLEDGER_MAGIC,
                                     ENTRY_HEADER_SIZE, ENTRY_HEADER_STRUCT)
from .records import RecordColumns, columns, consistent
from .split_plan import Split, StoreFiles

#: How the stitch reads a DLedger chain end (its FILE_DONE stops continue with the next file).
_CLEAN = {"size-zero": "zeros", "blank-in-last-file": "blank", "no-data-files": "zeros"}


def list_ledger(store: str, cfg) -> StoreFiles | None:
    """The data files of the store's DLedger log as :class:`StoreFiles`, or None for a
    plain store (:func:`rmqstore.files.dledger.ledger_for` decides, and refuses mixed ones)."""
    from ..files.dledger import ledger_for

    log = ledger_for(cfg)
    if log is None:
        return None
    with log:
        files = [(str(s.path), s.start, s.file_size) for s in log.data_files]
        return StoreFiles(store, log.file_size, cfg.max_message_size + 65536, files,
                          cfg.delay_millis, framing="dledger", ledger=str(log.ledger_dir))


def plan_ledger(sf: StoreFiles, split_size: int, first_id: int) -> list[Split]:
    """Splits of ``sf``'s data files at entry starts, about ``split_size`` bytes each, up to
    where DLedger's recovery ends the chain (files after it get none)."""
    from ..files.dledger import DLedgerLog

    where = {start: (i, path, length) for i, (path, start, length) in enumerate(sf.files)}
    per_file = []
    with DLedgerLog(sf.ledger, data_file_size=sf.segment_size) as log:
        for run in log.runs():
            pos = run.entry_pos
            kept_end = int(pos[-1] + run.size[-1]) if len(pos) else 0
            if len(pos):
                at = np.unique(np.searchsorted(pos, np.arange(0, kept_end, split_size)))
                begins = pos[at[at < len(pos)]].tolist()
            else:
                begins = [0]
            per_file.append((run.start, begins, kept_end))
        end = log.walk()
    out: list[Split] = []
    for k, (start, begins, kept_end) in enumerate(per_file):
        fi, path, length = where[start]
        last = k == len(per_file) - 1
        hint = _CLEAN.get(end.reason, end.reason) if last else "blank"
        ends = begins[1:] + [kept_end]
        for j, (b, e) in enumerate(zip(begins, ends)):
            out.append(Split(first_id + len(out), sf.store, path, fi, start,
                             min(length, sf.segment_size), sf.segment_size, b, e, sf.max_record,
                             True, b, framing="dledger",
                             stop_hint=hint if j == len(begins) - 1 else None))
    return out


def read_ledger_split(w, s: Split) -> tuple[RecordColumns, object]:
    """(columns of the valid records in the entries starting in ``[begin, end)``, boundary)
    of a DLedger split read through its window ``w`` (:class:`rmqstore.scan.splits.Window`).
    A header that is not the entry the plan found raises :class:`RecordError` (the file
    changed between planning and reading)."""
    from .split_stitch import Boundary

    first = s.start if s.start is not None else s.begin
    buf, size, base = w.buf, w.size, s.file_start
    unpack = ENTRY_HEADER_STRUCT.unpack_from
    rows: list[tuple[int, int, int, int]] = []
    pos = first
    while pos < s.end:
        if pos + ENTRY_HEADER_SIZE > size:
            raise RecordError("no room for the DLedger entry the plan found here (the file "
                              "changed?)", s.path, base + pos)
        magic, esize, index, term, epos, _, _, _, body = unpack(buf, pos - w.lo)
        if (magic != DLEDGER_MAGIC or epos != base + pos or esize <= DLEDGER_HEADER_SIZE
                or body + DLEDGER_BODY_OFFSET != esize or pos + esize > size):
            raise RecordError("not the DLedger entry the plan found here (the file changed?)",
                              s.path, base + pos)
        if pos >= s.begin:
            rows.append((pos, esize, index, term))
        pos += esize
    a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    run = EntryRun(Path(s.path), base, w.u8(), a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    cols = columns(run.u8, run.record_pos, base)
    if len(run):
        ok = run.record_ok() & consistent(cols)
        if not ok.all():  # the reader skips them too (design-14 §1.7)
            cols = cols.take(np.flatnonzero(ok))
    return cols, Boundary(s.split_id, first, pos, s.stop_hint or "range", len(cols), True)
