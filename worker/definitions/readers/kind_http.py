"""`kind: http` tool objects (docs/guides/definitions.md): one object, or a list of them, in a
JSON or YAML file.

Each tool is one URL: it gets an upstream of its own (`http:<name>`) whose base URL is `config.url`, so the
tool's path is empty and no argument is templated. The arguments go to the query string for GET, HEAD,
DELETE and OPTIONS and into a JSON body for POST, PUT and PATCH (the native "unreferenced arguments" rule).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from worker import constants
from worker.definitions.model import METHODS, TOOL_NAME_PATTERN, RequestTemplate, Source, Tool, ToolSet, Upstream
from worker.definitions.readers.document import Document, StrictModel
from worker.definitions.templates import Template, TemplateSyntaxError

UPSTREAM_PREFIX = "http:"


class ConfigModel(StrictModel):
    url: str
    method: str = "POST"
    timeout_seconds: float = Field(constants.DEFAULT_UPSTREAM_TIMEOUT_S, gt=0)
    headers: dict[str, str] = {}


class HttpToolModel(StrictModel):
    kind: Literal["http"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    tags: list[str] = []
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}
    config: ConfigModel
    max_tool_output_chars: int = Field(constants.DEFAULT_MAX_OUTPUT_CHARS, ge=1)


class KindHttpReader:
    name = "kind: http"

    def accepts(self, doc: Document) -> bool:
        """An object with a `kind` string, or a list of objects where one has one (not a toolbox upstream)."""
        data = doc.data
        if isinstance(data, dict):
            return isinstance(data.get("kind"), str)
        return (
            isinstance(data, list)
            and bool(data)
            and all(isinstance(item, dict) for item in data)
            and any(isinstance(item.get("kind"), str) for item in data)
        )

    def read(self, doc: Document) -> ToolSet:
        out = ToolSet()
        if isinstance(doc.data, dict):
            self._read_tool(doc, (), doc.data, out)
        else:
            for index, raw in enumerate(doc.data):
                self._read_tool(doc, (index,), raw, out)
        return out

    def _read_tool(self, doc: Document, loc: tuple[object, ...], raw: Any, out: ToolSet) -> None:
        try:
            model = HttpToolModel.model_validate(raw)
        except ValidationError as exc:
            out.problems.extend(doc.validation_problems(exc, *loc))
            return
        if model.name in out.tools:
            out.problems.append(doc.problem(f"duplicate tool name {model.name!r}", *loc))
            return
        try:
            upstream = build_upstream(model, doc.source(*loc, "config"))
            tool = build_tool(model, upstream.name, doc.source(*loc))
        except (TemplateSyntaxError, ValueError) as exc:
            out.problems.append(doc.problem(f"tool {model.name!r}: {exc}", *loc, "config"))
            out.unusable[model.name] = str(exc)
            return
        out.upstreams[upstream.name] = upstream
        out.tools[tool.name] = tool


def build_upstream(model: HttpToolModel, source: Source) -> Upstream:
    config = model.config
    base_url = _env_only(config.url, "config.url")
    return Upstream(
        name=UPSTREAM_PREFIX + model.name,
        base_url=base_url,
        timeout_s=config.timeout_seconds,
        headers={name: _env_only(value, f"config.headers.{name}") for name, value in config.headers.items()},
        max_output_chars=model.max_tool_output_chars,
        source=source,
    )


def build_tool(model: HttpToolModel, upstream: str, source: Source) -> Tool:
    method = model.config.method.upper()
    if method not in METHODS:
        raise ValueError(f"bad method {model.config.method!r} (one of {', '.join(sorted(METHODS))})")
    return Tool(
        name=model.name,
        upstream=upstream,
        description=model.description,
        tags=tuple(model.tags),
        schema=model.input_schema,
        request=RequestTemplate(method=method, send_unreferenced=True),
        source=source,
    )


def _env_only(text: str, where: str) -> Template:
    """A template that may read the worker's environment but not the arguments (they are sent as data)."""
    template = Template.parse(text)
    if template.arg_names:
        raise ValueError(f"{where} may use ${{env:...}} but not arguments: {text!r}")
    return template
