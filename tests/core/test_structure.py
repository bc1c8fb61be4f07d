"""The shape issue 23 asked for, kept: no import circle in supervisor/ (type-only and lazy
imports included, a module importing its package's ``__init__`` too), config knows nothing of
sync, no module reaches into another package's private modules, and the conductor stays small."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "supervisor"
CONDUCTOR_MAX = 250
CLASS_MAX = 350


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        name = ".".join(f.relative_to(SRC.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of supervisor/ that ``name`` imports, anywhere in it."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    out = {m for m in out if m in known and m != name}
    for m in list(out):  # importing supervisor.sync._x runs supervisor/sync/__init__.py first
        package = m.rsplit(".", 1)[0]
        if package != "supervisor" and package in known and not name.startswith(package + "."):
            out.add(package)
    return out - {name}


@cache
def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_no_import_circle() -> None:
    graph = _graph()
    circles = []
    for start in graph:  # a path back to itself, by depth-first search
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(path + [start])
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not circles, circles[0]


def test_the_structure_check_sees_a_circle(tmp_path: Path) -> None:
    """The check above can fail: a package whose module imports what imports the package."""
    pkg = tmp_path / "supervisor"
    (pkg / "sync").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def f():\n    from supervisor.sync._x import y\n")
    (pkg / "sync" / "__init__.py").write_text("from supervisor.config import f\n")
    (pkg / "sync" / "_x.py").write_text("y = 1\n")
    known = {"supervisor": pkg / "__init__.py", "supervisor.config": pkg / "config.py",
             "supervisor.sync": pkg / "sync" / "__init__.py", "supervisor.sync._x": pkg / "sync" / "_x.py"}
    assert "supervisor.sync" in _imports("supervisor.config", known["supervisor.config"], known)
    assert "supervisor.config" in _imports("supervisor.sync", known["supervisor.sync"], known)


def test_config_imports_nothing_of_sync_nor_the_job() -> None:
    deps = _graph()["supervisor.config"]
    assert not {d for d in deps if d.startswith("supervisor.sync") or d == "supervisor.job"}, deps


def test_no_module_imports_another_packages_private_modules() -> None:
    bad = []
    for name, deps in _graph().items():
        for d in deps:
            package, _, leaf = d.rpartition(".")
            if leaf.startswith("_") and leaf != "__init__" and package != "supervisor" and not name.startswith(package):
                bad.append(f"{name} → {d}")
    assert not bad, bad


def test_the_conductor_is_small_and_no_class_is_huge() -> None:
    agent = (SRC / "conduct" / "agent.py").read_text().count("\n")
    assert agent <= CONDUCTOR_MAX, f"supervisor/conduct/agent.py has {agent} lines: move logic into parts"
    big = []
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > CLASS_MAX:
                    big.append(f"{f.relative_to(SRC.parent)}: {node.name} {lines} lines")
    assert not big, big


def test_the_tests_import_helpers_from_support_never_from_a_conftest_or_a_test_module() -> None:
    """conftest.py files hold pytest's fixtures and hooks; what tests share is a module of
    tests/support (or a package's own ``_name`` module). Issue 32, item 6."""
    tests = Path(__file__).resolve().parents[1]
    bad = []
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(tests.parent)
        package = ".".join(where.parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                modules = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                leaf = module.rpartition(".")[2]
                if leaf == "conftest" or (leaf.startswith("test_") and module.startswith("tests.")):
                    bad.append(f"{where}:{node.lineno} imports {module}")
                    break
    assert not bad, "import helpers from tests/support, not from a conftest.py or a test module:\n" + "\n".join(bad)
