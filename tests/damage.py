"""Seeded damage for RocketMQ stores: the catalogue the fuzz suite applies (issue 11).

A *case* is one seed: it picks a base store (tests/fuzz_store.py), one or two damage
kinds from :data:`DAMAGES`, and every parameter, all from ``random.Random(seed)``, so the
same seed rebuilds the same damaged store. Each kind records what it did, and the first
CommitLog byte it changed or hid (``Case.touch``): repair must keep every valid record
before it. tests/fuzz_checks.py holds the invariants, tests/fuzz_campaign.py the long run.

Run the campaign: ``python -m tests.damage --stores 1000 --cli 200 --kills 200 --seed 1``
(see ``--help``); replay one case: ``python -m tests.damage --replay SEED --mode lib``.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import sys
from pathlib import Path

if __package__:  # ``python -m tests.damage``: the harness modules import each other by name
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fuzz_store import (MAGIC_BLANK, MAGIC_V1, SEG_NAME, Case, Rec, copy_tree,
                        encode_record, get_base, is_regular, parse_record, pick_base,
                        props_text, record_at)


class NotApplicable(Exception):
    """This damage cannot be made in this store (no such file, no room, ...)."""


def _pick(rng, items, what="file"):
    items = list(items)
    if not items:
        raise NotApplicable(f"no {what}")
    return rng.choice(items)


def _patch(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _flip(path: Path, at: int, rng) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        if not b:
            raise NotApplicable("position past the end of the file")
        f.seek(at)
        f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))


def _replace_with(p: Path, make) -> None:
    """Remove ``p`` (file or dir) and make something else there."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
    make(p)


def _rec_in_segment(c: Case, seg_path: Path) -> list[Rec]:
    start = int(seg_path.name)
    return [r for r in c.records if start <= r.offset < start + c.seg]


def _seg_of(c: Case, offset: int) -> tuple[Path, int]:
    start = offset - offset % c.seg
    return c.store / "commitlog" / f"{start:020d}", offset - start


def _forget_conf_expectation(c: Case) -> None:
    """A broker.conf replaced by a later config kind no longer says what the earlier one
    wrote (seed 2437: enableDLegerCommitLog, then junk over it)."""
    if c.expect_refusal and c.expect_refusal.startswith("broker.conf "):
        c.expect_refusal = None


def _write_conf(c: Case, text: str | bytes) -> None:
    _forget_conf_expectation(c)
    d = c.sandbox / "conf"
    d.mkdir(exist_ok=True)
    c.conf = d / "broker.conf"
    (c.conf.write_bytes if isinstance(text, bytes) else c.conf.write_text)(text)


def _geometry_lines(c: Case, **override) -> str:
    # The geometry the base really has (the fixtures and the engine bases share it),
    # except index geometry for the odd-index base.
    g = dict(mappedFileSizeCommitLog=c.seg, mappedFileSizeConsumeQueue=1280,
             maxHashSlotNum=64, maxIndexNum=100 if c.base.name == "gen-oddindex" else 256)
    g.update(override)
    return "".join(f"{k}={v}\n" for k, v in g.items())


DAMAGES: dict[str, callable] = {}
GROUPS: dict[str, list[str]] = {}


def damage(group: str):
    def reg(fn):
        name = fn.__name__.replace("_", "-")
        DAMAGES[name] = fn
        GROUPS.setdefault(group, []).append(name)
        return fn
    return reg


# --- configuration (issue 11, #1) -----------------------------------------------------------


@damage("config")
def conf_path_elsewhere(c: Case, rng):
    """storePathCommitLog / storePathRootDir naming a place that does not exist (the
    production value on a copy or rescue mount). docs/reading.md's rule: ignored with a
    note, STORE/commitlog is read (issue 11 #1: it emptied the store)."""
    where = c.sandbox / "data" / "rocketmq" / "store"  # absolute; inside the sandbox
    lines = rng.choice([f"storePathCommitLog={where}/commitlog\n",
                        f"storePathRootDir={where}\nstorePathCommitLog={where}/commitlog\n",
                        f"storePathRootDir={where}\n"])
    _write_conf(c, lines + _geometry_lines(c))
    c.note(f"conf-path-elsewhere: {lines.strip()!r}")


TWO_COMMITLOGS = "storePathCommitLog names an existing directory beside STORE/commitlog (two CommitLogs)"


@damage("config")
def conf_path_outside(c: Case, rng):
    """storePathCommitLog pointing at an existing directory outside the store: empty, a
    copy of some segments (docs/reading.md: two CommitLogs, refused), or a multi-path
    list that includes STORE/commitlog (one CommitLog in two directories)."""
    out = c.outside / "cl"
    out.mkdir(parents=True, exist_ok=True)
    segs = c.segments()
    v = rng.randrange(3)
    if v == 1 and segs:
        for p in segs[:rng.randint(1, len(segs))]:
            shutil.copy2(p, out / p.name)
    value = str(out) if v < 2 else f"{c.store / 'commitlog'},{out}"
    _write_conf(c, f"storePathCommitLog={value}\n" + _geometry_lines(c))
    if v < 2:
        c.expect_refusal = TWO_COMMITLOGS  # checked again once every damage is made
    c.note(f"conf-path-outside: storePathCommitLog={value} ({['empty', 'copied segments', 'multi-path'][v]})")


