"""The native format (SPEC §2.1): `upstreams:` and `tools:` in YAML or JSON."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker import constants
from worker.definitions.jolt import jolt_transform
from worker.definitions.model import (
    METHODS,
    Body,
    CircuitPolicy,
    RateLimit,
    RequestTemplate,
    RetryPolicy,
    Source,
    Tool,
    ToolSet,
    Transform,
    Upstream,
)
from worker.definitions.readers import Document
from worker.definitions.templates import Template, TemplateSyntaxError
from worker.definitions.transforms import TransformError, jmespath_transform

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
Scalar = str | int | float | bool


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryModel(_Model):
    attempts: int = Field(1, ge=1, le=10)
    backoff_seconds: float = Field(0.2, ge=0)
    max_backoff_seconds: float = Field(10.0, ge=0)
    statuses: list[Annotated[int, Field(ge=100, le=599)]] = [502, 503, 504]
    unsafe_methods: bool = False


class CircuitModel(_Model):
    threshold: int = Field(5, ge=1)
    cooldown_seconds: float = Field(30.0, ge=0)


class RateLimitModel(_Model):
    per_second: float = Field(gt=0)
    burst: int = Field(1, ge=1)


class UpstreamModel(_Model):
    base_url: str
    timeout_seconds: float = Field(constants.DEFAULT_TIMEOUT_S, gt=0)
    connect_timeout_seconds: float = Field(constants.DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    headers: dict[str, str] = {}
    verify_tls: bool = True
    max_concurrency: int = Field(100, ge=1)
    retry: RetryModel = RetryModel()
    max_output_chars: int = Field(constants.DEFAULT_MAX_OUTPUT_CHARS, ge=1)
    max_response_bytes: int = Field(constants.DEFAULT_MAX_RESPONSE_BYTES, ge=1)
    queue: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    overridable_headers: list[str] = []
    allow_offsite_redirects: bool = False
    circuit: CircuitModel = CircuitModel()
    rate_limit: RateLimitModel | None = None


class TransformModel(_Model):
    jmespath: str | None = None
    jolt: Any = None


class RequestModel(_Model):
    method: str = "GET"
    path: str = ""
    query: dict[str, Scalar] = {}
    headers: dict[str, Scalar] = {}
    body: Any = None
    content_type: str = "application/json"


class ResponseModel(_Model):
    transform: TransformModel | None = None
    max_output_chars: int | None = Field(None, ge=1)


class ToolModel(_Model):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    upstream: str
    description: str = ""
    tags: list[str] = []
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}
    request: RequestModel = RequestModel()
    response: ResponseModel = ResponseModel()


class NativeReader:
    name = "native"

    def accepts(self, doc: Document) -> bool:
        data = doc.data
        return isinstance(data, dict) and bool(data) and set(data) <= {"upstreams", "tools", "openapi"}

    def read(self, doc: Document) -> ToolSet:
        out = ToolSet()
        for name, raw in (doc.data.get("upstreams") or {}).items():
            self._read_upstream(doc, str(name), raw, out)
        for index, raw in enumerate(doc.data.get("tools") or []):
            self._read_tool(doc, index, raw, out)
        if doc.data.get("openapi"):
            from worker.definitions.readers.openapi import (
                read_entries,  # here: the openapi reader builds on this module
            )

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


def build_upstream(name: str, model: UpstreamModel, source: Source) -> Upstream:
    base_url = Template.parse(model.base_url)
    if base_url.arg_names:
        raise ValueError(f"upstream {name!r}: base_url may use ${{env:...}} but not arguments")
    retry = model.retry
    return Upstream(
        name=name,
        base_url=base_url,
        timeout_s=model.timeout_seconds,
        connect_timeout_s=model.connect_timeout_seconds,
        headers={k: Template.parse(v) for k, v in model.headers.items()},
        verify_tls=model.verify_tls,
        max_concurrency=model.max_concurrency,
        retry=RetryPolicy(
            attempts=retry.attempts,
            backoff_s=retry.backoff_seconds,
            max_backoff_s=retry.max_backoff_seconds,
            statuses=frozenset(retry.statuses),
            unsafe_methods=retry.unsafe_methods,
        ),
        max_output_chars=model.max_output_chars,
        max_response_bytes=model.max_response_bytes,
        queue=model.queue,
        overridable_headers=frozenset(h.lower() for h in model.overridable_headers),
        allow_offsite_redirects=model.allow_offsite_redirects,
        circuit=CircuitPolicy(model.circuit.threshold, model.circuit.cooldown_seconds),
        rate_limit=RateLimit(model.rate_limit.per_second, model.rate_limit.burst) if model.rate_limit else None,
        source=source,
    )


def build_tool(model: ToolModel, source: Source) -> Tool:
    request = model.request
    method = request.method.upper()
    if method not in METHODS:
        raise ValueError(f"bad method {request.method!r} (one of {', '.join(sorted(METHODS))})")
    return Tool(
        name=model.name,
        upstream=model.upstream,
        description=model.description,
        tags=tuple(model.tags),
        schema=model.input_schema,
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
