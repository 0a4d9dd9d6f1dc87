"""`openapi:` entries of native files, read at load; and specs met in a definitions folder."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from worker.definitions.model import ToolSet
from worker.definitions.readers.document import Document
from worker.definitions.readers.openapi.operations import Operation, Spec, SpecError, is_spec
from worker.definitions.readers.openapi.tools import build_tool
from worker.definitions.readers.upstreams import UpstreamModel, build_upstream
from worker.definitions.templates import TemplateSyntaxError, escape


class EntryModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream: str
    spec: str
    base_url: str | None = None
    include_tags: list[str] = []
    exclude_tags: list[str] = []


def read_entries(doc: Document, defined_upstreams: Collection[str]) -> ToolSet:
    """The tools (and upstreams) of a native file's `openapi:` entries.

    An entry yields an upstream named `upstream` unless the same file's `upstreams:` defines it; its
    base URL is the entry's `base_url`, else the spec's first server.
    """
    out = ToolSet()
    entries = doc.data.get("openapi")
    if not isinstance(entries, list):
        out.problems.append(doc.problem("openapi: must be a list of {upstream, spec, ...} entries", "openapi"))
        return out
    for index, raw in enumerate(entries):
        _read_entry(doc, index, raw, defined_upstreams, out)
    return out


def _read_entry(doc: Document, index: int, raw: Any, defined: Collection[str], out: ToolSet) -> None:
    loc = ("openapi", index)
    try:
        entry = EntryModel.model_validate(raw)
    except ValidationError as exc:
        out.problems.extend(doc.validation_problems(exc, *loc))
        return
    try:
        spec = Spec.load(Path(doc.file).parent / entry.spec)
    except SpecError as exc:
        out.problems.append(exc.problem)
        return
    _entry_upstream(doc, loc, entry, spec, defined, out)
    operations, problems = spec.operations(entry.include_tags, entry.exclude_tags)
    out.problems.extend(problems)
    for operation in operations:
        _add_tool(doc, loc, operation, entry.upstream, spec, out)


def _entry_upstream(
    doc: Document, loc: tuple[str, int], entry: EntryModel, spec: Spec, defined: Collection[str], out: ToolSet
) -> None:
    name = entry.upstream
    if name in defined:
        if entry.base_url is not None:
            out.problems.append(doc.problem(f"base_url is not used: upstream {name!r} is defined in upstreams:", *loc))
        return
    text = entry.base_url or (escape(url) if (url := spec.server_url()) else None)
    if text is None:
        message = f"upstream {name!r}: the spec names no absolute server URL; set base_url (or define the upstream)"
        out.problems.append(doc.problem(message, *loc))
        return
    if name in out.upstreams:
        if out.upstreams[name].base_url.source != text:
            out.problems.append(doc.problem(f"upstream {name!r} has another base URL in an earlier entry", *loc))
        return
    try:
        out.upstreams[name] = build_upstream(name, UpstreamModel(base_url=text), doc.source(*loc))
    except (TemplateSyntaxError, ValueError) as exc:
        out.problems.append(doc.problem(str(exc), *loc))


def _add_tool(
    doc: Document, loc: tuple[str, int], operation: Operation, upstream: str, spec: Spec, out: ToolSet
) -> None:
    if operation.name in out.tools or operation.name in out.unusable:
        out.problems.append(
            doc.problem(f"duplicate tool name {operation.name!r} ({operation.method} {operation.path})", *loc)
        )
    elif operation.unusable:
        out.unusable[operation.name] = f"This tool cannot be used: {operation.unusable}."
    else:
        out.tools[operation.name] = build_tool(operation, upstream, spec)


# The top-level keys of a file that holds only parts of a spec (a spec split over files names them by `$ref`).
_FRAGMENT_KEYS = frozenset({"components", "definitions", "parameters", "responses", "securityDefinitions"})


class SpecFileReader:
    """An OpenAPI or Swagger document, or a part of one that a spec names by `$ref`, met in a definitions
    folder: `openapi:` entries read it, not the store."""

    name = "openapi"

    def accepts(self, doc: Document) -> bool:
        data = doc.data
        fragment = isinstance(data, dict) and bool(data) and set(data) <= _FRAGMENT_KEYS
        return is_spec(data) or fragment

    def read(self, doc: Document) -> ToolSet:
        return ToolSet()
