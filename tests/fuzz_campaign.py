"""The long fuzz campaign: thousands of damaged stores checked by tests/fuzz_checks.py in
a few worker processes, with a summary table (stores tried, commands, failures by kind).

``python -m tests.damage --stores 10000 --cli 2000 --kills 200 --seed 1 --jobs 2``
(``--help`` for the rest). A worker that crashes or stalls is replaced and its case counted
as a failure. Every failure prints the line that replays it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import damage as D
import fuzz_store as FS
from fuzz_checks import FAILURE_KINDS, CaseResult, Failure, _where, features, run_library_case
from fuzz_cli import KILL_KINDS, run_cli_case, run_kill_case


# --- one case, any mode -----------------------------------------------------------------------------------


def run_case(seed: int, mode: str, workdir: Path, *, kinds=None, base=None, cache=None,
             keep: bool = False) -> CaseResult:
    """Build the damaged store of ``seed`` and check it in ``mode`` (lib, cli, kill)."""
    work = workdir / f"{mode}-{seed}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    res = CaseResult(seed, mode)
    rng = random.Random(f"{mode}:{seed}")
    if mode == "kill" and kinds is None:
        kinds = [random.Random(seed).choice(KILL_KINDS)]
    try:
        c = D.make_case(seed, work, kinds=kinds, base=base, cache=cache or workdir / "bases")
    except D.NotApplicable as e:
        res.skipped = f"not applicable: {e}"
        shutil.rmtree(work, ignore_errors=True)
        return res
    except Exception as e:  # noqa: BLE001 - reported, so a harness bug is never silent
        res.fail("harness-error", "make_case", f"{type(e).__name__}: {e}{_where(e)}")
        return res
    res.base, res.kinds, res.applied = c.base.name, list(c.kinds), list(c.applied)
    try:
        {"lib": run_library_case, "cli": run_cli_case, "kill": run_kill_case}[mode](c, res, work, rng)
    except Exception as e:  # noqa: BLE001 - rmqstore's errors are caught where it is called
        res.fail("harness-error", mode, f"{type(e).__name__}: {e}{_where(e, 'tests')}")
    finally:
        _unlock_all(work)
        if not (keep and res.failures):
            shutil.rmtree(work, ignore_errors=True)
    return res


def _unlock_all(root: Path) -> None:
    """Undo chmod 000 damage so the work directory can be removed."""
    for dirpath, dirnames, files in os.walk(root):
        for n in dirnames + files:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                with contextlib.suppress(OSError):
                    os.chmod(p, 0o755 if n in dirnames else 0o644)


# --- the campaign -----------------------------------------------------------------------------------------


def worker(mode: str, seeds: list[int], workdir: Path, kinds, base, keep) -> None:
    """Run cases one by one, one JSON line per case start and result on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write the protocol stream
    for s in seeds:
        out.write(json.dumps({"start": s}) + "\n")
        out.flush()
        r = run_case(s, mode, workdir, kinds=kinds, base=base, keep=keep)
        out.write(json.dumps({"result": r.to_json()}) + "\n")
        out.flush()


def _result_from(d: dict) -> CaseResult:
    r = CaseResult(d["seed"], d["mode"], d["base"], d["kinds"], d["applied"],
                   [Failure(**f) for f in d["failures"]], d["commands"], d["kills"],
                   Counter(d["checks"]), d["skipped"])
    return r


