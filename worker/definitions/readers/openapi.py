"""OpenAPI 3.x and Swagger 2.0 specs (README, "Formats accepted as they are"): one tool per operation.

Two entry points share everything here: `openapi:` entries of native files (`read_entries`; each
input schema is built on first use) and `import_openapi` (a native document with every schema built).

How an operation becomes a tool:
- name: `operationId` sanitised to the tool-name rule, else method and path; `_2`, `_3`… keep it unique.
- arguments: path, query and header parameters, each under its name made safe for every consumer
  (`^[A-Za-z0-9_.-]{1,64}$`: `filter[name]` -> `filter_name`; the template keeps the wire name). A name
  met again in another location becomes `<location>_<name>`. Cookie parameters are not mapped, and
  header parameters named Accept, Content-Type or Authorization are ignored, as OpenAPI says.
- JSON body: an object's properties become top-level arguments when none collides with a parameter
  (read-only ones are left out); each is placed by an explicit body template, so it lands in the body
  whatever the method, and an absent one is left out. Otherwise, and for bodies that are not objects,
  the whole body is one `body` argument. Form bodies with properties are always flattened (a colliding
  field becomes `body_<name>`); text and XML bodies are one string `body` argument. A required body of
  another media type (multipart, octet-stream) makes the tool unusable; an optional one is not sent.
- `$ref`: within the spec and into files beside it. A ref met again inside its own expansion (a cycle),
  nested deeper than MAX_REF_DEPTH, or past MAX_REF_EXPANSIONS in one schema, becomes a permissive
  schema that says so in its description: recursive schemas load, never loop.
- schemas: OpenAPI's dialect becomes JSON Schema 2020-12 (`nullable`, boolean `exclusiveMinimum`,
  `example`, `type: file`); keywords outside JSON Schema (`discriminator`, `xml`, `x-*`) are dropped,
  and so are values that would make the schema invalid (a `pattern` Python cannot compile).
- laziness: only what the request templates need (parameters' names and locations, the body's
  property names) is read at load; `Tool.schema` is a factory that builds the input schema.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache, partial
from itertools import count
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, ValidationError

from worker.definitions.model import (
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_LIST_KEYWORDS,
    SUBSCHEMA_MAP_KEYWORDS,
    Body,
    Problem,
    RequestTemplate,
    Source,
    Tool,
    ToolSet,
)
from worker.definitions.readers.document import DefinitionSyntaxError, Document, parse_file
from worker.definitions.readers.security import auth_skeleton
from worker.definitions.readers.upstreams import UpstreamModel, build_upstream
from worker.definitions.templates import Template, TemplateSyntaxError, escape

JSONSchema = dict[str, Any]
MAX_REF_DEPTH = 8  # refs nested inside one another in one schema
MAX_REF_EXPANSIONS = 500  # refs expanded in one input schema, against specs whose schemas fan out
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
# OpenAPI: header parameters with these names "SHALL be ignored" (other fields describe them).
_IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
_LOCATION_ORDER = {"path": 0, "query": 1, "header": 2}
_PATH_PARAM = re.compile(r"(\{[^{}]*\})")
_UNSAFE_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_UNSAFE_ARG_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME_LIMIT = 64


class SpecError(ValueError):
    """A spec cannot be used at all (unreadable, not OpenAPI, no base URL)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class RefError(LookupError):
    """A `$ref` cannot be followed."""


# --- $ref resolution -----------------------------------------------------------------------------


class Node(NamedTuple):  # a tuple: made by the thousand on large specs, and cheaper than a frozen dataclass
    """A node of a spec and the file that holds it (a `$ref` is relative to that file)."""

    value: Any
    file: Path


class Resolver:
    """Follows `$ref`s within the spec and into files beside it, parsing each file once."""

    def __init__(self, root: Path, data: Any) -> None:
        self.root = root
        self._documents: dict[Path, Any] = {root: data}
        # (file, $ref) -> (absolute key, target): shared parameters and schemas are followed many times
        self._targets: dict[tuple[Path, str], tuple[str, Node]] = {}

    def deref(self, node: Node) -> Node:
        """The node itself, or what its chain of `$ref`s points at."""
        seen: set[str] = set()
        while _is_ref(node.value):
            key = self.key(node)
            if key in seen:
                raise RefError(f"$ref cycle at {key}")
            seen.add(key)
            node = self.target(node)
        return node

    def key(self, node: Node) -> str:
        """An absolute name for the target of a `$ref` node (file and JSON pointer)."""
        return self._follow(node)[0]

    def target(self, node: Node) -> Node:
        return self._follow(node)[1]

    def _follow(self, node: Node) -> tuple[str, Node]:
        ref: str = node.value["$ref"]
        cached = self._targets.get((node.file, ref))
        if cached is None:
            location, _, pointer = ref.partition("#")
            if "://" in location:
                raise RefError(f"remote $ref {ref!r} is not fetched")
            file = (node.file.parent / unquote(location)).resolve() if location else node.file
            pointer = unquote(pointer)
            target = Node(_follow_pointer(self._document(file), pointer, ref), file)
            cached = self._targets[(node.file, ref)] = (f"{file}#{pointer}", target)
        return cached

    def _document(self, file: Path) -> Any:
        if file not in self._documents:
            try:
                self._documents[file] = parse_file(file, {}).data
            except (DefinitionSyntaxError, OSError) as exc:
                raise RefError(f"cannot read {file}: {exc}") from exc
        return self._documents[file]


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("$ref"), str)


