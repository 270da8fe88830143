"""Which maxHashSlotNum / maxIndexNum the IndexFiles of a store were written with.

Nothing in an IndexFile records its geometry (spec §7.1); the size gives only
``layout.index_file_size(slots, entries)`` (a header, then 4 bytes per slot and 20 per
entry). So the size is read with an assumption (the RocketMQ defaults, or maxIndexNum =
4 x maxHashSlotNum) and the assumption is then checked against
what the broker's putKey (spec §7.4) always leaves in an intact file:

* entry 0 is all zero; entry 1 holds ``beginPhyOffset`` and no previous entry; the last
  used entry (``indexCount - 1``) holds ``endPhyOffset`` and heads its slot's chain;
* every sampled entry has ``keyHash >= 0``, ``timeDiff >= 0``, ``0 <= prevIndex < i``,
  a slot head in ``[i, indexCount)``, and a previous entry in the same slot.

With the wrong slot count the entries are read 4 bytes per slot off their place, so these
checks fail on any file with a few entries. When the assumption fails (or the size fits
none), the candidates are the slot counts under which some file is exactly full
(``indexCount == maxIndexNum``) or under which the newest file's last non-zero byte lies
in its last entry; one that some file agrees with and no file contradicts is taken.
Anything less certain is left undetermined: reads warn, writes ask for ``--config``.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..format import layout as L
from .listing import entries as list_entries, open_regular
from .mapped import data_extents, map_read

DEFAULT_SLOTS, DEFAULT_ENTRIES = 5_000_000, 20_000_000
_H, _S, _E = L.INDEX_HEADER_SIZE, L.INDEX_SLOT_SIZE, L.INDEX_ENTRY_SIZE
AGREE, CONTRADICT = "agree", "contradict"
_SAMPLE = 12  # entries checked per file besides the first and last


@dataclass(frozen=True)
class IndexFacts:
    """One IndexFile's size and the header fields the checks use."""

    path: Path
    size: int
    begin_phy: int
    end_phy: int
    count: int  # indexCount, 0 read as 1 (spec §7.4)


@dataclass
class IndexDecision:
    slots: int | None
    entries: int | None
    how: str
    ambiguous: bool = False
    size: int | None = None
    example: Path | None = None


def entries_for(size: int, slots: int) -> int | None:
    """maxIndexNum that makes ``slots`` fit a file of ``size`` bytes, if any."""
    rest = size - _H - _S * slots
    if slots <= 0 or rest < 2 * _E or rest % _E:
        return None
    return rest // _E


def slots_for(size: int, entries: int) -> int | None:
    rest = size - _H - _E * entries
    if entries <= 1 or rest < _S or rest % _S:
        return None
    return rest // _S


def _list(index_dir: Path) -> list[Path]:
    """The files verify takes for IndexFiles (17-digit names): a stray file there (a
    segment copied in, say) is moved away by repair and must not decide the geometry."""
    from .listing import offset_name

    try:
        return [e.path for e in list_entries(index_dir)
                if e.kind == "file" and offset_name(e.name, 17) is not None]
    except OSError:
        return []


def _facts(p: Path) -> IndexFacts | None:
    try:
        with open_regular(p) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_H)
    except OSError:
        return None
    if len(head) < _H:
        return None
    _, _, begin_phy, end_phy, _, count = L.INDEX_HEADER_STRUCT.unpack(head)
    return IndexFacts(p, size, begin_phy, end_phy, count if count > 0 else 1)


def judge(f: IndexFacts, slots: int) -> str | None:
    """AGREE, CONTRADICT, or None (no entries to tell) for ``f`` read with ``slots``."""
    entries = entries_for(f.size, slots)
    if entries is None or f.count > entries:
        return CONTRADICT
    if f.count <= 1:
        return None
    ic = f.count
    base = _H + _S * slots
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        def entry(i: int):
            return L.INDEX_ENTRY_STRUCT.unpack(os.pread(fd, _E, base + _E * i))

        def slot(s: int) -> int:
            return L.INDEX_SLOT_STRUCT.unpack(os.pread(fd, _S, _H + _S * s))[0]

        if os.pread(fd, _E, base) != bytes(_E):
            return CONTRADICT
        first, last = entry(1), entry(ic - 1)
        if first[1] != f.begin_phy or first[3] != 0 or last[1] != f.end_phy:
            return CONTRADICT
        if last[0] < 0 or slot(last[0] % slots) != ic - 1:
            return CONTRADICT
        step = max(1, (ic - 1) // _SAMPLE)
        for i in sorted({*range(1, ic, step), *range(max(1, ic - 4), ic)}):
            h, _, td, prev = entry(i)
            if h < 0 or td < 0 or not 0 <= prev < i:
                return CONTRADICT
            if not i <= slot(h % slots) <= ic - 1:
                return CONTRADICT
            if prev > 0 and entry(prev)[0] % slots != h % slots:
                return CONTRADICT
        return AGREE
    except OSError:
        return None
    finally:
        os.close(fd)


def _tail_candidates(f: IndexFacts) -> set[int]:
    """Slot counts under which the file's last non-zero byte lies in its last used entry
    (everything after that entry is still zero in an intact, not-full file)."""
    last = _last_nonzero(f.path, f.size)
    if last is None:
        return set()
    ic = f.count
    lo = (last - _H - _E * ic) // _S + 1
    hi = (last - _H - _E * (ic - 1)) // _S
    return {s for s in range(max(lo, 1), hi + 1) if entries_for(f.size, s)}


def _last_nonzero(path: Path, size: int, chunk: int = 1 << 20) -> int | None:
    try:
        with open_regular(path) as fh:
            # Holes read as zeros without a bus error (tmpfs), and are not scanned: the
            # last non-zero byte is in the last data extent.
            m = map_read(fh.fileno(), 0, path)
            extents = data_extents(fh.fileno(), size)
    except (OSError, ValueError):
        return None
    try:
        end = min(size, len(m), extents[-1][1] if extents else 0)
        while end > _H:
            start = max(_H, end - chunk)
            nz = np.flatnonzero(np.frombuffer(m, np.uint8, end - start, start))
            if len(nz):
                return start + int(nz[-1])
            end = start
        return None
    finally:
        m.close()


def assumed_slots(size: int) -> tuple[int | None, str]:
    """The slot count the size gives under the defaults or the 4x ratio."""
    if size == L.index_file_size(DEFAULT_SLOTS, DEFAULT_ENTRIES):
        return DEFAULT_SLOTS, "the RocketMQ defaults"
    s, r = divmod(size - _H, _S + 4 * _E)
    if not r and s > 0:
        return s, "maxIndexNum = 4 x maxHashSlotNum"
    return None, ""


class IndexFiles:
    """The IndexFiles of a store, for deciding or checking their geometry."""

    def __init__(self, index_dir: Path):
        paths = _list(index_dir)
        sizes = Counter()
        for p in paths:
            try:
                n = p.stat().st_size
            except OSError:
                continue
            if n > 0:
                sizes[n] += 1
        self.sizes = sizes
        # IndexFiles are created full size (spec §7.5), so damage only makes them shorter:
        # the largest size is the geometry's, and the evidence below must still agree.
        self.size: int | None = max(sizes) if sizes else None
        self.facts: list[IndexFacts] = [f for f in map(_facts, paths) if f and f.size == self.size]

    @property
    def example(self) -> Path | None:
        return self.facts[0].path if self.facts else None

    @property
    def with_entries(self) -> list[IndexFacts]:
        return [f for f in self.facts if f.count > 1]

    def verdicts(self, slots: int, files: list[IndexFacts] | None = None) -> tuple[int, int, Path | None]:
        """(files agreeing, files contradicting, first contradicting file) for ``slots``."""
        agree = contra = 0
        first = None
        for f in self.with_entries if files is None else files:
            v = judge(f, slots)
            if v == AGREE:
                agree += 1
            elif v == CONTRADICT:
                contra += 1
                first = first or f.path
        return agree, contra, first

    def decide(self) -> IndexDecision | None:
        """The geometry the files show, or an ambiguous decision; None without files."""
        if not self.sizes:
            return None
        size = self.size
        assumed, why = assumed_slots(size)
        if assumed is not None:
            # The newest files are checked first: cheap (a few reads each), and a store
            # whose geometry changed would show it there.
            ag, co, _ = self.verdicts(assumed, self.with_entries[-3:])
            if not co:
                return self._decision(assumed, f"IndexFile size, assuming {why}"
                                      + (" (entries agree)" if ag else ""))
        if not self.with_entries:
            if assumed is not None:
                return self._decision(assumed, f"IndexFile size, assuming {why}")
            return IndexDecision(None, None, f"IndexFile size {size} fits neither the RocketMQ "
                                 "defaults nor maxIndexNum = 4 x maxHashSlotNum, and the files "
                                 "hold no entries to tell", ambiguous=True, size=size,
                                 example=self.example)
        cands = {assumed} if assumed is not None else set()
        for f in self.with_entries:
            s = slots_for(size, f.count)
            if s:
                cands.add(s)
        cands |= _tail_candidates(self.with_entries[-1])
        scores = {s: self.verdicts(s) for s in sorted(cands)}
        agreed = [s for s, (ag, _, _) in scores.items() if ag]
        clean = [s for s in agreed if not scores[s][1]]
        pick = None
        if len(clean) == 1:
            pick = clean[0]
        elif assumed in clean:
            pick = assumed
        elif not clean and len(agreed) == 1:
            pick = agreed[0]  # the other files are damaged; verify says which
        elif not clean and assumed in agreed:
            pick = assumed
        if pick is not None:
            ag, co, _ = scores[pick]
            return self._decision(pick, f"IndexFile contents ({ag} of {len(self.with_entries)} "
                                  "files agree)")
        return IndexDecision(None, None, f"IndexFile size {size} and contents do not tell "
                             "maxHashSlotNum from maxIndexNum" + (
                                 f" (candidates {sorted(agreed)[:4]})" if agreed else ""),
                             ambiguous=True, size=size, example=self.example)

    def _decision(self, slots: int, how: str) -> IndexDecision:
        return IndexDecision(slots, entries_for(self.size, slots), how, size=self.size,
                             example=self.example)


__all__ = ["IndexFiles", "IndexDecision", "IndexFacts", "judge", "entries_for", "slots_for",
           "assumed_slots", "AGREE", "CONTRADICT"]
