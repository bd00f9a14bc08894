"""The package's shape (issue 33): no import cycle between bnstudy's modules, counting imports inside functions; the
practitioner's library (``bnstudy`` outside ``bnstudy.study``) never imports the study machinery."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bnstudy"


def _modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, every import statement (top level or inside a function),
    a package's ``__init__`` left out of its own submodules' edges (Python imports it first anyway)."""
    mods = _modules(root)
    graph = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module
                for alias in node.names:
                    deps.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in mods and d != name and not name.startswith(d + ".")}
    return graph


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "bnstudy.study.book" in graph["bnstudy.study.release"] and "bnstudy.study.manifest" in graph["bnstudy.study.book"]  # sees inside functions
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_cycle_check_finds_a_cycle_inside_a_function(tmp_path):
    pkg = tmp_path / "bnstudy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    graph = import_graph(pkg)
    assert graph["bnstudy.a"] == {"bnstudy.b"} and graph["bnstudy.b"] == {"bnstudy.a"}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()


def test_the_library_never_imports_the_study_machinery():
    """The two users' layout: the front door (``bnstudy``, ``bnstudy.audit``) and the book's machinery in its own
    subpackage (``bnstudy.study``: engine, sweeps, claims, pages, chapters), which may use the library, never the
    reverse (a front-door import would otherwise need pandas, scipy, matplotlib)."""
    graph = import_graph()
    library = {m for m in graph if not (m == "bnstudy.study" or m.startswith("bnstudy.study."))}
    study = set(graph) - library
    assert {"bnstudy.freeze", "bnstudy.audit.freeze_audit"} <= library and "bnstudy.study.experiments.heads.run" in study
    crossing = {m: sorted(graph[m] & study) for m in library if graph[m] & study}
    assert not crossing, f"library modules importing the study machinery: {crossing}"
    assert any(graph[m] & library for m in study)  # the check sees the edges (the study side uses the library)
