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
from worker.gateway.rest import connections, routes, upstreams
from worker.gateway.rest import document as document_module
from worker.gateway.rest.bodies import BadBody, json_body, parse
from worker.gateway.rest.document import document
from worker.gateway.rest.operations import Operation, served

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


def get(path: str, query: bytes, path_params: dict[str, str] | None = None) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": []}
    return Request({**scope, "path_params": path_params or {}}, receive)


def operation(operation_id: str) -> Operation:
    return next(op for op in document_module.OPERATIONS if op.operation_id == operation_id)


def test_the_routes_served_are_the_operations_documented() -> None:
    """Every operation of the table is a served route (convertors and all) and an operation of the document,
    with the same method and path; nothing else is documented."""
    served_routes = [
        (method.lower(), route.path_format)
        for owner, table in (
            (object(), routes.OPERATIONS),
            (object(), connections.OPERATIONS),
            (object(), upstreams.OPERATIONS),
        )
        for route in served(table, owner)
        for method in route.methods or ()
        if method != "HEAD"
    ]
    doc = document("http://127.0.0.1:8780", "0")
    documented = [(method, path) for path, item in doc["paths"].items() for method in item if method in METHODS]
    assert sorted(served_routes) == sorted(documented)
    assert ("delete", "/v1/connections/{upstream}") in documented  # the convertor stays out of the document


async def test_a_query_is_read_with_its_model() -> None:
    """A repeated parameter is a list; integers are digits only (no `5.0`, no `1_0`), as the document types them."""
    inputs = await operation("listTools").read_inputs(get("/v1/tools", b"tag=a&tag=b&format=mcp"))
    assert inputs["query"].tag == ["a", "b"] and inputs["query"].format == "mcp"
    assert (await operation("searchTools").read_inputs(get("/v1/tools/search", b"question=x&top_k=7")))[
        "query"
    ].top_k == 7
    for top_k in (b"5.0", b"1_0", b"+5", b"51"):
        with pytest.raises(BadBody) as raised:
            await operation("searchTools").read_inputs(get("/v1/tools/search", b"question=x&top_k=" + top_k))
        assert raised.value.status == 422 and raised.value.problems[0]["field"] == "top_k"


async def test_a_path_parameter_is_checked_with_its_type() -> None:
    """A callId longer than the document allows is a 422 naming the parameter."""
    long = "c" * 257
    with pytest.raises(BadBody) as raised:
        await operation("getCall").read_inputs(get(f"/v1/calls/{long}", b"", {"callId": long}))
    assert raised.value.status == 422 and raised.value.problems[0]["field"] == "callId"


@pytest.mark.parametrize(
    ("operation_id", "path", "path_params"),
    [
        ("openConnectLink", "/v1/connections/people/authorize", {"upstream": "people"}),
        ("connectCallback", "/v1/connections/callback", {}),
    ],
)
async def test_a_browser_page_refuses_a_bad_query_with_a_page(
    operation_id: str, path: str, path_params: dict[str, str]
) -> None:
    """A connect link without its ticket, or a redirect back without its state, is a 400 HTML page for the
    user (not the API's JSON error), and no handler runs."""
    (route,) = served([operation(operation_id)], object())
    answer = await route.endpoint(get(path, b"", path_params))
    assert answer.status_code == 400 and answer.media_type == "text/html"
    assert b"not valid" in answer.body
