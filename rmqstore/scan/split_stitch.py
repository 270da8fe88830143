"""Stitching splits back together: the driver checks that the record chain runs unbroken
across every split and file, as a sequential walk from the first segment sees it (spec §4,
§10.1), re-reads splits that resynced wrong, and says where each store's valid data ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import RecordError
from ..files.ends import ValidEnd
from .split_plan import Split

#: Stop reasons after which the next segment file continues the chain (spec §4, §10.1).
FILE_DONE = ("blank", "end")


@dataclass
class Boundary:
    """What a task reports about its split, for the driver's chain check."""

    split_id: int
    first: int | None  # file position of the first record it owns (forced start if forced)
    chain_end: int  # file position just after its last owned record (or its first)
    stop: str  # "range" (the chain continues past the range), or why valid data stopped
    records: int
    forced: bool = False

    def as_row(self) -> dict:
        return dataclasses.asdict(self)



@dataclass(frozen=True)
class StoreEnd(ValidEnd):
    """Where a store's valid CommitLog data ends (spec §10.1) as the split walk finds it:
    ``reason`` is "" when every file ended cleanly (BLANK or file end), else why; the
    ``records`` before it; and where the data begins."""

    min_offset: int = 0  # first segment's start

    @property
    def end_offset(self) -> int:
        """First byte after the last valid record (recovery's processOffset)."""
        return self.offset


@dataclass
class Stitched:
    """The driver's verdict on every split."""

    keep: list[int]  # split ids whose records are part of the store's valid data
    drop: list[int]  # split ids whose records lie after the end of valid data
    rerun: dict[int, int]  # split id -> the position the chain says it must start at
    ends: dict[str, StoreEnd]
    records: int  # records in kept splits


def stitch(splits: Sequence[Split], boundaries: dict[int, Boundary]) -> Stitched:
    """Check the size chain across splits and files, as a sequential walk from the first
    segment would see it (spec §4, §10.1; spark-notes resync rule).

    Within a file the chain starts at 0 and each split must begin where the previous one's
    chain left its range; a split that disagrees is returned in ``rerun`` with the start
    it must use (only the first per file: the rest depend on it). After a BLANK or the
    file's end the next file continues; after anything else valid data has ended, and
    every later record of the store is dropped.
    """
    keep: list[int] = []
    drop: list[int] = []
    rerun: dict[int, int] = {}
    ends: dict[str, StoreEnd] = {}
    records = 0
    by_store: dict[str, list[Split]] = {}
    for s in splits:
        by_store.setdefault(s.store, []).append(s)
    for store, ss in by_store.items():
        ss = sorted(ss, key=lambda s: (s.file_index, s.begin))
        ended: tuple[int, str] | None = None
        counted = 0  # records in the store's kept splits
        last_end = ss[0].file_start if ss else 0
        # Where recovery's processOffset lands if nothing fails: at the last file's BLANK
        # (or its end), not at the end of its padding (spec §10.1).
        final = last_end
        i = 0
        while i < len(ss):
            fi = ss[i].file_index
            group = []
            while i < len(ss) and ss[i].file_index == fi:
                group.append(ss[i])
                i += 1
            head = group[0]
            if ended is None and not head.contiguous:
                ended = (last_end, "missing segment")
            expected: int | None = 0
            state = "open" if ended is None else "after"
            pending = False
            for s in group:
                b = boundaries[s.split_id]
                if pending:
                    continue  # decided once the rerun ahead of it is in
                if state != "open" or expected is None or expected >= s.end:
                    (drop if b.records else keep).append(s.split_id)
                    continue
                if b.first != expected:
                    rerun[s.split_id] = expected
                    pending = True
                    continue
                keep.append(s.split_id)
                counted += b.records
                if b.stop == "range":
                    expected = b.chain_end
                elif b.stop in FILE_DONE:
                    state = "done"
                    last_end = head.file_start + head.segment_size
                    final = head.file_start + b.chain_end
                else:
                    state = "ended"
                    ended = (head.file_start + b.chain_end, b.stop)
            if state == "open" and not pending:
                # The chain ran past the last range: it ended exactly at the file end.
                last_end = final = head.file_start + head.segment_size
        offset, reason = (final, "") if ended is None else ended
        ends[store] = StoreEnd(offset, reason, counted, ss[0].file_start if ss else 0)
        records += counted
    return Stitched(sorted(keep), sorted(drop), rerun, ends, records)


def resolve(splits: Sequence[Split], boundaries: dict[int, Boundary],
            rerun: Callable[[Split], Boundary]) -> tuple[Stitched, dict[int, Split]]:
    """Stitch, re-reading each wrongly resynced split with a forced start via ``rerun``
    until the chain is whole. Returns the verdict and the forced splits that replaced
    the originals (their outputs are the ones to keep)."""
    by_id = {s.split_id: s for s in splits}
    replaced: dict[int, Split] = {}
    boundaries = dict(boundaries)
    for _ in range(len(splits) + 1):
        st = stitch(splits, boundaries)
        if not st.rerun:
            return st, replaced
        for sid, start in st.rerun.items():
            if boundaries[sid].forced:
                # A forced start is the chain's own position; it cannot disagree.
                raise RecordError("split chain does not converge", by_id[sid].path, start)
            fs = by_id[sid].with_start(start)
            replaced[sid] = fs
            boundaries[sid] = rerun(fs)
    raise RecordError("split chain does not converge", splits[0].path if splits else None)


def run_local(splits: Sequence[Split], task: Callable[[Split], tuple[Boundary, object]],
              processes: int = 1) -> tuple[Stitched, dict[int, object]]:
    """Run ``task`` over every split in this process (or a process pool), stitch, re-run
    wrong resyncs, and return the verdict and each kept split's payload."""
    payloads: dict[int, object] = {}
    boundaries: dict[int, Boundary] = {}
    if processes > 1 and len(splits) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(processes) as pool:
            for s, (b, p) in zip(splits, pool.map(task, splits)):
                boundaries[s.split_id], payloads[s.split_id] = b, p
    else:
        for s in splits:
            boundaries[s.split_id], payloads[s.split_id] = task(s)

    def again(s: Split) -> Boundary:
        b, p = task(s)
        payloads[s.split_id] = p
        return b

    st, _ = resolve(splits, boundaries, again)
    return st, {sid: payloads[sid] for sid in st.keep}
