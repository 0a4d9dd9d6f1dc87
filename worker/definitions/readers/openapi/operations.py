"""The spec walker: a spec's operations, each with its arguments' names and places in the request
(the light index read at load); input schemas are built from it on first use."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import count
from pathlib import Path
from typing import Any, NamedTuple

from worker.definitions.model import Problem, Source
from worker.definitions.readers.document import DefinitionSyntaxError, Document, parse_file
from worker.definitions.readers.openapi.refs import MAX_REF_DEPTH, Node, RefError, Resolver
from worker.definitions.readers.openapi.schemas import JSONSchema, SchemaBuilder

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
# OpenAPI: header parameters with these names "SHALL be ignored" (other fields describe them).
_IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
_LOCATION_ORDER = {"path": 0, "query": 1, "header": 2}
PATH_PARAM = re.compile(r"(\{[^{}]*\})")
_UNSAFE_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_UNSAFE_ARG_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME_LIMIT = 64


class SpecError(ValueError):
    """A spec cannot be used at all (unreadable, not OpenAPI, no base URL)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class Argument(NamedTuple):
    """One argument of a tool: its name for the model, its name and place in the request."""

    name: str
    wire: str
    location: str  # path | query | header | field (one property of the body) | body (the whole body)
    required: bool
    schema: Node | None  # None: a plain string
    description: str = ""


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    method: str
    path: str
    description: str
    tags: tuple[str, ...]
    arguments: tuple[Argument, ...]
    content_type: str = JSON_TYPE
    unusable: str | None = None  # why the operation cannot be called
    response: Node | None = None  # the schema of its 2xx JSON response, if it has one


@dataclass(frozen=True, slots=True)
class _RawOperation:
    name: str
    method: str
    path: str
    item: Node
    operation: Node