def _follow_pointer(document: Any, pointer: str, ref: str) -> Any:
    node = document
    for token in pointer.split("/")[1:] if pointer else []:
        node = _child(node, token.replace("~1", "/").replace("~0", "~"))
        if node is _MISSING:
            raise RefError(f"$ref {ref!r} points at nothing")
    return node


_MISSING = object()


def _child(node: Any, token: str) -> Any:
    if isinstance(node, dict):
        if token in node:
            return node[token]
        # YAML reads unquoted keys such as response codes as integers
        return node.get(int(token), _MISSING) if token.isdigit() else _MISSING
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    return _MISSING


# --- schemas: OpenAPI's dialect to JSON Schema 2020-12 -------------------------------------------

_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_type(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and len(set(map(str, value))) == len(value) and all(t in _TYPES for t in value)
    return value in _TYPES


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value) and len(set(value)) == len(value)


@lru_cache(maxsize=4096)
def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _is_pattern(value: Any) -> bool:
    return isinstance(value, str) and _compiles(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


def _is_anything(value: Any) -> bool:
    return True


# Plain keywords kept, each with the check its value must pass to keep the schema valid.
_VALUE_RULES: dict[str, Callable[[Any], bool]] = {
    "type": _is_type,
    "format": _is_str,
    "title": _is_str,
    "description": _is_str,
    "pattern": _is_pattern,
    "contentEncoding": _is_str,
    "contentMediaType": _is_str,
    "multipleOf": lambda v: _is_number(v) and v > 0,
    "maximum": _is_number,
    "minimum": _is_number,
    "exclusiveMaximum": _is_number,
    "exclusiveMinimum": _is_number,
    "maxLength": _is_count,
    "minLength": _is_count,
    "maxItems": _is_count,
    "minItems": _is_count,
    "maxProperties": _is_count,
    "minProperties": _is_count,
    "uniqueItems": _is_bool,
    "deprecated": _is_bool,
    "readOnly": _is_bool,
    "writeOnly": _is_bool,
    "required": _is_names,
    "enum": _is_list,
    "examples": _is_list,
    "const": _is_anything,
    "default": _is_anything,
}


def json_safe(value: Any) -> Any:
    """A YAML value as JSON can hold it (YAML reads `2024-01-01` as a date)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return str(value)


class SchemaBuilder:
    """Converts one input schema's worth of OpenAPI schemas, with one budget of `$ref` expansions."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.budget = MAX_REF_EXPANSIONS
        self.trail: list[str] = []

    def convert(self, node: Node) -> Any:
        """A JSON Schema 2020-12 schema (a mapping or a boolean) for an OpenAPI schema node."""
        value = node.value
        if isinstance(value, bool):
            return value
        if not isinstance(value, dict):
            return {}
        if _is_ref(value):
            return self._ref(node)
        return _normalise(self._keywords(value, node.file), value)

    def _ref(self, node: Node) -> Any:
        try:
            key = self.resolver.key(node)
            target = self.resolver.target(node)
        except RefError as exc:
            return {"description": f"(not described: {exc})"}
        if key in self.trail or len(self.trail) >= MAX_REF_DEPTH or self.budget <= 0:
            return _cut(target.value, key)
        self.budget -= 1
        self.trail.append(key)
        try:
            converted = self.convert(target)
        finally:
            self.trail.pop()
        return _with_annotations(converted, node.value)

    def _keywords(self, value: Mapping[Any, Any], file: Path) -> JSONSchema:
        out: JSONSchema = {}
        for raw_key, item in value.items():
            key = str(raw_key)
            if key == "items" and isinstance(item, list):  # tuple form of older drafts
                out["prefixItems"] = [self.convert(Node(v, file)) for v in item]
            elif key in SUBSCHEMA_KEYWORDS:
                out[key] = self.convert(Node(item, file))
            elif key in SUBSCHEMA_LIST_KEYWORDS and isinstance(item, list):
                out[key] = [self.convert(Node(v, file)) for v in item]
            elif key in SUBSCHEMA_MAP_KEYWORDS and isinstance(item, dict):
                out[key] = {str(k): self.convert(Node(v, file)) for k, v in item.items()}
            elif key in _VALUE_RULES:
                out[key] = json_safe(item)
        return out


def _normalise(out: JSONSchema, raw: Mapping[Any, Any]) -> JSONSchema:
    """Rewrite OpenAPI-only forms into JSON Schema and drop what would make the schema invalid."""
    if out.get("type") == "file":  # Swagger 2.0 uploads
        out["type"], out["format"] = "string", "binary"
    _exclusive_bounds(out)
    if "example" in raw and "examples" not in out:
        out["examples"] = [json_safe(raw["example"])]
    out = {key: value for key, value in out.items() if key not in _VALUE_RULES or _VALUE_RULES[key](value)}
    if raw.get("nullable") is True or raw.get("x-nullable") is True:
        _allow_null(out)
    _drop_read_only(out)
    if out.get("type") == "array" and "items" not in out and "prefixItems" not in out:
        out["items"] = {}  # OpenAI refuses an array schema without items
    return _merge_all_of(out)


def _exclusive_bounds(out: JSONSchema) -> None:
    """OpenAPI 3.0's boolean `exclusiveMinimum: true` + `minimum: n` is 2020-12's `exclusiveMinimum: n`."""
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = out.get(exclusive)
        if isinstance(flag, bool):
            del out[exclusive]
            if flag and bound in out:
                out[exclusive] = out.pop(bound)


def _allow_null(out: JSONSchema) -> None:
    kind = out.get("type")
    if isinstance(kind, str) and kind != "null":
        out["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        out["type"] = [*kind, "null"]
    if isinstance(out.get("enum"), list) and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]


def _drop_read_only(out: JSONSchema) -> None:
    """A request never carries read-only properties."""
    properties = out.get("properties")
    if not isinstance(properties, dict):
        return
    dropped = {name for name, schema in properties.items() if isinstance(schema, dict) and schema.get("readOnly")}
    if dropped:
        out["properties"] = {k: v for k, v in properties.items() if k not in dropped}
        if "required" in out:
            out["required"] = [name for name in out["required"] if name not in dropped]


def _merge_all_of(schema: JSONSchema) -> JSONSchema:
    """Fold `allOf` into its parent when that changes nothing, which consumers take more readily."""
    members = schema.get("allOf")
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        return schema
    merged = {key: value for key, value in schema.items() if key != "allOf"}
    for member in members:
        for key, value in member.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            elif key in {"description", "title"} and key in merged:
                continue  # the outer annotation describes the whole
            elif key in merged and merged[key] != value:
                return schema
            else:
                merged[key] = value
    return merged


def _with_annotations(converted: Any, ref_node: Mapping[str, Any]) -> Any:
    """A `$ref`'s own description/title/default (OpenAPI 3.1) describe this use of the target."""
    notes = {k: json_safe(ref_node[k]) for k in ("description", "title", "default") if k in ref_node}
    if not notes or not isinstance(converted, dict):
        return converted
    return {**converted, **notes}


def _cut(target: Any, key: str) -> JSONSchema:
    """What stands for a schema not expanded (a cycle, or too deep): permissive, and says so."""
    name = key.rsplit("/", 1)[-1]
    out: JSONSchema = {"description": f"A {name} (nested too deeply or recursively to describe here)."}
    kind = target.get("type") if isinstance(target, dict) else None
    if isinstance(kind, str) and kind in _TYPES:
        out["type"] = kind
        if kind == "array":
            out["items"] = {}
    return out


# --- the light index: operations with their arguments' names and locations -----------------------


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
        )

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

    def input_schema(self, operation: Operation) -> JSONSchema:
        """The full input schema of an operation's tool (the factory behind `Tool.schema`)."""
        builder = SchemaBuilder(self.resolver)
        properties = {arg.name: _argument_schema(arg, builder) for arg in operation.arguments}
        schema: JSONSchema = {"type": "object", "properties": properties}
        required = [arg.name for arg in operation.arguments if arg.required]
        if required:
            schema["required"] = required
        return schema


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
    in_path = [p[1:-1] for p in _PATH_PARAM.findall(path)]
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


