"""`import rmqstore` exposes the public API lazily, and the ops script in docs/scripting.md
runs as written against a sample store."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import rmqstore

REPO = Path(__file__).resolve().parents[1]


def test_public_names_resolve_to_the_library_objects():
    import rmqstore.rebuild
    import rmqstore.verify
    from rmqstore import errors, reader, times

    assert rmqstore.open_store is reader.open_store
    assert rmqstore.parse_time is times.parse_time
    # verify and rebuild are modules too: they stay importable as modules, and callable
    import rmqstore.rebuild as rb

    assert rmqstore.rebuild is rb and rb.rebuild is sys.modules["rmqstore.rebuild"].rebuild
    assert hasattr(rb, "SCRATCH_PREFIX")
    assert callable(rmqstore.verify) and callable(rmqstore.rebuild)
    report = rmqstore.verify(REPO / "samples" / "multi-segment")
    assert report.ok and report.messages == 600
    assert rmqstore.RmqStoreError is errors.RmqStoreError
    for name in rmqstore.__all__:
        assert getattr(rmqstore, name) is not None, name
    assert set(rmqstore.__all__) <= set(dir(rmqstore))
    with pytest.raises(AttributeError):
        rmqstore.no_such_name  # noqa: B018


def test_import_is_light():
    """Names load on first use: importing the package pulls in neither numpy nor the engine."""
    code = ("import sys, rmqstore; print(sorted(m for m in sys.modules if m == 'numpy' "
            "or m.startswith('rmqstore.') and m != 'rmqstore.errors'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _script() -> str:
    text = (REPO / "docs" / "scripting.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if "sys.argv" in b)


def test_the_docs_ops_script_runs_on_a_sample_store():
    store = REPO / "samples" / "multi-segment"
    with rmqstore.open_store(store) as s:
        msgs = list(s.messages())
    out = subprocess.run([sys.executable, "-c", _script(), str(store)], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{store}: healthy, {len(msgs)} messages")
    topics = {m.topic for m in msgs}
    counted = {l.split(":")[0].strip(): int(l.split(":")[1]) for l in lines[1:1 + len(topics)]}
    assert counted == {t: sum(m.topic == t for m in msgs) for t in topics}
    assert sum(" from " in l and " pid " in l for l in lines) == 3
    assert any(re.match(r"  key '.+': \d+ message\(s\)", l) for l in lines)
    assert lines[-1].endswith("Z") and "message(s) stored before" in lines[-1]