class _ArgumentNames:
    """Hands out argument names that are safe for every consumer and unique within one tool."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def claim(self, wire: str, prefix: str) -> str:
        base = argument_name(wire)
        for candidate in (base, f"{prefix}_{base}"[:_NAME_LIMIT]):
            if candidate not in self.taken:
                self.taken.add(candidate)
                return candidate
        return self._numbered(base)

    def _numbered(self, base: str) -> str:
        for n in count(2):
            candidate = f"{base[: _NAME_LIMIT - len(str(n)) - 1]}_{n}"
            if candidate not in self.taken:
                self.taken.add(candidate)
                return candidate
        raise AssertionError("unreachable")


@lru_cache(maxsize=16384)
def argument_name(wire: str) -> str:
    """`filter[name]` -> `filter_name`: what OpenAI, Anthropic and MCP all accept as a property key."""
    return _UNSAFE_ARG_CHARS.sub("_", wire).strip("_")[:_NAME_LIMIT] or "arg"


def tool_name(operation_id: Any, method: str, path: str) -> str:
    """`operationId` made to follow the tool-name rule; `get_pets_petId` for `GET /pets/{petId}` without one."""
    if isinstance(operation_id, str) and operation_id.strip():
        name = _UNSAFE_TOOL_CHARS.sub("_", operation_id)
    else:
        name = re.sub(r"_+", "_", _UNSAFE_TOOL_CHARS.sub("_", f"{method.lower()}_{path}"))
    return name.strip("_")[:_NAME_LIMIT] or method.lower()


def _unique(name: str, used: set[str]) -> str:
    candidate = name
    for n in count(2):
        if candidate not in used:
            break
        candidate = f"{name[: _NAME_LIMIT - len(str(n)) - 1]}_{n}"
    used.add(candidate)
    return candidate


def describe(summary: Any, description: Any, method: str, path: str, deprecated: bool) -> str:
    """Summary first (it is what light listings show), then the description."""
    parts = [str(p).strip() for p in (summary, description) if isinstance(p, str) and p.strip()]
    if len(parts) == 2 and parts[1].startswith(parts[0]):
        parts = parts[1:]
    text = "\n\n".join(parts) or f"{method} {path}"
    return f"{text}\n\nDeprecated." if deprecated else text


@dataclass
class Spec:
    """A parsed OpenAPI or Swagger document: its operations, base URL, and schema building."""

    doc: Document
    resolver: Resolver
    swagger: bool
    _raw: list[_RawOperation] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, path: Path) -> Spec:
        try:
            doc = parse_file(path, {})
        except DefinitionSyntaxError as exc:
            raise SpecError(exc.problem) from exc
        except OSError as exc:
            raise SpecError(Problem(Source(str(path)), f"cannot read OpenAPI spec: {exc.strerror}")) from exc
        if not is_spec(doc.data):
            raise SpecError(doc.problem("not an OpenAPI 3.x or Swagger 2.0 document (no `openapi: 3.x` or `swagger`)"))
        return cls(doc, Resolver(path.resolve(), doc.data), swagger="swagger" in doc.data)

    def server_url(self) -> str | None:
        """The base URL the spec names (first server, variables at their defaults), if absolute."""
        url = self._swagger_url() if self.swagger else self._first_server()
        return url if url and re.match(r"^https?://[^/{}]+", url) and "{" not in url else None

    def _first_server(self) -> str | None:
        servers = self.doc.data.get("servers")
        first = servers[0] if isinstance(servers, list) and servers else None
        if not isinstance(first, dict) or not isinstance(first.get("url"), str):
            return None
        variables = first.get("variables")
        variables = variables if isinstance(variables, dict) else {}

        def default(match: re.Match[str]) -> str:
            spec = variables.get(match.group(1))
            return str(spec["default"]) if isinstance(spec, dict) and "default" in spec else match.group(0)

        return re.sub(r"\{([^{}]+)\}", default, first["url"])

    def _swagger_url(self) -> str | None:
        data = self.doc.data
        if not isinstance(data.get("host"), str):
            return None
        schemes = data.get("schemes") or ["https"]
        scheme = "https" if "https" in schemes else str(schemes[0])
        return f"{scheme}://{data['host']}{data.get('basePath') or ''}".rstrip("/")

    def operations(
        self, include_tags: Collection[str] = (), exclude_tags: Collection[str] = ()
    ) -> tuple[list[Operation], list[Problem]]:
        """The operations whose tags pass the filters, and a problem for each that cannot be read."""
        operations: list[Operation] = []
        problems: list[Problem] = []
        for raw in self._raw_operations():
            tags = _tags(raw.operation.value)
            if (include_tags and not set(tags) & set(include_tags)) or set(tags) & set(exclude_tags):
                continue
            try:
                operations.append(self._operation(raw, tags))
            except RefError as exc:
                problems.append(self.doc.problem(f"{raw.method} {raw.path}: {exc}", "paths", raw.path))
        return operations, problems

    def _raw_operations(self) -> list[_RawOperation]:
        """Every operation with its unique tool name; names are given before any tag filter applies."""
        if self._raw is None:
            used: set[str] = set()
            self._raw = [
                _RawOperation(
                    _unique(tool_name(op.value.get("operationId"), method, path), used), method, path, item, op
                )
                for path, method, item, op in self._walk_paths()
            ]
        return self._raw

    def _walk_paths(self) -> Iterator[tuple[str, str, Node, Node]]:
        paths = self.doc.data.get("paths")
        for path, raw_item in paths.items() if isinstance(paths, dict) else []:
            try:
                item = self.resolver.deref(Node(raw_item, self.resolver.root))
            except RefError:
                continue
            if not isinstance(item.value, dict):
                continue
            for method in HTTP_METHODS:
                operation = item.value.get(method)
                if isinstance(operation, dict):
                    yield str(path), method.upper(), item, Node(operation, item.file)

    def _operation(self, raw: _RawOperation, tags: tuple[str, ...]) -> Operation:
        op = raw.operation.value
        names = _ArgumentNames()
        parameters = self._parameters(raw.item, raw.operation)
        arguments = _parameter_arguments(parameters, raw.path, names, self.swagger)
        body, content_type, unusable = self._body(raw.operation, parameters, names)
        return Operation(
            name=raw.name,
            method=raw.method,
            path=raw.path,
            description=describe(
                op.get("summary"), op.get("description"), raw.method, raw.path, op.get("deprecated") is True
            ),
            tags=tags,
            arguments=(*arguments, *body),
            content_type=content_type,
            unusable=unusable,
            response=self._response_schema(raw.operation),
        )

    def _response_schema(self, operation: Node) -> Node | None:
        """The schema of the first 2xx response with a JSON body (Swagger: with a schema), if any."""
        responses = operation.value.get("responses")
        for code, raw in (
            sorted(responses.items(), key=lambda item: str(item[0])) if isinstance(responses, dict) else []
        ):
            if not str(code).startswith("2"):
                continue
            try:
                response = self.resolver.deref(Node(raw, operation.file))
            except RefError:
                return None
            return _json_schema_of(response, self.swagger)
        return None

    def _parameters(self, item: Node, operation: Node) -> list[Node]:
        """Path-level parameters overridden by the operation's own, by (name, location)."""
        merged: dict[tuple[str, str], Node] = {}
        for owner in (item, operation):
            raw_list = owner.value.get("parameters")
            for raw in raw_list if isinstance(raw_list, list) else []:
                param = self.resolver.deref(Node(raw, owner.file))
                value = param.value
                if isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("in"), str):
                    merged[(value["name"], value["in"])] = param
        return list(merged.values())

    def _body(
        self, operation: Node, parameters: list[Node], names: _ArgumentNames
    ) -> tuple[list[Argument], str, str | None]:
        if self.swagger:
            return _SwaggerBody(self, operation, parameters, names).arguments()
        raw = operation.value.get("requestBody")
        if raw is None:
            return [], JSON_TYPE, None
        body = self.resolver.deref(Node(raw, operation.file))
        content = body.value.get("content") if isinstance(body.value, dict) else None
        content = content if isinstance(content, dict) else {}
        required = body.value.get("required") is True
        media, kind = pick_media_type(content)
        if media is None:
            return [], JSON_TYPE, _unsupported_body(content, required)
        media_object = content[media] if isinstance(content[media], dict) else {}
        schema = Node(media_object.get("schema", {}), body.file)
        description = str(body.value.get("description") or "")
        return self.body_arguments(schema, kind, required, description, names), _content_type(media), None

    def body_arguments(
        self, schema: Node, kind: str, required: bool, description: str, names: _ArgumentNames
    ) -> list[Argument]:
        """Flattened properties of an object body, or the whole body as one argument."""
        if kind == "text":
            return [Argument(names.claim("body", "request"), "", "body", required, None, description)]
        fields = self.object_fields(schema)
        if fields is not None and (kind == "form" or _fits(fields, names)):
            properties, required_fields = fields
            return [
                Argument(names.claim(wire, "body"), wire, "field", required and wire in required_fields, node)
                for wire, node in properties.items()
            ]
        return [Argument(names.claim("body", "request"), "", "body", required, schema, description)]

    def object_fields(self, schema: Node, depth: int = 0) -> tuple[dict[str, Node], set[str]] | None:
        """The properties (not read-only) and required names of an object schema; None if it is not one."""
        node = self.resolver.deref(schema)
        value = node.value
        if not isinstance(value, dict) or depth > MAX_REF_DEPTH or {"oneOf", "anyOf", "not"} & set(value):
            return None
        if value.get("type", "object") != "object":
            return None
        raw_properties = value.get("properties")
        properties = {
            str(name): Node(prop, node.file)
            for name, prop in (raw_properties.items() if isinstance(raw_properties, dict) else [])
            if not self._read_only(Node(prop, node.file))
        }
        required = {r for r in value.get("required") or [] if isinstance(r, str)}
        for member in value.get("allOf") or []:
            sub = self.object_fields(Node(member, node.file), depth + 1)
            if sub is None:
                return None
            properties.update(sub[0])
            required |= sub[1]
        return (properties, required) if properties else None

    def _read_only(self, node: Node) -> bool:
        try:
            value = self.resolver.deref(node).value
        except RefError:
            return False  # described as unresolvable when the schema is built
        return isinstance(value, dict) and value.get("readOnly") is True

    def output_schema(self, operation: Operation) -> JSONSchema | None:
        """The schema of the operation's 2xx JSON response, `$ref`s resolved (the factory behind `Tool.output`)."""
        if operation.response is None:
            return None
        schema = SchemaBuilder(self.resolver, response=True).convert(operation.response)
        return schema if isinstance(schema, dict) and schema else None

    def input_schema(self, operation: Operation) -> JSONSchema:
        """The full input schema of an operation's tool (the factory behind `Tool.schema`)."""
        builder = SchemaBuilder(self.resolver)
        properties = {arg.name: _argument_schema(arg, builder) for arg in operation.arguments}
        schema: JSONSchema = {"type": "object", "properties": properties}
        required = [arg.name for arg in operation.arguments if arg.required]
        if required:
            schema["required"] = required
        return schema


