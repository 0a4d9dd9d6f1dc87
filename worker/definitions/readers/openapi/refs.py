"""`$ref` resolution: a spec's references followed within it and into files beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

from worker.definitions.readers.document import DefinitionSyntaxError, parse_file

MAX_REF_DEPTH = 8  # refs nested inside one another in one schema


class RefError(LookupError):
    """A `$ref` cannot be followed."""


class Node(NamedTuple):  # a tuple: made by the thousand on large specs, and cheaper than a frozen dataclass
    """A node of a spec and the file that holds it (a `$ref` is relative to that file)."""

    value: Any
    file: Path


class Resolver:
    """Follows `$ref`s within the spec and into files beside it, parsing each file once."""

    def __init__(self, root: Path, data: Any) -> None:
        self.root = root
        self._documents: dict[Path, Any] = {root: data}
        # (file, $ref) -> (absolute key, target): shared parameters and schemas are followed many times
        self._targets: dict[tuple[Path, str], tuple[str, Node]] = {}

    def deref(self, node: Node) -> Node:
        """The node itself, or what its chain of `$ref`s points at."""
        seen: set[str] = set()
        while is_ref(node.value):
            key = self.key(node)
            if key in seen:
                raise RefError(f"$ref cycle at {key}")
            seen.add(key)
            node = self.target(node)
        return node

    def key(self, node: Node) -> str:
        """An absolute name for the target of a `$ref` node (file and JSON pointer)."""
        return self._follow(node)[0]

    def target(self, node: Node) -> Node:
        return self._follow(node)[1]

    def _follow(self, node: Node) -> tuple[str, Node]:
        ref: str = node.value["$ref"]
        cached = self._targets.get((node.file, ref))
        if cached is None:
            location, _, pointer = ref.partition("#")
            if "://" in location:
                raise RefError(f"remote $ref {ref!r} is not fetched")
            file = (node.file.parent / unquote(location)).resolve() if location else node.file
            pointer = unquote(pointer)
            target = Node(_follow_pointer(self._document(file), pointer, ref), file)
            cached = self._targets[(node.file, ref)] = (f"{file}#{pointer}", target)
        return cached

    def _document(self, file: Path) -> Any:
        if file not in self._documents:
            try:
                self._documents[file] = parse_file(file, {}).data
            except (DefinitionSyntaxError, OSError) as exc:
                raise RefError(f"cannot read {file}: {exc}") from exc
        return self._documents[file]


def is_ref(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("$ref"), str)


def _follow_pointer(document: Any, pointer: str, ref: str) -> Any:
    node = document
    for token in pointer.split("/")[1:] if pointer else []:
        node = _child(node, token.replace("~1", "/").replace("~0", "~"))
        if node is _MISSING:
            raise RefError(f"$ref {ref!r} points at nothing")
    return node


_MISSING = object()


def _child(node: Any, token: str) -> Any:
    if isinstance(node, dict):
        if token in node:
            return node[token]
        # YAML reads unquoted keys such as response codes as integers
        return node.get(int(token), _MISSING) if token.isdigit() else _MISSING
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    return _MISSING
