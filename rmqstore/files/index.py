"""IndexFile: one file of the persistent ``topic#key`` -> CommitLog offset hash table
(spec §7): its geometry, header, slots and entries, read through a map and written with the
broker's putKey (:meth:`IndexFile.put`, §7.4) or its bulk form (:meth:`IndexFile.put_many`,
same bytes: vectorised with numpy, or compiled by :mod:`rmqstore.files.index_jit` when
numba is there and the batch is large). Geometry is never stored in a file (§7.1): pass
it, or infer it with :func:`infer_index_geometry`.

Queries over a directory of files are :mod:`rmqstore.files.index_query`; writing one like
the broker's IndexService is :mod:`rmqstore.files.index_service`.
"""

from __future__ import annotations

import mmap
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, SegmentError, StoreIOError
from ..format import layout as L
from . import jit
from .mapped import Ahead, allocate, io_error, map_read, note

DEFAULT_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
DEFAULT_MAX_MSGS_NUM_BATCH = 64
LONG_MAX = 2**63 - 1
_ENTRY = L.INDEX_ENTRY_STRUCT
_SLOT = L.INDEX_SLOT_STRUCT
_HEADER = L.INDEX_HEADER_STRUCT
_SLOTS_AT = L.INDEX_HEADER_SIZE  # hot paths: plain ints, not construct's sizeof per call
_SLOT_SIZE = L.INDEX_SLOT_SIZE
_ENTRY_SIZE = L.INDEX_ENTRY_SIZE

_slot_unpack_from = _SLOT.unpack_from
_slot_pack_into = _SLOT.pack_into
_entry_pack_into = _ENTRY.pack_into
_header_pack_into = _HEADER.pack_into
_INT32_MAX = L.INT32_MAX

@dataclass(frozen=True)
class IndexGeometry:
    """maxHashSlotNum and maxIndexNum (spec §1.2, §7.1)."""

    hash_slot_num: int = DEFAULT_HASH_SLOT_NUM
    index_num: int = DEFAULT_INDEX_NUM

    @property
    def file_size(self) -> int:
        return L.index_file_size(self.hash_slot_num, self.index_num)

    @property
    def entries_start(self) -> int:
        return self._entries_start

    def __post_init__(self):
        object.__setattr__(self, "_entries_start", L.index_slot_position(self.hash_slot_num))


def infer_index_geometry(file_size: int, *, hash_slot_num: int | None = None,
                         index_num: int | None = None, path=None) -> IndexGeometry:
    """Geometry from a file's size and one known value, else maxIndexNum = 4 x slots.

    The RocketMQ defaults (5,000,000 / 20,000,000) follow that ratio too.
    """
    rest = file_size - L.INDEX_HEADER_SIZE
    if hash_slot_num is not None and index_num is not None:
        g = IndexGeometry(hash_slot_num, index_num)
    elif hash_slot_num is not None:
        n, r = divmod(rest - hash_slot_num * L.INDEX_SLOT_SIZE, L.INDEX_ENTRY_SIZE)
        g = IndexGeometry(hash_slot_num, n) if not r and n > 1 else None
    elif index_num is not None:
        s, r = divmod(rest - index_num * L.INDEX_ENTRY_SIZE, L.INDEX_SLOT_SIZE)
        g = IndexGeometry(s, index_num) if not r and s > 0 else None
    else:
        s, r = divmod(rest, L.INDEX_SLOT_SIZE + 4 * L.INDEX_ENTRY_SIZE)
        g = IndexGeometry(s, 4 * s) if not r and s > 0 else None
    if g is None or g.file_size != file_size:
        raise ConfigError(
            f"cannot infer IndexFile geometry from a size of {file_size} bytes "
            f"(it is not {L.INDEX_HEADER_SIZE} + {L.INDEX_SLOT_SIZE}*maxHashSlotNum + "
            f"{L.INDEX_ENTRY_SIZE}*maxIndexNum for the values given or "
            "for maxIndexNum = 4*maxHashSlotNum); pass maxHashSlotNum and maxIndexNum", path)
    return g


