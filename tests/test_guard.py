"""The CLI's last resort (cli/guard.py): a command killed by SIGBUS is one line and exit
2, naming the file it had mapped; everything else (exit codes, stdin, stdout, signals
from other processes, Ctrl-C's "interrupted") is as without the fork. And worker
processes that die are typed errors (rmqstore/scan/parallel.py)."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore.files import notes
from rmqstore.errors import WorkerDiedError
from rmqstore.scan.parallel import Child, pool_map

REPO = Path(__file__).resolve().parents[1]
RMQSTORE = str(Path(sys.executable).parent / "rmqstore")

# A command that maps a file, lets it shrink under the map and reads it: SIGBUS.
BUS_ERROR = """
import os, sys
from cli.guard import supervise
supervise()
from rmqstore.files import checkpoint, mapped
path = sys.argv[1]
with open(path, "wb") as f:
    f.write(b"x" * 65536)
f = open(path, "rb")
mm = mapped.map_read(f.fileno(), 0, path)
if len(sys.argv) > 2:
    checkpoint.StoreLock(sys.argv[2]).acquire()  # a writing command
os.truncate(path, 0)
print(mm[40000])
"""


def python(code: str, *args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120, **kw)


def test_a_bus_error_is_one_line_and_exit_2(tmp_path):
    victim = tmp_path / "00000000000000000000"
    p = python(BUS_ERROR, victim)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rmqstore: {victim} changed or could not be read")
    assert "nothing was changed by this read-only command" in lines[0]
    assert "Traceback" not in p.stderr
    # Without the guard the same command dies of the signal, as every command did before.
    bare = python(BUS_ERROR, victim, env=dict(os.environ, RMQSTORE_NO_FORK="1"))
    assert bare.returncode == -signal.SIGBUS


def test_a_bus_error_in_a_writing_command_says_to_verify(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    p = python(BUS_ERROR, tmp_path / "f", store)
    assert p.returncode == 2
    assert len(p.stderr.splitlines()) == 1
    assert f"was writing to {store}: once the disk is healthy run `rmqstore verify {store}`" \
        in p.stderr


@pytest.mark.parametrize("how", ["exit 0", "exit 3", "SIGTERM", "SIGKILL"])
def test_the_parent_ends_as_the_child_did(how):
    body = f"sys.exit({how.split()[1]})" if how.startswith("exit") else \
        f"os.kill(os.getpid(), signal.{how})"
    p = python(f"import os, signal, sys\nfrom cli.guard import supervise\nsupervise()\n{body}")
    want = int(how.split()[1]) if how.startswith("exit") else -getattr(signal, how)
    assert p.returncode == want and p.stderr == ""


def test_stdin_stdout_and_exit_codes_of_a_real_command(tmp_path):
    """`append --jsonl -` reads stdin and prints a line per message through the guard;
    a bad line is one line and exit 2, exactly as without the fork."""
    lines = "".join(json.dumps({"topic": "T", "body": f"b{i}"}) + "\n" for i in range(3))
    outs = []
    for env in (None, dict(os.environ, RMQSTORE_NO_FORK="1")):
        store = tmp_path / f"s{len(outs)}"
        ok = subprocess.run([RMQSTORE, "append", str(store), "--create", "--jsonl", "-"],
                            input=lines, capture_output=True, text=True, env=env, timeout=120)
        bad = subprocess.run([RMQSTORE, "append", str(store), "--jsonl", "-"], input="{x\n",
                             capture_output=True, text=True, env=env, timeout=120)
        outs.append((ok.returncode, [json.loads(x)["status"] for x in ok.stdout.splitlines()],
                     bad.returncode, bad.stderr.replace(str(store), "S")))
    assert outs[0] == outs[1]
    assert outs[0][:3] == (0, ["PUT_OK"] * 3, 2) and outs[0][3].startswith("rmqstore: <stdin>:1:")


@pytest.mark.parametrize("sig, want", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_sent_to_the_command_reaches_it(tmp_path, sig, want):
    """`kill -INT` / `kill -TERM` of the rmqstore process (what `timeout` or a script
    does) reaches the command running in the child: Ctrl-C's "interrupted" and exit 130,
    or death by SIGTERM, as without the fork."""
    for env in (None, dict(os.environ, RMQSTORE_NO_FORK="1")):
        p = subprocess.Popen([RMQSTORE, "append", str(tmp_path / "s"), "--create", "--jsonl", "-"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        p.stdin.write(json.dumps({"topic": "T", "body": "b"}) + "\n")
        p.stdin.flush()
        assert json.loads(p.stdout.readline())["status"] == "PUT_OK"  # it is running
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=60)
        finally:
            p.kill()
        assert p.returncode == want, (env is None, p.returncode, err)
        if sig == signal.SIGINT:
            assert err.strip() == "rmqstore: interrupted"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_kill_9_of_the_command_stops_the_child_too(tmp_path):
    """SIGKILL reaches only the process it is sent to: the parent. The child running the
    command must not outlive it and go on writing the store (it did: an orphan append
    kept the lock and took more messages)."""
    import time

    from rmqstore.files.checkpoint import is_locked

    store = tmp_path / "s"
    p = subprocess.Popen([RMQSTORE, "append", str(store), "--create", "--jsonl", "-"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        p.stdin.write(json.dumps({"topic": "T", "body": "b"}) + "\n")
        p.stdin.flush()
        assert json.loads(p.stdout.readline())["status"] == "PUT_OK"
        assert is_locked(store)
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=60) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while is_locked(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_locked(store), "the command's child outlived rmqstore's kill -9"
    finally:
        p.kill()
        p.stdin.close()
        p.stdout.close()
        p.stderr.close()


def bus_error_at_5(i: int) -> int:
    if i == 5:
        notes.note("/store/commitlog/00000000000000000000", "read")
        faulthandler.disable()  # pytest's, inherited: no traceback dump in the output
        os.kill(os.getpid(), signal.SIGBUS)
    return i


def test_pool_worker_killed_by_a_bus_error_is_a_typed_error():
    notes.install_note_page()
    with pytest.raises(WorkerDiedError, match="killed by SIGBUS: the file changed or could "
                                              "not be read while mapped") as e:
        list(pool_map(bus_error_at_5, range(40), 2))
    assert e.value.path == "/store/commitlog/00000000000000000000"


def test_child_killed_is_a_typed_error():
    with pytest.raises(WorkerDiedError, match="killed by SIGKILL"):
        Child(lambda: os.kill(os.getpid(), signal.SIGKILL)).result()
