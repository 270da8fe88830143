"""The one switch for rmqstore's compiled (numba) kernels, and where their machine code is
cached. Every kernel has a numpy path that is its definition; ``RMQSTORE_NO_JIT=1`` (or
numba missing) makes every caller take that path.

Used by :mod:`rmqstore.scan.segment_pass` (the segment pass) and
:mod:`rmqstore.files.index` (the IndexFile bulk put). Nothing here imports numba: a kernel
module does, when :func:`load` first imports it.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path


def switched_off() -> bool:
    """Is ``RMQSTORE_NO_JIT=1`` set (read on every call: tests flip it)?"""
    return os.environ.get("RMQSTORE_NO_JIT", "") == "1"


def cache_dir() -> str:
    """Where compiled kernels are kept: ``$XDG_CACHE_HOME/rmqstore/numba`` (or
    ``~/.cache/...``); where that cannot be made, a directory of this user's in the
    temporary directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    d = Path(base) / "rmqstore" / "numba"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return str(d)
    except OSError:
        pass
    import tempfile  # only now: finding the temporary directory writes a probe file there

    return str(Path(tempfile.gettempdir()) / f"rmqstore-numba-{os.getuid()}")


def load(module: str):
    """Import the kernel module ``module`` (absolute name) with the cache directory set,
    or None when it cannot load here (no numba, say). Callers check :func:`switched_off`
    first and keep the answer."""
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = cache_dir()
    numba = sys.modules.get("numba")
    if numba is not None and not getattr(numba.config, "CACHE_DIR", ""):
        # numba reads NUMBA_CACHE_DIR when it is first imported: imported before (by the
        # caller's own code), it would put the kernels beside rmqstore's sources (or,
        # where those are read-only, compile them on every run)
        numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
    try:
        return importlib.import_module(module)
    except Exception:  # no numba, or it cannot load here: numpy does the work
        return None
