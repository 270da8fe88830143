"""The full-disk scenario of tests/test_full_disk.py, runnable on its own so that it can
run inside a user namespace: ``unshare -rm python tests/full_disk.py WORK userns``.

A small file system holds a store; it fills up; every command runs the way a user runs
it (the ``rmqstore`` CLI in a subprocess) and what it did is returned as JSON. Three ways
to get a small file system, best first (:func:`small_fs_mode`):

* ``tmpfs``: ``mount -t tmpfs -o size=3m`` (root);
* ``userns``: the same mount inside ``unshare -rm`` (an unprivileged user namespace);
* ``inject``: no mount; commands run through :func:`inject_main`, which makes every
  allocation and every write needing new space under the store fail with ENOSPC. It
  cannot fail a store through a memory map (a real full disk raises SIGBUS there), so
  it proves the error handling, not the allocation before mapped writes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZE = "3m"
SEGMENT = 32 << 20  # sparse on disk: its unwritten tail is a hole to read and allocate
BROKER_CONF = (f"mappedFileSizeCommitLog={SEGMENT}\nmappedFileSizeConsumeQueue=6000\n"
               "maxHashSlotNum=100\nmaxIndexNum=400\n")
MODES = ("tmpfs", "userns", "inject")


def small_fs_mode(probe: Path) -> str:
    """The best way to get a small file system here (``RMQSTORE_SMALL_FS`` forces one)."""
    forced = os.environ.get("RMQSTORE_SMALL_FS")
    if forced:
        if forced not in MODES:
            raise ValueError(f"RMQSTORE_SMALL_FS must be one of {MODES}, got {forced!r}")
        return forced
    probe.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)]
    if shutil.which("mount"):
        if subprocess.run(mount, capture_output=True).returncode == 0:
            subprocess.run(["umount", str(probe)], check=True)
            return "tmpfs"
        if shutil.which("unshare") and subprocess.run(["unshare", "-rm", *mount],
                                                      capture_output=True).returncode == 0:
            return "userns"
    return "inject"


def run_in_mode(work: Path, mode: str) -> dict:
    """The scenario's results, run here (tmpfs, inject) or in a user namespace."""
    if mode == "userns":
        p = subprocess.run(["unshare", "-rm", sys.executable, __file__, str(work), mode],
                           capture_output=True, text=True, cwd=REPO, timeout=1200)
        if p.returncode != 0:
            raise RuntimeError(f"scenario in a user namespace failed: {p.stderr[-3000:]}")
        return json.loads(p.stdout)
    return json.loads(json.dumps(scenario(work, mode)))  # the same shapes either way


# --- the scenario ---------------------------------------------------------------------


def hashes(root: Path, *parts: str) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and (not parts or rel.split("/")[0] in parts):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def fill(mnt: Path, leave: int = 0) -> None:
    """Write a filler file until the file system is full, then give ``leave`` bytes back."""
    with open(mnt / f"filler-{len(list(mnt.glob('filler-*')))}", "wb", buffering=0) as f:
        for block in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\xff" * block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        if leave:
            f.truncate(max(0, f.tell() - leave))


def messages(path: Path, first: int, count: int) -> None:
    with open(path, "w") as f:
        for i in range(first, first + count):
            f.write(json.dumps({"topic": f"T{i % 3}", "queueId": i % 4, "body": f"b{i:06d}" + "x" * 60,
                                "properties": {"KEYS": f"k{i}", "TAGS": f"t{i % 5}"}}) + "\n")


def scenario(work: Path, mode: str) -> dict:
    mnt = work / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    mounted = mode in ("tmpfs", "userns")
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mnt)], check=True)
    try:
        return _steps(work, mnt, mode)
    finally:
        if mounted:
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(mnt)])


