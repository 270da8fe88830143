"""The invariants the fuzz suite holds rmqstore to on every damaged store (tests/damage.py),
and their library side; tests/fuzz_cli.py checks the same through the ``rmqstore`` command
and under SIGKILL, tests/fuzz_campaign.py runs thousands of cases.

Read commands (dump, get, query-key, stats, verify): no exception but a typed
``RmqStoreError`` (library) or exit 0/1/2 without a traceback or "internal error" (CLI), an
answer within the timeout, and not one byte, mtime or directory entry changed anywhere in
the sandbox. Repair: ``--dry-run`` changes nothing; every record the spec calls valid
before the first damaged byte (or before the end rmqstore itself verified) is still there,
byte for byte; the backup gives back every byte removed; a second run has nothing to do;
nothing is written outside the store and the backup folder. Kills: a repair SIGKILLed at a
filesystem-operation boundary or at a random time is finished by the next ``repair``
(and undone by ``restore`` where that exists).

Checks that need an API main does not have yet (``restore``) switch on by themselves
when it appears; every result lists the checks that ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import signal
import stat
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import fuzz_store as FS

TIMEOUT_LIB = float(os.environ.get("RMQSTORE_FUZZ_TIMEOUT", "20"))
TIMEOUT_CLI = float(os.environ.get("RMQSTORE_FUZZ_CLI_TIMEOUT", "60"))

FAILURE_KINDS = {
    "exception": "library raised something other than RmqStoreError",
    "traceback": "CLI printed a Python traceback",
    "internal-error": "CLI said 'internal error'",
    "crash": "process died from a signal (SIGBUS, SIGSEGV, ...)",
    "hang": "no answer within the timeout",
    "bad-exit": "CLI exit code not 0, 1 or 2",
    "bad-json": "--format json/jsonl output does not parse (one document)",
    "error-not-one-line": "exit 2 without exactly one line on stderr",
    "read-changed": "a read command changed a byte, mtime or entry in the store",
    "wrote-outside": "a command changed something outside the store (and backup)",
    "not-refused": "a command answered where it must refuse (exit 2)",
    "dry-run-changed": "repair --dry-run (or planning) changed something",
    "prefix-lost": "repair changed or removed a valid record before the damage / verified end",
    "backup-incomplete": "the backup does not give back the original bytes (no backup folder)",
    "restore-mismatch": "restore did not give the original store back",
    "not-idempotent": "a second repair still has steps",
    "repair-midway": "repair failed after changing the store (and no restore to undo it)",
    "noop-changed": "repair with nothing to do changed the store",
    "store-grew": "repair grew the store by more than its own size",
    "healthy-not-noop": "repair planned steps on a healthy store",
    "healthy-flagged": "verify reported errors on a healthy store",
    "kill-not-finished": "after a SIGKILLed repair, the next repair did not finish the job",
    "kill-not-undone": "after a SIGKILLed repair, restore did not give the original back",
    "harness-error": "the fuzz harness itself failed (a bug in tests/, not in rmqstore)",
}


@dataclass
class Failure:
    kind: str
    command: str
    symptom: str


@dataclass
class CaseResult:
    seed: int
    mode: str
    base: str = ""
    kinds: list = field(default_factory=list)
    applied: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    commands: int = 0
    kills: int = 0
    checks: Counter = field(default_factory=Counter)
    skipped: str | None = None

    def fail(self, kind: str, command: str, symptom: str) -> None:
        assert kind in FAILURE_KINDS, kind
        symptom = " ".join(str(symptom).split())[:300]
        self.failures.append(Failure(kind, command, symptom))

    def to_json(self) -> dict:
        d = asdict(self)
        d["checks"] = dict(self.checks)
        return d

    def report(self) -> str:
        """What failed, with the line that reproduces it."""
        lines = [f"seed {self.seed} ({self.mode}) base {self.base} damage {self.applied}"]
        lines += [f"  {f.kind}: {f.command}: {f.symptom}" for f in self.failures]
        lines.append(f"  reproduce: {repro(self)}")
        return "\n".join(lines)


def repro(r: CaseResult) -> str:
    return (f"python -m tests.damage --replay {r.seed} --mode {r.mode} "
            f"--base {r.base} --kinds {','.join(r.kinds)}")


# --- snapshots ---------------------------------------------------------------------------


_SHA_CACHE: dict[tuple, str] = {}


def _sha(p: str, st: os.stat_result) -> str:
    # Big files (a repair's 420 MB IndexFile) are hashed once per version: any write
    # changes ctime, so (inode, size, mtime, ctime) names the content.
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if st.st_size > (1 << 20) and key in _SHA_CACHE:
        return _SHA_CACHE[key]
    with open(p, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if st.st_size > (1 << 20):
        if len(_SHA_CACHE) > 256:
            _SHA_CACHE.clear()
        _SHA_CACHE[key] = digest
    return digest


def tree_state(root: Path, *, content: bool = True) -> dict[str, tuple]:
    """Every entry under ``root`` (symlinks not followed): kind, size, mode, sha256 of
    regular files (when ``content``), symlink target; mtime_ns last."""
    out: dict[str, tuple] = {}

    def add(p: str, rel: str) -> None:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        m = st.st_mode
        if stat.S_ISLNK(m):
            v = ("link", os.readlink(p))
        elif stat.S_ISDIR(m):
            v = ("dir", stat.S_IMODE(m))
        elif stat.S_ISREG(m):
            try:
                digest = _sha(p, st) if content else None
            except PermissionError:  # mode 000 and not root
                digest = "unreadable"
            v = ("file", st.st_size, stat.S_IMODE(m), digest)
        else:
            v = ("special", stat.S_IFMT(m))
        out[rel] = v + (st.st_mtime_ns,)

    root = str(root)
    add(root, ".")
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            add(p, os.path.relpath(p, root))
    return out


def diff_states(a: dict, b: dict, *, ignore=None, times: bool = True, modes: bool = True,
                extras: bool = True, mtime_ok=frozenset()) -> list[str]:
    """What changed from ``a`` to ``b``, one line per entry; ``ignore(rel)`` skips an
    entry, ``mtime_ok`` holds entries whose mtime alone may change."""
    out = []
    for k in sorted(a.keys() | b.keys()):
        if ignore and ignore(k):
            continue
        va, vb = a.get(k), b.get(k)
        if va is None:
            if extras:
                out.append(f"created {k!r}")
        elif vb is None:
            out.append(f"removed {k!r}")
        else:
            ca, cb = _content(va, modes), _content(vb, modes)
            if ca != cb:
                out.append(f"changed {k!r} ({_short(ca)} -> {_short(cb)})")
            elif times and va[-1] != vb[-1] and va[0] != "link" and k not in mtime_ok:
                out.append(f"mtime of {k!r}")
    return out


def _content(v: tuple, modes: bool) -> tuple:
    v = v[:-1]
    if not modes and v[0] in ("dir", "file"):
        v = (v[0],) + tuple(x for i, x in enumerate(v[1:]) if not (i == (0 if v[0] == "dir" else 1)))
    return v


def _short(v: tuple) -> str:
    if v[0] == "file":
        return f"file {v[1]} B" + (f" {v[-1][:8]}" if v[-1] else "")
    return " ".join(map(str, v))


def _under(rel: str, prefix: str) -> bool:
    return rel == prefix or rel.startswith(prefix + os.sep)


def _ancestors(rel: str) -> set[str]:
    parts = Path(rel).parts
    return {"."} | {os.path.join(*parts[:i]) for i in range(1, len(parts))}


# --- features that switch checks on ----------------------------------------------------------

_FEATURES: dict | None = None


def features() -> dict:
    """What the code under test offers: a library ``restore`` and a ``restore`` command."""
    global _FEATURES
    if _FEATURES is not None:
        return _FEATURES
    f: dict = {"restore_lib": None, "restore_cli": None}
    for name in ("rmqstore.recovery.undo", "rmqstore.restore", "rmqstore.recovery.journal", "rmqstore.recovery.repair"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(mod, "restore", None)):
            f["restore_lib"] = f"{name}.restore"
            break
    try:
        import typer

        from cli.main import app

        group = typer.main.get_command(app)
        cmd = group.commands.get("restore")
        if cmd is not None:  # click parameters, whichever click typer carries
            f["restore_cli"] = {"arguments": [p.name for p in cmd.params if p.param_type_name == "argument"],
                                "options": [o for p in cmd.params if p.param_type_name == "option" for o in p.opts]}
    except Exception:  # noqa: BLE001 - no CLI, no CLI checks
        pass
    _FEATURES = f
    return f


def restore_lib(backup: Path, store: Path):
    """Call the library's restore, whatever the order of its (backup, store) arguments."""
    modname, fn_name = features()["restore_lib"].rsplit(".", 1)
    fn = getattr(importlib.import_module(modname), fn_name)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) <= 1:
        return fn(backup)
    if any(w in params[0].name for w in ("store", "root")):
        return fn(store, backup)
    return fn(backup, store)


