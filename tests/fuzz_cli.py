"""The fuzz checks through the command line: every read command in a subprocess (some on
a pty, as an operator's terminal), repair with its backup, and repairs SIGKILLed at each
file-system operation boundary and at random times (tests/fuzz_checks.py holds the
invariants, tests/damage.py the damage).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import damage as D
import fuzz_store as FS
from rmqstore.files.jit import cache_dir as kernel_cache_dir
from fuzz_checks import (NOT_LOCK, TIMEOUT_CLI, CaseResult, Runner, _read_diffs, _samples,
                         _store_entries, backup_unjudged, case_env, check_prefix, diff_states,
                         features, grew, healthy, lock_held, must_keep, outside_diff, restore_cli_args,
                         store_bytes, tree_state)

#: Read commands per store through the CLI, besides verify and dump (each costs a process).
CLI_READS = int(os.environ.get("RMQSTORE_FUZZ_CLI_READS", "6"))
RMQSTORE = [sys.executable, "-m", "cli.main"]


# --- CLI mode ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    rc: int | None
    out: str
    err: str
    hung: bool
    seconds: float


#: What the terminal and pager depend on, set here and never inherited from the test run.
TERMINAL_ENV = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "PAGER", "LESS", "LV",
                "TTY_COMPATIBLE")


def cli_env(c: FS.Case) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RMQSTORE_") and k not in TERMINAL_ENV}
    # No pager: it is tested in test_output_tty; here one would wait for a key (a hang) and
    # write ~/.lesshst (outside the store). An inherited LINES (pytest-xdist's workers
    # export LINES=24) gives the pty a height, so the output would outgrow it and page.
    env.update(TMPDIR=str(c.sandbox / "tmp"), HOME=str(c.sandbox / "home"), COLUMNS="120",
               PAGER="cat", PYTHONPATH=str(FS.REPO), NUMBA_CACHE_DIR=_KERNEL_CACHE)
    return env


# The compiled scan kernels' cache (rmqstore.files.jit.cache_dir: by default in the
# user's cache directory, never a store) is the one thing a command keeps outside the store,
# by design. Commands here share this session's cache, outside the sandbox whose every other
# byte is watched (and a fresh HOME per case would compile the kernels in every process).
_KERNEL_CACHE = os.environ.get("NUMBA_CACHE_DIR") or kernel_cache_dir()


def run_cli(args: list[str], c: FS.Case, *, tty: bool = False, timeout: float = TIMEOUT_CLI,
            extra_env: dict | None = None) -> Outcome:
    env = dict(cli_env(c), **(extra_env or {}))
    t0 = time.monotonic()
    if tty:
        return _run_pty(args, c, env, timeout, t0)
    try:
        p = subprocess.run(RMQSTORE + args, cwd=c.sandbox / "cwd", env=env, capture_output=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return Outcome(None, (e.stdout or b"").decode("utf-8", "replace"),
                       (e.stderr or b"").decode("utf-8", "replace"), True, time.monotonic() - t0)
    return Outcome(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
                   False, time.monotonic() - t0)


def _run_pty(args, c, env, timeout, t0) -> Outcome:
    """Run on a terminal (stdout and stderr a pty): table output and rich rendering."""
    import pty
    import select

    master, slave = pty.openpty()
    p = subprocess.Popen(RMQSTORE + args, cwd=c.sandbox / "cwd", env=dict(env, TERM="xterm-256color"),
                         stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, hung = [], False
    while True:
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            hung = True
            p.kill()
            break
        r, _, _ = select.select([master], [], [], min(left, 1.0))
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    os.close(master)
    rc = p.wait()
    text = b"".join(chunks).decode("utf-8", "replace")
    return Outcome(None if hung else rc, text, text, hung, time.monotonic() - t0)


def check_outcome(res: CaseResult, command: str, o: Outcome, fmt: str | None = None,
                  one_line: bool = True) -> None:
    res.commands += 1
    if o.hung:
        res.fail("hang", command, f"no answer in {TIMEOUT_CLI:.0f} s")
        return
    text = o.out + o.err
    if o.rc < 0:
        res.fail("crash", command, f"killed by {signal.Signals(-o.rc).name}; {o.err.strip()[-200:]}")
        return
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in o.err.splitlines() if ln.strip()][-1:] or ["?"]
        res.fail("traceback", command, last[0])
    elif "internal error" in o.err:
        line = next(ln for ln in o.err.splitlines() if "internal error" in ln)
        res.fail("internal-error", command, line)
    if o.rc not in (0, 1, 2):
        res.fail("bad-exit", command, f"exit {o.rc}: {o.err.strip()[-200:]}")
    if fmt in ("json", "jsonl") and o.rc in (0, 1):
        try:
            if fmt == "json":
                json.loads(o.out)
            else:
                for ln in o.out.splitlines():
                    if ln.strip():
                        json.loads(ln)
        except ValueError as e:
            res.fail("bad-json", command, f"{e}: {o.out[:120]!r}")
    if one_line and o.rc == 2 and fmt is not None:
        # Notes, warnings and what repair leaves may come first; the error is one line.
        lines = [ln for ln in o.err.splitlines() if ln.strip() and not ln.startswith(
            ("rmqstore: note:", "rmqstore: warning:", "rmqstore: not repaired:"))]
        if len(lines) != 1:
            res.fail("error-not-one-line", command, f"{len(lines)} lines: {' | '.join(lines[:2])[:200]}")


def cli_reads(c: FS.Case, res: CaseResult, rng) -> int:
    """Every read command through the CLI; the CommitLog end verify reported (-1: none)."""
    S = str(c.store)
    conf = ["--config", str(c.conf)] if c.conf else []
    picks = _samples(c, rng, 2)
    p = picks[0] if picks else None
    cmds: list[tuple[str, list[str], str | None, bool]] = [
        ("verify --deep -f json", ["verify", S, "--deep", "-f", "json"], "json", False),
        ("verify -f table", ["verify", S, "-f", "table"], "table", False),
        ("dump -f jsonl", ["dump", S, "-f", "jsonl"], "jsonl", False),
        ("dump -f table", ["dump", S, "-f", "table", "--limit", "300"], "table", False),
        ("stats -f json", ["stats", S, "-f", "json"], "json", False),
        ("stats (terminal)", ["stats", S], None, True),
        ("dump (terminal)", ["dump", S, "--limit", "300"], None, True),
        ("get --offset", ["get", S, "--offset", str(p.offset if p else 0), "-f", "table"], "table", False),
        ("query-key (terminal)", ["query-key", S, "-t", p.topic_str if p else "T0", "-k",
                                  (p.props.get("KEYS", "k1").split() or ["k1"])[0] if p else "k1"], None, True),
    ]
    if p is not None:
        cmds += [
            ("get --msg-id", ["get", S, "--msg-id", p.msg_id, "-f", "json"], "json", False),
            ("get --queue-offset", ["get", S, "--topic", p.topic_str, "--queue-id", str(p.queue_id),
                                    "--queue-offset", str(p.queue_offset), "-f", "jsonl"], "jsonl", False),
        ]
        if "UNIQ_KEY" in p.props:
            cmds.append(("get --uniq-key (terminal)", ["get", S, "--topic", p.topic_str, "--uniq-key",
                                                       p.props["UNIQ_KEY"]], None, True))
    entries = _store_entries(c)
    for e in rng.sample(entries, min(2, len(entries))):
        cmds.append((f"dump {c.rel(e)!r}", ["dump", str(e), "-f", rng.choice(["table", "json"])],
                     None, False))
    # verify (its end is needed) and dump on a terminal (#7) always; a sample of the rest.
    fixed = [cmds[0], cmds[6]]
    rest = [x for x in cmds if x not in fixed]
    cmds = fixed + rng.sample(rest, min(len(rest), CLI_READS))
    end = -1
    answered = {}
    for name, args, fmt, tty in cmds:
        if "\x00" in "".join(args):
            continue  # argv cannot carry NUL
        o = run_cli(args + conf, c, tty=tty)
        check_outcome(res, name, o, fmt)
        if o.hung:
            break
        if not name.startswith("dump '"):  # a store file's dump reads that file only
            cmd = name.split()[0]
            answered[cmd] = answered.get(cmd, False) or o.rc != 2
        if name.startswith("verify --deep") and o.rc in (0, 1):
            try:
                end = int(json.loads(o.out)["validUpTo"])
            except (ValueError, KeyError, TypeError):
                pass
    if c.expect_refusal:
        res.checks["refusal"] += 1
        for cmd in ("verify", "stats", "dump"):
            if answered.get(cmd):
                res.fail("not-refused", cmd, f"exit 0/1 although {c.expect_refusal}")
    return end


def cli_repair(c: FS.Case, res: CaseResult, verified_end: int, work: Path, pristine: dict, rng) -> None:
    S = str(c.store)
    conf = ["--config", str(c.conf)] if c.conf else []
    keep = must_keep(c, verified_end)
    before = tree_state(c.sandbox)
    o = run_cli(["repair", S, "--dry-run", "-f", "json"] + conf, c)
    check_outcome(res, "repair --dry-run -f json", o, "json")
    res.checks["dry-run"] += 1
    d = diff_states(before, tree_state(c.sandbox))
    if d:
        res.fail("dry-run-changed", "repair --dry-run", "; ".join(d[:3]))
        before = tree_state(c.sandbox)
    if o.hung:
        return
    if c.expect_refusal and o.rc != 2:
        res.checks["refusal"] += 1
        res.fail("not-refused", "repair --dry-run", f"exit {o.rc} although {c.expect_refusal}")
    if healthy(c):
        res.checks["healthy"] += 1
        if o.rc != 0:
            res.fail("healthy-not-noop", "repair --dry-run", f"exit {o.rc}: {o.out[:200]}")
    explicit = rng.random() < 0.8
    backup_args = ["--backup", str(c.backup)] if explicit else []
    size0 = store_bytes(c.store)
    o = run_cli(["repair", S, "--yes", "-f", "json"] + backup_args + conf, c)
    check_outcome(res, "repair --yes -f json", o, "json")
    if o.hung:
        return
    backup = _backup_used(o) or (c.backup if explicit else _default_backup(c, before))
    after = tree_state(c.sandbox)
    res.checks["repair-outside"] += 1
    d = outside_diff(c, before, after, *([backup] if backup else []))
    if d:
        res.fail("wrote-outside", "repair --yes", "; ".join(d[:3]))
    changed = diff_states(pristine, tree_state(c.store), ignore=NOT_LOCK, times=False, modes=False)
    if o.rc != 0:
        if changed:  # stopped midway: restore must give the store back (see library_repair)
            if features()["restore_cli"] and backup:
                check_restore_cli(c, pristine, backup, res)
            else:
                last = (o.err.strip().splitlines() or ["?"])[-1]
                res.fail("repair-midway", "repair --yes", f"exit {o.rc}: {last}; store changed: {'; '.join(changed[:2])}")
        return
    if not changed:
        return
    check_prefix(c, keep, res, "repair --yes")
    why = grew(size0, c.store)
    if why:
        res.fail("store-grew", "repair --yes", why)
    if backup is None:
        res.fail("backup-incomplete", "repair --yes", "no backup folder found")
    else:
        backup_unjudged(res)
    res.checks["idempotent"] += 1
    o = run_cli(["repair", S, "--dry-run", "-f", "json"] + conf, c)
    check_outcome(res, "repair --dry-run (second run)", o, "json")
    if o.rc != 0 and not o.hung:
        try:
            steps = json.loads(o.out)["steps"]
            why = f"{len(steps)} step(s): " + "; ".join(f"{s.get('action')} {s.get('path')}" for s in steps[:3])
        except (ValueError, KeyError, TypeError):
            why = (o.err.strip().splitlines() or [o.out[:200]])[-1]
        res.fail("not-idempotent", "repair --yes", f"second run exit {o.rc}: {why}")
    if backup is not None:
        check_restore_cli(c, pristine, backup, res)


def check_restore_cli(c: FS.Case, pristine: dict, backup: Path, res: CaseResult) -> None:
    """Where ``rmqstore restore`` exists: it puts the damaged store back exactly."""
    if not features()["restore_cli"] or not backup.exists():
        return
    res.checks["restore-cli"] += 1
    o = run_cli(restore_cli_args(backup, c.store), c)
    check_outcome(res, "restore", o, None)
    d = diff_states(pristine, tree_state(c.store), ignore=NOT_LOCK, times=False, modes=False)
    if d:
        res.fail("restore-mismatch", "restore", f"exit {o.rc}; {len(d)} difference(s): {'; '.join(d[:3])}")


def _backup_used(o: Outcome) -> Path | None:
    """The backup folder repair says it used (``-f json``: result.backup)."""
    try:
        doc = json.loads(o.out)
        got = (doc.get("result") or {}).get("backup") or doc.get("backup")
    except (ValueError, AttributeError, TypeError):
        return None
    return Path(got) if got else None


def _default_backup(c: FS.Case, before: dict) -> Path | None:
    """The backup folder repair made beside the store (default location)."""
    parent = c.store.parent
    new = [p for p in parent.iterdir() if p.name.startswith(c.store.name + ".rmqstore-backup")
           and os.path.relpath(p, c.sandbox) not in before]
    return new[0] if len(new) == 1 else None


def run_cli_case(c: FS.Case, res: CaseResult, work: Path, rng) -> None:
    pristine = tree_state(c.store)
    with lock_held(c):
        before = tree_state(c.sandbox)
        end = cli_reads(c, res, rng)
        res.checks["reads"] += 1
        _read_diffs(c, diff_states(before, tree_state(c.sandbox)), res, "read commands (CLI)")
        if not any(f.kind == "hang" for f in res.failures):
            cli_repair(c, res, end, work, pristine, rng)


# --- kills ---------------------------------------------------------------------------------------------

#: Runs ``rmqstore`` counting the calls that change the file system; SIGKILLs itself just
#: before call number RMQSTORE_FUZZ_KILL_AT (0: never) and writes at exit the count, the
#: times of the first and last such call (seconds after start) and which were fsyncs.
KILL_BOOT = r"""
import builtins, io, os, signal, sys, time
T0 = time.monotonic()
K = int(os.environ["RMQSTORE_FUZZ_KILL_AT"])
OUT = os.environ.get("RMQSTORE_FUZZ_OPS")
_open, _write, _close = os.open, os.write, os.close
n, first, last, synced = 0, 0.0, 0.0, []
def tick(name):
    global n, first, last
    n += 1
    if name in ("fsync", "fdatasync"):
        synced.append(n)
    last = time.monotonic() - T0
    first = first or last
    if n == K:
        os.kill(os.getpid(), signal.SIGKILL)
