"""The last resort against a bus error: each command runs in a forked child, and a child
killed by SIGBUS becomes one line and exit 2 instead of "Bus error (core dumped)".

rmqstore reads and writes through memory maps. It allocates before it writes through one
and maps holes safely (:mod:`rmqstore.files.mapped`), but a file truncated by another process
while mapped, or a disk failing under a map, still raises SIGBUS, which Python cannot
catch. The parent only waits: the child keeps stdin, stdout, stderr and the terminal's
process group, so pipes, ``| head``, Ctrl-C and Ctrl-Z behave as before. A signal sent to
the parent by another process (``kill``, ``timeout``) is passed on to the child; one
from the terminal reached the child already. The parent ends the way the child ended:
the same exit status, or the same signal (SIGBUS excepted, and SIGINT: a child that
died of it gets the command's "interrupted" line and exit 130). The child dies with the
parent (a ``kill -9`` of rmqstore stops the command, on Linux). ``RMQSTORE_NO_FORK=1``
runs the command in the first process, for debuggers.
"""

from __future__ import annotations

import os
import signal
import sys

from rmqstore.files import notes

#: Signals another process may send to the parent, handed on to the child.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
_SI_KERNEL = 0x80  # si_code of a signal the kernel sent (the terminal's Ctrl-C, hangup)
EXIT_UNUSABLE = 2


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def bus_error_message(op: str, path: str, store: str) -> str:
    """The one line for a command that died of SIGBUS, from what it noted last."""
    what = f"{_printable(path)} changed or could not be {'written' if op == 'write' else 'read'}" \
        if path else "a mapped file changed or could not be read"
    head = f"rmqstore: {what} while mapped (bus error: it shrank, or the disk or a full tmpfs failed)"
    if store:
        s = _printable(store)
        return (f"{head}; this command was writing to {s}: once the disk is healthy run "
                f"`rmqstore verify {s}`, and `rmqstore repair {s}` if it reports problems")
    return (f"{head}; nothing was changed by this read-only command: check the disk and that "
            "nothing truncates the store's files, then run it again")


_supervised = False


def run() -> None:
    """The ``rmqstore`` entry point: fork before the command's imports (the parent stays
    small and the fork cheap), then run the command in the child."""
    supervise()
    from cli.main import run as run_command

    run_command()


def supervise() -> None:
    """Fork; return in the child, which runs the command. The parent waits and exits as
    the child did, turning death by SIGBUS into one line on stderr and exit 2. Only the
    first call forks."""
    global _supervised
    if _supervised or os.environ.get("RMQSTORE_NO_FORK") or not hasattr(os, "fork") \
            or not hasattr(signal, "sigwaitinfo"):  # (macOS: run unguarded)
        return
    _supervised = True
    page = notes.install_note_page()
    waited = set(FORWARDED) | {signal.SIGCHLD}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return  # no fork: run the command here, unguarded
    if pid == 0:
        _die_with(parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return
    status = _wait(pid, waited)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
    if sig == signal.SIGBUS:
        op, path, store = notes.noted(page)
        try:
            sys.stderr.write(bus_error_message(op, path, store) + "\n")
            sys.stderr.flush()
        except OSError:
            pass
        os._exit(EXIT_UNUSABLE)
    if sig == signal.SIGINT:
        # Ctrl-C that landed where the command could not turn it into its one line (a
        # KeyboardInterrupt outside the error handler, seen once under load): say what the
        # command says and exit as it does, so the outcome never depends on the timing.
        try:
            sys.stderr.write("rmqstore: interrupted\n")
            sys.stderr.flush()
        except OSError:
            pass
        os._exit(130)
    # Die of the same signal, so a shell sees what it would have seen without the fork.
    try:
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    except (OSError, ValueError):
        pass  # SIGKILL: cannot be caught, blocked or reset, and need not be
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _die_with(parent: int) -> None:
    """In the child: be SIGKILLed when the parent dies. ``kill -9`` of rmqstore (an
    operator, the OOM killer, a supervisor's timeout) reaches the parent only; the command
    must not go on writing a store behind the operator's back (Linux PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + signal.SIGKILL)


def _wait(pid: int, waited: set) -> int:
    while True:
        info = signal.sigwaitinfo(waited)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return status
            continue
        if info.si_code != _SI_KERNEL:  # sent by a process to this one: pass it on
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass
