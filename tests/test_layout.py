"""The package's shape: no module imports one that imports it back, directly or through others, and no class
name means two things.

Every import counts, at the top of a module, inside a function, or only for type checking: a cycle of any
kind means two modules that cannot be read, changed or tested one without the other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shardbench"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "shardbench.cli" in graph["shardbench.__main__"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def class_homes(paths: list[Path]) -> dict[str, list[str]]:
    """Each class name defined in more than one module of `paths` (nested classes included), with those modules."""
    homes: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                homes[node.name].add(str(path))
    return {name: sorted(where) for name, where in homes.items() if len(where) > 1}


def test_no_class_name_is_defined_in_two_modules() -> None:
    # Two classes of one name (the record's Breakdown and the memory module's, once) are two declarations of one
    # thing, or two things a reader takes for one.
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 50
    assert class_homes(paths) == {}


def test_the_class_name_check_finds_a_name_defined_twice(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class Run:\n    pass\n")
    (tmp_path / "b.py").write_text("def f():\n    class Run:\n        pass\n")
    (tmp_path / "c.py").write_text("class Other:\n    pass\n")
    found = class_homes([tmp_path / n for n in ("a.py", "b.py", "c.py")])
    assert list(found) == ["Run"] and len(found["Run"]) == 2
