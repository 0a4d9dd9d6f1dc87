"""The OpenAPI reader's parts on their own: `$ref` resolution, schema building, the walker's media types,
descriptions and server URLs, and the request fields of an operation (the whole reader: test_openapi.py)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from worker.definitions.readers.openapi.operations import Argument, Operation, Spec, describe, pick_media_type
from worker.definitions.readers.openapi.refs import Node, RefError, Resolver
from worker.definitions.readers.openapi.schemas import SchemaBuilder, json_safe
from worker.definitions.readers.openapi.tools import request_fields

ROOT = Path("/specs/api.yaml")


def resolver(data: dict[str, Any], root: Path = ROOT) -> Resolver:
    return Resolver(root, data)


def ref(pointer: str, file: Path = ROOT) -> Node:
    return Node({"$ref": pointer}, file)


def convert(schema: Any, schemas: dict[str, Any] | None = None) -> Any:
    """The JSON Schema built for `schema` in a spec whose components hold `schemas`."""
    spec = {"components": {"schemas": schemas or {}}}
    return SchemaBuilder(resolver(spec)).convert(Node(schema, ROOT))


# --- $ref resolution ------------------------------------------------------------------------------


def test_a_chain_of_refs_ends_at_its_target() -> None:
    """deref follows a ref to a ref to a schema, and names the target by file and pointer."""
    data = {"components": {"schemas": {"A": {"$ref": "#/components/schemas/B"}, "B": {"type": "string"}}}}
    refs = resolver(data)
    assert refs.deref(ref("#/components/schemas/A")) == Node({"type": "string"}, ROOT)
    assert refs.key(ref("#/components/schemas/A")) == f"{ROOT}#/components/schemas/A"


def test_pointer_tokens_are_unescaped() -> None:
    """`~1` is a slash and `~0` a tilde (RFC 6901); percent-encoding is undone; YAML's integer keys match."""
    data = {"paths": {"/pets": {"get": {"responses": {200: {"description": "ok"}}}}}, "a~b": {"x": 1}}
    refs = resolver(data)
    assert refs.deref(ref("#/paths/~1pets/get/responses/200")).value == {"description": "ok"}
    assert refs.deref(ref("#/a~0b/x")).value == 1
    assert refs.deref(ref("#/paths/%7E1pets/get")).value == data["paths"]["/pets"]["get"]


def test_a_ref_cycle_is_an_error_not_a_loop() -> None:
    """Refs that only point at each other raise RefError naming the cycle."""
    data = {
        "components": {"schemas": {"A": {"$ref": "#/components/schemas/B"}, "B": {"$ref": "#/components/schemas/A"}}}
    }
    with pytest.raises(RefError, match="cycle"):
        resolver(data).deref(ref("#/components/schemas/A"))


@pytest.mark.parametrize(
    ("pointer", "message"),
    [
        ("#/components/schemas/Missing", "points at nothing"),
        ("https://example.com/schemas.yaml#/X", "remote \\$ref"),
        ("absent.yaml#/X", "cannot read"),
    ],
)
def test_refs_that_cannot_be_followed(tmp_path: Path, pointer: str, message: str) -> None:
    """A dangling pointer, a remote document (never fetched) and a missing file are RefErrors."""
    refs = resolver({"components": {"schemas": {}}}, tmp_path / "api.yaml")
    with pytest.raises(RefError, match=message):
        refs.deref(ref(pointer, tmp_path / "api.yaml"))


def test_a_ref_into_a_file_beside_the_spec_is_relative_to_that_file(tmp_path: Path) -> None:
    """A ref into another file lands there, and a ref inside that file is read against it, not the spec."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "pet.yaml").write_text(
        "Pet: {$ref: '#/Named'}\nNamed: {type: object, properties: {name: {type: string}}}\n", encoding="utf-8"
    )
    root = tmp_path / "api.yaml"
    target = resolver({}, root).deref(ref("models/pet.yaml#/Pet", root))
    assert target == Node(
        {"type": "object", "properties": {"name": {"type": "string"}}}, tmp_path / "models" / "pet.yaml"
    )


# --- schema building ------------------------------------------------------------------------------


def test_openapi_dialect_becomes_json_schema_2020_12() -> None:
    """nullable, boolean exclusive bounds, `example` and Swagger's `type: file` are rewritten."""
    assert convert({"type": "string", "nullable": True, "enum": ["a"]}) == {
        "type": ["string", "null"],
        "enum": ["a", None],
    }
    assert convert({"type": "number", "minimum": 1, "exclusiveMinimum": True}) == {
        "type": "number",
        "exclusiveMinimum": 1,
    }
    assert convert({"type": "number", "maximum": 9, "exclusiveMaximum": False}) == {"type": "number", "maximum": 9}
    assert convert({"type": "integer", "example": 3}) == {"type": "integer", "examples": [3]}
    assert convert({"type": "file"}) == {"type": "string", "format": "binary"}


def test_what_json_schema_does_not_know_or_cannot_hold_is_dropped() -> None:
    """Keywords outside JSON Schema go, and so do values that would make the schema invalid."""
    schema = {
        "type": "string",
        "discriminator": {"propertyName": "kind"},
        "xml": {"name": "x"},
        "x-internal": True,
        "pattern": "([a-z",
        "minLength": -1,
        "maxLength": 5,
    }
    assert convert(schema) == {"type": "string", "maxLength": 5}


