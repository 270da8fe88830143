"""Where compiled kernels are cached (rmqstore.files.jit): the user's cache directory, also
when the caller imported numba before rmqstore loaded its first kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("numba_first", [False, True])
def test_kernels_are_cached_in_the_users_cache_directory(tmp_path, numba_first):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "RMQSTORE_NO_JIT")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    code = ("import numba\n" if numba_first else "") + (
        "from rmqstore.scan import segment_pass\n"
        "assert segment_pass.warm()\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    cached = list((tmp_path / "cache" / "rmqstore" / "numba").rglob("*.nbi"))
    assert any("segment_jit" in p.name for p in cached), cached