def wrap(mod, name, pred=None):
    f = getattr(mod, name, None)
    if f is None:
        return
    def w(*a, **k):
        if pred is None or pred(*a, **k):
            tick(name)
        return f(*a, **k)
    setattr(mod, name, w)
W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
wrap(os, "open", lambda path, flags, *a, **k: flags & W)
for name in ("write", "pwrite", "ftruncate", "truncate", "rename", "replace", "unlink", "remove",
             "rmdir", "mkdir", "fsync", "fdatasync", "symlink", "link", "sendfile",
             "copy_file_range", "posix_fallocate", "utime", "chmod"):
    wrap(os, name)
wrap(builtins, "open", lambda file, mode="r", *a, **k: any(ch in mode for ch in "wax+"))
io.open = builtins.open
def done():
    if OUT:
        fd = _open(OUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _write(fd, f"{n} {first} {last} {','.join(map(str, synced))}".encode())
        _close(fd)
import atexit
atexit.register(done)
sys.argv = ["rmqstore"] + sys.argv[1:]
from cli.main import run
run()
"""

KILL_KINDS = [k for g in ("commitlog", "consumequeue", "index", "state", "odd-files")
              for k in D.GROUPS[g] if k not in ("lock-odd", "fifo")]


def _reset(c: FS.Case, template: Path) -> None:
    if c.sandbox.exists():
        shutil.rmtree(c.sandbox)
    FS.copy_tree(template, c.sandbox, skip=())


def run_kill_case(c: FS.Case, res: CaseResult, work: Path, rng, per_case: int = 6) -> None:
    """SIGKILL ``repair --yes`` at operation boundaries and random times, then check that
    the next repair (the same command line) finishes the job, and that restore (where it
    exists) gives the original back."""
    from rmqstore.files.config import load_config
    from rmqstore.recovery.verify import verify

    if c.hold_lock:
        res.skipped = "lock held"
        return
    template = work / "template"
    if template.exists():
        shutil.rmtree(template)
    FS.copy_tree(c.sandbox, template, skip=())
    pristine = tree_state(c.store)
    run = Runner(res)
    with case_env(c):
        st, rep = run("verify", lambda: verify(c.store, config=load_config(c.store, c.conf)))
    keep = must_keep(c, rep.end if st == "ok" else -1)
    S = str(c.store)
    conf = ["--config", str(c.conf)] if c.conf else []
    args = [sys.executable, "-c", KILL_BOOT, "repair", S, "--yes", "-f", "json",
            "--backup", str(c.backup)] + conf
    ops = work / "ops"
    env = dict(cli_env(c), RMQSTORE_FUZZ_KILL_AT="0", RMQSTORE_FUZZ_OPS=str(ops))
    p = subprocess.run(args, cwd=c.sandbox / "cwd", env=env, capture_output=True, timeout=TIMEOUT_CLI)
    words = ops.read_text().split() if ops.exists() else ["0", "0", "0"]
    n, first, last = int(words[0]), float(words[1]), float(words[2])
    durable = [int(x) + 1 for x in (words[3].split(",") if len(words) > 3 else []) if int(x) < n]
    if p.returncode != 0 or n == 0 or not diff_states(pristine, tree_state(c.store), ignore=NOT_LOCK, times=False):
        res.skipped = f"repair has nothing to do or refuses (exit {p.returncode}, {n} operations)"
        return
    # Kill points: before operation k (the boundaries between file-system changes, which
    # include every step boundary), and at random times while the repair is writing.
    # Half of them right after an fsync (where a step's effect is durable: a step boundary
    # of a journaled repair), half anywhere.
    after_sync = rng.sample(durable, min(len(durable), (per_case - 2) // 2))
    anywhere = [k for k in range(1, n + 1) if k not in after_sync]
    points = sorted(after_sync + rng.sample(anywhere, min(len(anywhere), per_case - 2 - len(after_sync))))
    plan = [("op", k) for k in points] + [("time", rng.uniform(first, max(first, last))) for _ in range(2)]
    for how, at in plan:
        _reset(c, template)
        before = tree_state(c.sandbox)
        env = dict(cli_env(c), RMQSTORE_FUZZ_KILL_AT=str(at if how == "op" else 0))
        proc = subprocess.Popen(args, cwd=c.sandbox / "cwd", env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        if how == "time":
            time.sleep(at)
            proc.send_signal(signal.SIGKILL)
        try:
            rc = proc.wait(timeout=TIMEOUT_CLI)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            res.fail("hang", f"repair (kill {how} {at})", "no answer")
            continue
        if rc != -signal.SIGKILL:
            continue  # finished before the kill point
        res.kills += 1
        label = (f"repair killed before operation {at} of {n}" if how == "op"
                 else f"repair killed at {at:.3f} s")
        if features()["restore_cli"]:
            res.checks["kill-undo"] += 1
            killed = work / "killed"
            if killed.exists():
                shutil.rmtree(killed)
            FS.copy_tree(c.sandbox, killed, skip=())
            o = run_cli(restore_cli_args(c.backup, c.store), c)
            check_outcome(res, f"restore after {label}", o, None)
            d = diff_states(pristine, tree_state(c.store), ignore=NOT_LOCK, times=False, modes=False)
            if d:
                res.fail("kill-not-undone", label, f"exit {o.rc}; {'; '.join(d[:3])}")
            _reset(c, killed)
        res.checks["kill-finish"] += 1
        # The operator runs the same command again.
        o = run_cli(["repair", S, "--yes", "-f", "json", "--backup", str(c.backup)] + conf, c)
        check_outcome(res, f"repair after {label}", o, None)
        allowed = [c.backup] + [b for b in [_backup_used(o)] if b]
        if o.rc != 0:
            last_line = (o.err.strip().splitlines() or ["?"])[-1]
            # ... and, refused, once more with a fresh backup folder: does it converge?
            fresh = c.sandbox / "backup-2"
            o2 = run_cli(["repair", S, "--yes", "-f", "json", "--backup", str(fresh)] + conf, c)
            check_outcome(res, f"repair (fresh backup) after {label}", o2, None)
            allowed += [fresh] + [b for b in [_backup_used(o2)] if b]
            res.fail("kill-not-finished", label, f"the same repair command exits {o.rc}: {last_line}; "
                     f"with a fresh --backup it exits {o2.rc}")
            if o2.rc != 0:
                continue
        o = run_cli(["repair", S, "--dry-run", "-f", "json"] + conf, c)
        if o.rc != 0:
            res.fail("kill-not-finished", label, f"steps left after the next repair (exit {o.rc}): {o.out[:150]}")
        check_prefix(c, keep, res, f"repair after {label}")
        d = outside_diff(c, before, tree_state(c.sandbox), *allowed)
        if d:
            res.fail("wrote-outside", label, "; ".join(d[:3]))
