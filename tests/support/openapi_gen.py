"""Generates large OpenAPI 3.0 specs (CRUD over many resources) for load tests and benchmarks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OPERATIONS_PER_RESOURCE = 5
TAGS = ("billing", "catalog", "crm", "inventory", "logistics", "marketing", "payments", "reports", "support", "users")


def generate_spec(operations: int = 1000) -> dict[str, Any]:
    """A spec of `operations` operations: list/create/get/update/delete over numbered resources."""
    resources = -(-operations // OPERATIONS_PER_RESOURCE)
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {"Address": _address(), "Page": _page()}
    for n in range(resources):
        paths.update(_resource_paths(n))
        schemas[f"Resource{n}"] = _resource_schema(n)
    spec = {
        "openapi": "3.0.3",
        "info": {"title": f"Generated API ({operations} operations)", "version": "1.0.0"},
        "servers": [{"url": "https://api.generated.example.com/v1"}],
        "paths": paths,
        "components": {"schemas": schemas, "parameters": _shared_parameters()},
    }
    _trim(spec, operations)
    return spec


def write_spec(folder: Path, operations: int = 1000) -> Path:
    """Write a generated spec as JSON and a native file with an `openapi:` entry naming it; return the latter."""
    spec_file = folder / "generated.json"
    spec_file.write_text(json.dumps(generate_spec(operations)), encoding="utf-8")
    definitions = folder / "generated-tools.yaml"
    definitions.write_text("openapi:\n  - {upstream: generated, spec: generated.json}\n", encoding="utf-8")
    return definitions


def _resource_paths(n: int) -> dict[str, Any]:
    tag = TAGS[n % len(TAGS)]
    name = f"Resource{n}"
    ref = {"$ref": f"#/components/schemas/{name}"}
    body = {"required": True, "content": {"application/json": {"schema": ref}}}
    item_id = {"name": "itemId", "in": "path", "required": True, "schema": {"type": "string"}}
    trace = {"$ref": "#/components/parameters/Trace"}
    page = [{"$ref": "#/components/parameters/Limit"}, {"$ref": "#/components/parameters/Offset"}, trace]

    def op(verb: str, summary: str, **extra: Any) -> dict[str, Any]:
        return {
            "operationId": f"{verb}{name}",
            "summary": summary,
            "description": f"{summary}. Part of the {tag} API; see the {tag} guide for limits.",
            "tags": [tag],
            **extra,
        }

    return {
        f"/{tag}/resource{n}": {
            "get": op("list", f"List {tag} resource {n} items", parameters=page),
            "post": op("create", f"Create a {tag} resource {n} item", parameters=[trace], requestBody=body),
        },
        f"/{tag}/resource{n}/{{itemId}}": {
            "parameters": [item_id, trace],
            "get": op("get", f"Fetch one {tag} resource {n} item by ID"),
            "put": op("update", f"Replace a {tag} resource {n} item", requestBody=body),
            "delete": op("delete", f"Delete a {tag} resource {n} item"),
        },
    }


def _resource_schema(n: int) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name"],
        "properties": {
            "id": {"type": "string", "readOnly": True},
            "name": {"type": "string", "maxLength": 200, "example": f"item {n}"},
            "description": {"type": "string", "nullable": True},
            "quantity": {"type": "integer", "minimum": 0},
            "price": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
            "status": {"type": "string", "enum": ["draft", "active", "archived"]},
            "labels": {"type": "array", "items": {"type": "string"}},
            "address": {"$ref": "#/components/schemas/Address"},
            "related": {"type": "array", "items": {"$ref": f"#/components/schemas/Resource{max(n - 1, 0)}"}},
        },
    }


def _address() -> dict[str, Any]:
    fields = ("street", "city", "postcode", "country")
    return {"type": "object", "properties": {f: {"type": "string"} for f in fields}}


def _page() -> dict[str, Any]:
    return {"type": "object", "properties": {"total": {"type": "integer"}, "next": {"type": "string"}}}


def _shared_parameters() -> dict[str, Any]:
    return {
        "Limit": {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
        "Offset": {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
        "Trace": {"name": "X-Trace-Id", "in": "header", "schema": {"type": "string"}},
    }


def _trim(spec: dict[str, Any], operations: int) -> None:
    """Drop operations beyond the count asked for (the last resource may be partial)."""
    seen = 0
    for item in spec["paths"].values():
        for method in [m for m in item if m != "parameters"]:
            seen += 1
            if seen > operations:
                del item[method]