@dataclass
class IndexHeader:
    """The 40-byte header (spec §7.1); ``index_count`` is the next free entry number."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def pack(self) -> bytes:
        return _HEADER.pack(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                            self.end_phy_offset, self.hash_slot_count, self.index_count)


class IndexFile:
    """One index file over an mmap: read-only unless ``writable`` (spec §7.1)."""

    def __init__(self, path: str | os.PathLike, geometry: IndexGeometry, *,
                 writable: bool = False, _create: bool = False):
        self.path = Path(path)
        self.geometry = g = geometry
        self.writable = writable or _create
        self._file = None
        self._ahead: Ahead | None = None  # entries allocated ahead (writable files)
        self._limit = 0  # entries below min(maxIndexNum, allocated) are put straight in
        try:
            if _create:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except OSError as e:
                    raise io_error(e, self.path, "create IndexFile") from None
                self._file = os.fdopen(fd, "r+b")
                try:
                    os.ftruncate(fd, g.file_size)  # sparse zeros, like the broker's fresh mmap
                    self._start_writing(1)
                except BaseException as e:
                    self._file.close()
                    os.unlink(self.path)  # a full disk leaves no half-made file
                    if isinstance(e, OSError):
                        raise io_error(e, self.path, "size IndexFile") from None
                    raise
            else:
                self._file = open(self.path, "r+b" if writable else "rb")
            size = os.fstat(self._file.fileno()).st_size
            if size != g.file_size:
                self._file.close()
                raise ConfigError(
                    f"IndexFile is {size} bytes but maxHashSlotNum={g.hash_slot_num}, "
                    f"maxIndexNum={g.index_num} need {g.file_size}", self.path)
            if self.writable:
                if not _create:
                    # The header is read with pread: it may be a hole (a file created and
                    # never written), which a writable map on tmpfs would allocate.
                    head = os.pread(self._file.fileno(), L.INDEX_HEADER_SIZE, 0)
                    count = _HEADER.unpack(head.ljust(L.INDEX_HEADER_SIZE, b"\0"))[5]
                    self._start_writing(min(max(count, 1), g.index_num))
                note(self.path, "write")
                self._map = mmap.mmap(self._file.fileno(), size, access=mmap.ACCESS_WRITE)
            else:
                self._map = map_read(self._file.fileno(), size, self.path)
        except StoreIOError:
            if self._file is not None and not self._file.closed:
                self._file.close()
            raise
        except OSError as e:
            if self._file is not None:
                self._file.close()
            raise SegmentError(f"cannot map IndexFile: {e.strerror}", self.path) from None
        self.header = IndexHeader(*_HEADER.unpack_from(self._map, 0))
        if self.header.index_count <= 0:
            self.header.index_count = 1  # a new file shows 0 until its first put (§7.4)

    def _start_writing(self, count: int) -> None:
        """Allocate header, slots and the ``count`` entries so far (puts store into the
        slots anywhere), then entries ahead; :class:`StoreIOError` (nothing written) when
        the disk is full."""
        g = self.geometry
        fd = self._file.fileno()
        at = g.entries_start + count * _ENTRY_SIZE
        self._ahead = Ahead(fd, at, g.file_size, ALLOCATE_AHEAD, self.path, "the IndexFile")
        allocate(fd, 0, at, self.path, "the IndexFile's header and slots")
        self._allocate(count + 1)

    def _allocate(self, entries: int) -> None:
        """Allocate entries ``[0, entries)`` (and ahead) before they are stored."""
        g = self.geometry
        end = self._ahead.need(g.entries_start + min(entries, g.index_num) * _ENTRY_SIZE)
        self._limit = min(g.index_num, (end - g.entries_start) // _ENTRY_SIZE)

    @classmethod
    def create(cls, path: str | os.PathLike, geometry: IndexGeometry,
               prev: "IndexFile | None" = None) -> "IndexFile":
        """A new file; one that follows a full file starts from its end (spec §7.4 quirk)."""
        f = cls(path, geometry, _create=True)
        h = f.header
        if prev is not None and prev.header.end_phy_offset > 0:
            h.begin_phy_offset = h.end_phy_offset = prev.header.end_phy_offset
        if prev is not None and prev.header.end_timestamp > 0:
            h.begin_timestamp = h.end_timestamp = prev.header.end_timestamp
        # The counters stay 0 on disk until the first put.
        f._map[:L.INDEX_HEADER_SIZE] = _HEADER.pack(
            h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset, 0, 0)
        return f

    # --- raw views --------------------------------------------------------------------

    @property
    def slots(self) -> np.ndarray:
        """The slot table as big-endian int32 (a view of the map)."""
        return np.frombuffer(self._map, dtype=L.INDEX_SLOT_DTYPE["head"],
                             count=self.geometry.hash_slot_num, offset=L.INDEX_HEADER_SIZE)

    @property
    def entries(self) -> np.ndarray:
        """All ``maxIndexNum`` entries (entry 0 is never used), a view of the map."""
        return np.frombuffer(self._map, dtype=L.INDEX_ENTRY_DTYPE,
                             count=self.geometry.index_num, offset=self.geometry.entries_start)

    @property
    def used_entries(self) -> np.ndarray:
        return self.entries[1:self.header.index_count]

    @property
    def is_write_full(self) -> bool:
        return self.header.index_count >= self.geometry.index_num

    def time_matched(self, begin: int, end: int) -> bool:
        """Does the file's time range overlap ``[begin, end]`` (spec §7.6 step 2)."""
        fb, fe = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < fb and end > fe) or fb <= begin <= fe or fb <= end <= fe

    def select(self, key_hash: int, max_num: int, begin: int, end: int, out: list[int]) -> None:
        """Walk one slot chain, appending hits to ``out`` (spec §7.6 step 3)."""
        mm, g = self._map, self.geometry
        # A damaged header can claim more entries than the file holds: never read past them.
        ic = min(self.header.index_count, g.index_num - 1)
        (e,) = _SLOT.unpack_from(mm, _SLOTS_AT + key_hash % g.hash_slot_num * L.INDEX_SLOT_SIZE)
        if ic <= 1 or e <= 0 or e > ic:
            return
        # The broker follows a corrupt cycle forever; offline we stop after ic steps.
        for _ in range(ic):
            if len(out) >= max_num:
                break
            kh, phy, td, prev = _ENTRY.unpack_from(mm, g.entries_start + e * L.INDEX_ENTRY_SIZE)
            if td < 0:
                break
            t = self.header.begin_timestamp + td * 1000
            if kh == key_hash and begin <= t <= end:
                out.append(phy)
            if prev <= 0 or prev > ic or prev == e or t < begin:
                break
            e = prev

    # --- writing (spec §7.4) --------------------------------------------------------

    def put(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """putKey with a precomputed index hash; False when the file is write-full."""
        h = self.header
        count = h.index_count
        g = self.geometry
        if count >= self._limit:
            if count >= g.index_num:
                return False
            self._allocate(count + 1)
        mm = self._map
        sp = _SLOTS_AT + key_hash % g.hash_slot_num * _SLOT_SIZE
        (head,) = _slot_unpack_from(mm, sp)
        if head <= 0 or head > count:
            head = 0
            h.hash_slot_count += 1
        begin = h.begin_timestamp
        if begin <= 0:
            td = 0
        else:
            td = (store_timestamp - begin) // 1000  # seconds, clamped (spec §7.1)
            if not 0 <= td <= _INT32_MAX:
                td = 0 if td < 0 else _INT32_MAX
        _entry_pack_into(mm, g._entries_start + count * _ENTRY_SIZE,
                         key_hash, phy_offset, td, head)
        _slot_pack_into(mm, sp, count)
        if count <= 1:
            h.begin_phy_offset = phy_offset
            h.begin_timestamp = begin = store_timestamp
        count += 1
        h.index_count = count
        h.end_phy_offset = phy_offset
        h.end_timestamp = store_timestamp
        _header_pack_into(mm, 0, begin, store_timestamp, h.begin_phy_offset,
                          phy_offset, h.hash_slot_count, count)
        return True

    def put_many(self, key_hashes: np.ndarray, phy_offsets: np.ndarray,
                 timestamps: np.ndarray) -> None:
        """:meth:`put` for each entry, in one compiled loop (batches of
        :data:`JIT_MIN_ENTRIES` or more, switch on) or vectorised; the entries must fit in
        this file."""
        h, g = self.header, self.geometry
        m, c0 = len(key_hashes), h.index_count
        if m == 0:
            return
        if c0 + m > g.index_num:
            raise ValueError("entries do not fit in this IndexFile")
        if c0 + m > self._limit:
            self._allocate(c0 + m)
        if m >= JIT_MIN_ENTRIES and self._put_compiled(key_hashes, phy_offsets, timestamps):
            return
        slot = np.asarray(key_hashes, dtype=np.int64) % g.hash_slot_num
        slots = self.slots
        if m < 2 or (m <= _DISTINCT_CHECK_MAX and (np.diff(np.sort(slot)) != 0).all()):
            # A small batch usually has no two keys in one slot: each entry's predecessor
            # is then its slot's current head (when that is a valid entry number).
            ns = np.arange(c0, c0 + m, dtype=np.int64)
            head = slots[slot].astype(np.int64)
            head[(head <= 0) | (head > ns)] = 0
            self._put_block(key_hashes, phy_offsets, timestamps, head, slot, ns, head)
            return
        # Sorted by (slot, position), each entry sits right after its predecessor in its
        # slot's chain; packing both into one int64 makes that one plain sort.
        if m < 1 << 31 and g.hash_slot_num < 1 << 31:
            packed = slot << 32
            packed |= np.arange(m, dtype=np.int64)
            packed.sort()
            ss = packed >> 32
            order = packed
            order &= 0xFFFFFFFF
        else:
            order = np.argsort(slot, kind="stable")
            ss = slot[order]
        del slot
        ns = order + c0
        first = np.ones(m, dtype=bool)
        np.not_equal(ss[1:], ss[:-1], out=first[1:])
        last = np.ones(m, dtype=bool)
        last[:-1] = first[1:]
        head = slots[ss[first]].astype(np.int64)
        head[(head <= 0) | (head > ns[first])] = 0
        prev_sorted = np.empty(m, dtype=np.int64)
        prev_sorted[1:] = ns[:-1]
        prev_sorted[first] = head
        prev = np.empty(m, dtype=np.int64)
        prev[order] = prev_sorted
        self._put_block(key_hashes, phy_offsets, timestamps, prev, ss[last], ns[last], head)

    def _put_compiled(self, key_hashes, phy_offsets, timestamps) -> bool:
        """``put_many`` by the compiled kernel (:mod:`rmqstore.files.index_jit`); False
        when it is switched off or cannot load (the numpy form then does the work)."""
        loaded = _kernel()
        if loaded is None:
            used["off"] += 1
            return False
        K, geo = loaded
        h, g = self.header, self.geometry
        kh, phy, ts = (np.ascontiguousarray(a, dtype=np.int64)
                       for a in (key_hashes, phy_offsets, timestamps))
        words = np.frombuffer(self._map, np.uint32)
        put, count, new, begin, begin_phy = K.put_entries(
            words, geo, g.hash_slot_num, g.entries_start // words.itemsize, h.index_count,
            g.index_num, h.begin_timestamp, h.begin_phy_offset, kh, phy, ts)
        del words  # no view of the map may outlive it
        if put != len(kh):  # put_many checked they fit: a kernel that stops early is wrong
            raise AssertionError(f"IndexFile kernel put {put} of {len(kh)} entries")
        h.hash_slot_count += int(new)
        h.index_count = int(count)
        h.begin_timestamp, h.begin_phy_offset = int(begin), int(begin_phy)
        h.end_phy_offset, h.end_timestamp = int(phy[-1]), int(ts[-1])
        self._map[:L.INDEX_HEADER_SIZE] = h.pack()
        used["kernel"] += 1
        return True

    def _put_block(self, key_hashes, phy_offsets, timestamps, prev, set_at, set_to,
                   head) -> None:
        """Write ``put_many``'s entries (predecessors known), slots and header."""
        h = self.header
        m, c0 = len(key_hashes), h.index_count
        # timeDiff against the file's beginTimestamp, which the first put sets
        begin = h.begin_timestamp if c0 > 1 else int(timestamps[0])
        if begin > 0:
            ts = np.asarray(timestamps, dtype=np.int64)
            td = _time_diff(ts - begin)
            td[ts < begin] = 0  # where the difference wrapped round int64: put's 0
        else:
            td = np.zeros(m, np.int64)
        if c0 <= 1 and h.begin_timestamp <= 0:
            td[0] = 0  # the very first put still sees the empty header's 0
        elif c0 <= 1:
            td[0] = _time_diff(int(timestamps[0]) - h.begin_timestamp)
        block = self.entries[c0:c0 + m]
        block["key_hash"], block["phy_offset"] = key_hashes, phy_offsets
        block["time_diff"], block["prev_index"] = td, prev
        self.slots[set_at] = set_to
        if c0 <= 1:
            h.begin_phy_offset, h.begin_timestamp = int(phy_offsets[0]), int(timestamps[0])
        h.hash_slot_count += int(np.count_nonzero(head == 0))
        h.index_count += m
        h.end_phy_offset, h.end_timestamp = int(phy_offsets[-1]), int(timestamps[-1])
        self._map[:L.INDEX_HEADER_SIZE] = h.pack()

    def flush(self) -> None:
        if self.writable:
            try:
                self._map.flush()
            except OSError as e:
                raise io_error(e, self.path, "sync IndexFile") from None

    def close(self) -> None:
        if self._ahead is not None:
            # Entries allocated ahead and never written: back to a hole, as the broker has it.
            self._ahead.give_back(self.geometry.entries_start
                                  + self.header.index_count * _ENTRY_SIZE)
            self._ahead, self._limit = None, 0
        try:
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view; the map closes when it is dropped
        self._file.close()


#: Batches from this many entries take the compiled kernel when it is on (smaller ones
#: are not worth importing numba for).
JIT_MIN_ENTRIES = 4096
#: How often each form of ``put_many`` ran in this process ("kernel", "off"); tests read it.
used: Counter = Counter()
_kernel_state = None  # (kernel module, geometry vector), or False where it cannot load


def _kernel():
    """The compiled put (:mod:`rmqstore.files.index_jit`) or None: switched off
    (``RMQSTORE_NO_JIT=1``, :mod:`rmqstore.files.jit`) or no numba."""
    global _kernel_state
    if jit.switched_off():
        return None
    if _kernel_state is None:
        K = jit.load(__package__ + ".index_jit")
        geo = K.geometry() if K is not None else None
        _kernel_state = (K, geo) if geo is not None else False
    return _kernel_state or None


_DISTINCT_CHECK_MAX = 1 << 16  # batches up to this size first try the no-collision path
#: Bytes allocated at a time ahead of the entries written (52,428 entries): a store
#: through the map into an unallocated page on a full disk is a SIGBUS.
ALLOCATE_AHEAD = 1 << 20


def _time_diff(delta):
    """Seconds, clamped to 0 .. 2^31-1 (spec §7.1); flooring is safe after the clamp."""
    return np.clip(np.asarray(delta) // 1000, 0, L.INT32_MAX) if isinstance(delta, np.ndarray) \
        else min(max(delta // 1000, 0), L.INT32_MAX)


def list_index_files(index_dir: Path) -> list[Path]:
    """Regular files with all-digit names, oldest first; links are not followed
    (:mod:`rmqstore.files.listing`; verify reports them)."""
    from .listing import entries

    return [e.path for e in entries(index_dir) if e.kind == "file" and e.name.isdigit()
            and e.name.isascii()]
