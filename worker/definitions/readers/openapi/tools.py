"""An operation as a tool: its request template, and its native `tools:` entry."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache, partial
from typing import Any

from worker.definitions.model import Body, RequestTemplate, Source, Tool
from worker.definitions.readers.openapi.operations import PATH_PARAM, Operation, Spec
from worker.definitions.templates import Template, escape


def request_fields(operation: Operation) -> dict[str, Any]:
    """The operation's `request:` mapping in the native format."""
    args = operation.arguments
    fields: dict[str, Any] = {"method": operation.method, "path": _path_template(operation)}
    query = {a.wire: f"${{{a.name}}}" for a in args if a.location == "query"}
    headers = {a.wire: f"${{{a.name}}}" for a in args if a.location == "header"}
    if query:
        fields["query"] = query
    if headers:
        fields["headers"] = headers
    whole = [a for a in args if a.location == "body"]
    body_fields = {a.wire: f"${{{a.name}}}" for a in args if a.location == "field"}
    if whole:
        fields["body"] = f"${{{whole[0].name}}}"
    elif body_fields:
        fields["body"] = body_fields
    fields["content_type"] = operation.content_type
    return fields


def _path_template(operation: Operation) -> str:
    by_wire = {a.wire: a.name for a in operation.arguments if a.location == "path"}
    parts = []
    for part in PATH_PARAM.split(operation.path):
        wire = part[1:-1] if part.startswith("{") and part.endswith("}") else None
        parts.append(f"${{{by_wire[wire]}}}" if wire in by_wire else escape(part))
    return "".join(parts)


def request_template(fields: Mapping[str, Any]) -> RequestTemplate:
    """The RequestTemplate the native reader builds from these fields (so imports round-trip)."""
    return RequestTemplate(
        method=fields["method"],
        path=_parse(fields["path"]),
        query={k: _parse(v) for k, v in fields.get("query", {}).items()},
        headers={k: _parse(v) for k, v in fields.get("headers", {}).items()},
        body=_body_template(fields.get("body")),
        content_type=fields["content_type"],
    )


# Templates are immutable, and a spec repeats the same `${name}` across operations: parse each once.
_parse = lru_cache(maxsize=16384)(Template.parse)


def _body_template(body: str | dict[str, str] | None) -> Body:
    """What `native.parse_body` makes of the two body shapes `request_fields` writes."""
    if isinstance(body, dict):
        return Body("structured", {key: _parse(value) for key, value in body.items()})
    return Body("text", _parse(body)) if body is not None else Body()


def build_tool(operation: Operation, upstream: str, spec: Spec) -> Tool:
    """A tool whose input schema is built on first use."""
    return Tool(
        name=operation.name,
        upstream=upstream,
        request=request_template(request_fields(operation)),
        description=operation.description,
        tags=operation.tags,
        source=Source(spec.doc.file),
        schema=partial(spec.input_schema, operation),
        output=None if operation.response is None else partial(spec.output_schema, operation),
    )


def tool_definition(operation: Operation, upstream: str, spec: Spec) -> dict[str, Any]:
    """The operation as a native `tools:` entry, with its full input schema."""
    definition: dict[str, Any] = {
        "name": operation.name,
        "upstream": upstream,
        "description": operation.description,
        "tags": list(operation.tags),
        "input_schema": spec.input_schema(operation),
        "request": request_fields(operation),
    }
    output = spec.output_schema(operation)
    if output is not None:
        definition["output_schema"] = output
    if not operation.tags:
        del definition["tags"]
    return definition
