"""Definitions stores: read every file below a folder and check the tools against each other."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import redis
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from worker.constants import (
    DEFINITIONS_BUNDLE_PREFIX,
    DEFINITIONS_CURRENT_KEY,
    DEFINITIONS_VERSION_KEY,
    ROUTES_KEY,
)
from worker.definitions.model import Problem, Source, Tool, ToolSet
from worker.definitions.readers import DefinitionSyntaxError, parse_file, read_document

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


# --- the shared store: definitions published to Redis, so every worker and client sees one catalog ---


def routes(toolset: ToolSet) -> dict[str, str]:
    """Tool -> queue for the tools whose upstream has a queue of its own."""
    return {
        name: upstream.queue
        for name, tool in toolset.tools.items()
        if (upstream := toolset.upstreams.get(tool.upstream)) is not None and upstream.queue
    }


def write_routes(client: redis.Redis, toolset: ToolSet) -> None:
    """Make this toolset's routes the ones clients use (replacing the previous map at once)."""
    table = routes(toolset)
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(ROUTES_KEY)
        if table:
            pipe.hset(ROUTES_KEY, mapping=cast(Any, table))  # redis-py types reject dict[str, str]
        pipe.execute()


def bundle(paths: list[Path]) -> dict[str, str]:
    """The definitions files below `paths`, relative path -> text (a root index prefixes several roots)."""
    files: dict[str, str] = {}
    for index, root in enumerate(paths):
        prefix = f"{index}/" if len(paths) > 1 else ""
        base = root if root.is_dir() else root.parent
        candidates = definition_files([root])
        for file in candidates:
            files[prefix + file.relative_to(base).as_posix()] = file.read_text(encoding="utf-8")
    return files


def publish(client: redis.Redis, paths: list[Path], environ: Mapping[str, str] | None = None) -> tuple[int, ToolSet]:
    """Check the definitions, then make them the current version; a set with problems changes nothing.

    The files are read once: what is checked is the bundle the workers will load, so a file edited
    meanwhile cannot slip in unchecked. Problems name the files as they are on disk."""
    files = bundle(paths)
    with tempfile.TemporaryDirectory(prefix="toolworker-definitions-") as tmp:
        toolset = load([materialize(files, Path(tmp))], environ)
        toolset.problems = [_on_disk(problem, Path(tmp), paths) for problem in toolset.problems]
    if toolset.problems:
        return 0, toolset
    version = int(client.incr(DEFINITIONS_VERSION_KEY))
    payload = json.dumps({"version": version, "files": files, "publishedAt": time.time()})
    with client.pipeline(transaction=True) as pipe:
        pipe.set(DEFINITIONS_BUNDLE_PREFIX + str(version), payload)
        pipe.set(DEFINITIONS_CURRENT_KEY, version)
        pipe.execute()
    write_routes(client, toolset)
    return version, toolset


def _on_disk(problem: Problem, bundle_dir: Path, paths: list[Path]) -> Problem:
    """A problem found in a materialized bundle, pointing at the file it came from (see `bundle`)."""
    try:
        parts = Path(problem.source.file).relative_to(bundle_dir).parts
    except ValueError:
        return problem
    root = paths[int(parts[0])] if len(paths) > 1 else paths[0]
    base = root if root.is_dir() else root.parent
    relative = parts[1:] if len(paths) > 1 else parts
    return replace(problem, source=replace(problem.source, file=str(base.joinpath(*relative))))


def materialize(files: Mapping[str, str], directory: Path) -> Path:
    """Write a bundle's files below `directory` (relative references between them keep working)."""
    for relative, text in files.items():
        target = (directory / relative).resolve()
        if directory.resolve() not in target.parents:  # a bundle names files below its root only
            raise ValueError(f"bundle path escapes its folder: {relative!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return directory


def load_bundle(payload: bytes | str, environ: Mapping[str, str] | None = None) -> tuple[int, ToolSet]:
    """The version and toolset of a published bundle."""
    data = json.loads(payload)
    with tempfile.TemporaryDirectory(prefix="toolworker-definitions-") as tmp:
        return int(data["version"]), load([materialize(data["files"], Path(tmp))], environ)
