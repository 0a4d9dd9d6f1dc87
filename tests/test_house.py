"""The sizes of the house's rooms (STYLE.md): no class over 250 lines and no function over 80 in worker/,
measured from the source with ast (a definition's lines from its `def` or `class` line to its last)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMITS = {"class": 250, "function": 80}


def definitions(tree: ast.AST, path: str, outer: str = "") -> Iterator[tuple[str, str, int]]:
    """(kind, path:qualified name, lines) of every class and function in a tree, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            name = f"{outer}{node.name}"
            yield kind, f"{path}:{name}", (node.end_lineno or node.lineno) - node.lineno + 1
            yield from definitions(node, path, f"{name}.")
        else:
            yield from definitions(node, path, outer)


@cache
def sizes() -> list[tuple[str, str, int]]:
    found = []
    for file in sorted(ROOT.joinpath("worker").rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        found += definitions(ast.parse(file.read_text(encoding="utf-8")), path)
    return found


def over_limits() -> set[str]:
    return {name for kind, name, lines in sizes() if lines > LIMITS[kind]}


def test_no_class_or_function_is_over_its_limit() -> None:
    """Every class is at most 250 lines and every function at most 80 (the longest of each are printed)."""
    for kind in LIMITS:
        longest = sorted((lines, name) for k, name, lines in sizes() if k == kind)[-3:]
        print(f"longest, {kind}: " + ", ".join(f"{name} ({lines})" for lines, name in reversed(longest)))
    assert sorted(over_limits()) == []
