"""The REST API's contract, without a server: its OpenAPI document, and how request bodies are read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request

from worker.definitions.model import Problem
from worker.definitions.readers.openapi import import_openapi
from worker.definitions.readers.openapi.refs import Node, Resolver
from worker.gateway.rest.bodies import BadBody, json_body, parse
from worker.gateway.rest.document import document

METHODS = {"get", "post", "put", "patch", "delete"}


def refs(value: Any) -> list[str]:
    """Every `$ref` in a JSON value."""
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [r for item in value.values() for r in refs(item)]
    if isinstance(value, list):
        return [r for item in value for r in refs(item)]
    return []


def test_every_ref_of_the_document_resolves_and_every_schema_is_valid() -> None:
    """The document's `$ref`s all point at something; each component schema is valid JSON Schema 2020-12."""
    doc = document("http://127.0.0.1:8780", "1.2.3")
    resolver = Resolver(Path("/gateway.json"), doc)
    pointers = set(refs(doc))
    assert pointers and all(resolver.deref(Node({"$ref": p}, resolver.root)).value for p in pointers)
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    assert doc["info"]["version"] == "1.2.3" and doc["servers"] == [{"url": "http://127.0.0.1:8780"}]


def test_the_document_imports_as_one_tool_per_operation(tmp_path: Path) -> None:
    """import-openapi reads the gateway's own document: every operationId is a tool, none left out, and the
    bearer scheme becomes the upstream's auth skeleton."""
    doc = document("http://127.0.0.1:8780", "0")
    operation_ids = {op["operationId"] for item in doc["paths"].values() for m, op in item.items() if m in METHODS}
    spec = tmp_path / "gateway.json"
    spec.write_text(json.dumps(doc), encoding="utf-8")
    problems: list[Problem] = []
    native = import_openapi(spec, "gateway", None, [], problems=problems)
    assert problems == []
    assert {tool["name"] for tool in native["tools"]} == operation_ids
    assert native["upstreams"]["gateway"]["auth"] == {"type": "bearer", "token": "${env:GATEWAY_TOKEN}"}


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    timeoutSeconds: float = 60


def test_a_body_of_the_wrong_shape_is_422_naming_each_field() -> None:
    """pydantic's errors become one message and a list of problems, each with its field."""
    with pytest.raises(BadBody) as raised:
        parse(Body, {"timeoutSeconds": "soon", "extra": 1})
    assert raised.value.status == 422
    fields = {problem["field"] for problem in raised.value.problems}
    assert fields == {"tool", "timeoutSeconds", "extra"}
    assert all(f"`{field}`" in raised.value.message for field in fields)
    assert parse(Body, {"tool": "t"}) == Body(tool="t")


def test_a_body_that_is_not_an_object_is_422_for_the_body_itself() -> None:
    """A list where an object is expected is a problem of `body`; at most five problems are listed."""
    with pytest.raises(BadBody) as raised:
        parse(Body, [1, 2])
    assert [p["field"] for p in raised.value.problems] == ["body"]

    class Wide(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int
        f: int

    with pytest.raises(BadBody) as many:
        parse(Wide, {})
    assert len(many.value.problems) == 5


def request(body: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/calls", "headers": []}, receive)


@pytest.mark.parametrize(("raw", "expected"), [(b"", {}), (b"  \n", {}), (b'{"tool": "t"}', {"tool": "t"})])
async def test_json_bodies(raw: bytes, expected: Any) -> None:
    """An empty body reads as an empty object; JSON reads as JSON."""
    assert await json_body(request(raw)) == expected


@pytest.mark.parametrize("raw", [b"{not json", b"[" * 100_000])
async def test_a_body_that_is_not_json_is_400(raw: bytes) -> None:
    """Broken JSON, and JSON nested too deeply to parse, are both a 400 that says so."""
    with pytest.raises(BadBody) as raised:
        await json_body(request(raw))
    assert raised.value.status == 400 and "not valid JSON" in raised.value.message