def restore_cli_args(backup: Path, store: Path) -> list[str]:
    spec = features()["restore_cli"]
    args = ["restore"]
    names = spec["arguments"]
    for n in names:
        args.append(str(store) if any(w in n for w in ("store", "root")) else str(backup))
    if "--yes" in spec["options"]:
        args.append("--yes")
    return args


# --- running library code under a deadline -----------------------------------------------------


class Hang(BaseException):
    """The deadline passed (BaseException, so no ``except Exception`` swallows it)."""


@contextlib.contextmanager
def deadline(seconds: float):
    def on_alarm(signum, frame):
        raise Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _where(e: BaseException, package: str = "rmqstore") -> str:
    """`` at dir/file.py:line`` of the innermost frame in ``package`` (else the innermost)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if f"{os.sep}{package}{os.sep}" in f.filename] or frames
    if not mine:
        return ""
    f = mine[-1]
    return f" at {Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}"


class Runner:
    """Runs library calls for one case: typed errors are answers, anything else a failure."""

    def __init__(self, res: CaseResult, timeout: float = TIMEOUT_LIB):
        self.res, self.timeout = res, timeout
        self.hung = False

    def __call__(self, command: str, fn):
        """("ok", value) | ("refused", RmqStoreError) | ("failed", exception) | ("hang", None)."""
        from rmqstore.errors import RmqStoreError

        if self.hung:
            return "hang", None
        self.res.commands += 1
        try:
            with deadline(self.timeout):
                return "ok", fn()
        except Hang:
            self.hung = True
            self.res.fail("hang", command, f"no answer in {self.timeout:.0f} s")
            return "hang", None
        except RmqStoreError as e:
            return "refused", e
        except Exception as e:  # noqa: BLE001 - that is the finding
            self.res.fail("exception", command, f"{type(e).__name__}: {e}{_where(e)}")
            return "failed", e


@contextlib.contextmanager
def case_env(c: FS.Case):
    """Temp files and the working directory inside the sandbox, where they show."""
    old_tmp, old_cwd = tempfile.tempdir, os.getcwd()
    tempfile.tempdir = str(c.sandbox / "tmp")
    os.chdir(c.sandbox / "cwd")
    try:
        yield
    finally:
        tempfile.tempdir = old_tmp
        os.chdir(old_cwd)


LOCK_HOLDER = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
               "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)\nprint('ready', flush=True)\n"
               "sys.stdin.read()\n")


@contextlib.contextmanager
def lock_held(c: FS.Case):
    """Another process holds the store lock (a running broker) while the block runs."""
    if not c.hold_lock or not FS.is_regular(c.store / "lock"):
        yield False
        return
    p = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(c.store / "lock")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ok = p.stdout.readline().strip() == "ready"
    try:
        yield ok
    finally:
        p.stdin.close()
        p.wait(timeout=30)


# --- shared pieces of the checks ----------------------------------------------------------------


def must_keep(c: FS.Case, verified_end: int) -> list[tuple[FS.Rec, bytes]]:
    """Records repair must keep byte for byte: intact and valid by the spec (§3.9), and
    before the first damaged byte or before the end rmqstore verified."""
    out = []
    for r, now in FS.current_records(c):
        if now is None or not isinstance(FS.parse_record(now, 0, r.offset), FS.Rec):
            continue
        if r.end <= c.damage_from or r.end <= verified_end:
            out.append((r, now))
    return out


def check_prefix(c: FS.Case, keep, res: CaseResult, command: str) -> None:
    res.checks["prefix"] += 1
    lost = [r for r, b in keep if FS.record_at(c.store, c.seg, r.offset, r.size) != b]
    if lost:
        res.fail("prefix-lost", command, f"{len(lost)} of {len(keep)} valid record(s) changed or "
                 f"gone, first at offset {lost[0].offset} (damage from {c.damage_from})")


def grew(before: int, root: Path) -> str | None:
    """Why the store grew by more than its own size (and 4 MiB), naming its largest file."""
    after = store_bytes(root)
    if after <= 2 * before + (4 << 20):
        return None
    largest = max(((os.path.getsize(os.path.join(d, n)), os.path.relpath(os.path.join(d, n), root))
                   for d, _, files in os.walk(root) for n in files
                   if FS.is_regular(Path(d) / n)), default=(0, "?"))
    return f"{before} -> {after} bytes; largest {largest[1]} ({largest[0]} B)"


def store_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for n in files:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


NOT_LOCK = lambda rel: rel == "lock"  # noqa: E731 - writers take (and write) the lock


def backup_unjudged(res: CaseResult) -> None:
    """Without ``restore`` there is no way to judge a backup: counted, so the summary
    says the check did not run."""
    if not features()["restore_lib"] and not features()["restore_cli"]:
        res.checks["backup-unjudged"] += 1


def ignore_for_writer(c: FS.Case, *allowed: Path):
    """Paths a writing command may touch: under the store and the backup folders, and
    the mtimes of the directories that hold them."""
    rels = [os.path.relpath(p, c.sandbox) for p in (c.store, *allowed)]
    # The top-level commitlog/, consumequeue/ and index/ may be links to other disks
    # (docs/playbook.md, "Symbolic links and other disks"): where they lead is the store.
    for name in ("commitlog", "consumequeue", "index"):
        link = c.store / name
        if link.is_symlink():
            target = Path(os.path.realpath(link))
            if target.is_relative_to(c.sandbox):
                rels.append(os.path.relpath(target, c.sandbox))
    anc = set().union(*(_ancestors(r) for r in rels))

    def ignore(rel: str) -> bool:
        return any(_under(rel, r) for r in rels)

    return ignore, anc


def outside_diff(c: FS.Case, before: dict, after: dict, *allowed: Path) -> list[str]:
    ignore, anc = ignore_for_writer(c, *allowed)
    return diff_states(before, after, ignore=ignore, mtime_ok=anc)


# --- library mode ----------------------------------------------------------------------------------


def _samples(c: FS.Case, rng, n=3) -> list[FS.Rec]:
    recs = [r for r, b in FS.current_records(c) if b == r.raw]
    return rng.sample(recs, min(n, len(recs))) if recs else []


def _store_entries(c: FS.Case) -> list[Path]:
    out = []
    for dirpath, dirnames, files in os.walk(c.store):
        out += [Path(dirpath) / n for n in dirnames + files]
    return out


def library_reads(c: FS.Case, res: CaseResult, run: Runner, rng) -> dict:
    from rmqstore.files.config import load_config
    from rmqstore.reader import classify, open_segment_file, open_store
    from rmqstore.stats import store_stats
    from rmqstore.recovery.verify import verify

    S, conf = c.store, c.conf
    picks = _samples(c, rng)
    out: dict = {"verified_end": -1}
    answered = {}

    def dump():
        with open_store(S, conf) as r:
            n = sum(1 for _ in r.messages())
            for mode in ("base64", "text", "hex", "none"):
                for _ in r.message_dicts(mode, limit=200):
                    pass
            for p in picks[:1]:
                list(r.messages(topic=p.topic_str, queue_id=p.queue_id, from_offset=p.offset,
                                to_offset=p.end + 1, since=0, until=2**62, limit=5))
        return n

    answered["dump"] = run("dump", dump)[0]

    # get and query-key: one store handle, each lookup a command of its own.
    st, r = run("get (open)", lambda: open_store(S, conf))
    if st == "ok":
        with r:
            offsets = [p.offset for p in picks] + [0, rng.randrange(1 << 20), -1, 2**63 - 1]
            for off in offsets:
                run("get --offset", lambda: r.read_at(off))
            for p in picks:
                run("get --msg-id", lambda: r.get_by_msg_id(p.msg_id))
                run("get --queue-offset", lambda: r.get_by_queue_offset(p.topic_str, p.queue_id, p.queue_offset))
                if "UNIQ_KEY" in p.props:
                    run("get --uniq-key", lambda: r.get_by_uniq_key(p.topic_str, p.props["UNIQ_KEY"]))
            run("get --msg-id", lambda: r.get_by_msg_id("00" * 16))
            run("get --queue-offset", lambda: r.get_by_queue_offset("../..", -1, 2**40))
            for p in picks[:2]:
                keys = p.props.get("KEYS", "x").split() or ["x"]
                run("query-key", lambda: r.query_key(p.topic_str, rng.choice(keys)))
            run("query-key", lambda: r.query_key("[/x]", "\x00", 64, 0, 2**63 - 1))

    def stats():
        with open_store(S, conf) as r:
            return store_stats(r, conf=conf)

    answered["stats"] = run("stats", stats)[0]

    def do_verify(deep):
        cfg = load_config(S, conf)
        return verify(S, deep=deep, config=cfg)

    st, rep = run("verify --deep", lambda: do_verify(True))
    answered["verify"] = st
    if st == "ok":
        out["verified_end"] = rep.end
        out["report"] = rep
    run("verify", lambda: do_verify(False))

    entries = _store_entries(c)
    for p in rng.sample(entries, min(4, len(entries))):
        run(f"dump {c.rel(p)!r}", lambda: _dump_path(p, conf, classify, open_store, open_segment_file))
    if c.expect_refusal:
        res.checks["refusal"] += 1
        for cmd, st in answered.items():
            if st == "ok":
                res.fail("not-refused", cmd, f"answered although {c.expect_refusal}")
    return out


def _dump_path(p: Path, conf, classify, open_store, open_segment_file):
    """What ``rmqstore dump PATH`` reads, for each kind of path."""
    from rmqstore.files.checkpoint import read_checkpoint
    from rmqstore.files.config import load_config
    from rmqstore.files.consumequeue import ConsumeQueue
    from rmqstore.files.index import IndexFile, infer_index_geometry

    kind = classify(p)
    if kind.kind in ("store", "commitlog-segment"):
        opener = open_store if kind.kind == "store" else open_segment_file
        with opener(p, conf) as r:
            return sum(1 for _ in r.message_dicts("text", limit=100))
    if kind.kind in ("consumequeue-dir", "consumequeue-file"):
        cfg = load_config(kind.root, conf)
        qdir = kind.path if kind.kind == "consumequeue-dir" else kind.path.parent
        with ConsumeQueue(qdir, cfg.cq_file_size) as cq:
            return sum(1 for _ in cq.iter_units(None, placeholders=True))
    if kind.kind == "indexfile":
        cfg = load_config(kind.root, conf)
        g = infer_index_geometry(kind.path.stat().st_size, hash_slot_num=cfg.max_hash_slot_num,
                                 index_num=cfg.max_index_num, path=kind.path)
        f = IndexFile(kind.path, g)
        try:
            return f.header, len(f.used_entries["key_hash"])
        finally:
            f.close()
    if kind.kind == "checkpoint":
        return read_checkpoint(kind.path)
    return None


def library_repair(c: FS.Case, res: CaseResult, run: Runner, verified_end: int, work: Path,
                   pristine: dict) -> None:
    from rmqstore.files.config import load_config
    from rmqstore.recovery.repair import repair
    from rmqstore.recovery.repair_plan import plan_repair

    S, conf = c.store, c.conf
    st, cfg = run("load_config", lambda: load_config(S, conf) if conf else None)
    if st != "ok":
        return
    keep = must_keep(c, verified_end)
    before = tree_state(c.sandbox)
    run("repair --dry-run", lambda: repair(S, dry_run=True, config=cfg))
    st, plan = run("plan_repair", lambda: plan_repair(S, config=cfg))
    res.checks["dry-run"] += 1
    d = diff_states(before, tree_state(c.sandbox))
    if d:
        res.fail("dry-run-changed", "repair --dry-run", "; ".join(d[:3]))
        before = tree_state(c.sandbox)
    if c.expect_refusal and st == "ok":
        res.checks["refusal"] += 1
        res.fail("not-refused", "plan_repair", f"planned {len(plan.steps)} step(s) although {c.expect_refusal}")
    if healthy(c) and st == "ok":
        res.checks["healthy"] += 1
        if plan.steps:
            res.fail("healthy-not-noop", "plan_repair", _steps_text(plan.steps))
    if run.hung:
        return
    size0 = store_bytes(S)
    st, result = run("repair", lambda: repair(S, backup_dir=c.backup, config=cfg))
    after = tree_state(c.sandbox)
    res.checks["repair-outside"] += 1
    d = outside_diff(c, before, after, c.backup)
    if d:
        res.fail("wrote-outside", "repair", "; ".join(d[:3]))
    changed = diff_states(pristine, tree_state(S), ignore=NOT_LOCK, times=False, modes=False)
    if st != "ok":
        if changed and st != "hang":
            # Stopped midway: acceptable only if restore gives the store back (the issue:
            # "unchanged or resumable"); without restore there is no way to tell.
            if features()["restore_lib"]:
                check_restore_lib(c, pristine, res, run)
            else:
                res.fail("repair-midway", "repair", f"{type(result).__name__}: {result}; store changed: {'; '.join(changed[:2])}")
        return
    if not result.executed:
        if changed:
            res.fail("noop-changed", "repair", "; ".join(changed[:3]))
        return
    check_prefix(c, keep, res, "repair")
    why = grew(size0, S)
    if why:
        res.fail("store-grew", "repair", why)
    backup_unjudged(res)
    res.checks["idempotent"] += 1
    st, again = run("plan_repair (second run)",
                    lambda: plan_repair(S, config=load_config(S, conf) if conf else None))
    if st == "ok" and again.steps:
        res.fail("not-idempotent", "repair", _steps_text(again.steps))
    elif st == "refused":
        res.fail("not-idempotent", "repair", f"second plan refused: {again}")
    check_restore_lib(c, pristine, res, run)


def check_restore_lib(c: FS.Case, pristine: dict, res: CaseResult, run: Runner) -> None:
    """Where the library has ``restore``: the backup puts the damaged store back exactly."""
    if not features()["restore_lib"] or not c.backup.exists():
        return
    res.checks["restore-lib"] += 1
    run("restore", lambda: restore_lib(c.backup, c.store))
    d = diff_states(pristine, tree_state(c.store), ignore=NOT_LOCK, times=False, modes=False)
    if d:
        res.fail("restore-mismatch", "restore", f"{len(d)} difference(s): {'; '.join(d[:3])}")


def healthy(c: FS.Case) -> bool:
    return c.kinds == ["none"] and c.base.clean and c.conf is None


def _steps_text(steps) -> str:
    return f"{len(steps)} step(s): " + "; ".join(f"{s.action} {s.path}" for s in steps[:3])


def run_library_case(c: FS.Case, res: CaseResult, work: Path, rng) -> None:
    run = Runner(res)
    pristine = tree_state(c.store)
    with case_env(c), lock_held(c):
        before = tree_state(c.sandbox)
        got = library_reads(c, res, run, rng)
        res.checks["reads"] += 1
        d = diff_states(before, tree_state(c.sandbox))
        _read_diffs(c, d, res, "read commands (library)")
        rep = got.get("report")
        if healthy(c) and rep is not None and not rep.ok:
            res.checks["healthy"] += 1
            res.fail("healthy-flagged", "verify", ", ".join(sorted({f.code for f in rep.problems})))
        if not run.hung:
            library_repair(c, res, run, got["verified_end"], work, pristine)


def _read_diffs(c: FS.Case, d: list[str], res: CaseResult, command: str) -> None:
    store_rel = os.path.relpath(c.store, c.sandbox)
    inside = [x for x in d if store_rel in x]
    outside = [x for x in d if store_rel not in x]
    if inside:
        res.fail("read-changed", command, "; ".join(inside[:3]))
    if outside:
        res.fail("wrote-outside", command, "; ".join(outside[:3]))
