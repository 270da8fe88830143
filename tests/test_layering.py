"""rmqstore's imports point down its layers and never go round in a cycle (issue #13).

The layers, bottom to top (docs/engine.md opens with the same map)::

    errors -> format -> files -> scan -> engine -> recovery -> top level -> cli

``rmqstore/format/`` holds bytes and rules, ``files/`` one module per file kind, ``scan/``
many records at once, ``engine/`` the writer, ``recovery/`` verify, repair and rebuild; the
top level (``reader``, ``stats``, ``pipeline/``...) serves the CLI and scripts. A module may
import its own layer and the layers below; an import inside a function counts too (it
runs later, but it is still a dependency). Cycles are counted among imports that run when
a module is imported (module and class bodies, not functions). No module reaches another's
private names (``from .x import _name``, ``x._name``): what is shared is public.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (layer, module prefixes), bottom first; any other ``rmqstore.*`` module is top level.
LAYERS = [
    ("errors", ("rmqstore", "rmqstore.errors")),
    ("format", ("rmqstore.format",)),
    ("files", ("rmqstore.files",)),
    ("scan", ("rmqstore.scan",)),
    ("engine", ("rmqstore.engine",)),
    ("recovery", ("rmqstore.recovery",)),
    ("top", ()),
    ("cli", ("cli", "rmqstore.__main__")),
]
TOP = [name for name, _ in LAYERS].index("top")


def layer(module: str) -> int:
    best, rank = -1, TOP
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            exact = p in ("rmqstore",)  # the package itself: only its __init__
            if module == p or (not exact and module.startswith(p + ".")):
                if len(p) > best:
                    best, rank = len(p), i
    return rank


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_edges(root: Path, packages=("rmqstore", "cli")):
    """(importer, imported, at import time?) for every import of a module under
    ``packages`` found in their source below ``root``."""
    files = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    modules = set(files)
    edges = []
    for mod, path in sorted(files.items()):
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

        def target(name: str) -> str | None:
            return name if name.split(".")[0] in packages else None

        def walk(node, in_function: bool):
            for ch in ast.iter_child_nodes(node):
                inner = in_function or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
                if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                    inner = True  # never runs
                if isinstance(ch, ast.Import):
                    for a in ch.names:
                        t = target(a.name)
                        if t:
                            edges.append((mod, t, not in_function))
                elif isinstance(ch, ast.ImportFrom):
                    if ch.level:
                        base = pkg.split(".")[:len(pkg.split(".")) - (ch.level - 1)]
                        src = ".".join(base + ([ch.module] if ch.module else []))
                    else:
                        src = ch.module or ""
                    if target(src):
                        for a in ch.names:
                            sub = f"{src}.{a.name}"
                            edges.append((mod, sub if sub in modules else src, not in_function))
                walk(ch, inner)

        walk(ast.parse(path.read_text()), False)
    return edges


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(root: Path, packages=("rmqstore", "cli")) -> list[str]:
    """``from x import _name`` and ``x._name`` (``x`` a module imported by name) of our
    modules, each as "module:line: what"."""
    files = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    out = []
    for mod, path in sorted(files.items()):
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if src.split(".")[0] not in packages:
                    continue
                for a in node.names:
                    if _private(a.name):
                        out.append(f"{mod}:{node.lineno}: from {src} import {a.name}")
                    elif f"{src}.{a.name}" in files:
                        aliases.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in files and a.asname:
                        aliases.add(a.asname)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) \
                    and isinstance(node.value, ast.Name) and node.value.id in aliases:
                out.append(f"{mod}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


def upward(edges) -> list[str]:
    return sorted({f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
                   for a, b, _ in edges if layer(b) > layer(a)})


def cycles(edges) -> list[list[str]]:
    """Strongly connected groups of more than one module among import-time edges."""
    graph: dict[str, set[str]] = {}
    for a, b, at_import in edges:
        if at_import and a != b:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down_the_layers():
    bad = upward(import_edges(REPO))
    assert not bad, "imports that point up the layers (move the code down, or the import):\n" \
        + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(import_edges(REPO))
    assert not found, f"modules that import each other when imported: {found}"


def test_no_module_reaches_another_modules_private_names():
    found = private_uses(REPO)
    assert not found, "private names used across modules (make them public where they " \
        "belong):\n" + "\n".join(found)


def test_every_rmqstore_package_is_a_known_layer():
    """A new package under rmqstore/ gets its place in LAYERS (else it is top level by
    accident)."""
    known = {p for _, prefixes in LAYERS for p in prefixes}
    packages = {f"rmqstore.{p.parent.name}" for p in (REPO / "rmqstore").glob("*/__init__.py")}
    assert packages - known <= {"rmqstore.pipeline"}, sorted(packages - known)


def test_the_checks_see_an_upward_import_and_a_cycle(tmp_path):
    """The checks find what they are for, on a small made-up tree."""
    pkg = tmp_path / "rmqstore"
    for d in ("format", "engine"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .errors import E\n")
    (pkg / "errors.py").write_text("class E(Exception): pass\n")
    (pkg / "format" / "rules.py").write_text("def f():\n    from ..engine import store\n")
    (pkg / "engine" / "store.py").write_text("from . import batch\nfrom ..format import rules\n")
    (pkg / "engine" / "batch.py").write_text("from .store import X\n")
    edges = import_edges(tmp_path, packages=("rmqstore",))
    assert upward(edges) == ["rmqstore.format.rules (format) imports rmqstore.engine.store (engine)"]
    assert cycles(edges) == [["rmqstore.engine.batch", "rmqstore.engine.store"]]
    assert layer("rmqstore.stats") == TOP and layer("rmqstore.pipeline.jobs") == TOP
    assert layer("rmqstore") == 0 and layer("rmqstore.formatting") == TOP
    (pkg / "engine" / "batch.py").write_text("from .store import _x\nfrom . import store as s\n"
                                             "from ..format import rules\n"
                                             "y = s._y + rules._z + s.__doc__ + rules.f\n")
    assert private_uses(tmp_path, packages=("rmqstore",)) == [
        "rmqstore.engine.batch:1: from rmqstore.engine.store import _x",
        "rmqstore.engine.batch:4: s._y", "rmqstore.engine.batch:4: rules._z"]