def _steps(work: Path, mnt: Path, mode: str) -> dict:
    store = mnt / "store"
    conf = work / "broker.conf"
    conf.write_text(BROKER_CONF)
    a, b = work / "a.jsonl", work / "b.jsonl"
    messages(a, 0, 300)
    messages(b, 300, 3000)
    full = {"on": False}

    def rmq(*args) -> dict:
        args = [str(x) for x in args]
        cmd = [sys.executable, "-m", "rmqstore", *args]
        if mode == "inject" and full["on"]:
            cmd = [sys.executable, __file__, "--inject", str(mnt), *args]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
        return {"args": args, "rc": p.returncode, "stderr": p.stderr, "stdout": p.stdout}

    def verify() -> dict:
        r = rmq("verify", store, "-f", "json")
        try:
            rep = json.loads(r["stdout"])
        except ValueError:
            rep = {}
        return {"rc": r["rc"], "stderr": r["stderr"], "messages": rep.get("messages"),
                "findings": [(f["severity"], f["code"]) for f in rep.get("findings", [])]}

    def make_full(leave: int = 0) -> None:
        if mode == "inject":
            full["on"] = True
        else:
            fill(mnt, leave)

    def make_room() -> None:
        full["on"] = False
        for p in mnt.glob("filler-*"):
            p.unlink()

    out: dict = {"mode": mode}
    out["create"] = rmq("append", store, "--create", "--jsonl", a, "-c", conf)
    # A preallocated, never written segment after the last one, as a broker leaves it:
    # all hole.
    with open(store / "commitlog" / f"{SEGMENT:020d}", "xb") as f:
        f.truncate(SEGMENT)
    out["verify_before"] = verify()
    make_full()

    # Read-only commands on the full file system: same answers, not one byte or block.
    h0, m0 = hashes(store), mtimes(store)
    free0 = os.statvfs(mnt).f_bfree
    out["read"] = {}
    for name, args in (("verify", ("verify", store, "-f", "json")),
                       ("dump", ("dump", store, "-f", "jsonl")),
                       ("stats", ("stats", store, "-f", "json"))):
        r = rmq(*args)
        out["read"][name] = {"rc": r["rc"], "stderr": r["stderr"],
                             "lines": len(r["stdout"].splitlines())}
    out["read_verify"] = verify()
    out["read_unchanged"] = hashes(store) == h0 and mtimes(store) == m0
    out["read_free_blocks"] = [free0, os.statvfs(mnt).f_bfree]

    # append fills the last 128 KiB and stops with one line (injected: at once).
    make_room()
    make_full(leave=128 * 1024)
    r = rmq("append", store, "--jsonl", b, "-c", conf)
    ok = [json.loads(x)["status"] for x in r["stdout"].splitlines()]
    out["append"] = {"rc": r["rc"], "stderr": r["stderr"], "put_ok": ok.count("PUT_OK"),
                     "other": len(ok) - ok.count("PUT_OK")}
    out["verify_after_append"] = verify()

    # rebuild writes in a scratch directory: the old files stay, the scratch goes.
    kept = hashes(store, "consumequeue", "index")
    r = rmq("rebuild", store, "-c", conf)
    out["rebuild"] = {"rc": r["rc"], "stderr": r["stderr"]}
    out["rebuild_kept_files"] = hashes(store, "consumequeue", "index") == kept
    out["rebuild_scratch_left"] = [p.name for p in store.iterdir() if p.name.startswith(".rmqstore-rebuild-")]
    out["verify_after_rebuild"] = verify()

    # repair must write: one queue's file is gone (which frees room: fill again).
    make_room()
    (store / "consumequeue" / "T1" / "1" / f"{0:020d}").unlink()
    make_full()
    out["verify_before_repair"] = verify()
    r = rmq("repair", store, "--yes", "-c", conf)
    out["repair"] = {"rc": r["rc"], "stderr": r["stderr"]}
    out["verify_after_repair"] = verify()

    # Room again: the store is finished by repair, nothing lost.
    make_room()
    for p in mnt.glob("store.rmqstore-backup-*"):
        shutil.rmtree(p)  # a failed repair's partial backup (not part of the store)
    r = rmq("repair", store, "--yes", "-c", conf)
    out["repair_with_room"] = {"rc": r["rc"], "stderr": r["stderr"]}
    out["verify_final"] = verify()
    r = rmq("dump", store, "-f", "jsonl", "--body", "text")
    out["final_bodies"] = [json.loads(x)["body"][:7] for x in r["stdout"].splitlines()]
    return out


# --- ENOSPC without a small file system ---------------------------------------------------


def inject_main(root: str, args: list[str]) -> None:
    """Run ``rmqstore ARGS`` with ENOSPC from every allocation and every write needing new
    space (past the end, or into a hole) in a file under ``root``."""
    root = os.path.realpath(root) + os.sep
    real = {n: getattr(os, n) for n in ("posix_fallocate", "pwrite", "write", "sendfile",
                                        "copy_file_range") if hasattr(os, n)}

    def under(fd: int) -> bool:
        try:
            return os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")).startswith(root)
        except OSError:
            return False

    def needs_space(fd: int, off: int, n: int) -> bool:
        try:
            return off + n > os.fstat(fd).st_size or os.lseek(fd, off, os.SEEK_HOLE) < off + n
        except OSError:
            return False

    def enospc():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def posix_fallocate(fd, off, n):
        if under(fd):
            raise enospc()
        return real["posix_fallocate"](fd, off, n)

    def pwrite(fd, data, off):
        if under(fd) and needs_space(fd, off, len(data)):
            raise enospc()
        return real["pwrite"](fd, data, off)

    def write(fd, data):
        if under(fd) and needs_space(fd, os.lseek(fd, 0, os.SEEK_CUR), len(data)):
            raise enospc()
        return real["write"](fd, data)

    def sendfile(out_fd, in_fd, offset, count, *a, **k):
        if under(out_fd):
            raise enospc()
        return real["sendfile"](out_fd, in_fd, offset, count, *a, **k)

    def copy_file_range(src, dst, count, *a, **k):
        if under(dst):
            raise enospc()
        return real["copy_file_range"](src, dst, count, *a, **k)

    for fn in (posix_fallocate, pwrite, write, sendfile, copy_file_range):
        if fn.__name__ in real:
            setattr(os, fn.__name__, fn)
    sys.argv = ["rmqstore", *args]
    sys.path.insert(0, str(REPO))
    from cli.main import run

    run()


if __name__ == "__main__":
    if sys.argv[1] == "--inject":
        inject_main(sys.argv[2], sys.argv[3:])
    else:
        json.dump(scenario(Path(sys.argv[1]), sys.argv[2]), sys.stdout)