@damage("config")
def conf_geometry(c: Case, rng):
    """A geometry value in broker.conf that disagrees with the files (#1, #8)."""
    options = []
    if c.segments():
        options += [("mappedFileSizeCommitLog", v) for v in (1 << 30, c.seg * 2, c.seg // 2, c.seg + 4096)]
    if c.cq_files():
        options += [("mappedFileSizeConsumeQueue", v) for v in (6_000_000, 2560, 640, 1000)]
    if c.index_files():
        options += [("maxHashSlotNum", v) for v in (5_000_000, 128, 32)]
        options += [("maxIndexNum", v) for v in (20_000_000, 512, 100 if c.base.name != "gen-oddindex" else 256)]
    key, value = _pick(rng, options, "files that fix a geometry")
    _write_conf(c, _geometry_lines(c, **{key: value}))
    c.expect_refusal = f"broker.conf {key}={value} disagrees with the files"
    c.note(f"conf-geometry: {key}={value}")


@damage("config")
def conf_garbage(c: Case, rng):
    """A broker.conf that is not usable: bad numbers, binary junk, a directory, missing."""
    v = rng.randrange(6)
    if v == 0:
        _write_conf(c, rng.randbytes(rng.randint(1, 400)))
    elif v == 1:
        _write_conf(c, f"mappedFileSizeCommitLog={rng.choice(['abc', '-1', '0', '99999999999999999999', '1e9', ''])}\n")
    elif v == 2:
        _write_conf(c, "mappedFileSizeConsumeQueue=-20\nmaxHashSlotNum=0\nmaxIndexNum=-5\n")
    elif v == 3:
        _write_conf(c, "\\\nstorePathRootDir\\u0000=\\\n\x00\n==\n:\n")
    elif v == 4:
        _forget_conf_expectation(c)
        (c.sandbox / "conf").mkdir(exist_ok=True)
        c.conf = c.sandbox / "conf" / "broker.conf"
        if c.conf.is_file():  # a conf-* kind applied before wrote one
            c.conf.unlink()
        c.conf.mkdir(exist_ok=True)
    else:
        _forget_conf_expectation(c)
        c.conf = c.sandbox / "conf" / "missing.conf"
    c.note(f"conf-garbage: variant {v}")


@damage("config")
def conf_flags(c: Case, rng):
    """Settings that change what a store is: DLedger, RocksDB CQ, no index, slave role."""
    line = rng.choice(["enableDLegerCommitLog=true", "storeType=defaultRocksDB",
                       "messageIndexEnable=false", "brokerRole=SLAVE", "enableConsumeQueueExt=true",
                       "duplicationEnable=true", "flushDiskType=BOGUS", "brokerVersion=9",
                       "messageIndexSafe=true", "maxMsgsNumBatch=0"])
    _write_conf(c, line + "\n" + _geometry_lines(c))
    if line in ("enableDLegerCommitLog=true", "storeType=defaultRocksDB"):
        c.expect_refusal = f"broker.conf {line}: a store kind rmqstore does not support (docs/reading.md)"
    c.note(f"conf-flags: {line}")


# --- names from disk (issue 11, #2 #7) ------------------------------------------------------

HOSTILE_TOPICS = [b"..", b"../..", b"../../../../x", b".", b"", b"a/b", b"x\x00y", b"x\ny",
                  b"[/x]", b"[bold]T[/bold]", b"\x1b[31mred\x1b[0m", b"\x07\x08\x7f", b"\xff\xfe\xfd",
                  b"T\xc3", b"%RETRY%../x", b"consumequeue", b"T" * 127, b"x" * 200, b" ", b"~",
                  b"-1", b"\\..\\x", b"commitlog/../..", b"T/0", b"\xc0\xaf..\xc0\xaf"]


def _hostile_topic(c: Case, rng) -> bytes:
    t = rng.choice(HOSTILE_TOPICS + [b"ABS"])
    if t == b"ABS":  # an absolute path: inside the sandbox, never anywhere else
        t = str(c.sandbox / "abs-topic").encode()
    return t


def _append_record(c: Case, rec_bytes_for, note: str) -> Rec:
    """Append a record after the end of valid data, as a broker would place it (§4)."""
    end = c.data_end()
    path, pos = _seg_of(c, end)
    if end == 0 and not c.segments():
        (c.store / "commitlog").mkdir(parents=True, exist_ok=True)
    rec = rec_bytes_for(end)
    if pos and is_regular(path) and pos + len(rec) + 8 <= c.seg and path.stat().st_size >= pos + len(rec):
        _patch(path, pos, rec)
        at = end
    else:
        if pos:  # close the segment with a BLANK and start the next one
            if not is_regular(path) or pos + 8 > path.stat().st_size:
                raise NotApplicable("no room to close the last segment")
            _patch(path, pos, struct.pack(">ii", c.seg - pos, MAGIC_BLANK))
            end += c.seg - pos
        nxt = c.store / "commitlog" / f"{end:020d}"
        if nxt.exists() or nxt.is_symlink():
            raise NotApplicable("next segment exists")
        rec = rec_bytes_for(end)
        if len(rec) + 8 > c.seg:
            raise NotApplicable("record larger than a segment")
        with open(nxt, "wb") as f:
            f.truncate(c.seg)
            f.write(rec)
        at = end
    r = parse_record(rec, 0, at)
    assert isinstance(r, Rec), note
    c.records.append(r)
    return r


@damage("names")
def topic_record(c: Case, rng):
    """A valid record whose topic is a path, markup, control chars or bad UTF-8 (#2)."""
    topic = _hostile_topic(c, rng)
    last = c.records[-1] if c.records else None
    ts = (last.store_ts + 1) if last else 1_700_000_000_000
    body = rng.randbytes(rng.randint(0, 64))
    props = props_text({"KEYS": "hk1 hk2", "UNIQ_KEY": "AB" * 16, "TAGS": "[/x]"})
    qid = rng.choice([0, 1, 3])
    r = _append_record(c, lambda at: encode_record(topic, body=body, props=props, queue_id=qid,
                                                   phys=at, store_ts=ts, born_ts=ts), "topic")
    c.note(f"topic-record: topic {topic!r} queue {qid} at {r.offset}")


def _same_length_hostile(n: int, rng) -> bytes:
    options = [(b"../" * n)[:n], b"." * min(n, 2) + b"x" * max(0, n - 2), b"\xff" * n,
               (b"T\x00" * n)[:n], (b"\x1b[31m" + b"x" * n)[:n]]
    if n >= 4:
        options.append(b"[/x]" + b"x" * (n - 4))
    if n >= 2:
        options += [b"..", b"\n" + b"y" * (n - 1)] if n == 2 else [b"\n" + b"y" * (n - 1)]
    return rng.choice([o for o in options if len(o) == n])


@damage("names")
def topic_inplace(c: Case, rng):
    """An existing record's topic rewritten in place, same length: still a valid record
    (BODYCRC covers the body only), now naming ``..``, markup or bad bytes."""
    recs = [r for r in c.records if len(r.topic) > 0]
    r = _pick(rng, recs, "record")
    new = _same_length_hostile(len(r.topic), rng)
    b = 20 if r.sys_flag & 0x10 else 8
    s = 20 if r.sys_flag & 0x20 else 8
    body_len = struct.unpack_from(">i", r.raw, 68 + b + s)[0]
    tpos = 68 + b + s + 4 + max(body_len, 0) + (1 if struct.unpack_from(">i", r.raw, 4)[0] == MAGIC_V1 else 2)
    path, pos = _seg_of(c, r.offset)
    _patch(path, pos + tpos, new)
    i = c.records.index(r)
    c.records[i] = parse_record(r.raw[:tpos] + new + r.raw[tpos + len(new):], 0, r.offset)
    c.note(f"topic-inplace: record {r.offset} topic {r.topic!r} -> {new!r}")


ODD_NAMES = [b"x\ny", b"\x1b[31mT", b"[/x]", b"\xff\xfe", b"T\x7f", b" ", b"-", b"a" * 255,
             b".hidden", b"T\\x", b"[bold]", b"\xc3(", b"%RETRY%g", b"\t"]


@damage("names")
def queue_dir_odd(c: Case, rng):
    """A ConsumeQueue directory named oddly (newline, escapes, bad UTF-8, markup) or with
    an odd queue id (-1, 2**64, 'abc', '007'), holding a copy of a real CQ file or junk."""
    cq = c.store / "consumequeue"
    if not cq.is_dir() or cq.is_symlink():
        raise NotApplicable("no consumequeue/")
    src = rng.choice(c.cq_files() or [None])
    if rng.random() < 0.5:
        tdir = os.path.join(os.fsencode(cq), rng.choice(ODD_NAMES))
        qname = rng.choice([b"0", b"1"])
    else:
        topics = [t for t in sorted(cq.iterdir()) if t.is_dir() and not t.is_symlink()]
        tdir = os.fsencode(_pick(rng, topics, "topic dir"))
        qname = rng.choice([b"-1", b"99999999999999999999", b"abc", b"007", b"0x1", b"+1", b"1\n"])
    qdir = os.path.join(tdir, qname)
    os.makedirs(qdir, exist_ok=True)
    fname = os.path.join(qdir, b"0" * 20)
    if src is not None and rng.random() < 0.7:
        shutil.copy2(src, fname)
    else:
        with open(fname, "wb") as f:
            f.write(rng.randbytes(rng.choice([20, 53, 1280])))
    c.note(f"queue-dir-odd: {os.path.relpath(qdir, os.fsencode(c.store))!r}")


# --- symlinks (issue 11, #3) -----------------------------------------------------------------


def _next_segment_name(c: Case) -> str:
    segs = c.segments()
    last = int(segs[-1].name) if segs else -c.seg
    return f"{last + c.seg:020d}"


def _outside_copy(c: Case, p: Path) -> Path:
    c.outside.mkdir(parents=True, exist_ok=True)
    dst = c.outside / f"copy-{len(list(c.outside.iterdir()))}-{p.name}"
    if p.is_dir():
        copy_tree(p, dst, skip=())
    else:
        shutil.copy2(p, dst)
    return dst


def _link(at: Path, target: Path | str, rng) -> str:
    """Make ``at`` a symlink to ``target``, relative or absolute at random."""
    if isinstance(target, Path) and rng.random() < 0.5:
        target = os.path.relpath(target, at.parent)
    os.symlink(target, at)
    return str(target)


@damage("symlinks")
def symlink_dotdot(c: Case, rng):
    """A symlink to ``..`` (or ``../..``) where the broker expects its own files (#3)."""
    spots = []
    if (c.store / "consumequeue").is_dir():
        spots.append(c.store / "consumequeue" / "Loop")
        spots += [t / "9" for t in sorted((c.store / "consumequeue").iterdir()) if t.is_dir()][:3]
    if (c.store / "commitlog").is_dir():
        spots.append(c.store / "commitlog" / _next_segment_name(c))
    if (c.store / "index").is_dir():
        spots.append(c.store / "index" / "99999999999999998")
    at = _pick(rng, [s for s in spots if not s.exists() and not s.is_symlink()], "spot")
    target = rng.choice(["..", "../..", "../../.."])
    os.symlink(target, at)
    c.note(f"symlink-dotdot: {c.rel(at)} -> {target}")


@damage("symlinks")
def symlink_self(c: Case, rng):
    """A self-referencing symlink named like a segment, CQ file, index file or topic."""
    spots = []
    if (c.store / "commitlog").is_dir():
        spots.append(c.store / "commitlog" / _next_segment_name(c))
    for q in c.queue_dirs()[:3]:
        files = sorted(q.iterdir())
        last = int(files[-1].name) if files and SEG_NAME.match(files[-1].name) else -1280
        spots.append(q / f"{last + 1280:020d}")
    if (c.store / "index").is_dir():
        spots.append(c.store / "index" / "99999999999999997")
    if (c.store / "consumequeue").is_dir():
        spots.append(c.store / "consumequeue" / "Self")
    at = _pick(rng, spots, "spot")
    os.symlink(at.name, at)
    c.note(f"symlink-self: {c.rel(at)}")


@damage("symlinks")
def symlink_outside(c: Case, rng):
    """A store file or directory replaced by (or added as) a symlink to a copy outside
    the store: segment, CQ file, index file, topic dir, checkpoint, lock, abort, or a
    whole commitlog/ consumequeue/ index/ directory."""
    choices = []
    segs = c.segments()
    if segs:
        choices += ["segment", "new-segment", "commitlog-dir"]
    if c.cq_files():
        choices += ["cq-file", "topic-dir", "consumequeue-dir"]
    if c.index_files():
        choices += ["index-file", "index-dir"]
    if is_regular(c.store / "checkpoint"):
        choices.append("checkpoint")
    choices += ["lock", "abort"]
    what = _pick(rng, choices)
    if what == "segment":
        p = rng.choice(segs)
        target = _outside_copy(c, p)
        p.unlink()
        c.touch(int(p.name))
    elif what == "new-segment":
        p = c.store / "commitlog" / _next_segment_name(c)
        target = _outside_copy(c, rng.choice(segs))
    elif what == "commitlog-dir":
        p = c.store / "commitlog"
        target = _outside_copy(c, p)
        shutil.rmtree(p)
        c.touch(int(segs[0].name))
    elif what == "cq-file":
        p = rng.choice(c.cq_files())
        target = _outside_copy(c, p)
        p.unlink()
    elif what == "topic-dir":
        p = rng.choice(c.queue_dirs()).parent
        target = _outside_copy(c, p)
        shutil.rmtree(p)
    elif what == "consumequeue-dir":
        p = c.store / "consumequeue"
        target = _outside_copy(c, p)
        shutil.rmtree(p)
    elif what == "index-file":
        p = rng.choice(c.index_files())
        target = _outside_copy(c, p)
        p.unlink()
    elif what == "index-dir":
        p = c.store / "index"
        target = _outside_copy(c, p)
        shutil.rmtree(p)
    else:
        p = c.store / what
        if is_regular(p):
            target = _outside_copy(c, p)
            p.unlink()
        else:
            c.outside.mkdir(parents=True, exist_ok=True)
            target = c.outside / f"{what}-target"
            target.write_bytes(b"lock" if what == "lock" else b"")
    shown = _link(p, target, rng)
    c.note(f"symlink-outside: {c.rel(p)} -> {shown}")


@damage("symlinks")
def symlink_dangling(c: Case, rng):
    """A dangling symlink named like a segment, CQ file, index file or checkpoint."""
    spots = []
    if (c.store / "commitlog").is_dir():
        spots.append(c.store / "commitlog" / _next_segment_name(c))
    spots += [q / "00000000000000999680" for q in c.queue_dirs()[:2]]
    if (c.store / "index").is_dir():
        spots.append(c.store / "index" / "99999999999999996")
    if not (c.store / "checkpoint").exists():
        spots.append(c.store / "checkpoint")
    at = _pick(rng, [s for s in spots if not s.exists() and not s.is_symlink()], "spot")
    os.symlink(rng.choice(["nowhere", str(c.outside / "nowhere")]), at)
    c.note(f"symlink-dangling: {c.rel(at)}")


# --- odd files (issue 11, #3 #7) --------------------------------------------------------------


@damage("odd-files")
def stray_segment(c: Case, rng):
    """A small file named like a segment: between existing segments (overlapping one),
    right after the last, far beyond, or in a queue directory (#3: 53 bytes)."""
    segs = c.segments()
    spots = []
    if segs:
        first, last = int(segs[0].name), int(segs[-1].name)
        spots += [f"commitlog/{first + rng.choice([4096, 53, c.seg // 2]):020d}",
                  f"commitlog/{last + c.seg:020d}", f"commitlog/{last + 10 * c.seg:020d}"]
        if len(segs) > 2:
            spots.append(f"commitlog/{int(rng.choice(segs[1:-1]).name) + 4096:020d}")
    for q in c.queue_dirs()[:2]:
        spots.append(f"{c.rel(q)}/{rng.choice([20, 1300, 2560 * 10]):020d}")
    rel = _pick(rng, spots, "spot")
    p = c.store / rel
    if p.exists() or p.is_symlink():
        raise NotApplicable("name taken")
    size = rng.choice([53, 0, 1, 8, 4096, c.seg - 1])
    content = rng.choice([b"\0" * size, rng.randbytes(size),
                          (segs[0].read_bytes()[:size] if segs else b"\0" * size)])
    p.write_bytes(content)
    c.note(f"stray-segment: {rel} ({len(content)} bytes)")


@damage("odd-files")
def dir_for_file(c: Case, rng):
    """A directory where a file should be (segment, CQ file, index file, checkpoint,
    abort, lock), or a file where a directory should be (topic, queue)."""
    options = ["new-segment-dir", "checkpoint", "abort", "lock"]
    if c.segments():
        options.append("segment")
    if c.cq_files():
        options += ["cq-file", "queue-as-file"]
    if c.index_files():
        options.append("index-file")
    what = rng.choice(options)
    if what == "new-segment-dir":
        p = c.store / "commitlog" / _next_segment_name(c)
        p.mkdir(parents=True)
    elif what == "segment":
        p = rng.choice(c.segments())
        _replace_with(p, Path.mkdir)
        c.touch(int(p.name))
    elif what == "cq-file":
        p = rng.choice(c.cq_files())
        _replace_with(p, Path.mkdir)
    elif what == "queue-as-file":
        p = rng.choice(c.queue_dirs())
        _replace_with(p, lambda x: x.write_bytes(b"\0" * 20))
    elif what == "index-file":
        p = rng.choice(c.index_files())
        _replace_with(p, Path.mkdir)
    else:
        p = c.store / what
        _replace_with(p, Path.mkdir)
    if rng.random() < 0.3 and p.is_dir():
        (p / "inner").write_bytes(b"x")
    c.note(f"dir-for-file: {c.rel(p)} ({what})")


@damage("odd-files")
def huge_name(c: Case, rng):
    """Names past any offset: 99999999999999999999 (> 2**63) segments, CQ files and queue
    ids, a 17-digit index name, Long.MAX_VALUE (#7: OverflowError)."""
    spots = ["commitlog/99999999999999999999", "commitlog/09223372036854775807",
             "commitlog/18446744073709551615", "index/99999999999999999"]
    for q in c.queue_dirs()[:2]:
        spots += [f"{c.rel(q)}/99999999999999999999", f"{c.rel(q.parent)}/99999999999999999999/{'0' * 20}"]
    rel = rng.choice(spots)
    p = c.store / rel
    if p.exists():
        raise NotApplicable("name taken")
    p.parent.mkdir(parents=True, exist_ok=True)
    size = rng.choice([53, 0, 1280, c.seg])
    with open(p, "wb") as f:
        f.truncate(size)
        if size and rng.random() < 0.5:
            f.write(rng.randbytes(min(size, 512)))
    c.note(f"huge-name: {rel} ({size} bytes)")


@damage("odd-files")
def fifo(c: Case, rng):
    """A named pipe where a store file is expected: opening it for reading would block."""
    options = ["commitlog/" + _next_segment_name(c), "index/99999999999999995"]
    if c.cq_files():
        options.append("cq-file")
    options += ["checkpoint", "abort", "lock"]
    what = rng.choice(options)
    if what == "cq-file":
        p = rng.choice(c.cq_files())
    else:
        p = c.store / what
    if not p.parent.is_dir():
        raise NotApplicable("no parent dir")
    _replace_with(p, lambda x: os.mkfifo(x))
    c.note(f"fifo: {c.rel(p)}")


@damage("odd-files")
def stray_files(c: Case, rng):
    """Files that are not the broker's: notes, temp files, an interrupted rebuild's
    scratch directory, editor backups, a copy of a segment directory."""
    spots = ["commitlog/notes.txt", "index/README", "consumequeue/x.tmp", "checkpoint.bak",
             ".rmqstore-rebuild-12345/consumequeue/T0/0/" + "0" * 20, "commitlog.old/" + "0" * 20,
             "commitlog/.00000000000000000000.swp", "index/20240101000000000.tmp"]
    for q in c.queue_dirs()[:1]:
        spots.append(f"{c.rel(q)}/x.tmp")
    rel = rng.choice(spots)
    p = c.store / rel
    if p.exists() or not (p.parent.is_dir() or "/" in rel):
        raise NotApplicable("name taken or no parent")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(rng.choice([b"hello", rng.randbytes(200), b""]))
    c.note(f"stray-files: {rel}")


@damage("odd-files")
def empty_files(c: Case, rng):
    """Zero-byte files: an existing segment, CQ or index file emptied, or a new empty
    segment after the last."""
    options = [("new", None)]
    options += [("segment", p) for p in c.segments()]
    options += [("cq", p) for p in c.cq_files()[:5]]
    options += [("index", p) for p in c.index_files()]
    what, p = rng.choice(options)
    if what == "new":
        p = c.store / "commitlog" / _next_segment_name(c)
        if not p.parent.is_dir():
            raise NotApplicable("no commitlog/")
    elif what == "segment":
        c.touch(int(p.name))
    p.write_bytes(b"")
    c.note(f"empty-files: {c.rel(p)}")


# --- CommitLog bytes ---------------------------------------------------------------------------


def _pick_record(c: Case, rng, bias_last=0.5) -> Rec:
    recs = [r for r in c.records if record_at(c.store, c.seg, r.offset, r.size) == r.raw]
    if not recs:
        raise NotApplicable("no intact record")
    return recs[-1] if rng.random() < bias_last else rng.choice(recs)


@damage("commitlog")
def torn_record(c: Case, rng):
    """A record zeroed from a point inside it to its end (a torn write)."""
    r = _pick_record(c, rng, 0.7)
    cut = rng.randint(1, r.size - 1)
    path, pos = _seg_of(c, r.offset)
    _patch(path, pos + cut, b"\0" * (r.size - cut))
    c.touch(r.offset)
    c.note(f"torn-record: {r.offset} zeroed from +{cut}")


@damage("commitlog")
def garbage_tail(c: Case, rng):
    """Random non-zero bytes right after the end of valid data."""
    end = c.data_end()
    path, pos = _seg_of(c, end)
    if not is_regular(path):
        raise NotApplicable("end at a segment boundary")
    room = min(path.stat().st_size, c.seg) - pos
    if room < 9:
        raise NotApplicable("no room after the end")
    n = rng.randint(9, min(room, 300))
    _patch(path, pos, bytes(rng.randrange(1, 256) for _ in range(n)))
    c.touch(end)
    c.note(f"garbage-tail: {n} bytes at {end}")


#: Header fields (name, position, size) for IPv4 hosts (§3.1); IPv6 shifts later ones.
HEADER_FIELDS = [("TOTALSIZE", 0, 4), ("MAGICCODE", 4, 4), ("BODYCRC", 8, 4), ("QUEUEID", 12, 4),
                 ("FLAG", 16, 4), ("QUEUEOFFSET", 20, 8), ("PHYSICALOFFSET", 28, 8),
                 ("SYSFLAG", 36, 4), ("BORNTIMESTAMP", 40, 8), ("BORNHOST", 48, 8),
                 ("STORETIMESTAMP", 56, 8), ("STOREHOST", 64, 8), ("RECONSUMETIMES", 72, 4),
                 ("PREPAREDTXOFFSET", 76, 8), ("BODYLENGTH", 84, 4)]


@damage("commitlog")
def header_flip(c: Case, rng):
    """One bit flipped in one header field of one record (#4, #7: KeyError -1)."""
    r = _pick_record(c, rng, 0.2)
    name, at, size = rng.choice(HEADER_FIELDS)
    if r.sys_flag & 0x30 and at >= 48:
        at += 12 * bool(r.sys_flag & 0x10) + (12 * bool(r.sys_flag & 0x20) if at >= 64 else 0)
    path, pos = _seg_of(c, r.offset)
    _flip(path, pos + at + rng.randrange(size), rng)
    c.touch(r.offset)
    c.note(f"header-flip: record {r.offset} field {name}")


@damage("commitlog")
def body_flip(c: Case, rng):
    """One bit flipped in a record's body, topic or properties."""
    r = _pick_record(c, rng, 0.2)
    b = 20 if r.sys_flag & 0x10 else 8
    s = 20 if r.sys_flag & 0x20 else 8
    start = 68 + b + s + 4
    if r.size - start < 1:
        raise NotApplicable("empty record tail")
    at = start + rng.randrange(r.size - start)
    path, pos = _seg_of(c, r.offset)
    _flip(path, pos + at, rng)
    c.touch(r.offset)
    c.note(f"body-flip: record {r.offset} byte +{at}")


@damage("commitlog")
def truncate_segment(c: Case, rng):
    """A CommitLog segment cut short: to 0, inside a record, at a record boundary."""
    segs = c.segments()
    p = segs[-1] if segs and rng.random() < 0.5 else _pick(rng, segs, "segment")
    recs = _rec_in_segment(c, p)
    start = int(p.name)
    points = [0, rng.randrange(1, c.seg), c.seg - 1]
    if recs:
        r = rng.choice(recs)
        points += [r.offset - start, r.offset - start + rng.randrange(1, r.size)]
    n = rng.choice(points)
    os.truncate(p, n)
    c.touch(start + n)
    c.note(f"truncate-segment: {p.name} to {n}")


@damage("commitlog")
def missing_segment(c: Case, rng):
    """A CommitLog segment deleted: the first, one in the middle, or the last."""
    segs = c.segments()
    p = _pick(rng, [segs[0], segs[-1], *segs[1:-1]] if segs else [], "segment")
    p.unlink()
    c.touch(int(p.name))
    c.note(f"missing-segment: {p.name}")


@damage("commitlog")
def zero_range(c: Case, rng):
    """A range of a segment zeroed (a lost page, a hole)."""
    p = _pick(rng, c.segments(), "segment")
    size = p.stat().st_size
    if size == 0:
        raise NotApplicable("empty segment")
    a = rng.randrange(size)
    n = min(size - a, rng.choice([1, 8, 100, 4096, size]))
    _patch(p, a, b"\0" * n)
    c.touch(int(p.name) + a)
    c.note(f"zero-range: {p.name} [{a}, {a + n})")


@damage("commitlog")
def random_range(c: Case, rng):
    """A range of a segment overwritten with random bytes."""
    p = _pick(rng, c.segments(), "segment")
    size = p.stat().st_size
    if size == 0:
        raise NotApplicable("empty segment")
    a = rng.randrange(size)
    n = min(size - a, rng.choice([4, 16, 300, 4096]))
    _patch(p, a, rng.randbytes(n))
    c.touch(int(p.name) + a)
    c.note(f"random-range: {p.name} [{a}, {a + n})")


@damage("commitlog")
def duplicate_segment(c: Case, rng):
    """A copy of a segment under the next free name (a bad restore, a copy tool)."""
    segs = c.segments()
    src = _pick(rng, segs, "segment")
    dst = c.store / "commitlog" / _next_segment_name(c)
    if dst.exists() or dst.is_symlink():
        raise NotApplicable("name taken")
    shutil.copy2(src, dst)
    c.note(f"duplicate-segment: {src.name} copied to {dst.name}")


@damage("commitlog")
def oversize_segment(c: Case, rng):
    """A segment longer than the geometry (bytes appended after its end)."""
    p = _pick(rng, c.segments(), "segment")
    with open(p, "ab") as f:
        f.write(rng.choice([b"\0", rng.randbytes(100), b"\0" * 4096]))
    c.note(f"oversize-segment: {p.name} now {p.stat().st_size} bytes")


@damage("commitlog")
def bogus_blank(c: Case, rng):
    """A BLANK (end-of-segment) header written over a record in the middle of a segment."""
    r = _pick_record(c, rng, 0.1)
    path, pos = _seg_of(c, r.offset)
    _patch(path, pos, struct.pack(">ii", rng.choice([c.seg - pos, 8, -1, 0]), MAGIC_BLANK))
    c.touch(r.offset)
    c.note(f"bogus-blank: at {r.offset}")


# --- ConsumeQueue ----------------------------------------------------------------------------


@damage("consumequeue")
def cq_flip(c: Case, rng):
    """One bit flipped in one ConsumeQueue unit (offset, size or tagsCode)."""
    p = _pick(rng, c.cq_files(), "CQ file")
    size = p.stat().st_size
    if size == 0:
        raise NotApplicable("empty CQ file")
    data = p.read_bytes()
    used = [i for i in range(0, len(data) - 19, 20) if data[i:i + 20] != b"\0" * 20] or [0]
    at = rng.choice(used) + rng.randrange(20)
    _flip(p, min(at, size - 1), rng)
    c.note(f"cq-flip: {c.rel(p)} byte {at}")


@damage("consumequeue")
def cq_truncate(c: Case, rng):
    """A ConsumeQueue file cut to 0, to a non-multiple of 20, or in half."""
    p = _pick(rng, c.cq_files(), "CQ file")
    n = rng.choice([0, 7, 20 * rng.randint(0, 30) + rng.randint(1, 19), p.stat().st_size // 2])
    os.truncate(p, min(n, p.stat().st_size))
    c.note(f"cq-truncate: {c.rel(p)} to {n}")


@damage("consumequeue")
def cq_missing_file(c: Case, rng):
    """A ConsumeQueue file deleted (first, middle or last of its queue)."""
    p = _pick(rng, c.cq_files(), "CQ file")
    p.unlink()
    c.note(f"cq-missing-file: {c.rel(p)}")


@damage("consumequeue")
def cq_garbage(c: Case, rng):
    """A ConsumeQueue file's bytes replaced: random, zeroed range, or units pointing past
    the CommitLog end (huge or negative offsets and sizes)."""
    p = _pick(rng, c.cq_files(), "CQ file")
    size = p.stat().st_size
    v = rng.randrange(3)
    if v == 0:
        p.write_bytes(rng.randbytes(size))
    elif v == 1 and size:
        a = rng.randrange(size)
        _patch(p, a, b"\0" * min(size - a, rng.choice([20, 100, size])))
    else:
        end = c.data_end()
        units = b"".join(struct.pack(">qiq", o, s, 0) for o, s in
                         [(end + 100, 200), (2**62, 100), (-1, 50), (0, -5), (end - 10, 2**31 - 1)][:rng.randint(1, 5)])
        _patch(p, 20 * rng.randrange(max(1, size // 20)), units)
    c.note(f"cq-garbage: {c.rel(p)} variant {v}")


@damage("consumequeue")
def cq_missing_queue(c: Case, rng):
    """A whole queue or topic directory deleted, or consumequeue/ itself."""
    qs = c.queue_dirs()
    v = rng.randrange(3)
    if v == 2 or not qs:
        p = c.store / "consumequeue"
        if not p.is_dir() or p.is_symlink():
            raise NotApplicable("no consumequeue/")
    else:
        p = rng.choice(qs) if v == 0 else rng.choice(qs).parent
    shutil.rmtree(p)
    c.note(f"cq-missing-queue: {c.rel(p)}")


@damage("consumequeue")
def cq_duplicate_queue(c: Case, rng):
    """A queue's directory copied under another queue id or another topic."""
    q = _pick(rng, c.queue_dirs(), "queue")
    dst = rng.choice([q.parent / "77", q.parent.parent / "CopiedTopic" / q.name])
    if dst.exists():
        raise NotApplicable("name taken")
    copy_tree(q, dst, skip=())
    c.note(f"cq-duplicate-queue: {c.rel(q)} -> {c.rel(dst)}")


# --- IndexFile --------------------------------------------------------------------------------


@damage("index")
def index_flip(c: Case, rng):
    """One bit flipped in an IndexFile header, slot table or entry."""
    p = _pick(rng, c.index_files(), "index file")
    size = p.stat().st_size
    if size == 0:
        raise NotApplicable("empty index file")
    at = rng.choice([rng.randrange(min(40, size)), rng.randrange(size)])
    _flip(p, at, rng)
    c.note(f"index-flip: {c.rel(p)} byte {at}")


@damage("index")
def index_truncate(c: Case, rng):
    """An IndexFile cut short: to 0, inside the 40-byte header, after it, anywhere."""
    p = _pick(rng, c.index_files(), "index file")
    n = rng.choice([0, 39, 40, rng.randrange(max(1, p.stat().st_size))])
    os.truncate(p, n)
    c.note(f"index-truncate: {c.rel(p)} to {n}")


@damage("index")
def index_missing(c: Case, rng):
    """An IndexFile deleted (first, middle or last)."""
    p = _pick(rng, c.index_files(), "index file")
    p.unlink()
    c.note(f"index-missing: {c.rel(p)}")


@damage("index")
def index_garbage(c: Case, rng):
    """An IndexFile of random bytes (same size or odd size), all zeros, or an extra file
    (a copy of the last one, or junk) with a later name."""
    files = c.index_files()
    v = rng.randrange(4)
    if v < 3:
        p = _pick(rng, files, "index file")
        size = p.stat().st_size
        p.write_bytes([rng.randbytes(size), rng.randbytes(rng.randint(1, 9000)), b"\0" * size][v])
    else:
        d = c.store / "index"
        if not d.is_dir() or d.is_symlink():
            raise NotApplicable("no index/")
        last = int(files[-1].name) if files else 20240101000000000
        p = d / f"{last + rng.randint(1, 5000):017d}"
        if files and rng.random() < 0.5:
            shutil.copy2(files[-1], p)
        else:
            p.write_bytes(rng.randbytes(rng.choice([40, 5416, 100])))
    c.note(f"index-garbage: {c.rel(p)} variant {v}")


# --- checkpoint, abort, lock ---------------------------------------------------------------------


@damage("state")
def checkpoint_odd(c: Case, rng):
    """The checkpoint missing, truncated, oversized, random, or holding odd timestamps
    (0, -1, Long.MAX, far future, before the first record)."""
    p = c.store / "checkpoint"
    v = rng.randrange(5)
    if p.exists() and not is_regular(p):  # an earlier kind made it a directory or a pipe
        raise NotApplicable("checkpoint is not a file")
    if v == 0:
        if not p.exists():
            raise NotApplicable("no checkpoint")
        p.unlink()
    elif v == 1:
        p.write_bytes((p.read_bytes() if is_regular(p) else b"\0" * 4096)[:rng.choice([0, 8, 23, 24, 40, 4095])])
    elif v == 2:
        p.write_bytes(rng.randbytes(rng.choice([4096, 8192])))
    else:
        vals = [rng.choice([0, -1, 2**63 - 1, 4_102_444_800_000, 1_000, 1_700_000_000_000])
                for _ in range(5)]
        p.write_bytes(struct.pack(">5q", *vals) + b"\0" * (4096 - 40))
    c.note(f"checkpoint-odd: variant {v}")


@damage("state")
def abort_present(c: Case, rng):
    """``abort`` left behind (a crash): empty (4.9), a PID (5.x), with ``abort.bak``."""
    p = c.store / "abort"
    if p.exists() or p.is_symlink():
        raise NotApplicable("abort exists")
    p.write_bytes(rng.choice([b"", b"12345", b"\0" * 10]))
    if rng.random() < 0.3:
        (c.store / "abort.bak").write_bytes(b"")
    c.note("abort-present")


@damage("state")
def lock_odd(c: Case, rng):
    """The lock file missing, empty, junk, huge, unreadable, or held by another process."""
    p = c.store / "lock"
    v = rng.randrange(6)
    if p.exists() and not is_regular(p):  # an earlier kind made it a directory or a pipe
        raise NotApplicable("lock is not a file")
    if v == 0:
        if not p.exists():
            raise NotApplicable("no lock file")
        p.unlink()
    elif v == 1:
        p.write_bytes(b"")
    elif v == 2:
        p.write_bytes(rng.randbytes(rng.choice([4, 100])))
    elif v == 3:
        p.write_bytes(b"\0" * (1 << 20))
    elif v == 4:
        p.write_bytes(b"lock")
        os.chmod(p, 0)
    else:
        if not is_regular(p):
            p.write_bytes(b"lock")
        c.hold_lock = True
    c.note(f"lock-odd: variant {v}{' (held)' if c.hold_lock else ''}")


@damage("state")
def missing_dir(c: Case, rng):
    """commitlog/, consumequeue/ or index/ gone (a mount that did not come up)."""
    name = rng.choice(["commitlog", "consumequeue", "index"])
    p = c.store / name
    if not p.is_dir() or p.is_symlink():
        raise NotApplicable(f"no {name}/")
    shutil.rmtree(p)
    if name == "commitlog":
        c.touch(0)
    c.note(f"missing-dir: {name}/")


@damage("none")
def none(c: Case, rng):
    """No damage: a healthy base must read fine and repair must have nothing to do."""
    c.note("none")


ALL_KINDS = list(DAMAGES)


# --- building a case -------------------------------------------------------------------------


def make_case(seed: int, workdir: Path, *, kinds: list[str] | None = None,
              base: str | None = None, cache: Path | None = None) -> Case:
    """Build the damaged store of ``seed`` under ``workdir/sandbox``.

    ``kinds`` forces the damage kinds (else one or two picked by the seed); ``base`` forces
    the base store. Kinds that do not apply to the store are replaced by others (when not
    forced) or raise :class:`NotApplicable` (when forced).
    """
    rng = random.Random(seed)
    drawn_base = pick_base(rng)  # drawn even when forced: the later draws stay the seed's
    base_name = base or drawn_base
    b = get_base(base_name, cache or workdir.parent / "bases")
    sandbox = workdir / "sandbox"
    if sandbox.exists():
        shutil.rmtree(sandbox)
    c = Case(seed, b, sandbox, records=list(b.records))
    copy_tree(b.path, c.store)
    for d in ("outside", "tmp", "home", "cwd"):
        (sandbox / d).mkdir(parents=True, exist_ok=True)
    if b.unsupported:
        c.expect_refusal = "a DLedger CommitLog (dledger-*/), a layout rmqstore does not read"
    forced = kinds is not None
    drawn = rng.sample(ALL_KINDS, rng.choice([1, 1, 2]))  # as above: a replay that names
    wanted = list(kinds) if forced else drawn           # the seed's kinds gets its damage
    tries = 0
    while wanted:
        k = wanted.pop(0)
        try:
            DAMAGES[k](c, rng)
            c.kinds.append(k)
        except NotApplicable as e:
            if forced:
                raise NotApplicable(f"{k}: {e}") from None
            tries += 1
            if tries > 20:
                break
            wanted.append(rng.choice([x for x in ALL_KINDS if x not in c.kinds and x != k]))
    if c.expect_refusal == TWO_COMMITLOGS and not (c.store / "commitlog").is_dir():
        c.expect_refusal = None  # a later damage removed STORE/commitlog: one CommitLog again
    if c.expect_refusal and "disagrees with the files" in c.expect_refusal:
        # A later damage took away the files that fixed this value (seeds 4638, 5502:
        # commitlog/ or consumequeue/ deleted): nothing is left to disagree with.
        key = c.expect_refusal.split()[1].split("=")[0]
        have = {"mappedFileSizeCommitLog": c.segments, "mappedFileSizeConsumeQueue": c.cq_files,
                "maxHashSlotNum": c.index_files, "maxIndexNum": c.index_files}[key]()
        if not have:
            c.expect_refusal = None
    if not c.kinds:
        c.kinds.append("none")
        c.note("none (no damage applied)")
    return c


if __name__ == "__main__":
    from fuzz_campaign import main

    raise SystemExit(main())
