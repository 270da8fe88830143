"""DLedger's recovery walk over a data folder (``DLedgerMmapFileStore#recover``, DLedger
0.3.1.2; design-14 §1.5, D2): where the recovery starts, each frame checked in DLedger's
order, the index-driven vector step, and the :class:`~rmqstore.files.dledger_chain.ChainEnd`
it concludes.

:class:`ChainWalk` is a base of :class:`rmqstore.files.dledger.DLedgerLog`: it reads only
what the log provides (``data_files``, ``file_size``, ``files``, ``checkpoint``, ``_index``,
``_buffer``, ``_limit``). Nothing here writes.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import RecordError
from ..format.dledger_layout import (DLEDGER_BLANK_MAGIC, DLEDGER_BODY_OFFSET, DLEDGER_HEADER_SIZE,
                                     DLEDGER_MAGIC, ENTRY_HEADER_DTYPE, ENTRY_HEADER_SIZE,
                                     ENTRY_HEADER_STRUCT, EntryHeader, I32_STRUCT as _I32,
                                     java_int)
from .consumequeue import first_false
from .dledger_chain import (END_BAD_BODY_SIZE, END_BAD_INDEX, END_BAD_MAGIC, END_BAD_POS,
                            END_BAD_TERM, END_LAST_BLANK, END_NO_FILES, END_PAST_FILE, END_SHORT,
                            END_SIZE_ZERO, END_TOO_SMALL, ChainEnd, EntryRun)
from .segments import Segment

#: Index units gathered per vectorised step: the first try, and the most (32 MiB of units).
_FIRST_WINDOW = 1 << 12
_WINDOW = 1 << 20


class _Ended(Exception):
    """Internal: one frame ends the walk of a file (reason, detail)."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail


