"""The file store: read every definitions file below a folder and check the tools against each other.

(The store that workers share through Redis is `redis_store.py`.)"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from worker.definitions.model import Problem, Source, Tool, ToolSet
from worker.definitions.readers import DefinitionSyntaxError, parse_file, read_document
from worker.definitions.templates import Env, File

SUFFIXES = frozenset({".yaml", ".yml", ".json"})


def definition_files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()))
        else:
            files.append(path)
    return files


def load(paths: Iterable[Path], environ: Mapping[str, str] | None = None) -> ToolSet:
    """Read and check every definitions file; problems are collected, never raised."""
    environ = os.environ if environ is None else environ
    toolset = ToolSet()
    for file in definition_files(paths):
        try:
            doc = parse_file(file, environ)
        except DefinitionSyntaxError as exc:
            toolset.problems.append(exc.problem)
            continue
        except OSError as exc:
            toolset.problems.append(Problem(Source(str(file)), f"cannot read: {exc.strerror}"))
            continue
        toolset.merge(read_document(doc))
    check(toolset)
    return toolset


def check(toolset: ToolSet) -> None:
    """Move every tool that cannot be used into `unusable`, with a problem that says why."""
    for tool in list(toolset.tools.values()):
        reasons = tool_problems(tool, toolset)
        if reasons:
            del toolset.tools[tool.name]
            toolset.unusable[tool.name] = "; ".join(reasons)
            toolset.problems.extend(Problem(tool.source, f"tool {tool.name!r}: {r}") for r in reasons)


def tool_problems(tool: Tool, toolset: ToolSet) -> list[str]:
    problems = []
    if tool.upstream not in toolset.upstreams:
        problems.append(f"unknown upstream {tool.upstream!r}")
    if tool.schema_is_lazy:  # built on first use from a spec that generated consistent templates
        return problems
    schema = tool.input_schema
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [*problems, f"invalid input_schema: {exc.message}"]
    if schema.get("type", "object") != "object":
        problems.append("input_schema must be an object schema")
    declared = set(schema.get("properties", {}))
    for template in tool.request.templates:
        for name in template.arg_names:
            if name not in declared:
                problems.append(
                    f"template {template.source!r} names argument {name!r}, which input_schema does not declare"
                )
    return problems


def unset_settings(toolset: ToolSet, environ: Mapping[str, str]) -> list[str]:
    """What an upstream's templates need that this environment lacks: `${env:NAME}`s without a value or a
    default, `${file:...}`s that could not be read. A worker without them answers the upstream's calls 78."""
    found: dict[str, None] = {}
    for upstream in toolset.upstreams.values():
        templates = [upstream.base_url, *upstream.headers.values(), *(upstream.auth.templates if upstream.auth else [])]
        for part in (part for template in templates for part in template.parts):
            if isinstance(part, File) and part.content is None:
                found[f"{upstream.name}: the secret file {part.name} cannot be read"] = None
            elif (
                isinstance(part, Env)
                and not isinstance(part, File)
                and not environ.get(part.name)
                and part.default is None
            ):
                found[f"{upstream.name}: ${{env:{part.name}}} is unset"] = None
    return list(found)
