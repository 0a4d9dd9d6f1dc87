"""The native format (docs/guides/definitions.md): `upstreams:`, `tools:` and `openapi:` in YAML or JSON."""

from __future__ import annotations

import re
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import Field, ValidationError

from worker.constants import TENANT_PATTERN
from worker.definitions.jolt import jolt_transform
from worker.definitions.model import (
    JSON,
    METHODS,
    PAGINATION_STYLES,
    TOOL_NAME_PATTERN,
    Body,
    Pagination,
    RateLimit,
    RequestTemplate,
    Source,
    Tenant,
    Tool,
    ToolSet,
    Transform,
)
from worker.definitions.readers.document import Document, StrictModel
from worker.definitions.readers.openapi import read_entries
from worker.definitions.readers.upstreams import (
    ApprovalSetting,
    CacheModel,
    RateLimitModel,
    UpstreamModel,
    build_approval,
    build_cache,
    build_upstream,
)
from worker.definitions.templates import Template, TemplateSyntaxError
from worker.definitions.transforms import TransformError, jmespath_transform

Scalar = str | int | float | bool


class TransformModel(StrictModel):
    jmespath: str | None = None
    jolt: Any = None


class RequestModel(StrictModel):
    method: str = "GET"
    path: str = ""
    query: dict[str, Scalar] = {}
    headers: dict[str, Scalar] = {}
    body: Any = None
    content_type: str = "application/json"


class ResponseModel(StrictModel):
    transform: TransformModel | None = None
    max_output_chars: int | None = Field(None, ge=1)


class PaginationModel(StrictModel):
    style: Literal["link", "cursor", "offset"]
    next: str | None = None
    param: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    limit_param: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    limit: int | None = Field(None, ge=1)
    items: str = "@"
    max_pages: int = Field(5, ge=1, le=100)


class ToolModel(StrictModel):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    upstream: str
    description: str = ""
    tags: list[str] = []
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}
    request: RequestModel = RequestModel()
    response: ResponseModel = ResponseModel()
    approval: ApprovalSetting | None = None
    output_schema: dict[str, Any] | None = None
    pagination: PaginationModel | None = None
    cache: CacheModel | None = None
    # MCP tasks (model.TASK_MODES); absent: model.DEFAULT_TASK_MODE.
    task: Literal["forbidden", "optional", "required"] | None = None


class TenantModel(StrictModel):
    weight: int = Field(1, ge=1, le=1000)
    max_in_flight: int | None = Field(None, ge=1)
    max_queued: int | None = Field(None, ge=1)
    rate_limit: RateLimitModel | None = None


class NativeReader:
    name = "native"

    def accepts(self, doc: Document) -> bool:
        data = doc.data
        return isinstance(data, dict) and bool(data) and set(data) <= {"upstreams", "tools", "openapi", "tenants"}

    def read(self, doc: Document) -> ToolSet:
        out = ToolSet()
        for name, raw in (doc.data.get("upstreams") or {}).items():
            self._read_upstream(doc, str(name), raw, out)
        for index, raw in enumerate(doc.data.get("tools") or []):
            self._read_tool(doc, index, raw, out)
        for name, raw in (doc.data.get("tenants") or {}).items():
            self._read_tenant(doc, str(name), raw, out)
        if doc.data.get("openapi"):
            out.merge(read_entries(doc, set(doc.data.get("upstreams") or {})))
        return out

    def _read_upstream(self, doc: Document, name: str, raw: Any, out: ToolSet) -> None:
        try:
            model = UpstreamModel.model_validate(raw)
            out.upstreams[name] = build_upstream(name, model, doc.source("upstreams", name))
        except ValidationError as exc:
            out.problems.extend(doc.validation_problems(exc, "upstreams", name))
        except (TemplateSyntaxError, ValueError) as exc:
            out.problems.append(doc.problem(str(exc), "upstreams", name))

    def _read_tenant(self, doc: Document, name: str, raw: Any, out: ToolSet) -> None:
        if not re.fullmatch(TENANT_PATTERN, name):
            out.problems.append(doc.problem(f"tenant name {name!r} must match {TENANT_PATTERN}", "tenants", name))
            return
        try:
            model = TenantModel.model_validate(raw or {})
        except ValidationError as exc:
            out.problems.extend(doc.validation_problems(exc, "tenants", name))
            return
        rate = model.rate_limit
        out.tenants[name] = Tenant(
            name,
            model.weight,
            model.max_in_flight,
            model.max_queued,
            RateLimit(rate.per_second, rate.burst) if rate else None,
            doc.source("tenants", name),
        )

    def _read_tool(self, doc: Document, index: int, raw: Any, out: ToolSet) -> None:
        loc = ("tools", index)
        try:
            model = ToolModel.model_validate(raw)
        except ValidationError as exc:
            out.problems.extend(doc.validation_problems(exc, *loc))
            if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                out.unusable[raw["name"]] = "its definition is invalid"
            return
        try:
            tool = build_tool(model, doc.source(*loc))
        except (TemplateSyntaxError, TransformError, ValueError) as exc:
            out.problems.append(doc.problem(f"tool {model.name!r}: {exc}", *loc))
            out.unusable[model.name] = str(exc)
            return
        if tool.name in out.tools:
            out.problems.append(doc.problem(f"duplicate tool name {tool.name!r}", *loc))
            return
        out.tools[tool.name] = tool