def _json_schema_of(response: Node, swagger: bool) -> Node | None:
    value = response.value if isinstance(response.value, dict) else {}
    if swagger:
        return Node(value["schema"], response.file) if isinstance(value.get("schema"), dict) else None
    content = value.get("content")
    for media, media_object in content.items() if isinstance(content, dict) else []:
        kind = str(media).split(";", 1)[0].strip().lower()
        if (kind == JSON_TYPE or kind.endswith("+json")) and isinstance(media_object, dict):
            schema = media_object.get("schema")
            return Node(schema, response.file) if isinstance(schema, dict) else None
    return None


def is_spec(data: Any) -> bool:
    """Whether a parsed document is an OpenAPI 3.x or Swagger 2.0 spec."""
    if not isinstance(data, dict):
        return False
    return str(data.get("openapi", "")).startswith("3.") or str(data.get("swagger", "")) == "2.0"


def _tags(operation: Mapping[str, Any]) -> tuple[str, ...]:
    tags = operation.get("tags")
    return tuple(str(t) for t in tags) if isinstance(tags, list) else ()


def _fits(fields: tuple[dict[str, Node], set[str]], names: _ArgumentNames) -> bool:
    """Whether a body's properties can be top-level arguments without renaming any of them."""
    wanted = [argument_name(wire) for wire in fields[0]]
    return len(set(wanted)) == len(wanted) and not set(wanted) & names.taken


def _parameter_arguments(parameters: list[Node], path: str, names: _ArgumentNames, swagger: bool) -> list[Argument]:
    in_path = [p[1:-1] for p in PATH_PARAM.findall(path)]
    ordered = sorted(parameters, key=lambda p: _LOCATION_ORDER.get(p.value["in"], 9))
    arguments = []
    for param in ordered:
        value = param.value
        wire, where = value["name"], value["in"]
        if where not in _LOCATION_ORDER or (where == "path" and wire not in in_path):
            continue
        if where == "header" and wire.lower() in _IGNORED_HEADERS:
            continue
        schema = param if swagger else _parameter_schema(param)
        required = where == "path" or value.get("required") is True
        description = str(value.get("description") or "")
        arguments.append(Argument(names.claim(wire, where), wire, where, required, schema, description))
    declared = {a.wire for a in arguments if a.location == "path"}
    for wire in in_path:  # a spec that forgets to declare a path parameter still gets a working tool
        if wire not in declared:
            arguments.append(Argument(names.claim(wire, "path"), wire, "path", True, None))
    return arguments


def _parameter_schema(param: Node) -> Node | None:
    value = param.value
    if "schema" in value:
        return Node(value["schema"], param.file)
    content = value.get("content")
    if isinstance(content, dict) and content:
        media = next(iter(content.values()))
        if isinstance(media, dict) and "schema" in media:
            return Node(media["schema"], param.file)
    return None