def test_arrays_get_items_and_requests_lose_read_only_properties() -> None:
    """An array without items accepts any items; read-only properties are neither offered nor required."""
    assert convert({"type": "array"}) == {"type": "array", "items": {}}
    body = {
        "type": "object",
        "properties": {"id": {"type": "integer", "readOnly": True}, "name": {"type": "string"}},
        "required": ["id", "name"],
    }
    assert convert(body) == {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_all_of_is_folded_only_when_nothing_conflicts() -> None:
    """allOf members' properties and required names merge into the parent; a conflicting member keeps allOf."""
    merged = convert(
        {"allOf": [{"$ref": "#/components/schemas/Named"}, {"properties": {"age": {"type": "integer"}}}]},
        {"Named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    )
    assert merged == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name"],
    }
    conflicting = convert({"allOf": [{"type": "string"}, {"type": "integer"}]})
    assert conflicting == {"allOf": [{"type": "string"}, {"type": "integer"}]}


def test_a_recursive_schema_is_cut_and_says_so() -> None:
    """A schema met again inside its own expansion becomes a permissive schema of the same type."""
    node = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}},
    }
    schema = convert({"$ref": "#/components/schemas/Node"}, {"Node": node})
    inner = schema["properties"]["children"]["items"]
    assert inner == {"type": "object", "description": "A Node (nested too deeply or recursively to describe here)."}
    Draft202012Validator.check_schema(schema)


def test_a_refs_own_annotations_describe_its_use_and_a_broken_ref_says_so() -> None:
    """OpenAPI 3.1 lets a ref carry its own description; a ref that cannot be followed is described, not fatal."""
    owner = {"$ref": "#/components/schemas/Person", "description": "Who owns the pet."}
    assert convert(owner, {"Person": {"type": "object", "description": "A person."}}) == {
        "type": "object",
        "description": "Who owns the pet.",
    }
    broken = convert({"$ref": "#/components/schemas/Nowhere"})
    assert set(broken) == {"description"} and "points at nothing" in broken["description"]


def test_yaml_values_become_json_values() -> None:
    """Dates that YAML reads as dates are ISO strings; keys are strings; tuples are lists."""
    value = {1: datetime.date(2024, 1, 2), "t": (datetime.time(10, 30), None)}
    assert json_safe(value) == {"1": "2024-01-02", "t": ["10:30:00", None]}


# --- the walker: media types, descriptions, server URLs -------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"application/xml": {}, "application/json": {}}, ("application/json", "json")),
        ({"application/vnd.api+json": {}}, ("application/vnd.api+json", "json")),
        ({"text/plain": {}, "application/x-www-form-urlencoded": {}}, ("application/x-www-form-urlencoded", "form")),
        ({"application/xml": {}}, ("application/xml", "text")),
        ({"multipart/form-data": {}, "application/octet-stream": {}}, (None, "")),
    ],
)
def test_the_body_media_type_the_worker_can_send(content: dict[str, Any], expected: tuple[str | None, str]) -> None:
    """JSON before a form before text; multipart and octet streams are not built."""
    assert pick_media_type(content) == expected


def test_descriptions_lead_with_the_summary() -> None:
    """A description that repeats its summary is used alone; deprecation is said; nothing gives method and path."""
    assert describe("List pets", "List pets, newest first.", "GET", "/pets", False) == "List pets, newest first."
    assert describe("List pets", "Paged.", "GET", "/pets", True) == "List pets\n\nPaged.\n\nDeprecated."
    assert describe(None, "  ", "DELETE", "/pets/{id}", False) == "DELETE /pets/{id}"


def spec_file(tmp_path: Path, text: str) -> Spec:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    return Spec.load(path)


@pytest.mark.parametrize(
    ("text", "url"),
    [
        (
            "openapi: 3.0.0\nservers: [{url: 'https://{region}.example.com/v1', variables: {region: {default: eu}}}]",
            "https://eu.example.com/v1",
        ),
        ("openapi: 3.0.0\nservers: [{url: /v1}]", None),
        ("openapi: 3.0.0\nservers: [{url: 'https://{tenant}.example.com'}]", None),
        ("swagger: '2.0'\nhost: api.example.com\nbasePath: /v2/\nschemes: [http, https]", "https://api.example.com/v2"),
        ("swagger: '2.0'\nhost: api.example.com\nschemes: [http]", "http://api.example.com"),
    ],
)
def test_the_server_url_a_spec_names(tmp_path: Path, text: str, url: str | None) -> None:
    """Variables at their defaults, HTTPS when offered; relative or unfilled URLs name no server."""
    assert spec_file(tmp_path, text + "\npaths: {}\n").server_url() == url


# --- an operation's request fields ----------------------------------------------------------------


def test_request_fields_place_each_argument_by_its_wire_name() -> None:
    """Path, query and header arguments keep their wire names in the templates; body fields form the body;
    literal text of the path that looks like a template is escaped."""
    arguments = (
        Argument("id", "id", "path", True, None),
        Argument("filter_name", "filter[name]", "query", False, None),
        Argument("x_trace", "X-Trace", "header", False, None),
        Argument("name", "name", "field", True, None),
    )
    operation = Operation("rename", "PATCH", "/items/{id}/cost${", "", (), arguments)
    assert request_fields(operation) == {
        "method": "PATCH",
        "path": "/items/${id}/cost$${",
        "query": {"filter[name]": "${filter_name}"},
        "headers": {"X-Trace": "${x_trace}"},
        "body": {"name": "${name}"},
        "content_type": "application/json",
    }


def test_a_whole_body_argument_is_the_body_template() -> None:
    """An argument that is the whole body is the body's one template, whatever its content type."""
    operation = Operation("note", "POST", "/notes", "", (), (Argument("body", "", "body", True, None),), "text/plain")
    assert request_fields(operation) == {
        "method": "POST",
        "path": "/notes",
        "body": "${body}",
        "content_type": "text/plain",
    }
