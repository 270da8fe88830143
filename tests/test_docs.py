"""The docs: docs/cli.md is what the commands' --help says today, links resolve, and the
pages carry what issue 6 promises (format diagrams, performance figures with commands)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

from conftest import REPO

DOCS = REPO / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_is_current():
    gen = _generator()
    expected = gen.render()
    actual = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert actual == expected, "docs/cli.md is stale: run .venv/bin/python scripts/gen_cli_docs.py"


def test_cli_reference_does_not_depend_on_the_terminal():
    env = dict(os.environ, COLUMNS="40", LINES="10", TERM="dumb")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_docs.py"), "--check"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_cli_reference_covers_every_command():
    gen = _generator()
    from cli.main import app
    import typer

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    paths = [" ".join(p) for p, _ in gen.walk(typer.main.get_command(app), ["rmqstore"])]
    assert len(paths) > 5
    for p in paths:
        assert f"## `{p}`" in text, f"{p} missing from docs/cli.md"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_relative_links_resolve():
    pages = list(DOCS.glob("*.md")) + [REPO / "README.md", REPO / "samples" / "README.md"]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_format_page_draws_each_layout():
    text = (DOCS / "format.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    drawn = "\n".join(b for b in blocks if "┌" in b and "└" in b)
    for field in ("TOTALSIZE", "PHYSICALOFFSET", "PROPERTIES",          # record
                  "tagsCode",                                         # CQ unit
                  "beginTimestamp", "indexCount",                     # IndexFile header
                  "newest entry number",                              # slot
                  "keyHash", "timeDiff",                              # entry
                  "physicMsgTimestamp"):                              # checkpoint
        assert field in drawn, f"docs/format.md has no diagram showing {field}"


def test_performance_page_names_machine_and_commands():
    text = (DOCS / "performance.md").read_text(encoding="utf-8")
    assert "2 cores" in text and "24 GiB" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    names = {"append", "scan", "verify", "rebuild", "query-key", "dump", "spark-export"}
    seen = set()
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0].strip("`") in names:
            seen.add(cells[0].strip("`"))
            assert "rmqstore bench" in row or "pending" in row, row
    assert seen == names, f"performance.md lacks rows for {names - seen}"


def test_index_page_has_install_and_tour():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    assert "pip install" in text and "samples/tour.sh" in text
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "samples/tour.sh" in readme