def campaign(mode: str, seeds, target: int, workdir: Path, jobs: int, *, kinds=None, base=None,
             keep=False, count=lambda r: 0 if r.skipped else 1, progress=None,
             case_timeout: float = 900) -> list[CaseResult]:
    """Run cases of ``mode`` from ``seeds`` in ``jobs`` worker processes until ``count``
    reaches ``target``. A worker that dies or stalls is replaced; its case is a failure."""
    seeds = iter(seeds)
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[CaseResult] = []
    done = 0
    chunk = 10
    workers: dict = {}

    def start(batch):
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "damage.py"), "--worker",
               "--mode", mode, "--seeds", ",".join(map(str, batch)), "--workdir", str(workdir)]
        if kinds:
            cmd += ["--kinds", ",".join(kinds)]
        if base:
            cmd += ["--base", base]
        if keep:
            cmd.append("--keep")
        log = open(workdir / f"worker-{mode}-{batch[0]}.log", "w")  # a harness bug's traceback lands here
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                             cwd=FS.REPO, env=dict(os.environ, PYTHONPATH=str(FS.REPO)))
        log.close()
        os.set_blocking(p.stdout.fileno(), False)
        workers[p] = {"batch": list(batch), "current": None, "since": time.monotonic(), "buf": ""}

    def feed():
        while len(workers) < jobs and done < target:
            batch = [s for _, s in zip(range(chunk), seeds)]
            if not batch:
                return
            start(batch)

    import select

    feed()
    while workers:
        ready, _, _ = select.select([p.stdout for p in workers], [], [], 5.0)
        for p in list(workers):
            w = workers[p]
            if p.stdout in ready:
                try:
                    data = p.stdout.read()
                except (BlockingIOError, TypeError):
                    data = None
                if data:
                    w["buf"] += data
                    *lines, w["buf"] = w["buf"].split("\n")
                    for ln in lines:
                        msg = json.loads(ln)
                        if "start" in msg:
                            w["current"], w["since"] = msg["start"], time.monotonic()
                        else:
                            r = _result_from(msg["result"])
                            results.append(r)
                            w["batch"].remove(r.seed)
                            w["current"] = None
                            done += count(r)
                            if progress:
                                progress(r, done)
                elif data == "" and p.poll() is not None:
                    _worker_gone(p, w, mode, results, "crash", f"worker exited {p.returncode}")
                    del workers[p]
                    if w["batch"] and done < target:
                        start(w["batch"])
                    continue
            if w["current"] is not None and time.monotonic() - w["since"] > case_timeout:
                p.kill()
                p.wait()
                _worker_gone(p, w, mode, results, "hang", f"case took over {case_timeout:.0f} s")
                del workers[p]
                if w["batch"] and done < target:
                    start(w["batch"])
        if done >= target:
            for p in workers:
                p.kill()
                p.wait()
            break
        feed()
    return results


def _worker_gone(p, w, mode, results, kind, why) -> None:
    s = w["current"]
    if s is None:
        return
    r = CaseResult(s, mode)
    r.fail(kind, "worker", why)
    results.append(r)
    w["batch"].remove(s)


def summary(results: list[CaseResult]) -> str:
    """The table the campaign prints: stores tried, commands, kills, failures by kind."""
    lines = []
    feats = features()
    lines.append(f"features: restore (library) {feats['restore_lib'] or 'absent'}, "
                 f"restore (CLI) {'present' if feats['restore_cli'] else 'absent'}")
    for mode in ("lib", "cli", "kill"):
        rs = [r for r in results if r.mode == mode]
        if not rs:
            continue
        tried = [r for r in rs if not r.skipped]
        checks = Counter()
        for r in tried:
            checks.update(r.checks)
        lines.append(f"\n[{mode}] stores tried {len(tried)} (skipped {len(rs) - len(tried)}), "
                     f"commands {sum(r.commands for r in rs)}, kills {sum(r.kills for r in rs)}, "
                     f"stores with failures {sum(1 for r in rs if r.failures)}")
        lines.append("  checks run: " + ", ".join(f"{k} {v}" for k, v in sorted(checks.items())))
        by = Counter()
        seeds: dict[str, set] = {}
        for r in rs:
            for f in r.failures:
                by[f.kind] += 1
                seeds.setdefault(f.kind, set()).add(r.seed)
        lines.append(f"  {'failure kind':<20} {'count':>6} {'stores':>6}  example seed")
        for k in FAILURE_KINDS:
            if by[k]:
                lines.append(f"  {k:<20} {by[k]:>6} {len(seeds[k]):>6}  {min(seeds[k])}")
        if not by:
            lines.append("  (no failures)")
        lines.append(f"  {'damage kind':<20} {'stores':>6} {'failing':>7}  most common failures")
        per: dict[str, list] = {}
        for r in tried:
            for k in r.kinds:
                per.setdefault(k, []).append(r)
        for k in sorted(per):
            bad = [r for r in per[k] if r.failures]
            common = Counter(f.kind for r in bad for f in r.failures).most_common(3)
            lines.append(f"  {k:<20} {len(per[k]):>6} {len(bad):>7}  "
                         + ", ".join(f"{x} {n}" for x, n in common))
    return "\n".join(lines)


def _symptom_key(text: str) -> str:
    """A symptom with paths, numbers and quoted names blurred, to group alike failures."""
    t = re.sub(r"/\S*?/sandbox/(n1/n2/n3/n4/n5/)?", "<sandbox>/", text)
    t = re.sub(r"'[^']*'", "'…'", t)
    t = re.sub(r"\d+", "N", t)
    return t[:160]


