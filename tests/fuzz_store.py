"""The stores the fuzz suite damages (tests/damage.py) and what it knows about them.

Records are read here as the spec defines them (§3.1 layout, §3.9 validation, §4 BLANK,
§5.1 ids), never through rmqstore, so the harness can judge rmqstore. Bases are stores made
with the engine at a small geometry and copies of the RocketMQ-written fixtures. A
:class:`Case` is one damaged copy of a base, deep inside a *sandbox* directory that also
holds the targets of outside symlinks and the broker.conf: whatever a command writes where
it should not lands in the sandbox and shows in its snapshot (tests/fuzz_checks.py).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("RMQSTORE_FIXTURES", REPO.parent / "shared" / "fixtures"))

# Small engine geometry, as tests/test_faults.py uses (and the fixtures have).
CFG = dict(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=1280,
           max_hash_slot_num=64, max_index_num=256)
SEG = CFG["mapped_file_size_commit_log"]

# spec §3.2 / §4
MAGIC_V1, MAGIC_V2, MAGIC_BLANK = -626843481, -626843477, -875286124
SEG_NAME = re.compile(r"^\d{20}$")
INDEX_NAME = re.compile(r"^\d{17}$")
#: How deep the store sits in its sandbox: every relative escape a damage creates (``..``
#: chains in topics and symlinks, at most 5 levels) still lands inside the sandbox.
NEST = ("n1", "n2", "n3", "n4", "n5")


# --- records, from the spec ----------------------------------------------------------------


@dataclass
class Rec:
    """A CommitLog record as the spec reads it (§3.1)."""

    offset: int
    size: int
    topic: bytes
    queue_id: int
    queue_offset: int
    sys_flag: int
    store_ts: int
    store_host: bytes  # address + port, as in the offsetMsgId (§5.1)
    props: dict
    raw: bytes

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def msg_id(self) -> str:
        return (self.store_host + struct.pack(">q", self.offset)).hex().upper()

    @property
    def topic_str(self) -> str:
        return self.topic.decode("utf-8", "replace")


def parse_record(buf: bytes, pos: int, offset: int):
    """§3.9 on ``buf[pos:]``: a :class:`Rec`, ``"blank"`` (END_OF_SEGMENT) or ``None`` (FAIL)."""
    left = len(buf) - pos
    if left < 8:
        return None
    total, magic = struct.unpack_from(">ii", buf, pos)
    if magic == MAGIC_BLANK:
        return "blank"
    if magic not in (MAGIC_V1, MAGIC_V2) or total < 20 or total > left:
        return None
    try:
        crc, qid, _flag, qoff, _phys, sys_flag, _born = struct.unpack_from(">iiiqqiq", buf, pos + 8)
        b = 20 if sys_flag & 0x10 else 8  # BORNHOST_V6 (§3.3)
        s = 20 if sys_flag & 0x20 else 8  # STOREHOSTADDRESS_V6
        store_ts = struct.unpack_from(">q", buf, pos + 48 + b)[0]
        store_host = bytes(buf[pos + 56 + b:pos + 56 + b + s])
        p = pos + 68 + b + s
        (body_len,) = struct.unpack_from(">i", buf, p)
        p += 4
        body = bytes(buf[p:p + max(body_len, 0)])
        if len(body) != max(body_len, 0):
            return None
        p += len(body)
        if body_len > 0 and zlib.crc32(body) & 0x7FFFFFFF != crc:
            return None
        if magic == MAGIC_V1:
            tlen = struct.unpack_from(">b", buf, p)[0]
            p += 1
        else:
            tlen = struct.unpack_from(">h", buf, p)[0]
            p += 2
        if tlen < 0:
            return None
        topic = bytes(buf[p:p + tlen])
        p += tlen
        (plen,) = struct.unpack_from(">h", buf, p)
        p += 2
        props = bytes(buf[p:p + max(plen, 0)])
        p += max(plen, 0)
    except struct.error:
        return None
    if p - pos != total:
        return None
    text = props.decode("utf-8", "replace")
    pairs = dict(kv.split("\x01", 1) for kv in text.split("\x02") if "\x01" in kv)
    return Rec(offset, total, topic, qid, qoff, sys_flag, store_ts, store_host, pairs,
               bytes(buf[pos:pos + total]))


def is_regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def segment_files(commitlog: Path) -> list[Path]:
    """Regular (not symlinked) segment-named files, by start offset; a name no Java long
    holds (past 2**63 - 1) is no segment (spec: offsets are longs), as rmqstore reads it."""
    if not commitlog.is_dir() or commitlog.is_symlink():
        return []
    return sorted((p for p in commitlog.iterdir() if SEG_NAME.match(p.name) and is_regular(p)
                   and int(p.name) < 2**63), key=lambda p: int(p.name))


def walk_records(commitlog: Path, seg: int) -> list[Rec]:
    """Valid records from the first segment on, as recovery scans (§10.1): stop at the
    first FAIL, jump segments at BLANK, stop at a gap between segment names."""
    recs: list[Rec] = []
    expect = None
    for p in segment_files(commitlog):
        start = int(p.name)
        if expect is not None and start != expect:
            break
        data = p.read_bytes()
        pos = 0
        while True:
            r = parse_record(data, pos, start + pos)
            if r == "blank":
                break
            if r is None:
                return recs
            recs.append(r)
            pos += r.size
        expect = start + seg
    return recs


def record_at(store: Path, seg: int, offset: int, size: int) -> bytes | None:
    """The ``size`` bytes at CommitLog ``offset``, from a regular segment file, or None."""
    p = store / "commitlog" / f"{offset - offset % seg:020d}"
    if not is_regular(p):
        return None
    with open(p, "rb") as f:
        f.seek(offset % seg)
        data = f.read(size)
    return data if len(data) == size else None


def encode_record(topic: bytes, *, body: bytes = b"", props: bytes = b"", queue_id: int = 0,
                  queue_offset: int = 0, phys: int = 0, store_ts: int = 0,
                  born_ts: int = 0, magic: int | None = None) -> bytes:
    """A record with IPv4 hosts (§3.1), valid BODYCRC; any topic bytes (v2 when > 127)."""
    if magic is None:
        magic = MAGIC_V2 if len(topic) > 127 else MAGIC_V1
    tl = struct.pack(">h" if magic == MAGIC_V2 else ">B", len(topic) & (0xFFFF if magic == MAGIC_V2 else 0xFF))
    total = 88 + len(body) + len(tl) + len(topic) + 2 + len(props)
    head = struct.pack(">iiiiiqqiq4siq4siiqi", total, magic, zlib.crc32(body) & 0x7FFFFFFF,
                       queue_id, 0, queue_offset, phys, 0, born_ts, b"\x7f\0\0\x01", 40000,
                       store_ts, b"\x7f\0\0\x01", 10911, 0, 0, len(body))
    return head + body + tl + topic + struct.pack(">h", len(props)) + props


def props_text(d: dict) -> bytes:
    return "".join(f"{k}\x01{v}\x02" for k, v in d.items()).encode()


# --- base stores ---------------------------------------------------------------------------

#: Engine-made bases: name -> (message count, rng seed, options).
GENERATED = {
    "gen-400": (400, 7, {}),
    "gen-900": (900, 11, {}),
    "gen-30": (30, 3, {}),
    "gen-markup": (150, 5, {"hostile_data": True}),
    "gen-oddindex": (300, 9, {"index": (64, 100)}),  # IndexFile size not 4 x slots (#8)
    "gen-5x": (200, 13, {"version": "5"}),
    "gen-empty": (0, 1, {}),
}

#: Data that is healthy but hostile to a terminal: markup, escapes, bad UTF-8 (#7).
HOSTILE_TEXT = ["[/x]", "[bold red]hi[/]", "[link=file:///etc/passwd]x[/link]", "\x1b[31mred\x1b[0m",
                "\x1b]0;title\x07", "a\nb", "tab\there", "\r\x08\x7f", "émoji😀", "[", "]", "\\[x]",
                "%s%n", "{0}", "\u202eRTL", "\x00nul"]


def make_generated(root: Path, count: int, seed: int, *, hostile_data: bool = False,
                   index: tuple[int, int] = (64, 256), version: str = "4.9") -> Path:
    from rmqstore.format.message import Message
    from rmqstore.files.config import StoreConfig
    from rmqstore.engine.store import MessageStore

    rng = random.Random(seed)
    cfg = StoreConfig(**dict(CFG, max_hash_slot_num=index[0], max_index_num=index[1]),
                      broker_version=version)
    with MessageStore.open(root, cfg, create=True) as st:
        for i in range(count):
            props = {"KEYS": f"k{i} shared{i % 7}", "UNIQ_KEY": f"{seed:08X}{i:024X}"}
            body = rng.randbytes(rng.randint(0, 1500))
            topic = f"T{i % 3}"
            if i % 3:
                props["TAGS"] = f"tag{i % 5}"
            if hostile_data and i % 2:
                t = HOSTILE_TEXT[i % len(HOSTILE_TEXT)]
                props["TAGS"] = t
                props["KEYS"] = f"{t} k{i}"
                props[f"p{i % 4}"] = t
                body = (t.encode() + b"\xff\xfe\x00") * rng.randint(1, 40)
                topic = "Tx[bold]"  # markup, yet one safe path component
            st.put(Message(topic=topic, queue_id=i % 4, properties=props, body=body,
                           born_timestamp=1_700_000_000_000 + i), stamp=True)
    return root


@dataclass
class Base:
    name: str
    path: Path
    seg: int = SEG
    clean: bool = True  # healthy as written: repair must have nothing to do
    unsupported: bool = False  # a layout rmqstore must name and refuse (DLedger)
    records: list = field(default_factory=list)


def fixture_bases() -> list[str]:
    out = []
    for group in ("rocketmq-4.9.8", "rocketmq-5.3.3", "rocketmq-4.9.8-dledger"):
        d = FIXTURES / group
        if d.is_dir():
            out += [f"fx:{group}/{p.name}" for p in sorted(d.iterdir()) if p.is_dir()]
    return out


def copy_tree(src: Path, dst: Path, *, skip=("manifest.json",)) -> Path:
    """Copy a store or sandbox: symlinks as links, FIFOs as FIFOs, files writable."""

    def copy(s, d):
        st = os.lstat(s)
        if stat.S_ISFIFO(st.st_mode):
            os.mkfifo(d)
        elif st.st_size > (1 << 20):
            copy_sparse(s, d)
        elif not os.access(s, os.R_OK):  # mode 000 (lock-odd) and not root: an empty stand-in
            open(d, "wb").close()
        else:
            shutil.copy2(s, d)
            os.chmod(d, 0o644)

    shutil.copytree(src, dst, symlinks=True, copy_function=copy,
                    ignore=lambda d, names: [n for n in names if n in skip and Path(d) == Path(src)])
    os.chmod(dst, 0o755)
    for dirpath, dirnames, _ in os.walk(dst):  # never into symlinked directories
        for n in dirnames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
    return dst


def copy_sparse(src, dst) -> None:
    """Copy only the data regions of ``src`` (a repair may leave 420 MB sparse files)."""
    with open(src, "rb") as f, open(dst, "wb") as g:
        size = os.fstat(f.fileno()).st_size
        g.truncate(size)
        pos = 0
        while pos < size:
            try:
                data = os.lseek(f.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            hole = os.lseek(f.fileno(), data, os.SEEK_HOLE)
            f.seek(data)
            g.seek(data)
            left = hole - data
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                g.write(chunk)
                left -= len(chunk)
            pos = hole
    os.chmod(dst, 0o644)


_BASES: dict[tuple[str, str], Base] = {}


def get_base(name: str, cache: Path) -> Base:
    """The pristine base store ``name``, built (or copied) once per cache directory."""
    key = (str(cache), name)
    if key in _BASES:
        return _BASES[key]
    dst = cache / name.replace(":", "_").replace("/", "_")
    if not dst.exists():
        tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        if name.startswith("fx:"):
            copy_tree(FIXTURES / name[3:], tmp)
        else:
            count, seed, opts = GENERATED[name]
            make_generated(tmp, count, seed, **opts)
        try:
            os.replace(tmp, dst)
        except OSError:
            # Another worker built the same base first (the rename cannot replace a
            # non-empty directory): theirs is as good as ours.
            if not dst.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    unsupported = "dledger" in name
    # Not healthy though RocketMQ shut it down cleanly: the fixtures README says its
    # recovery kept a unit whose tagsCode the record's destroyed TAGS no longer gives
    # (verify's cq-tags-mismatch, rightly).
    damaged_by_rocketmq = name == "fx:rocketmq-4.9.8/crash-torn-tail-recovered"
    # Healthy, but with 5.x features rmqstore does not check yet (issue 14): verify says so
    # (store-feature) and reads their queues as 4.x ones, so they are no "healthy" base.
    not_yet_read = name in ("fx:rocketmq-5.3.3/batch-cq", "fx:rocketmq-5.3.3/lmq",
                            "fx:rocketmq-5.3.3/prop-crc")
    clean = (not unsupported and not damaged_by_rocketmq and not not_yet_read
             and not (dst / "abort").exists())
    base = Base(name, dst, SEG, clean, unsupported, walk_records(dst / "commitlog", SEG))
    _BASES[key] = base
    return base


def base_names() -> list[str]:
    return list(GENERATED) + fixture_bases()


def pick_base(rng: random.Random) -> str:
    fx = fixture_bases()
    f498 = [n for n in fx if n.startswith("fx:rocketmq-4.9.8/")]
    f5 = [n for n in fx if n.startswith("fx:rocketmq-5.3.3/")]
    dl = [n for n in fx if "dledger" in n]
    r = rng.random()
    if f498 and r < 0.40:
        return rng.choice(f498)
    if f5 and r < 0.47:
        return rng.choice(f5)
    if dl and r < 0.50:
        return rng.choice(dl)
    return rng.choice(list(GENERATED))


# --- a case --------------------------------------------------------------------------------


@dataclass
class Case:
    seed: int
    base: Base
    sandbox: Path
    kinds: list = field(default_factory=list)
    applied: list = field(default_factory=list)  # "kind: what was done"
    damage_from: float = float("inf")  # first CommitLog byte a damage changed or hid
    records: list = field(default_factory=list)  # Rec of the base (+ injected), by offset
    conf: Path | None = None  # broker.conf to pass (--config)
    hold_lock: bool = False  # another process holds the store lock while commands run
    expect_refusal: str | None = None  # every command must refuse (exit 2), and why

    @property
    def store(self) -> Path:
        return self.sandbox.joinpath(*NEST, "store")

    @property
    def outside(self) -> Path:
        return self.sandbox / "outside"

    @property
    def backup(self) -> Path:
        return self.sandbox / "backup"

    @property
    def seg(self) -> int:
        return self.base.seg

    def touch(self, offset: int) -> None:
        self.damage_from = min(self.damage_from, offset)

    def note(self, text: str) -> None:
        self.applied.append(text)

    # views of the store as it is now
    def segments(self) -> list[Path]:
        return segment_files(self.store / "commitlog")

    def queue_dirs(self) -> list[Path]:
        base = self.store / "consumequeue"
        if not base.is_dir() or base.is_symlink():
            return []
        out = []
        for t in sorted(base.iterdir()):
            if t.is_dir() and not t.is_symlink():
                out += [q for q in sorted(t.iterdir()) if q.is_dir() and not q.is_symlink()]
        return out

    def cq_files(self) -> list[Path]:
        return [f for q in self.queue_dirs() for f in sorted(q.iterdir())
                if SEG_NAME.match(f.name) and is_regular(f)]

    def index_files(self) -> list[Path]:
        d = self.store / "index"
        if not d.is_dir() or d.is_symlink():
            return []
        return sorted(p for p in d.iterdir() if INDEX_NAME.match(p.name) and is_regular(p))

    def data_end(self) -> int:
        recs = [r for r in self.records]
        return recs[-1].end if recs else 0

    def rel(self, p: Path) -> str:
        return os.path.relpath(p, self.store)


def current_records(c: Case) -> list[tuple[Rec, bytes | None]]:
    """Each known record with the bytes now at its place (None when its segment is gone
    or not a regular file)."""
    return [(r, record_at(c.store, c.seg, r.offset, r.size)) for r in c.records]
