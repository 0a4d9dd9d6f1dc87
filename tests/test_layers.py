"""The house's layering, read from the imports of worker/: the tree follows the call, each folder using
only the folders below it, and the leaves nothing but leaves."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "worker"
# Top to bottom. A module of a layer may import its own layer's and any lower layer's, never a higher one's.
LAYERS: list[frozenset[str]] = [
    frozenset({"__init__", "__main__", "app", "cli", "dev"}),  # entry points
    frozenset({"gateway"}),
    frozenset({"client"}),
    frozenset({"queue"}),
    frozenset({"call"}),
    frozenset({"http"}),
    frozenset({"definitions"}),
]
# Skips that the layering alone would allow: the gateway reaches the fleet through the client, the client
# never needs the worker's queue, and the transport knows nothing of tool definitions.
FORBIDDEN = {("gateway", "call"), ("client", "queue"), ("client", "call"), ("http", "definitions")}


def room(module: str) -> str:
    """The top-level folder or module of `worker.<room>...`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(name: str) -> int:
    """Its layer's index; every module that is no folder and no entry point is a leaf (the lowest)."""
    return next((i for i, rooms in enumerate(LAYERS) if name in rooms), len(LAYERS))


def imports() -> Iterator[tuple[str, str, str]]:
    """(file, importing room, imported room) for every import of worker's own modules, lazy ones too."""
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        source = room(".".join(relative.parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "worker":
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("worker."):
                targets = [room(node.module)]
            elif isinstance(node, ast.Import):
                targets = [room(a.name) for a in node.names if a.name.startswith("worker.")]
            else:
                continue
            for target in targets:
                if target != source:
                    yield str(relative), source, target


def test_the_import_reader_sees_the_known_arrows() -> None:
    """The reader finds arrows that are known to exist (so an empty result cannot pass the checks below)."""
    arrows = {(source, target) for _, source, target in imports()}
    assert {("queue", "call"), ("call", "http"), ("gateway", "client"), ("call", "errors")} <= arrows


@pytest.mark.parametrize(("source", "target", "allowed"), [("call", "queue", False), ("queue", "call", True)])
def test_the_rule_itself(source: str, target: str, allowed: bool) -> None:
    """An arrow up the tree is refused, one down it allowed."""
    assert (layer(source) <= layer(target)) is allowed


def test_no_arrow_points_up_the_tree() -> None:
    """No module imports from a layer above its own (a leaf imports only leaves)."""
    upward = [(f, s, t) for f, s, t in imports() if layer(s) > layer(t)]
    assert upward == []


def test_no_arrow_skips_the_seams() -> None:
    """The gateway does not reach into call/, the client not into queue/ or call/, http/ not into
    definitions/."""
    skips = [(f, s, t) for f, s, t in imports() if (s, t) in FORBIDDEN]
    assert skips == []