def findings_markdown(results: list[CaseResult]) -> str:
    """Failures grouped by kind and symptom: count, damage kinds, an example to replay."""
    groups: dict[tuple, list] = {}
    for r in results:
        for f in r.failures:
            groups.setdefault((f.kind, r.mode, _symptom_key(f"{f.command}: {f.symptom}")), []).append((r, f))
    out = []
    order = {k: i for i, k in enumerate(FAILURE_KINDS)}
    kind = None
    for key in sorted(groups, key=lambda k: (order.get(k[0], 99), -len(groups[k]), k)):
        items = groups[key]
        if key[0] != kind:
            kind = key[0]
            out.append(f"\n### {kind}: {FAILURE_KINDS.get(kind, '')}\n")
            out.append("| count | mode | damage kinds | example seed | command: symptom |")
            out.append("|---|---|---|---|---|")
        r, f = min(items, key=lambda x: (len(x[0].kinds), x[0].seed))  # the simplest example
        dk = Counter(k for x, _ in items for k in x.kinds)
        kinds = ", ".join(f"{k} {n}" for k, n in dk.most_common(4))
        sym = f"{f.command}: {f.symptom}".replace("|", "\\|")[:220]
        out.append(f"| {len(items)} | {key[1]} | {kinds} | {r.seed} (`{r.base}`, "
                   f"`--kinds {','.join(r.kinds)}`) | {sym} |")
    return "\n".join(out)


def load_results(path: Path) -> list[CaseResult]:
    return [_result_from(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.damage", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stores", type=int, default=0, help="damaged stores checked through the library")
    ap.add_argument("--cli", type=int, default=0, help="damaged stores checked through the CLI")
    ap.add_argument("--kills", type=int, default=0, help="SIGKILLed repairs to check")
    ap.add_argument("--seed", type=int, default=1, help="first seed; case seeds follow it")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a new one in /tmp)")
    ap.add_argument("--out", type=Path, default=None, help="write every result as JSON Lines here")
    ap.add_argument("--replay", type=int, default=None, help="run this one seed in this process, verbosely")
    ap.add_argument("--mode", choices=("lib", "cli", "kill"), default="lib")
    ap.add_argument("--kinds", default=None, help="comma-separated damage kinds (default: the seed's)")
    ap.add_argument("--base", default=None, help="base store name (default: the seed's)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories of failing cases")
    ap.add_argument("--list", action="store_true", help="list damage kinds and bases, then exit")
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="do not run: summarise the results of an earlier --out file")
    ap.add_argument("--findings", action="store_true",
                    help="with --from: print the failures grouped by kind and symptom (Markdown)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    kinds = a.kinds.split(",") if a.kinds else None
    if a.list:
        for g, ks in D.GROUPS.items():
            print(f"{g}: {', '.join(ks)}")
        print("bases:", ", ".join(FS.base_names()))
        return 0
    if a.source:
        results = load_results(a.source)
        print(findings_markdown(results) if a.findings else summary(results))
        return 0
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="rmqstore-fuzz-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if a.worker:
        worker(a.mode, [int(s) for s in a.seeds.split(",") if s], workdir, kinds, a.base, a.keep)
        return 0
    if a.replay is not None:
        r = run_case(a.replay, a.mode, workdir, kinds=kinds, base=a.base, keep=a.keep)
        print(r.report() if r.failures else f"seed {r.seed} ({r.mode}) ok: base {r.base} damage "
              f"{r.applied} checks {dict(r.checks)} {r.skipped or ''}")
        if a.keep and r.failures:
            print(f"work directory kept in {workdir}")
        return 1 if r.failures else 0
    results: list[CaseResult] = []
    t0 = time.monotonic()
    out = open(a.out, "w") if a.out else None

    def progress(r, n):
        if out:
            out.write(json.dumps(r.to_json()) + "\n")
            out.flush()
        if r.failures:
            print(r.report(), flush=True)

    plans = [("lib", a.stores, 0, lambda r: 0 if r.skipped else 1),
             ("cli", a.cli, 0, lambda r: 0 if r.skipped else 1),
             ("kill", a.kills, 0, lambda r: r.kills)]
    for mode, target, _, count in plans:
        if target > 0:
            seeds = range(a.seed, a.seed + 10**9)
            results += campaign(mode, seeds, target, workdir, a.jobs, kinds=kinds, base=a.base,
                                keep=a.keep, count=count, progress=progress)
    if out:
        out.close()
    print("\n" + summary(results))
    print(f"\n{time.monotonic() - t0:.0f} s; seeds from {a.seed}; workdir {workdir}")
    if not a.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(r.failures for r in results) else 0
