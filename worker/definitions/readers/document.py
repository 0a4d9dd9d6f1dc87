"""What every reader works on: a parsed definitions file that knows the line of each node."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from worker.definitions.model import Problem, Source, ToolSet

# libyaml is several times faster on large specs; the pure Python loader where PyYAML was built without it.
_Loader: type[yaml.CSafeLoader | yaml.SafeLoader] = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader

Loc = tuple[str, ...]


class StrictModel(BaseModel):
    """A section of a definitions file: unknown keys are problems (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class Document:
    """A parsed definitions file; line numbers are computed only when a problem needs one."""

    file: str
    text: str
    data: Any
    environ: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def _lines(self) -> dict[Loc, int]:
        return _line_map(self.text)

    def source(self, *loc: object) -> Source:
        """The source of the nearest enclosing node of `loc` (a path of keys and indexes)."""
        path = tuple(str(part) for part in loc)
        while path and path not in self._lines:
            path = path[:-1]
        return Source(self.file, self._lines.get(path))

    def problem(self, message: str, *loc: object) -> Problem:
        return Problem(self.source(*loc), message)

    def validation_problems(self, error: ValidationError, *prefix: object) -> list[Problem]:
        """One problem per pydantic error, each at the line of the offending node."""
        problems = []
        for item in error.errors():
            where = ".".join(str(p) for p in item["loc"])
            message = f"{where}: {item['msg']}" if where else item["msg"]
            problems.append(self.problem(message, *prefix, *item["loc"]))
        return problems


class Reader(Protocol):
    name: str

    def accepts(self, doc: Document) -> bool: ...

    def read(self, doc: Document) -> ToolSet: ...


def parse_file(path: Path, environ: Mapping[str, str]) -> Document:
    """Parse a YAML or JSON file; a syntax error raises `DefinitionSyntaxError` with its line."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_Loader)
    except json.JSONDecodeError as exc:
        raise DefinitionSyntaxError(Problem(Source(str(path), exc.lineno), exc.msg)) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        message = str(getattr(exc, "problem", None) or exc)
        raise DefinitionSyntaxError(Problem(Source(str(path), line), message)) from exc
    return Document(str(path), text, data, environ)


class DefinitionSyntaxError(ValueError):
    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _line_map(text: str) -> dict[Loc, int]:
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        return {}
    lines: dict[Loc, int] = {}
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())] if root is not None else []
    while stack:
        node, path = stack.pop()
        lines.setdefault(path, node.start_mark.line + 1)  # a key's own line wins over its value's
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = (*path, str(key.value))
                lines[child] = key.start_mark.line + 1
                stack.append((value, child))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((value, (*path, str(i))) for i, value in enumerate(node.value))
    return lines
