"""Forked work: a process-pool ``map``, one function run in a child beside the parent, and
an :class:`Arena` of shared memory for results too big to pickle cheaply.

Everything forks, so children inherit the parent's imports and arrays (copy-on-write) and
start in milliseconds; results come back pickled, or as views of the arena.
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
from typing import Callable

import numpy as np

from ..errors import WorkerDiedError
from ..files.notes import noted


def died(how: str) -> WorkerDiedError:
    """The typed error for a worker that died ``how`` ("killed by SIGBUS", ...), naming
    the file a process last noted mapping (:func:`rmqstore.files.mapped.note`) for a bus error."""
    op, path, _ = noted() if "SIGBUS" in how else ("", "", "")
    why = ""
    if "SIGBUS" in how:
        what = f"the file changed or could not be {'written' if op == 'write' else 'read'}" \
            if path else "a mapped file changed or could not be read"
        why = f": {what} while mapped (it shrank, or the disk or a full tmpfs failed)"
    elif "SIGKILL" in how:
        why = " (out of memory?)"
    return WorkerDiedError(f"a worker process died, {how}{why}", path or None)


def _how(status_or_code: int, *, exitcode: bool = False) -> str:
    """"killed by SIGBUS" / "exit status 3" from a wait status (or a Process.exitcode)."""
    if exitcode:
        sig = -status_or_code if status_or_code < 0 else 0
        code = status_or_code if status_or_code >= 0 else None
    else:
        sig = os.WTERMSIG(status_or_code) if os.WIFSIGNALED(status_or_code) else 0
        code = os.WEXITSTATUS(status_or_code) if os.WIFEXITED(status_or_code) else None
    if sig:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit status {code}"


def pool_map(fn, items, workers: int):
    """``map`` in a fork-based process pool, results in order as they complete. A worker
    that dies (a bus error, the OOM killer) is a :class:`WorkerDiedError`, not a hang."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=keep_heap) as ex:
        try:
            yield from ex.map(fn, items)
        except BrokenProcessPool:
            procs = list((getattr(ex, "_processes", None) or {}).values())
            ex.shutdown(wait=True)  # every worker reaped: their exit codes are known
            # The pool terminates the others (SIGTERM) once one died: name the one that did.
            codes = sorted((p.exitcode for p in procs if p.exitcode not in (None, 0)),
                           key=lambda c: c == -signal.SIGTERM)
            raise died(_how(codes[0], exitcode=True) if codes else "abruptly") from None


def keep_heap() -> None:
    """In a worker process: let glibc's malloc keep freed memory for reuse.

    Tasks allocate and free the same big numpy temporaries over and over; by default
    glibc hands each one back to the kernel (mmap'd chunks, heap trimming), so every task
    page-faults its memory in again: ~280k faults in a 1 GiB rebuild, 15 % of the
    workers' time. Workers exit with the pool, so nothing outlives it; without glibc
    this does nothing."""
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    mallopt(M_MMAP_THRESHOLD, 512 << 20)
    mallopt(M_TRIM_THRESHOLD, 1 << 30)
    mallopt(M_TOP_PAD, 64 << 20)


def trim_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim``).

    A parent that drops many mid-sized arrays (the workers' parts, once merged) keeps their
    pages: glibc returns only the top of the heap, so the next phases' arrays come on top
    and the peak counts both. Without glibc this does nothing."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Child:
    """``fn()`` running in a forked child; :meth:`result` waits for its value (or raises
    its exception in the parent). Call :meth:`result` exactly once."""

    def __init__(self, fn: Callable[[], object]):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code
            try:
                os.close(r)
                try:
                    payload = (True, fn())
                except BaseException as e:  # noqa: BLE001 - handed to the parent as is
                    payload = (False, e)
                try:
                    data = pickle.dumps(payload)
                except Exception as e:  # noqa: BLE001 - an unpicklable error or value
                    data = pickle.dumps((False, RuntimeError(f"child result: {e!r}")))
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(w)
        self._pid, self._r = pid, r

    def result(self):
        with os.fdopen(self._r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(self._pid, 0)
        if not data:
            raise died(_how(status))
        ok, value = pickle.loads(data)
        if not ok:
            raise value
        return value


class Done:
    """A :class:`Child` look-alike for work done in this process."""

    def __init__(self, fn: Callable[[], object]):
        self._value = fn()

    def result(self):
        return self._value


class _Ref:
    """Where an array a worker wrote into an :class:`Arena` lies."""

    __slots__ = ("offset", "dtype", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple):
        self.offset, self.dtype, self.shape = offset, dtype, shape

    def __reduce__(self):
        return _Ref, (self.offset, self.dtype, self.shape)


_ARENAS: dict[int, "Arena"] = {}


class Arena:
    """Shared memory that forked workers fill and the parent reads without a copy.

    Handing a result back pickles it through a pipe: four copies and many small reads,
    as much work as a fast task itself. Instead a task writes its big arrays into its own
    slot of one anonymous shared mapping, made before the workers fork, and sends only
    where they lie; the parent's arrays are views of the mapping. An array that does not
    fit its slot travels pickled as before. Register with ``with Arena(...) as a`` before
    the pool starts; tasks find it by :attr:`key`."""

    MIN_BYTES = 1024  # smaller arrays are cheaper pickled

    def __init__(self, slots: int, slot_size: int):
        self.slot_size = -(-slot_size // 4096) * 4096
        self.mm = mmap.mmap(-1, max(slots, 1) * self.slot_size)  # MAP_SHARED | ANONYMOUS
        self.buf = np.frombuffer(self.mm, dtype=np.uint8)
        self.key = id(self)

    def __enter__(self) -> "Arena":
        _ARENAS[self.key] = self
        return self

    def __exit__(self, *exc) -> None:
        _ARENAS.pop(self.key, None)  # views keep the mapping alive as long as needed

    def put(self, slot: int, d: dict) -> dict:
        """In a worker: ``d`` with its big arrays written into ``slot``, as references."""
        base, used, out = slot * self.slot_size, 0, {}
        for k, v in d.items():
            if isinstance(v, np.ndarray) and v.nbytes >= self.MIN_BYTES:
                v = np.ascontiguousarray(v)
                if used + v.nbytes <= self.slot_size:
                    self.buf[base + used:base + used + v.nbytes] = v.reshape(-1).view(np.uint8)
                    out[k] = _Ref(base + used, v.dtype.str, v.shape)
                    used = -(-(used + v.nbytes) // 8) * 8
                    continue
            out[k] = v
        return out

    def get(self, d: dict) -> dict:
        """In the parent: ``d`` with references turned into arrays (views, no copy)."""
        out = {}
        for k, v in d.items():
            if isinstance(v, _Ref):
                dt = np.dtype(v.dtype)
                count = int(np.prod(v.shape))
                v = np.frombuffer(self.mm, dtype=dt, count=count, offset=v.offset).reshape(v.shape)
            out[k] = v
        return out


def arena(key: int | None) -> "Arena | None":
    """The registered :class:`Arena` with this key (None for None or unknown)."""
    return None if key is None else _ARENAS.get(key)