def _headers_at(u8: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The entry headers at ``pos`` (all with ``pos + 48 <= len(u8)``) as one copy."""
    top = len(u8) - ENTRY_HEADER_SIZE
    raw = np.ndarray(shape=(top + 1,), dtype=f"V{ENTRY_HEADER_SIZE}", buffer=u8, offset=0,
                     strides=(1,))
    return raw[pos].view(ENTRY_HEADER_DTYPE)


def _columns(rows: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, ...]:
    """(pos, size, index, term) columns of entries walked one by one."""
    a = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].copy()


class _Chain:
    """State of one walk: the last entry kept and what has been seen."""

    def __init__(self):
        self.last_index = -1
        self.last_term = -1
        self.last_entry_end = -1
        self.entries = 0
        self.index_rewrite_from: int | None = None
        self.target_end: int | None = None  # end of the entry the checkpoint names
        self.damage: list[RecordError] = []


class ChainWalk:
    """The recovery walk of a DLedger log (mixed into :class:`~rmqstore.files.dledger.DLedgerLog`)."""

    def _precheck(self, seg: Segment) -> bool:
        """The first entry of a file as the recovery's start search checks it: magic
        neither -1 nor < 1 (Java's upper bound there is a tautology), size > 44, pos ==
        file start, body size + 48 == size, and its index unit equal."""
        if self._limit(seg) < ENTRY_HEADER_SIZE:
            return False
        h = EntryHeader(*ENTRY_HEADER_STRUCT.unpack_from(self._buffer(seg), 0))
        if h.magic == DLEDGER_BLANK_MAGIC or h.magic < DLEDGER_MAGIC:
            return False
        if h.size <= DLEDGER_HEADER_SIZE or h.pos != seg.start:
            return False
        if java_int(h.body_size + DLEDGER_BODY_OFFSET) != h.size:
            return False
        u = self._index.unit(h.index)
        return u is not None and u == (h.magic, seg.start, h.size, h.index, h.term)

    def _recovery_start(self) -> int:
        """Index of the data file DLedger's walk starts in: ``max(0, n - 3)``, walking back
        while that file's first entry fails :meth:`_precheck`; file 0 if none passes."""
        segs = self.data_files
        for i in range(max(0, len(segs) - 3), -1, -1):
            if self._precheck(segs[i]):
                return i
        return 0

    def _step(self, seg: Segment, buf, limit: int, p: int, chain: _Chain, compare: bool):
        """One frame of the recovery loop at position ``p``: (magic, size, index, term) of
        the entry there, or None for a blank; raises :class:`_Ended`. Checks in DLedger's
        order, so the reason is the one its log would give."""
        left = limit - p
        where = seg.start + p
        if left < 4:
            raise _Ended(END_SHORT, f"{left} bytes left at the end of {seg.path.name}")
        if left < ENTRY_HEADER_SIZE:
            magic = _I32.unpack_from(buf, p)[0]
            if magic == DLEDGER_BLANK_MAGIC:
                return None
            if left >= 8 and _I32.unpack_from(buf, p + 4)[0] == 0:
                raise _Ended(END_SIZE_ZERO, f"entry size 0 at {where}")
            raise _Ended(END_SHORT, f"{left} bytes left at the end of {seg.path.name}, "
                                    "too few for an entry header")
        magic, size, index, term, pos, _, _, _, body_size = ENTRY_HEADER_STRUCT.unpack_from(buf, p)
        if magic == DLEDGER_BLANK_MAGIC:
            return None
        if size == 0:
            raise _Ended(END_SIZE_ZERO, f"entry size 0 at {where}")
        if pos != where:
            raise _Ended(END_BAD_POS, f"entry at {where} says its pos is {pos}")
        if java_int(body_size + DLEDGER_BODY_OFFSET) != size:
            raise _Ended(END_BAD_BODY_SIZE, f"entry at {where}: size {size} != body size "
                                            f"{body_size} + {DLEDGER_BODY_OFFSET}")
        if not 0 <= java_int(p + size) <= limit:
            raise _Ended(END_PAST_FILE, f"entry at {where} of {size} bytes runs past the "
                                        f"end of {seg.path.name}")
        if magic != DLEDGER_MAGIC:
            raise _Ended(END_BAD_MAGIC, f"entry at {where} has magic {magic}, not {DLEDGER_MAGIC}")
        if chain.last_index != -1 and index != chain.last_index + 1:
            raise _Ended(END_BAD_INDEX, f"entry at {where} has index {index}, "
                                        f"expected {chain.last_index + 1}")
        if term < chain.last_term:
            raise _Ended(END_BAD_TERM, f"entry at {where} has term {term} < the previous "
                                       f"entry's {chain.last_term}")
        if size <= DLEDGER_HEADER_SIZE:
            raise _Ended(END_TOO_SMALL, f"entry at {where} has size {size} <= {DLEDGER_HEADER_SIZE}")
        if compare and chain.index_rewrite_from is None:  # DLedger stops comparing there
            u = self._index.unit(index)
            if u is None or u != (magic, where, size, index, term):
                chain.index_rewrite_from = index
        return magic, size, index, term

    def _vector(self, seg: Segment, u8: np.ndarray, limit: int, p: int, chain: _Chain,
                compare: bool, window: int) -> tuple[np.ndarray, ...] | None:
        """Entries from ``p`` found through the index units and proved by the data alone
        (contiguous, every check of :meth:`_step`): the same entries the frame-by-frame
        walk accepts, at numpy speed. None when the index does not lead anywhere here."""
        e = chain.last_index + 1
        units = self._index.units(e, min(window, (limit - p) // (DLEDGER_HEADER_SIZE + 1) + 1))
        if len(units) == 0:
            return None
        upos = units["pos"].astype(np.int64) - seg.start
        n = first_false((upos >= p) & (upos + ENTRY_HEADER_SIZE <= limit))
        if n == 0 or upos[0] != p:
            return None
        upos, units = upos[:n], units[:n]
        h = _headers_at(u8, upos)
        size = h["size"].astype(np.int64)
        index = h["index"].astype(np.int64)
        term = h["term"].astype(np.int64)
        nxt = upos + size
        ok = ((h["magic"] == DLEDGER_MAGIC) & (size > DLEDGER_HEADER_SIZE)
              & (h["pos"].astype(np.int64) == upos + seg.start)
              & (h["body_size"].astype(np.int64) + DLEDGER_BODY_OFFSET == size)
              & (nxt <= limit) & (index == e + np.arange(n))
              & (term >= np.concatenate(([chain.last_term], term[:-1]))))
        ok[1:] &= upos[1:] == nxt[:-1]
        k = first_false(ok)
        if k == 0:
            return None
        if compare and chain.index_rewrite_from is None:
            same = ((units["magic"][:k] == h["magic"][:k]) & (units["size"][:k] == h["size"][:k])
                    & (units["index"][:k] == h["index"][:k]) & (units["term"][:k] == h["term"][:k]))
            if not same.all():
                chain.index_rewrite_from = int(index[first_false(same)])
        return upos[:k], size[:k], index[:k], term[:k]

    def _runs(self, target: int | None) -> Iterator[EntryRun]:
        """Walk every data file: files before the recovery start are read with the same
        entry checks (a break there is damage, the rest of that file skipped); from the
        recovery start on, DLedger's walk decides the end. Sets ``self._end``."""
        segs = self.data_files
        chain = _Chain()
        if not segs:
            self._end = self._conclude(None, 0, END_NO_FILES, "no DLedger data files", 0, chain, None)
            return
        start = self._recovery_start()
        k = 0
        while k < len(segs):
            seg = segs[k]
            if k == start:  # DLedger's walk begins afresh here (lastEntryIndex = -1)
                if chain.last_index != -1:
                    h = self._peek_index(seg)
                    if h is not None and h != chain.last_index + 1:
                        chain.damage.append(RecordError(
                            f"first entry of the recovery start file has index {h}, the "
                            f"previous file ended at {chain.last_index}", seg.path, seg.start))
                chain.last_index, chain.last_term = -1, -1
            trusted = k < start
            buf, limit = self._buffer(seg), self._limit(seg)
            u8 = np.frombuffer(buf, dtype=np.uint8, count=limit) if limit else np.zeros(0, np.uint8)
            cols: list[tuple[np.ndarray, ...]] = []
            p, blank, ended = 0, None, None
            mine = None if trusted else target  # DLedger reads pos + size of those from the index
            # Ask the index for entries in windows that grow while it leads true, and back
            # off (frames walked one by one) while it does not: a stale index costs little.
            patience, backoff, window = 1, 64, _FIRST_WINDOW
            pend: list[tuple[int, int, int, int]] = []  # entries walked frame by frame
            while True:
                if chain.last_index != -1 and patience <= 0:
                    if pend:
                        cols.append(_columns(pend))
                        pend = []
                    got = self._vector(seg, u8, limit, p, chain, not trusted, window)
                    if got is not None:
                        cols.append(got)
                        self._accepted(chain, seg.start, got, mine)
                        p = int(got[0][-1] + got[1][-1])
                        if len(got[0]) == window:
                            window = min(window * 2, _WINDOW)
                        patience, backoff = 0, 64
                        continue
                    patience, backoff, window = backoff, min(backoff * 2, 1 << 16), _FIRST_WINDOW
                try:
                    h = self._step(seg, buf, limit, p, chain, not trusted)
                except _Ended as e:
                    ended = e
                    break
                if h is None:
                    size_field = _I32.unpack_from(buf, p + 4)[0] if limit - p >= 8 else None
                    blank = (seg.start + p, size_field)
                    break
                _, size, index, term = h
                pend.append((p, size, index, term))
                if index == mine:
                    chain.target_end = seg.start + p + size
                chain.last_index, chain.last_term = index, term
                chain.last_entry_end = seg.start + p + size
                chain.entries += 1
                p += size
                patience -= 1
            if pend:
                cols.append(_columns(pend))
            yield self._run(seg, u8, cols, blank)
            if ended is not None and trusted:
                chain.damage.append(RecordError(
                    f"DLedger entry chain breaks ({ended.reason}): {ended.detail}; the rest of "
                    "the file is skipped (DLedger does not walk this file on restart; RocketMQ's "
                    "reput skips the rest of it)", seg.path, seg.start + p))
                chain.last_index, chain.last_term = -1, -1
                k += 1
                continue
            if ended is not None:
                self._end = self._conclude(seg, seg.start + p, ended.reason, ended.detail, start,
                                           chain, target)
                return
            if k == len(segs) - 1:  # a blank in the last file: DLedger ends at the file end
                end = seg.start + self.file_size
                self._end = self._conclude(seg, end, END_LAST_BLANK, f"the last data file "
                                           f"{seg.path.name} ends in a blank at {blank[0]}",
                                           start, chain, target, blank=p)
                return
            k += 1

    def _peek_index(self, seg: Segment) -> int | None:
        if self._limit(seg) < ENTRY_HEADER_SIZE:
            return None
        return EntryHeader(*ENTRY_HEADER_STRUCT.unpack_from(self._buffer(seg), 0)).index

    @staticmethod
    def _accepted(chain: _Chain, base: int, cols: tuple[np.ndarray, ...], target: int | None) -> None:
        pos, size, index, term = cols
        if target is not None and index[0] <= target <= index[-1]:
            i = int(target - index[0])
            chain.target_end = base + int(pos[i] + size[i])
        chain.last_index, chain.last_term = int(index[-1]), int(term[-1])
        chain.last_entry_end = base + int(pos[-1] + size[-1])
        chain.entries += len(pos)

    @staticmethod
    def _run(seg: Segment, u8: np.ndarray, cols, blank) -> EntryRun:
        if cols:
            pos, size, index, term = (np.concatenate([c[j] for c in cols]) for j in range(4))
        else:
            pos = size = index = term = np.zeros(0, np.int64)
        return EntryRun(seg.path, seg.start, u8, pos, size, index, term, blank)

    def _conclude(self, seg: Segment | None, end: int, reason: str, detail: str, start: int,
                  chain: _Chain, target: int | None, blank: int | None = None) -> ChainEnd:
        segs = self.data_files
        refuses = [f"{p.path}: {p.detail}" for p in self.files.refusing_problems]
        tail_clean, position = True, 0
        if seg is not None:
            position = end - seg.start
            limit = self._limit(seg)
            u8 = np.frombuffer(self._buffer(seg), dtype=np.uint8, count=limit) if limit else None
            if blank is not None:  # a true filler: its size is the rest of the file, zeros after
                size_ok = limit - blank >= 8 and _I32.unpack_from(u8, blank + 4)[0] == limit - blank
                tail_clean = size_ok and not u8[blank + 8:].any()
            elif position < limit:
                tail_clean = not u8[position:].any()
            last = segs[-1]
            if last.start - end > self.file_size:  # DLedgerMmapFileStore#recover: System.exit
                refuses.append(f"the entry chain ends at {end}, more than a file before the last "
                               f"data file {last.path.name}: DLedger refuses to start")
        begin = self._peek_index(segs[0]) if segs and chain.last_index != -1 else None
        begin_index = -1 if begin is None else begin
        end_index = chain.last_index
        ck = self.checkpoint.committed_index
        committed_index, committed_pos = -1, -1
        # DLedgerMmapFileStore#updateCommittedIndex, called with the checkpoint's value.
        if ck is not None and ck != -1 and end_index != -1 and ck >= -1 and ck >= begin_index:
            committed_index = min(ck, end_index)
            if committed_index == end_index:
                committed_pos = chain.last_entry_end
            elif target == committed_index and chain.target_end is not None:
                committed_pos = chain.target_end
            else:  # before the recovery walk: DLedger takes pos + size from the index unit
                u = self._index.unit(committed_index)
                if u is None:
                    refuses.append(f"no index unit for committedIndex {committed_index}: "
                                   "DLedger's recovery fails")
                    committed_index = -1
                else:
                    committed_pos = u[1] + u[2]
        first = segs[0].start if segs else 0
        max_offset = committed_pos if committed_pos > 0 else (first if first > 0 else 0)
        return ChainEnd(
            offset=end, reason=reason, detail=detail,
            path=seg.path if seg is not None else None, position=position,
            recovery_start=segs[start].start if segs else 0, entries=chain.entries,
            begin_index=begin_index, end_index=end_index,
            end_term=chain.last_term if end_index != -1 else -1,
            last_entry_end=chain.last_entry_end if end_index != -1 else first,
            tail_clean=tail_clean, files_after_end=[s.path for s in segs if s.start > end],
            index_rewrite_from=chain.index_rewrite_from,
            checkpoint_index=ck, committed_index=committed_index, committed_pos=committed_pos,
            max_offset=max_offset, refuses_start=refuses, damage=chain.damage)

    def _target(self) -> int | None:
        ck = self.checkpoint.committed_index
        return ck if ck is not None and ck >= 0 else None

    def walk(self) -> ChainEnd:
        """Where valid data ends and why, as DLedger's recovery decides (cached)."""
        if self._end is None:
            for _ in self._runs(self._target()):
                pass
        return self._end

    def runs(self) -> Iterator[EntryRun]:
        """The valid entries, one :class:`EntryRun` per data file, in order, up to the end
        :meth:`walk` reports (files after it are not read; damaged spans are skipped)."""
        for run in self._runs(self._target()):
            yield run
