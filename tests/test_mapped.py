"""rmqstore.files.mapped and its users: hole-safe read maps, allocation before mapped writes,
and ENOSPC (injected here into ``posix_fallocate``) as a typed error raised before a
byte changes. The same on a real full tmpfs: tests/test_full_disk.py."""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import tree_hashes
from rmqstore.files import mapped
from rmqstore.format.message import Message
from rmqstore.files.config import StoreConfig
from rmqstore.files.consumequeue import ConsumeQueue
from rmqstore.files.consumequeue_writer import ConsumeQueueWriter
from rmqstore.errors import StoreIOError
from rmqstore.files.index import IndexFile, IndexGeometry
from rmqstore.files.index_service import IndexService
from rmqstore.reader import open_store
from rmqstore.engine.store import MessageStore
from rmqstore.recovery.verify import ERROR, verify

MIB = 1 << 20
CFG = dict(mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=6000,
           max_hash_slot_num=100, max_index_num=400)


def sparse_file(path: Path, size: int, pieces: list[tuple[int, int]], seed: int = 1) -> bytes:
    """A sparse file of ``size`` bytes with random data at ``(offset, length)`` pieces."""
    rng = random.Random(seed)
    want = bytearray(size)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, n in pieces:
            data = rng.randbytes(n)
            f.seek(off)
            f.write(data)
            want[off:off + n] = data
    return bytes(want)


