"""Forked work: a process-pool ``map``, and one function run in a child beside the parent.

Both fork, so children inherit the parent's imports and arrays (copy-on-write) and start
in milliseconds; results come back pickled.
"""

from __future__ import annotations

import os
import pickle
from typing import Callable


def pool_map(fn, items, workers: int):
    """``map`` in a fork-based process pool, results in order as they complete."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as ex:
        yield from ex.map(fn, items)


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
            raise RuntimeError(f"worker process ended without a result (wait status {status})")
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
