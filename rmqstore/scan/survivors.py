"""Records that survive a break: well-formed, CRC-valid records at or after the verified
end of the CommitLog (spec §10.5), found by resyncing every later segment
(:func:`rmqstore.scan.splits.resync`: magic, the §3.9 size rule, PHYSICALOFFSET equal to
the position, a chain that holds) and checking each body CRC; and the first CRC-valid
record anywhere in a file whose name or place says nothing of its offset.

They are the evidence :mod:`rmqstore.recovery.guard` weighs before a repair or rebuild
removes anything, and what a store's reopen refuses to truncate
(:mod:`rmqstore.engine.store`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files.segments import Segment, SegmentQueue
from .properties import sorted_isin


@dataclass
class Survivors:
    """Well-formed, CRC-valid records at or after the verified end, in offset order."""

    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.offset)

    def within(self, lo: int, hi: int) -> tuple[int, int | None]:
        """(how many start in ``[lo, hi)``, the first one's offset)."""
        a, b = np.searchsorted(self.offset, [lo, hi])
        return int(b - a), (int(self.offset[a]) if b > a else None)

    def hit(self, offsets: np.ndarray) -> np.ndarray:
        """Which of ``offsets`` are survivors' offsets."""
        return sorted_isin(np.asarray(offsets, np.int64), self.offset)


def _records_after(seg: Segment, pos: int, segment_size: int, max_record: int,
                   limit: int | None = None):
    from .dispatch import split_dispatch
    from .split_plan import Split

    limit = seg.readable_size if limit is None else min(limit, seg.readable_size)
    offs, sizes = [], []
    while pos < limit:
        sp = Split(0, "", str(seg.path), 0, seg.start, limit, segment_size, pos, limit,
                   max_record)
        b, part = split_dispatch(sp, True, None, False, lambda p: p)
        if b.first is None:
            break
        n = len(part)
        good = n if part.consistent.all() else int(np.argmin(part.consistent))
        ok = part.crc_ok[:good]
        offs.append(part.offset[:good][ok])
        sizes.append(part.size[:good][ok])
        nxt = int(part.offset[good]) - seg.start + 1 if good < n else part.chain_end - seg.start
        pos = max(nxt, b.first + 1, pos + 1)
    return offs, sizes


def find_survivors(queue: SegmentQueue, end: int, max_record: int, *,
                   data_only: bool = False) -> Survivors:
    """Valid records from ``end`` on, in every segment of ``queue`` (see the module doc).

    ``data_only``: read each segment only up to its last non-zero byte (and one record
    beyond, for trailing zero fields), found through its data extents: a reopen's check
    then costs nothing on a preallocated segment that is all hole."""
    from ..files.sparse import nonzero_end

    offs, sizes = [], []
    for seg in queue.segments:
        if seg.start + seg.readable_size <= end or seg.readable_size <= 0:
            continue
        pos, limit = max(0, end - seg.start), None
        if data_only:
            last = nonzero_end(seg.path, pos, seg.readable_size)
            if last <= pos:
                continue
            limit = last + max_record
        o, s = _records_after(seg, pos, queue.segment_size, max_record, limit)
        offs += o
        sizes += s
    if not offs:
        return Survivors()
    off = np.concatenate(offs).astype(np.int64)
    size = np.concatenate(sizes).astype(np.int64)
    order = np.argsort(off, kind="stable")
    return Survivors(off[order], size[order])


def first_record_in(path: Path, max_record: int, start: int = 0,
                    stop: int | None = None) -> tuple[Path, int] | None:
    """(file, position) of the first CRC-valid record in ``[start, stop)`` of a file, or in
    any regular file under a directory (links and special files are not opened), or None.

    For bytes whose name or place says nothing of their CommitLog offset (a stray file, a
    segment copied or renamed, a range after the end): a record is a magic code, lengths
    that add up by the §3.9 rules and a body matching its CRC, wherever it stands;
    PHYSICALOFFSET is not asked to match."""
    import os
    import stat as st_

    from ..errors import RecordError
    from ..files.mapped import map_read
    from ..format.layout import MESSAGE_MAGICS
    from ..format.record import decode_record

    try:
        info = os.lstat(path)
    except OSError:
        return None
    if st_.S_ISDIR(info.st_mode):
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return None
        for n in names:
            hit = first_record_in(Path(path) / n, max_record)
            if hit is not None:
                return hit
        return None
    if not st_.S_ISREG(info.st_mode) or info.st_size == 0:
        return None
    stop = info.st_size if stop is None else min(stop, info.st_size)
    magics = [m.to_bytes(4, "big", signed=True) for m in MESSAGE_MAGICS]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        try:
            buf = map_read(fd, 0, path)
        except (OSError, ValueError):
            return None
        try:
            nxt = {m: buf.find(m, start + 4, stop) for m in magics}
            while True:
                live = [(at, m) for m, at in nxt.items() if at >= 0]
                if not live:
                    break
                at, m = min(live)
                p = at - 4
                try:
                    decode_record(buf, p, limit=min(stop, p + max_record), check_crc=True)
                    return Path(path), p
                except (RecordError, ValueError, IndexError):
                    pass
                nxt[m] = buf.find(m, at + 1, stop)
        finally:
            buf.close()
    finally:
        os.close(fd)
    return None
