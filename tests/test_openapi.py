"""The OpenAPI 3.x / Swagger 2.0 reader: `openapi:` entries, lazy schemas, and `import_openapi`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from tests.support.openapi_gen import generate_spec, write_spec
from worker.call.rendering import PreparedRequest, render
from worker.definitions import catalog, file_store
from worker.definitions.model import Problem, ToolSet
from worker.definitions.readers import parse_file
from worker.definitions.readers.openapi import (
    JSON_TYPE,
    SpecError,
    SpecFileReader,
    argument_name,
    import_openapi,
    tool_name,
)

FIXTURES = Path(__file__).parent / "fixtures" / "openapi"
PETSTORE_TOOLS = {
    "listPets",
    "createPet",
    "getPetById",
    "updatePet",
    "deletePet",
    "replacePetTags",
    "place_order",
    "get_store_inventory",
    "loginUser",
}


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    """A folder holding a copy of every fixture spec."""
    for file in FIXTURES.iterdir():
        shutil.copy(file, tmp_path / file.name)
    return tmp_path


def load(folder: Path, definitions: str, name: str = "tools.yaml") -> ToolSet:
    file = folder / name
    file.write_text(definitions, encoding="utf-8")
    return file_store.load([file], environ={})


def entry(folder: Path, spec: str, upstream: str = "api", extra: str = "") -> ToolSet:
    return load(folder, f"openapi:\n  - {{upstream: {upstream}, spec: {spec}{extra}}}\n")


def write_json(folder: Path, spec: dict[str, Any], name: str = "spec.json") -> str:
    (folder / name).write_text(json.dumps(spec), encoding="utf-8")
    return name


def call(toolset: ToolSet, name: str, arguments: dict[str, Any]) -> PreparedRequest:
    tool = toolset.tools[name]
    return render(tool, toolset.upstreams[tool.upstream], arguments, {}, {})


def tiny_spec(paths: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "servers": [{"url": "https://t.example"}]} | {
        "paths": paths,
        **top,
    }


@pytest.fixture
def petstore(specs: Path) -> ToolSet:
    """The Petstore 3.0 fixture loaded through an `openapi:` entry."""
    return entry(specs, "petstore.yaml", upstream="petstore")


# --- loading and naming ----------------------------------------------------------------------------


def test_every_operation_of_the_petstore_becomes_a_tool(petstore: ToolSet) -> None:
    """One tool per operation; the upstream's base URL is the first server with its variables' defaults."""
    assert set(petstore.tools) == PETSTORE_TOOLS
    assert petstore.problems == []
    assert petstore.upstreams["petstore"].base_url.source == "https://eu.petstore.example.com/v1"


def test_names_are_sanitised_operation_ids_or_method_and_path(petstore: ToolSet) -> None:
    """`place order!` becomes `place_order`; an operation without operationId is named from method and path."""
    assert "place_order" in petstore.tools
    assert petstore.tools["get_store_inventory"].request.path.source == "/store/inventory"


@pytest.mark.parametrize(
    ("operation_id", "method", "path", "expected"),
    [
        ("listPets", "GET", "/pets", "listPets"),
        ("pets.list v2", "GET", "/pets", "pets_list_v2"),
        (None, "GET", "/pets/{petId}", "get_pets_petId"),
        ("", "DELETE", "/a/{b}/c", "delete_a_b_c"),
        ("x" * 80, "GET", "/", "x" * 64),
    ],
)
def test_tool_name_follows_the_name_rule(operation_id: str | None, method: str, path: str, expected: str) -> None:
    """Tool names match ^[A-Za-z0-9_-]{1,64}$ whatever the spec says."""
    assert tool_name(operation_id, method, path) == expected


def test_duplicate_operation_ids_are_made_unique(tmp_path: Path) -> None:
    """Two operations with one operationId (or one cut to 64 characters) get distinct names."""
    long_id = "a" * 70
    op = {"operationId": "same", "responses": {}}
    paths = {"/a": {"get": op, "post": op}, "/b": {"get": {"operationId": long_id}, "put": {"operationId": long_id}}}
    toolset = entry(tmp_path, write_json(tmp_path, tiny_spec(paths)))
    assert set(toolset.tools) == {"same", "same_2", "a" * 64, "a" * 62 + "_2"}


@pytest.mark.parametrize(
    ("wire", "expected"),
    [("filter[name]", "filter_name"), ("$select", "select"), ("X-Request-Id", "X-Request-Id"), ("a b", "a_b")],
)
def test_argument_names_are_safe_property_keys(wire: str, expected: str) -> None:
    """Argument names match ^[a-zA-Z0-9_.-]{1,64}$ (Anthropic's rule for property keys)."""
    assert argument_name(wire) == expected


def test_description_and_tags_are_kept(petstore: ToolSet) -> None:
    """The summary leads the description (light listings show it); tags are kept; deprecation is said."""
    tool = petstore.tools["listPets"]
    assert tool.summary == "List all pets"
    assert "optionally filtered by status and tags" in tool.description
    assert tool.tags == ("pets",)
    assert petstore.tools["deletePet"].description.endswith("Deprecated.")


# --- parameters and bodies -------------------------------------------------------------------------


def test_query_header_and_path_parameters_render(petstore: ToolSet) -> None:
    """Query parameters (arrays repeat the key, wire names kept) and header parameters are placed."""
    args = {"limit": 5, "status": "sold", "tags": ["a", "b"], "filter_name": "rex", "X-Request-Id": "r-1"}
    request = call(petstore, "listPets", args)
    assert request.url == (
        "https://eu.petstore.example.com/v1/pets?limit=5&status=sold&tags=a&tags=b&filter%5Bname%5D=rex"
    )
    assert ("X-Request-Id", "r-1") in request.headers
    assert request.body is None


def test_absent_optional_parameters_are_left_out(petstore: ToolSet) -> None:
    """An optional parameter the model does not pass is neither in the query nor in the headers."""
    request = call(petstore, "listPets", {"status": "available"})
    assert request.url.endswith("/pets?status=available")
    assert not any(name == "X-Request-Id" for name, _ in request.headers)


def test_ignored_headers_are_not_arguments(petstore: ToolSet) -> None:
    """A header parameter named Accept is ignored, as OpenAPI says."""
    assert "Accept" not in petstore.tools["listPets"].input_schema["properties"]


def test_path_parameter_is_one_encoded_segment(petstore: ToolSet) -> None:
    """A path argument cannot add segments to the path."""
    assert call(petstore, "getPetById", {"petId": 7}).url.endswith("/v1/pets/7")
    assert call(petstore, "getPetById", {"petId": "../x"}).url.endswith("/v1/pets/..%2Fx")


def test_json_body_properties_are_flattened(petstore: ToolSet) -> None:
    """An object body's properties are top-level arguments; absent ones are left out of the body."""
    schema = petstore.tools["createPet"].input_schema
    assert set(schema["properties"]) == {"X-Request-Id", "name", "tag", "birthday", "category"}
    assert schema["required"] == ["name"]
    request = call(petstore, "createPet", {"name": "Rex", "tag": None, "X-Request-Id": "r-2"})
    assert json.loads(request.body or b"") == {"name": "Rex"}
    assert ("Content-Type", "application/json") in request.headers


def test_flattened_body_keeps_json_types(petstore: ToolSet) -> None:
    """Nested objects and numbers reach the body with their JSON types."""
    args = {"petId": 3, "name": "Rex", "category": {"id": 2, "name": "dogs"}}
    request = call(petstore, "updatePet", args)
    assert request.method == "PUT"
    assert json.loads(request.body or b"") == {"name": "Rex", "category": {"id": 2, "name": "dogs"}}


def test_all_of_is_flattened_without_read_only_properties(petstore: ToolSet) -> None:
    """`allOf` members contribute their properties; a read-only `id` is not an argument."""
    properties = petstore.tools["updatePet"].input_schema["properties"]
    assert set(properties) == {"petId", "name", "tag", "birthday", "category", "status"}


def test_a_body_colliding_with_a_parameter_is_one_body_argument(petstore: ToolSet) -> None:
    """When a body property has a parameter's name, the whole body is the `body` argument."""
    schema = petstore.tools["place_order"].input_schema
    assert set(schema["properties"]) == {"storeId", "body"}
    assert schema["required"] == ["storeId", "body"]
    request = call(petstore, "place_order", {"storeId": 1, "body": {"storeId": 1, "petId": 9, "quantity": 2}})
    assert request.url.endswith("/stores/1/orders")
    assert json.loads(request.body or b"") == {"storeId": 1, "petId": 9, "quantity": 2}


def test_a_body_that_is_not_an_object_is_one_body_argument(petstore: ToolSet) -> None:
    """An array body is passed whole as `body` and sent as JSON."""
    schema = petstore.tools["replacePetTags"].input_schema
    assert schema["properties"]["body"] == {"type": "array", "items": {"type": "string"}}
    request = call(petstore, "replacePetTags", {"petId": 1, "body": ["a", "b"]})
    assert json.loads(request.body or b"") == ["a", "b"]


def test_form_body_is_urlencoded(petstore: ToolSet) -> None:
    """An application/x-www-form-urlencoded body is flattened and sent form-encoded."""
    request = call(petstore, "loginUser", {"username": "ann", "password": "s3cr&t"})
    assert request.body == b"username=ann&password=s3cr%26t"
    assert ("Content-Type", "application/x-www-form-urlencoded") in request.headers


def test_a_required_body_the_worker_cannot_build_makes_the_tool_unusable(petstore: ToolSet) -> None:
    """An octet-stream upload is known but unusable, with a reason the caller can read."""
    assert "uploadPetImage" not in petstore.tools
    assert "application/octet-stream" in petstore.unusable["uploadPetImage"]


def test_a_parameter_name_in_two_locations_gets_a_prefix(tmp_path: Path) -> None:
    """A query and a header parameter of one name become `version` and `header_version`."""
    params = [{"name": "version", "in": "query", "schema": {}}, {"name": "version", "in": "header", "schema": {}}]
    toolset = entry(
        tmp_path, write_json(tmp_path, tiny_spec({"/x": {"get": {"operationId": "x", "parameters": params}}}))
    )
    request = call(toolset, "x", {"version": "1", "header_version": "2"})
    assert request.url == "https://t.example/x?version=1"
    assert ("version", "2") in request.headers


def test_undeclared_path_parameters_become_required_strings(tmp_path: Path) -> None:
    """A path template naming a parameter the spec forgot still yields a working tool."""
    toolset = entry(tmp_path, write_json(tmp_path, tiny_spec({"/items/{id}": {"get": {"operationId": "item"}}})))
    assert toolset.tools["item"].input_schema == {
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
    }


# --- schemas ---------------------------------------------------------------------------------------


def test_schemas_are_built_on_first_use(petstore: ToolSet) -> None:
    """Loading builds no input schema; reading one builds and caches it."""
    tool = petstore.tools["createPet"]
    assert tool.schema_is_lazy
    assert all("input_schema" not in t.__dict__ for t in petstore.tools.values())
    assert tool.input_schema is tool.input_schema


def test_built_schemas_are_valid_json_schema(specs: Path) -> None:
    """Every input schema of every fixture spec is a valid draft 2020-12 object schema."""
    for spec in ("petstore.yaml", "swagger.json", "recursive.yaml"):
        toolset = entry(specs, spec)
        for tool in toolset.tools.values():
            Draft202012Validator.check_schema(tool.input_schema)
            assert tool.input_schema["type"] == "object"


def test_openapi_dialect_becomes_json_schema(petstore: ToolSet) -> None:
    """nullable, boolean exclusiveMaximum, example and YAML dates become 2020-12; OpenAPI-only keys go."""
    listing = petstore.tools["listPets"].input_schema["properties"]
    assert listing["limit"] == {
        "type": ["integer", "null"],
        "minimum": 1,
        "exclusiveMaximum": 100,
        "description": "How many pets to return at most",
    }
    pet = petstore.tools["createPet"].input_schema["properties"]
    assert pet["birthday"]["examples"] == ["2020-01-01"]
    assert pet["tag"]["type"] == ["string", "null"]
    assert "x-display" not in json.dumps(petstore.tools["updatePet"].input_schema)
    order = petstore.tools["place_order"].input_schema["properties"]["body"]
    assert "discriminator" not in order
    assert order["properties"]["code"] == {"type": "string"}  # `\p{L}` is no Python regex


def test_refs_into_other_files_are_resolved(petstore: ToolSet) -> None:
    """A `$ref` to a file beside the spec is followed, and refs inside that file are relative to it."""
    category = petstore.tools["createPet"].input_schema["properties"]["category"]
    assert category["properties"]["name"] == {"type": "string", "description": "The category's name"}


def test_recursive_schemas_are_cut_not_looped(specs: Path) -> None:
    """A schema that contains itself is expanded once, then stands as a permissive, described schema."""
    toolset = entry(specs, "recursive.yaml")
    children = toolset.tools["createTree"].input_schema["properties"]["children"]
    assert children["items"]["properties"]["children"]["items"]["description"].startswith("A TreeNode")
    spouse = toolset.tools["createPerson"].input_schema["properties"]["spouse"]
    assert spouse["properties"]["spouse"] == {
        "description": "A Person (nested too deeply or recursively to describe here).",
        "type": "object",
    }


def test_ref_chains_that_loop_and_refs_to_nothing_do_not_break_loading(specs: Path) -> None:
    """A `$ref` cycle without any schema in it and a dangling `$ref` become described permissive schemas."""
    properties = entry(specs, "recursive.yaml").tools["createLoop"].input_schema["properties"]
    assert "recursively" in properties["loop"]["description"]
    assert "points at nothing" in properties["missing"]["description"]


def test_deep_ref_nesting_is_bounded(tmp_path: Path) -> None:
    """A chain of 60 schemas, each holding the next, is cut after a few levels."""
    schemas = {
        f"S{i}": {"type": "object", "properties": {"next": {"$ref": f"#/components/schemas/S{i + 1}"}}}
        for i in range(60)
    }
    schemas["S60"] = {"type": "string"}
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/S0"}}}}
    spec = tiny_spec({"/x": {"post": {"operationId": "deep", "requestBody": body}}}, components={"schemas": schemas})
    schema = entry(tmp_path, write_json(tmp_path, spec)).tools["deep"].input_schema
    assert json.dumps(schema).count('"next"') < 12


# --- entries ----------------------------------------------------------------------------------------


def test_entry_base_url_replaces_the_servers(specs: Path) -> None:
    """base_url (a template) is the upstream's base URL."""
    toolset = entry(specs, "petstore.yaml", extra=", base_url: '${env:PETS_URL}'")
    assert toolset.upstreams["api"].base_url.env_names == ("PETS_URL",)


def test_an_upstream_defined_in_the_same_file_is_used(specs: Path) -> None:
    """The file's own `upstreams:` entry wins over the spec's servers."""
    toolset = load(
        specs,
        "upstreams:\n  api: {base_url: 'https://mirror.example.com', timeout_seconds: 3}\n"
        "openapi:\n  - {upstream: api, spec: petstore.yaml}\n",
    )
    assert toolset.problems == []
    assert toolset.upstreams["api"].base_url.source == "https://mirror.example.com"
    assert call(toolset, "getPetById", {"petId": 1}).url == "https://mirror.example.com/pets/1"


def test_base_url_beside_a_defined_upstream_is_a_problem(specs: Path) -> None:
    """An entry's base_url that would be ignored is reported."""
    toolset = load(
        specs,
        "upstreams:\n  api: {base_url: 'https://a.example.com'}\n"
        "openapi:\n  - {upstream: api, spec: petstore.yaml, base_url: 'https://b.example.com'}\n",
    )
    assert [p.message for p in toolset.problems] == ["base_url is not used: upstream 'api' is defined in upstreams:"]


def test_include_and_exclude_tags_filter_operations(specs: Path) -> None:
    """include_tags keeps operations with one of the tags; exclude_tags drops them."""
    assert set(entry(specs, "petstore.yaml", extra=", include_tags: [store]").tools) == {
        "place_order",
        "get_store_inventory",
    }
    assert set(entry(specs, "petstore.yaml", extra=", exclude_tags: [pets, store]").tools) == {"loginUser"}


@pytest.mark.parametrize(
    ("definitions", "message"),
    [
        ("openapi:\n  - {upstream: api, spec: missing.yaml}\n", "cannot read OpenAPI spec"),
        ("openapi:\n  - {upstream: api, spec: common.yaml}\n", "not an OpenAPI 3.x or Swagger 2.0 document"),
        ("openapi:\n  - {upstream: api, spec: petstore.yaml, tags: [x]}\n", "Extra inputs are not permitted"),
        ("openapi: {upstream: api}\n", "must be a list"),
    ],
)
def test_entry_problems_are_reported(specs: Path, definitions: str, message: str) -> None:
    """A missing spec, a document that is no spec, an unknown key and a bad shape are problems."""
    toolset = load(specs, definitions)
    assert any(message in p.message for p in toolset.problems), toolset.problems
    assert toolset.tools == {}


def test_a_spec_without_an_absolute_server_needs_a_base_url(tmp_path: Path) -> None:
    """A relative server URL cannot be an upstream; base_url makes the entry work."""
    spec = tiny_spec({"/x": {"get": {"operationId": "x"}}}) | {"servers": [{"url": "/api"}]}
    name = write_json(tmp_path, spec)
    assert "no absolute server URL" in entry(tmp_path, name).problems[0].message
    toolset = entry(tmp_path, name, extra=", base_url: 'https://t.example/api'")
    assert call(toolset, "x", {}).url == "https://t.example/api/x"


def test_spec_files_in_a_definitions_folder_are_recognised() -> None:
    """A spec met as a definitions file is accepted by the spec-file reader and yields nothing by itself."""
    doc = parse_file(FIXTURES / "swagger.json", {})
    reader = SpecFileReader()
    assert reader.accepts(doc)
    assert reader.read(doc).tools == {}
    assert not reader.accepts(parse_file(FIXTURES / "common.yaml", {}))


# --- Swagger 2.0 -------------------------------------------------------------------------------------


@pytest.fixture
def swagger(specs: Path) -> ToolSet:
    """The Swagger 2.0 fixture loaded through an `openapi:` entry."""
    return entry(specs, "swagger.json", upstream="legacy")


def test_swagger_base_url_is_scheme_host_and_base_path(swagger: ToolSet) -> None:
    """https is preferred among the schemes; basePath prefixes every path."""
    assert swagger.upstreams["legacy"].base_url.source == "https://petstore.example.com/api/v2"
    assert call(swagger, "deletePet", {"petId": 4, "api_key": "k"}).url == "https://petstore.example.com/api/v2/pet/4"


def test_swagger_body_parameter_is_flattened(swagger: ToolSet) -> None:
    """An `in: body` object is flattened; definitions refs, x-nullable and readOnly are honoured."""
    schema = swagger.tools["addPet"].input_schema
    assert set(schema["properties"]) == {"name", "photoUrls", "nickname", "category"}
    assert schema["required"] == ["name", "photoUrls"]
    assert schema["properties"]["nickname"]["type"] == ["string", "null"]
    request = call(swagger, "addPet", {"name": "Rex", "photoUrls": []})
    assert json.loads(request.body or b"") == {"name": "Rex", "photoUrls": []}


def test_swagger_form_data_and_query_arrays(swagger: ToolSet) -> None:
    """formData parameters make a urlencoded body; a query array repeats its key."""
    form = call(swagger, "updatePetWithForm", {"petId": 1, "name": "Rex"})
    assert form.body == b"name=Rex"
    query = call(swagger, "findPetsByStatus", {"status": ["sold", "pending"]})
    assert query.url.endswith("/pet/findByStatus?status=sold&status=pending")
    assert swagger.tools["findPetsByStatus"].input_schema["properties"]["status"]["items"]["enum"] == [
        "available",
        "pending",
        "sold",
    ]


def test_swagger_form_data_is_a_form_whatever_the_global_consumes(tmp_path: Path) -> None:
    """formData fields are sent urlencoded even when the spec's global `consumes` names only JSON."""
    form = [{"name": "note", "in": "formData", "type": "string"}, {"name": "id", "in": "query", "type": "string"}]
    spec = {
        "swagger": "2.0",
        "host": "t.example",
        "consumes": [JSON_TYPE],
        "paths": {"/n": {"post": {"parameters": form}}},
    }
    request = call(entry(tmp_path, write_json(tmp_path, spec)), "post_n", {"note": "hi", "id": "7"})
    assert (request.url, request.body) == ("https://t.example/n?id=7", b"note=hi")


def test_swagger_file_upload_is_unusable(swagger: ToolSet) -> None:
    """A multipart file upload is known but unusable."""
    assert "multipart/form-data" in swagger.unusable["uploadFile"]


# --- large specs -------------------------------------------------------------------------------------


def test_a_spec_of_1000_operations_loads_without_building_schemas(tmp_path: Path) -> None:
    """1,000 operations load as tools; listing and searching them builds no input schema."""
    toolset = file_store.load([write_spec(tmp_path, 1000)], environ={})
    assert toolset.problems == []
    assert len(toolset.tools) == 1000
    assert len(catalog.list_tools(toolset)) == 1000
    assert catalog.search(toolset, "delete crm resource 12 item", top_k=1)[0]["name"] == "deleteResource12"
    assert all("input_schema" not in tool.__dict__ for tool in toolset.tools.values())
    schema = toolset.tools["createResource7"].input_schema
    Draft202012Validator.check_schema(schema)
    assert "id" not in schema["properties"]


def test_the_generator_makes_the_number_of_operations_asked_for() -> None:
    """A partial last resource still counts exactly."""
    paths = generate_spec(12)["paths"].values()
    assert sum(len([m for m in item if m != "parameters"]) for item in paths) == 12


# --- import_openapi ----------------------------------------------------------------------------------


def sample_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """One plausible value per argument, by type."""
    samples = {"string": "v a/l", "integer": 3, "number": 1.5, "boolean": True, "array": ["x", "y"], "object": {"k": 1}}
    arguments = {}
    for name, prop in schema["properties"].items():
        kind = prop.get("type", "string")
        arguments[name] = samples[kind[0] if isinstance(kind, list) else kind]
    return arguments


@pytest.mark.parametrize("spec", ["petstore.yaml", "swagger.json", "recursive.yaml"])
def test_imported_documents_render_the_same_requests(specs: Path, spec: str) -> None:
    """The native document from import_openapi, loaded by the store, renders what the entry renders."""
    document = import_openapi(specs / spec, "api", None, [])
    (specs / "imported.yaml").write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    imported = file_store.load([specs / "imported.yaml"], environ={})
    direct = entry(specs, spec)
    assert imported.problems == []
    assert set(imported.tools) == set(direct.tools)
    for name, tool in imported.tools.items():
        assert not tool.schema_is_lazy
        assert tool.input_schema == direct.tools[name].input_schema
        arguments = sample_arguments(dict(tool.input_schema))
        assert call(imported, name, arguments) == call(direct, name, arguments)


def test_import_reports_operations_it_leaves_out(specs: Path) -> None:
    """Operations that cannot be mapped are left out of the document and listed as problems."""
    problems: list[Problem] = []
    document = import_openapi(specs / "petstore.yaml", "pets", "https://pets.example.com", ["pets"], problems=problems)
    assert document["upstreams"] == {"pets": {"base_url": "https://pets.example.com"}}
    assert {t["name"] for t in document["tools"]} == PETSTORE_TOOLS - {
        "place_order",
        "get_store_inventory",
        "loginUser",
    }
    assert [p.message for p in problems] == [
        "POST /pets/{petId}/image left out: its request body must be sent as application/octet-stream, "
        "which the worker cannot build"
    ]


def test_import_without_any_base_url_is_refused(tmp_path: Path) -> None:
    """A spec with no absolute server and no base URL given cannot be imported."""
    spec = tiny_spec({"/x": {"get": {}}}) | {"servers": []}
    with pytest.raises(SpecError, match="no absolute server URL"):
        import_openapi(tmp_path / write_json(tmp_path, spec), "api", None, [])