def pick_media_type(content: Mapping[str, Any]) -> tuple[str | None, str]:
    """The request body's media type the worker can send (JSON first), and how: json, form or text."""
    kinds = {str(media): _media_kind(str(media)) for media in content}
    for wanted in ("json", "form", "text"):
        for media, kind in kinds.items():
            if kind == wanted:
                return media, kind
    return None, ""


def _media_kind(media: str) -> str | None:
    mime = media.split(";", 1)[0].strip().lower()
    if mime in {"application/json", "*/*"} or mime.endswith("+json") or mime.endswith("/json"):
        return "json"
    if mime == FORM_TYPE:
        return "form"
    if mime.startswith("text/") or mime in {"application/xml"} or mime.endswith("+xml"):
        return "text"
    return None


def _content_type(media: str) -> str:
    return JSON_TYPE if media.strip() == "*/*" else media


def _unsupported_body(content: Mapping[str, Any], required: bool) -> str | None:
    if not required:
        return None  # the tool still works, without a body
    kinds = ", ".join(str(m) for m in content) or "none given"
    return f"its request body must be sent as {kinds}, which the worker cannot build"


class _SwaggerBody:
    """Swagger 2.0 keeps the body among the parameters: one `in: body`, or `in: formData` fields."""

    def __init__(self, spec: Spec, operation: Node, parameters: list[Node], names: _ArgumentNames) -> None:
        self.spec = spec
        self.names = names
        consumes = operation.value.get("consumes") or spec.doc.data.get("consumes") or []
        self.consumes = [str(c) for c in consumes] if isinstance(consumes, list) else []
        self.body = [p for p in parameters if p.value["in"] == "body"]
        self.form = [p for p in parameters if p.value["in"] == "formData"]

    def arguments(self) -> tuple[list[Argument], str, str | None]:
        if self.body:
            return self._body(self.body[0])
        if self.form:
            return self._form()
        return [], JSON_TYPE, None

    def _body(self, param: Node) -> tuple[list[Argument], str, str | None]:
        media, kind = pick_media_type(dict.fromkeys(self.consumes or [JSON_TYPE]))
        if media is None:
            return [], JSON_TYPE, _unsupported_body(dict.fromkeys(self.consumes), param.value.get("required") is True)
        schema = Node(param.value.get("schema", {}), param.file)
        required = param.value.get("required") is True
        description = str(param.value.get("description") or "")
        return self.spec.body_arguments(schema, kind, required, description, self.names), _content_type(media), None

    def _form(self) -> tuple[list[Argument], str, str | None]:
        uploads = any(p.value.get("type") == "file" for p in self.form)
        if uploads or ("multipart/form-data" in self.consumes and FORM_TYPE not in self.consumes):
            required = any(p.value.get("required") is True for p in self.form)
            return [], JSON_TYPE, _unsupported_body(dict.fromkeys(self.consumes or ["multipart/form-data"]), required)
        arguments = [
            Argument(
                self.names.claim(p.value["name"], "body"),
                p.value["name"],
                "field",
                p.value.get("required") is True,
                p,
                str(p.value.get("description") or ""),
            )
            for p in self.form
        ]
        return arguments, FORM_TYPE, None


def _argument_schema(argument: Argument, builder: SchemaBuilder) -> JSONSchema:
    schema = builder.convert(argument.schema) if argument.schema is not None else {"type": "string"}
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if argument.description and "description" not in schema:
        schema = {**schema, "description": argument.description}
    return schema