# --- tools and native documents ------------------------------------------------------------------


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
    for part in _PATH_PARAM.split(operation.path):
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
    if not operation.tags:
        del definition["tags"]
    return definition


def import_openapi(
    spec_path: Path,
    upstream: str,
    base_url: str | None,
    tags: list[str],
    *,
    problems: list[Problem] | None = None,
) -> dict[str, Any]:
    """A native definitions document (`upstreams:` and `tools:`) for a spec's operations.

    `base_url` (a template: `${env:NAME}` allowed) replaces the spec's servers; `tags` keeps only the
    operations with one of them. Operations that cannot be mapped are left out, each with a problem
    appended to `problems` when given. Raises SpecError when the spec cannot be used at all.
    """
    spec = Spec.load(spec_path)
    url = base_url or spec.server_url()
    if not url:
        raise SpecError(spec.doc.problem("the spec names no absolute server URL: give a base URL"))
    operations, found = spec.operations(include_tags=tags)
    found += [
        spec.doc.problem(f"{op.method} {op.path} left out: {op.unusable}", "paths", op.path)
        for op in operations
        if op.unusable
    ]
    if problems is not None:
        problems.extend(found)
    entry: dict[str, Any] = {"base_url": base_url or escape(url)}
    auth = auth_skeleton(spec.doc.data, upstream)
    if auth is not None:
        entry["auth"] = auth
    return {
        "upstreams": {upstream: entry},
        "tools": [tool_definition(op, upstream, spec) for op in operations if not op.unusable],
    }


# --- `openapi:` entries of native files ----------------------------------------------------------


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