def build_tool(model: ToolModel, source: Source) -> Tool:
    request = model.request
    method = request.method.upper()
    if method not in METHODS:
        raise ValueError(f"bad method {request.method!r} (one of {', '.join(sorted(METHODS))})")
    pagination = build_pagination(model.pagination)
    return Tool(
        name=model.name,
        upstream=model.upstream,
        description=model.description,
        tags=tuple(model.tags),
        schema=with_continuation(model.input_schema, pagination),
        output=checked_output_schema(model.output_schema),
        pagination=pagination,
        cache=build_cache(model.cache),
        request=RequestTemplate(
            method=method,
            path=Template.parse(request.path),
            query={k: Template.parse(str(v)) for k, v in request.query.items()},
            headers={k: Template.parse(str(v)) for k, v in request.headers.items()},
            body=parse_body(request.body),
            content_type=request.content_type,
        ),
        transform=build_transform(model.response.transform),
        max_output_chars=model.response.max_output_chars,
        source=source,
        approval=build_approval(model.approval),
        task=model.task,
    )


def parse_body(value: Any) -> Body:
    if value is None:
        return Body()
    if isinstance(value, str):
        return Body("text", Template.parse(value))
    return Body("structured", _parse_tree(value))


def _parse_tree(node: Any) -> Any:
    if isinstance(node, str):
        return Template.parse(node)
    if isinstance(node, dict):
        return {str(k): _parse_tree(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_parse_tree(v) for v in node]
    return node


def build_transform(model: TransformModel | None) -> Transform | None:
    if model is None:
        return None
    if model.jmespath is not None and model.jolt is not None:
        raise TransformError("a transform is either jmespath or jolt, not both")
    if model.jmespath is not None:
        return jmespath_transform(model.jmespath)
    if model.jolt is not None:
        return jolt_transform(model.jolt)
    return None


def build_pagination(model: PaginationModel | None) -> Pagination | None:
    """A `pagination:` block with what its style needs (JMESPath expressions compiled to check them)."""
    if model is None:
        return None
    assert model.style in PAGINATION_STYLES
    if model.style == "cursor" and (model.next is None or model.param is None):
        raise ValueError("pagination style cursor needs `next` (JMESPath) and `param`")
    if model.style == "offset" and (model.param is None or model.limit is None):
        raise ValueError("pagination style offset needs `param` and `limit`")
    for expression in (model.items, model.next):
        if expression is not None:
            jmespath_transform(expression)  # raises TransformError on a bad expression
    return Pagination(
        style=model.style,
        items=model.items,
        max_pages=model.max_pages,
        next=model.next,
        param=model.param or "cursor",
        limit_param=model.limit_param,
        limit=model.limit,
    )


_CONTINUATION_HELP = {
    "link": "To continue a listing: the `next_cursor` of the previous result (the next page's URL).",
    "cursor": "To continue a listing: the `next_cursor` of the previous result.",
    "offset": "To continue a listing: the `next_cursor` of the previous result (the offset to start at).",
}


def with_continuation(schema: dict[str, JSON], pagination: Pagination | None) -> dict[str, JSON]:
    """The input schema, naming the argument a model passes back to continue a paginated listing."""
    if pagination is None:
        return schema
    properties = dict(schema.get("properties") or {})
    described = dict(properties.get(pagination.param) or {})
    described.setdefault("type", "integer" if pagination.style == "offset" else "string")
    described.setdefault("description", _CONTINUATION_HELP[pagination.style])
    properties[pagination.param] = described
    return {**schema, "properties": properties}


def checked_output_schema(schema: dict[str, JSON] | None) -> dict[str, JSON] | None:
    """An `output_schema:`, if it is a JSON Schema (draft 2020-12)."""
    if schema is not None:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise ValueError(f"output_schema is not a valid JSON Schema: {exc.message}") from None
    return schema
