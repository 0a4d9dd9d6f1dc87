"""SentinelAI's remote HTTP toolbox YAML (docs/guides/definitions.md), read as its
`HttpToolReaders` reads it.

The file maps an upstream name to `{url, tools}`; each tool is `{metadata, definition, transformer}` as in
`com.phonepe.sentinelai.toolbox.remotehttp` (HttpToolMetadata, HttpCallTemplate, ResponseTransformerConfig).
Keys and enum values are as strict as Jackson reads them. What SentinelAI does at call time decides the rest:
- every parameter is required and no other argument is accepted (`HttpToolBox` builds a strict schema);
- only what a template names is sent (`send_unreferenced` is off);
- a header listed with several templates is set to the last one (OkHttp's `Request.Builder.header` replaces);
- a body is sent for POST and PUT only, as JSON unless `contentType` says otherwise.
Templates become native ones: TEXT is literal; TEXT_SUBSTITUTOR keeps `${x}` (a `:-default` is dropped, as
the schema requires the argument anyway; `${env:NAME}` reads the worker's environment; `${urlEncode:x}` is
`${x}`); HANDLEBARS `{{x}}` and `{{{x}}}` become `${x}`, and blocks, partials and helpers are refused.
A `?query` written in the path becomes query entries. Where SentinelAI inserts values raw (or, for
Handlebars, HTML-escaped), they are encoded for where they land: a path segment, a query value, JSON text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import unquote_plus, urlsplit

from pydantic import Field, ValidationError

from worker.definitions.jolt import jolt_transform
from worker.definitions.model import TOOL_NAME_PATTERN, Body, RequestTemplate, Source, Tool, ToolSet, Upstream
from worker.definitions.readers.document import Document, StrictModel
from worker.definitions.templates import Arg, Env, File, Part, Template, TemplateSyntaxError, escape
from worker.definitions.transforms import TransformError

JSON = Any
BODY_METHODS = frozenset({"POST", "PUT"})
_INT_RANGES = {"BYTE": 8, "SHORT": 16, "INTEGER": 32, "LONG": 64}
_SCALAR_SCHEMAS: dict[str, dict[str, JSON]] = {
    "STRING": {"type": "string"},
    "BOOLEAN": {"type": "boolean"},
    "FLOAT": {"type": "number", "format": "float"},
    "DOUBLE": {"type": "number", "format": "double"},
    "CHARACTER": {"type": "string", "minLength": 1, "maxLength": 1},
    **{
        name: {"type": "integer", "minimum": -(2 ** (bits - 1)), "maximum": 2 ** (bits - 1) - 1}
        for name, bits in _INT_RANGES.items()
    },
}
ParameterType = Literal[
    "STRING", "BOOLEAN", "INTEGER", "LONG", "FLOAT", "DOUBLE", "BYTE", "SHORT", "CHARACTER",
    "STRING_ARRAY", "BOOLEAN_ARRAY", "INTEGER_ARRAY", "LONG_ARRAY", "FLOAT_ARRAY", "DOUBLE_ARRAY",
    "BYTE_ARRAY", "SHORT_ARRAY", "CHARACTER_ARRAY",
]  # fmt: skip


class TemplateModel(StrictModel):
    type: Literal["TEXT", "TEXT_SUBSTITUTOR", "HANDLEBARS"]
    content: str


class DefinitionModel(StrictModel):
    method: Literal["GET", "PUT", "POST", "HEAD", "DELETE"]
    path: TemplateModel
    headers: dict[str, list[TemplateModel]] | None = None
    body: TemplateModel | None = None
    content_type: str | None = Field(None, alias="contentType")


class ParameterModel(StrictModel):
    description: str
    type: ParameterType


class MetadataModel(StrictModel):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str
    parameters: dict[str, ParameterModel] | None = None


class TransformerModel(StrictModel):
    type: Literal["JOLT"]
    config: str


class ToolModel(StrictModel):
    metadata: MetadataModel
    definition: DefinitionModel
    transformer: TransformerModel | None = None


class UpstreamModel(StrictModel):
    url: str | None = None
    tools: list[Any]


class Located(ValueError):
    """A definition error found below the tool, with the path of keys to the node at fault."""

    def __init__(self, message: str, *loc: object) -> None:
        super().__init__(message)
        self.loc = loc


class ToolboxReader:
    name = "toolbox"

    def accepts(self, doc: Document) -> bool:
        data = doc.data
        if not isinstance(data, dict) or not data or not all(isinstance(v, dict) for v in data.values()):
            return False
        return any("tools" in value for value in data.values())

    def read(self, doc: Document) -> ToolSet:
        out = ToolSet()
        for name, raw in doc.data.items():
            self._read_upstream(doc, str(name), raw, out)
        return out

    def _read_upstream(self, doc: Document, name: str, raw: Any, out: ToolSet) -> None:
        try:
            model = UpstreamModel.model_validate(raw)
        except ValidationError as exc:
            out.problems.extend(doc.validation_problems(exc, name))
            return
        try:
            upstream = build_upstream(doc, name, model.url)
        except Located as exc:
            out.problems.append(doc.problem(str(exc), name, *exc.loc))
        else:
            if upstream is not None:
                out.upstreams[name] = upstream
        for index, tool in enumerate(model.tools):
            self._read_tool(doc, (name, "tools", index), tool, out)

    def _read_tool(self, doc: Document, loc: tuple[object, ...], raw: Any, out: ToolSet) -> None:
        try:
            model = ToolModel.model_validate(raw)
        except ValidationError as exc:
            out.problems.extend(doc.validation_problems(exc, *loc))
            return
        name = model.metadata.name
        try:
            tool = build_tool(str(loc[0]), model, doc.source(*loc))
        except Located as exc:
            out.problems.append(doc.problem(f"tool {name!r}: {exc}", *loc, *exc.loc))
            out.unusable[name] = str(exc)
            return
        if name in out.tools:
            out.problems.append(doc.problem(f"duplicate tool name {name!r}", *loc))
            return
        out.tools[name] = tool


def build_upstream(doc: Document, name: str, url: str | None) -> Upstream | None:
    """The upstream from its `url`, else from TOOLWORKER_UPSTREAM_<NAME>_URL; None leaves it to other files."""
    if url is not None:
        base_url = _checked_url(url, "url", "url")
        return Upstream(name=name, base_url=Template.literal(base_url), source=doc.source(name, "url"))
    variable = upstream_url_variable(name)
    value = doc.environ.get(variable)
    if value is None:
        return None
    return Upstream(name=name, base_url=Template.literal(_checked_url(value, variable)), source=doc.source(name))


def upstream_url_variable(name: str) -> str:
    return "TOOLWORKER_UPSTREAM_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper() + "_URL"


def _checked_url(url: str, where: str, *loc: object) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise Located(f"{where} must be an http(s) URL with a host, not {url!r}", *loc)
    return url


def build_tool(upstream: str, model: ToolModel, source: Source) -> Tool:
    return Tool(
        name=model.metadata.name,
        upstream=upstream,
        description=model.metadata.description,
        schema=input_schema(model.metadata.parameters or {}),
        request=build_request(model.definition),
        transform=_transform(model.transformer),
        source=source,
    )


def input_schema(parameters: Mapping[str, ParameterModel]) -> dict[str, JSON]:
    """The object schema SentinelAI gives the model: every parameter required, nothing else allowed."""
    properties = {name: {**parameter_schema(p.type), "description": p.description} for name, p in parameters.items()}
    schema: dict[str, JSON] = {"type": "object", "properties": properties, "additionalProperties": False}
    if parameters:
        schema["required"] = list(parameters)
    return schema


def parameter_schema(kind: str) -> dict[str, JSON]:
    if kind.endswith("_ARRAY"):
        return {"type": "array", "items": dict(_SCALAR_SCHEMAS[kind.removesuffix("_ARRAY")])}
    return dict(_SCALAR_SCHEMAS[kind])


def _transform(model: TransformerModel | None) -> Any:
    if model is None:
        return None
    try:
        return jolt_transform(model.config)
    except TransformError as exc:
        raise Located(str(exc), "transformer", "config") from exc


def build_request(definition: DefinitionModel) -> RequestTemplate:
    path, query = split_query(to_template(definition.path, "definition", "path"))
    body = definition.body if definition.method in BODY_METHODS else None  # OkHttp sends none for the others
    return RequestTemplate(
        method=definition.method,
        path=path,
        query=query,
        headers=_headers(definition.headers or {}),
        body=Body("text", to_template(body, "definition", "body")) if body is not None else Body(),
        content_type=definition.content_type or "application/json",
        send_unreferenced=False,
    )


def _headers(headers: Mapping[str, Sequence[TemplateModel]]) -> dict[str, Template]:
    """Each header with its last template: setting a header again replaces it."""
    return {
        name: to_template(templates[-1], "definition", "headers", name, len(templates) - 1)
        for name, templates in headers.items()
        if templates
    }


# ---------------------------------------------------------------------------------------------------------------
# Templates: each engine's syntax turned into native template text (`${x}`, with `$${` for a literal `${`).


def to_template(model: TemplateModel, *loc: object) -> Template:
    try:
        if model.type == "TEXT":
            return Template.literal(model.content)
        text = substitutor_text(model.content) if model.type == "TEXT_SUBSTITUTOR" else handlebars_text(model.content)
        return Template.parse(text)
    except (TemplateSyntaxError, ValueError) as exc:
        raise Located(f"{model.type} template {model.content!r}: {exc}", *loc) from exc


_SUBSTITUTION = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
# StringSubstitutor lookups whose meaning a native template has: encoding follows where a value lands.
_URL_ENCODE_LOOKUPS = ("urlEncode:", "urlEncoder:")


def substitutor_text(content: str) -> str:
    """Apache Commons Text `StringSubstitutor` syntax (`${x}`, `${x:-default}`, `$${` escape) as native text."""

    def placeholder(match: re.Match[str]) -> str:
        inner = match.group(1)
        return "$${" if inner is None else "${" + _variable(inner.strip()) + "}"

    return _SUBSTITUTION.sub(placeholder, content)


def _variable(inner: str) -> str:
    if inner.startswith("env:"):
        return inner
    for prefix in _URL_ENCODE_LOOKUPS:
        if inner.startswith(prefix):
            inner = inner.removeprefix(prefix)
    name = inner.partition(":-")[0]
    if ":" in name:
        raise ValueError(f"the lookup {name.partition(':')[0]!r} is not supported")
    return name


_MUSTACHE = re.compile(r"\\\{\{|\{\{\{(.*?)\}\}\}|\{\{(.*?)\}\}", re.DOTALL)
_HANDLEBARS_NAME = re.compile(r"^[^\s!\"#%&'()*+,./;<=>@\[\\\]^`{|}~]+$")


def handlebars_text(content: str) -> str:
    """Handlebars with simple variables only (`{{x}}`, `{{{x}}}`, comments) as native template text."""
    out: list[str] = []
    position = 0
    for match in _MUSTACHE.finditer(content):
        out.append(escape(content[position : match.start()]))
        out.append(_mustache(match))
        position = match.end()
    out.append(escape(content[position:]))
    return "".join(out)


def _mustache(match: re.Match[str]) -> str:
    if match.group(0) == "\\{{":
        return "{{"
    expression = (match.group(1) if match.group(1) is not None else match.group(2)).strip()
    if match.group(1) is None and expression.startswith("!"):
        return ""
    if expression == "this" or not _HANDLEBARS_NAME.match(expression):
        raise ValueError(
            f"{{{{{expression}}}}} is not supported: only simple variables like {{{{name}}}} are "
            "(no block helpers, partials, helpers with arguments or paths)"
        )
    return "${" + expression + "}"


# ---------------------------------------------------------------------------------------------------------------
# A query string written in the path: `/x?a=${a}&b=1` becomes path `/x` and query entries `a`, `b`.


def split_query(template: Template) -> tuple[Template, dict[str, Template]]:
    for index, part in enumerate(template.parts):
        if isinstance(part, str) and "?" in part:
            before, _, after = part.partition("?")
            query = _query_entries([after, *template.parts[index + 1 :]])
            if query is None:
                return template, {}
            return _join([*template.parts[:index], before]), query
    return template, {}


def _query_entries(parts: Sequence[Part]) -> dict[str, Template] | None:
    """The entries of a query made of `name=value` pairs; None when it is not that simple."""
    pairs: list[list[Part]] = [[]]
    for part in parts:
        if isinstance(part, str):
            first, *others = part.split("&")
            pairs[-1].append(first)
            pairs.extend([piece] for piece in others)
        else:
            pairs[-1].append(part)
    query: dict[str, Template] = {}
    for pair in (p for p in pairs if p not in ([], [""])):
        head = pair[0]
        if not isinstance(head, str) or "=" not in head:
            return None
        name, _, value = head.partition("=")
        name = unquote_plus(name)
        if not name or name in query:
            return None
        query[name] = _join([value, *pair[1:]], decode=True)
    return query


def _join(parts: Sequence[Part], decode: bool = False) -> Template:
    text = "".join(_native(part, decode) for part in parts)
    return Template.parse(text)


def _native(part: Part, decode: bool) -> str:
    if isinstance(part, Arg):
        return "${" + part.name + "}"
    if isinstance(part, File):
        return "${file:" + part.name + "}"
    if isinstance(part, Env):
        default = f":-{part.default}" if part.default is not None else ""
        return "${env:" + part.name + default + "}"
    return escape(unquote_plus(part) if decode else part)