LAYOUTS = {
    "data-then-hole": (3 * MIB, [(0, 5000)]),
    "hole-first": (3 * MIB, [(2 * MIB + 100, 3000)]),
    "big-extent-unaligned-ends": (7 * MIB + 123, [(0, 5000), (3 * MIB + 10, 2 * MIB + 77),
                                                  (7 * MIB + 23, 100)]),
    "all-hole": (2 * MIB, []),
    "no-hole": (MIB + 7, [(0, MIB + 7)]),
    "many-small": (4 * MIB, [(i * 64 * 1024, 100) for i in range(0, 64, 3)]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_hole_safe_map_reads_the_file_bytes_read_only(layout, tmp_path):
    """The hole-safe form (forced here; by default only on tmpfs and kin) gives exactly
    the file's bytes, whatever the holes, and stays read-only like ACCESS_READ."""
    size, pieces = LAYOUTS[layout]
    p = tmp_path / "f"
    want = sparse_file(p, size, pieces)
    with open(p, "rb") as f:
        mm = mapped.map_read(f.fileno(), 0, p, hole_safe=True)
        assert len(mm) == size
        assert bytes(mm) == want
        assert np.frombuffer(mm, np.uint8)[-1] == want[-1]
        with pytest.raises(TypeError):
            mm[0:1] = b"x"
        mm.madvise(22, 0, size - size % mapped.PAGE)  # MADV_POPULATE_READ: no fault
        mm.close()
    assert p.read_bytes() == want


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_hole_safe_map_survives_letting_pages_go(layout, tmp_path):
    """Readers drop a window's pages with MADV_DONTNEED once read (reader.release_pages):
    the data must read back the same after it, copied extents included."""
    size, pieces = LAYOUTS[layout]
    p = tmp_path / "f"
    want = sparse_file(p, size, pieces)
    with open(p, "rb") as f:
        mm = mapped.map_read(f.fileno(), 0, p, hole_safe=True)
        assert bytes(mm) == want
        mm.madvise(mmap.MADV_DONTNEED, 0, size - size % mapped.PAGE)
        mm.madvise(mmap.MADV_DONTNEED, mapped.PAGE)
        assert bytes(mm) == want
        mm.close()


def test_big_extents_are_mapped_not_copied(tmp_path):
    """A segment's data is mapped from the file, not read: the process's maps show the
    file for the extent of 1 MiB or more only (printing 5 messages reads 5 messages)."""
    p = tmp_path / "seg"
    sparse_file(p, 8 * MIB, [(0, 3 * MIB)])
    with open(p, "rb") as f:
        mm = mapped.map_read(f.fileno(), 0, p, hole_safe=True)
        maps = [line for line in Path("/proc/self/maps").read_text().splitlines()
                if line.endswith(str(p))]
        assert len(maps) == 1
        lo, hi = (int(x, 16) for x in maps[0].split()[0].split("-"))
        assert hi - lo == 3 * MIB
        mm.close()


def test_plain_map_where_holes_are_safe(tmp_path):
    """Off tmpfs (ext4, xfs, ...) map_read is the plain ACCESS_READ map: one mapping of
    the whole file, holes included."""
    p = tmp_path / "seg"
    sparse_file(p, 4 * MIB, [(0, 4096)])
    with open(p, "rb") as f:
        if mapped.allocates_on_read(f.fileno()):
            pytest.fail(f"{tmp_path} is on {mapped.fs_type(f.fileno())}: this test needs a disk")
        mm = mapped.map_read(f.fileno(), 0, p)
        maps = [line for line in Path("/proc/self/maps").read_text().splitlines()
                if line.endswith(str(p))]
        lo, hi = (int(x, 16) for x in maps[0].split()[0].split("-"))
        assert (len(maps), hi - lo) == (1, 4 * MIB)
        mm.close()


def test_fs_type_comes_from_mountinfo(tmp_path):
    with open(tmp_path / "x", "wb") as f:
        dev = os.fstat(f.fileno()).st_dev
        want = next((line.split(" - ")[1].split()[0] for line in
                     Path("/proc/self/mountinfo").read_text().splitlines()
                     if line.split()[2] == f"{os.major(dev)}:{os.minor(dev)}"), "")
        assert mapped.fs_type(f.fileno()) == want


# --- allocation ---------------------------------------------------------------------


class Fallocate:
    """Records posix_fallocate calls; ``fail_from`` (a call count) on: ENOSPC."""

    def __init__(self, monkeypatch, fail_from: int | None = None, fail_over: int | None = None):
        self.calls: list[tuple[int, int]] = []
        self.fail_from, self.fail_over = fail_from, fail_over
        self.real = os.posix_fallocate
        monkeypatch.setattr(mapped.os, "posix_fallocate", self)

    def __call__(self, fd, offset, length):
        self.calls.append((offset, length))
        if (self.fail_from is not None and len(self.calls) > self.fail_from) or \
                (self.fail_over is not None and length > self.fail_over):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real(fd, offset, length)


def test_ahead_falls_back_to_what_is_needed(tmp_path, monkeypatch):
    fa = Fallocate(monkeypatch, fail_over=8192)
    with open(tmp_path / "f", "wb+") as f:
        f.truncate(MIB)
        a = mapped.Ahead(f.fileno(), 0, MIB, 64 * 1024, "f", "test")
        assert a.need(100) == 4096  # the big step failed; the page that holds the bytes did not
        assert fa.calls == [(0, 64 * 1024), (0, 4096)]
        fa.fail_over = None
        assert a.need(5000) == 68 * 1024  # a whole step again
        assert a.need(60_000) == 68 * 1024 and len(fa.calls) == 3  # already there
        assert a.need(MIB - 1) == MIB  # never past the file's end
    with open(tmp_path / "g", "wb+") as f:
        f.truncate(MIB)
        fa.fail_over = 0
        with pytest.raises(StoreIOError, match="No space left") as e:
            mapped.Ahead(f.fileno(), 0, MIB, 4096, "g", "the X").need(1)
        assert (e.value.path, e.value.errno) == ("g", errno.ENOSPC)
        assert "for the X" in str(e.value)


def test_give_back_frees_what_was_allocated_and_keeps_what_was_there(tmp_path):
    """Allocated-ahead blocks go back to holes; data that was in the file past where
    writing started (a torn tail a broker left past the end of valid data) stays, and
    so do the zeros allocated after it (nobody can tell them from data any more)."""
    p = tmp_path / "f"
    want = sparse_file(p, 4 * MIB, [(0, 100), (2 * MIB + 100, 5000)])
    with open(p, "rb+") as f:
        a = mapped.Ahead(f.fileno(), 100, 4 * MIB, 4 * MIB, p, "test")
        a.need(200)
        assert os.fstat(f.fileno()).st_blocks * 512 >= 4 * MIB
        a.give_back(200)
        assert os.fstat(f.fileno()).st_blocks * 512 <= 4096 + 2 * MIB + 8192
    assert p.read_bytes() == want
    q = tmp_path / "g"
    want = sparse_file(q, 4 * MIB, [(0, 100)])
    with open(q, "rb+") as f:
        a = mapped.Ahead(f.fileno(), 100, 4 * MIB, 4 * MIB, q, "test")
        a.need(200)
        a.give_back(200)
        assert os.fstat(f.fileno()).st_blocks * 512 <= 4096 + 8192
    assert q.read_bytes() == want


def test_bytes_past_the_end_of_valid_data_survive_an_append(tmp_path):
    """A clean close gives back the segment allocated ahead, but never by zeroing bytes
    the session did not write (garbage past the recovered end is left as it was)."""
    root = tmp_path / "s"
    fill(root, 200)
    seg = root / "commitlog" / f"{0:020d}"
    junk = bytes(range(256)) * 16
    with open(seg, "r+b") as f:
        f.seek(200 * 1024)
        f.write(junk)
    with MessageStore.open(root, StoreConfig(**CFG)) as st:
        st.put(next(messages(1, start=200)))
    with open(seg, "rb") as f:
        f.seek(200 * 1024)
        assert f.read(len(junk)) == junk


def messages(n: int, seed: int = 7, start: int = 0):
    rng = random.Random(seed)
    for i in range(start, start + n):
        yield Message(topic=f"T{i % 3}", queue_id=i % 4, body=rng.randbytes(rng.randint(0, 300)),
                      properties={"KEYS": f"k{i}", "TAGS": f"t{i % 5}"},
                      born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_000 + i)


def fill(root: Path, n: int, **kw) -> None:
    with MessageStore.open(root, StoreConfig(**CFG), create=True,
                           clock=lambda: 1_700_000_000_000) as st:  # IndexFile names
        for m in messages(n, **kw):
            assert st.put(m).ok


def test_allocation_leaves_the_bytes_as_they_were(tmp_path, monkeypatch):
    """Every file is byte for byte what the same puts write without allocation (the
    bytes themselves are pinned to RocketMQ's by test_append_fixtures), and the puts
    that crossed two CommitLog segments, 20 ConsumeQueue files and several IndexFiles
    made few posix_fallocate calls."""
    fa = Fallocate(monkeypatch)
    fill(tmp_path / "a", 5000)
    calls = len(fa.calls)
    monkeypatch.setattr(mapped.os, "posix_fallocate", lambda fd, o, n: None)
    fill(tmp_path / "b", 5000)
    a, b = tree_hashes(tmp_path / "a"), tree_hashes(tmp_path / "b")
    a.pop("abort", None), b.pop("abort", None)
    assert a == b and len([k for k in a if k.startswith("consumequeue/")]) >= 20
    assert len([k for k in a if k.startswith("commitlog/")]) >= 2
    assert calls <= 5000 // 50  # not one a put: whole files here, chunks on big ones
    seg = tmp_path / "a" / "commitlog" / "00000000000000000000"
    assert os.stat(seg).st_blocks * 512 >= 200 * 1024  # the written part is allocated


def test_a_clean_close_gives_back_what_was_allocated_ahead(tmp_path):
    """After close the last CommitLog segment, each queue's last ConsumeQueue file and
    the last IndexFile take about what their data takes (like the broker's sparse files),
    not what was allocated ahead of it."""
    root = tmp_path / "s"
    cfg = dict(CFG, mapped_file_size_commit_log=64 * MIB, max_hash_slot_num=1000,
               max_index_num=100_000)
    with MessageStore.open(root, StoreConfig(**cfg), create=True) as st:
        for m in messages(2000):
            st.put(m)
        end = st.appender.end
    slack = 8192  # a block either side

    def used(p: Path) -> int:
        return os.stat(p).st_blocks * 512

    assert end <= used(root / "commitlog" / f"{0:020d}") <= end + slack
    for q in (root / "consumequeue").glob("*/*"):
        last = sorted(q.iterdir())[-1]
        data = len(last.read_bytes().rstrip(b"\0"))
        assert data <= used(last) <= data + slack
    (index,) = (root / "index").iterdir()
    data = IndexGeometry(1000, 100_000).entries_start + 2001 * 20
    assert used(index) <= data + slack


def data_files(root: Path) -> dict[str, str]:
    return {k: v for k, v in tree_hashes(root).items()
            if k.split("/")[0] in ("commitlog", "consumequeue", "index")}


def test_put_on_a_full_disk_raises_before_writing_and_the_store_carries_on(tmp_path, monkeypatch):
    """The CommitLog allocation fails: StoreIOError naming the segment, not one byte
    changed, and once there is room again the same store takes the message."""
    root = tmp_path / "s"
    fill(root, 600)
    before = data_files(root)
    st = MessageStore.open(root, StoreConfig(**CFG))
    fa = Fallocate(monkeypatch, fail_from=0)
    with pytest.raises(StoreIOError, match="commitlog segment: No space left") as e:
        st.put(next(messages(1, start=600)))
    assert e.value.path.startswith(str(root / "commitlog"))
    after = data_files(root)
    new = set(after) - set(before)  # the next segment, preallocated as the broker does
    assert {k: after[k] for k in before} == before
    assert all(not (root / k).read_bytes().strip(b"\0") for k in new)
    fa.fail_from = None
    more = list(messages(5, start=5000))
    assert all(st.put(m).ok for m in more)
    st.close()
    rep = verify(root)
    assert rep.ok, [f.code for f in rep.problems]
    with open_store(root) as r:
        bodies = [m.body for m in r.messages()]
    assert len(bodies) == 605 and bodies[-5:] == [m.body for m in more]


def test_full_disk_in_dispatch_reports_the_put_and_stops_the_store(tmp_path, monkeypatch):
    """A record is written, then its ConsumeQueue or IndexFile cannot grow: the put is
    PUT_OK (it is in the CommitLog, as a broker's is before dispatch), the next put
    raises, close keeps ``abort``, and the next open re-dispatches: nothing is lost."""
    root = tmp_path / "s"
    fill(root, 300)
    st = MessageStore.open(root, StoreConfig(**CFG))
    fa = Fallocate(monkeypatch)
    # Let the CommitLog segment be allocated whole, then fail everything else.
    st.put(next(messages(1, start=300)))
    fa.fail_from = len(fa.calls)
    ok = 1
    with pytest.raises(StoreIOError, match="No space left") as e:
        for m in messages(3000, start=301):
            assert st.put(m).ok
            ok += 1
    assert "no more messages" in str(e.value)
    st.close()
    assert (root / "abort").exists()
    rep = verify(root)  # resumable: a crash's warnings, no error
    assert not [f.code for f in rep.findings if f.severity == ERROR]
    assert "abort-present" in {f.code for f in rep.problems}
    fa.fail_from = None
    MessageStore.open(root, StoreConfig(**CFG)).close()  # the next open recovers
    rep = verify(root)
    assert rep.ok, [f.code for f in rep.problems]
    with open_store(root) as r:
        assert sum(1 for _ in r.messages()) == 300 + ok


def test_consume_queue_writer_allocates_before_storing(tmp_path, monkeypatch):
    fa = Fallocate(monkeypatch)
    w = ConsumeQueueWriter(tmp_path / "q", 6000)
    w.put(0, 0, 100, 7)
    assert fa.calls[0] == (0, 6000)  # a small file: whole (64 KiB ahead otherwise)
    fa.fail_from = len(fa.calls)
    for i in range(1, 300):
        w.put(i, i * 100, 100, 7)
    before = (tmp_path / "q" / f"{0:020d}").read_bytes()
    with pytest.raises(StoreIOError, match="ConsumeQueue segment: No space left"):
        w.put(300, 300 * 100, 100, 7)  # the second file cannot be allocated
    w.close()
    assert (tmp_path / "q" / f"{0:020d}").read_bytes() == before
    with ConsumeQueue(tmp_path / "q", 6000) as cq:
        assert cq.max_offset == 300


def test_index_file_that_cannot_be_allocated_is_not_left_behind(tmp_path, monkeypatch):
    Fallocate(monkeypatch, fail_from=0)
    svc = IndexService(tmp_path, IndexGeometry(100, 400))
    with pytest.raises(StoreIOError, match="IndexFile's header and slots: No space left"):
        svc.put_hash(5, 0, 1_700_000_000_000)
    svc.close()
    assert list(tmp_path.iterdir()) == []


def test_index_entries_are_allocated_ahead(tmp_path, monkeypatch):
    fa = Fallocate(monkeypatch)
    g = IndexGeometry(1000, 200_000)
    f = IndexFile.create(tmp_path / "i", g)
    first = g.entries_start + 20  # header, slots and entry 0 (never used)
    assert fa.calls[0] == (0, first)
    assert fa.calls[1][0] == first and fa.calls[1][1] >= 1 << 20  # entries, a MiB ahead
    for i in range(60_000):
        f.put(i % 977, i, 1_700_000_000_000)
    assert len(fa.calls) == 3  # 52,428 entries a MiB
    f.close()
