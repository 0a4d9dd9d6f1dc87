"""Schema building: OpenAPI's schema dialect to JSON Schema 2020-12, one input schema at a time."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from worker.definitions.model import SUBSCHEMA_KEYWORDS, SUBSCHEMA_LIST_KEYWORDS, SUBSCHEMA_MAP_KEYWORDS
from worker.definitions.readers.openapi.refs import MAX_REF_DEPTH, Node, RefError, Resolver, is_ref

JSONSchema = dict[str, Any]
MAX_REF_EXPANSIONS = 500  # refs expanded in one input schema, against specs whose schemas fan out

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

    def __init__(self, resolver: Resolver, response: bool = False) -> None:
        self.resolver = resolver
        # A response's schema keeps read-only properties and drops write-only ones (a request's: the reverse).
        self.dropped = "writeOnly" if response else "readOnly"
        self.budget = MAX_REF_EXPANSIONS
        self.trail: list[str] = []

    def convert(self, node: Node) -> Any:
        """A JSON Schema 2020-12 schema (a mapping or a boolean) for an OpenAPI schema node."""
        value = node.value
        if isinstance(value, bool):
            return value
        if not isinstance(value, dict):
            return {}
        if is_ref(value):
            return self._ref(node)
        return _normalise(self._keywords(value, node.file), value, self.dropped)

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


def _normalise(out: JSONSchema, raw: Mapping[Any, Any], dropped: str = "readOnly") -> JSONSchema:
    """Rewrite OpenAPI-only forms into JSON Schema and drop what would make the schema invalid."""
    if out.get("type") == "file":  # Swagger 2.0 uploads
        out["type"], out["format"] = "string", "binary"
    _exclusive_bounds(out)
    if "example" in raw and "examples" not in out:
        out["examples"] = [json_safe(raw["example"])]
    out = {key: value for key, value in out.items() if key not in _VALUE_RULES or _VALUE_RULES[key](value)}
    if raw.get("nullable") is True or raw.get("x-nullable") is True:
        _allow_null(out)
    _drop_flagged(out, dropped)
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


def _drop_flagged(out: JSONSchema, flag: str) -> None:
    """A request never carries read-only properties (`flag`), a response write-only ones."""
    properties = out.get("properties")
    if not isinstance(properties, dict):
        return
    dropped = {name for name, schema in properties.items() if isinstance(schema, dict) and schema.get(flag)}
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
