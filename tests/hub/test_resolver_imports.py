"""The resolver's modules import one another one way: no cycle, not even inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import cmh.hub.resolver

PACKAGE = Path(cmh.hub.resolver.__file__).parent


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports anywhere (top level or inside a function)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(a.name for a in node.names)
    return found - {"__init__"}


def test_no_import_cycle_between_resolver_modules() -> None:
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert "_session" in graph["_patch"] and "_window" in graph["_session"]  # the graph was read

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(m for m in graph if m in reach(m))
    assert cycles == []
