"""No class in supervisor/ over 350 lines (issue 23's bar): a class that grows past it does
several jobs and is split by job and composed, as the pair engine was (sync/_pair.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import supervisor

LIMIT = 350


def test_no_class_in_supervisor_is_over_the_limit():
    root = Path(supervisor.__file__).parent
    sizes = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes[f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) > 20, "no classes found: the walk looks in the wrong place"
    assert {k: n for k, n in sizes.items() if n > LIMIT} == {}
