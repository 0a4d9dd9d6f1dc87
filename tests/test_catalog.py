"""The catalog: light listings, full schemas, lexical search, and exports for OpenAI, Anthropic and MCP."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from worker.definitions import catalog, file_store
from worker.definitions.model import ToolSet

FIXTURES = Path(__file__).parent / "fixtures" / "openapi"
LONG_DESCRIPTION = "Escalate a ticket to the on-call engineer. " * 40
NATIVE = f"""
upstreams:
  support: {{base_url: "https://support.example.com"}}
tools:
  - name: ticket_lookup
    upstream: support
    description: Look up a support ticket by ID. Returns status, priority and last update.
    tags: [support, tickets]
    input_schema:
      $schema: https://json-schema.org/draft/2020-12/schema
      $id: https://example.com/schemas/ticket-lookup
      type: object
      properties:
        ticket_id: {{type: string, examples: [TICKET-123], x-internal: true}}
        labels: {{type: array}}
        link: {{$ref: "https://example.com/schemas/link.json", description: A related link}}
        parent: {{$ref: "#/$defs/ticket"}}
        examples: {{type: string, description: a property that happens to be named examples}}
      $defs:
        ticket: {{type: string}}
      anyOf:
        - required: [ticket_id]
        - properties: {{reference: {{type: string}}}}
    request: {{method: GET, path: "/tickets/${{ticket_id}}"}}
  - name: ticket_escalate
    upstream: support
    description: "{LONG_DESCRIPTION}"
    tags: [support]
    input_schema:
      type: object
      properties:
        ticket_id: {{type: string}}
        severity: {{type: string, enum: [low, high]}}
      required: [ticket_id]
    request: {{method: POST, path: "/tickets/${{ticket_id}}/escalations"}}
"""

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANTHROPIC_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANTHROPIC_KEY = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
MCP_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@pytest.fixture
def toolset(tmp_path: Path) -> ToolSet:
    """The Petstore spec (lazy schemas), the recursive spec, and two native tools with awkward schemas."""
    for file in FIXTURES.iterdir():
        shutil.copy(file, tmp_path / file.name)
    (tmp_path / "native.yaml").write_text(NATIVE, encoding="utf-8")
    (tmp_path / "specs.yaml").write_text(
        "openapi:\n  - {upstream: petstore, spec: petstore.yaml}\n  - {upstream: trees, spec: recursive.yaml}\n",
        encoding="utf-8",
    )
    loaded = file_store.load([tmp_path / "native.yaml", tmp_path / "specs.yaml"], environ={})
    assert loaded.problems == []
    return loaded


def built(toolset: ToolSet) -> set[str]:
    return {name for name, tool in toolset.tools.items() if tool.schema_is_lazy and "input_schema" in tool.__dict__}


# --- listing -------------------------------------------------------------------------------------


def test_list_tools_gives_light_summaries_without_building_schemas(toolset: ToolSet) -> None:
    """Listing shows name, method, path, summary, tags and upstream, and builds no lazy schema."""
    listing = catalog.list_tools(toolset)
    assert [s["name"] for s in listing] == sorted(toolset.tools)
    assert next(s for s in listing if s["name"] == "getPetById") == {
        "name": "getPetById",
        "method": "GET",
        "path": "/pets/${petId}",
        "summary": "Find a pet by ID",
        "tags": ["pets"],
        "upstream": "petstore",
    }
    assert built(toolset) == set()


def test_list_tools_filters_by_any_of_the_tags(toolset: ToolSet) -> None:
    """A tool is listed when it has one of the tags asked for."""
    names = [s["name"] for s in catalog.list_tools(toolset, tags=["tickets", "user"])]
    assert names == ["loginUser", "ticket_lookup"]


def test_schemas_gives_full_definitions_and_missing_names(toolset: ToolSet) -> None:
    """Named tools come with their input schema; unknown names are listed as missing."""
    result = catalog.schemas(toolset, ["createPet", "nope", "ticket_lookup", "createPet"])
    assert [d["name"] for d in result["tools"]] == ["createPet", "ticket_lookup"]
    assert result["missing"] == ["nope"]
    assert result["tools"][0]["inputSchema"]["required"] == ["name"]
    assert built(toolset) == {"createPet"}


def test_upstream_tools_lists_the_tools_of_one_upstream(toolset: ToolSet) -> None:
    """Only the tools that call the named upstream are listed."""
    assert [s["name"] for s in catalog.upstream_tools(toolset, "support")] == ["ticket_escalate", "ticket_lookup"]
    assert catalog.upstream_tools(toolset, "elsewhere") == []


# --- search --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("find a pet by its id", "getPetById"),
        ("create a new pet", "createPet"),
        ("delete a pet", "deletePet"),
        ("list pets filtered by status", "listPets"),
        ("replace the tags of a pet", "replacePetTags"),
        ("place an order for a pet at a store", "place_order"),
        ("how many pets are in the inventory", "get_store_inventory"),
        ("log in with a username and password", "loginUser"),
        ("what is the priority of support ticket TICKET-123?", "ticket_lookup"),
        ("escalate a ticket to on-call", "ticket_escalate"),
        ("build a tree of nodes with children", "createTree"),
        ("add a person and their employer", "createPerson"),
    ],
)
def test_search_ranks_the_expected_tool_first(toolset: ToolSet, question: str, expected: str) -> None:
    """A question finds the tool a person would pick."""
    results = catalog.search(toolset, question, top_k=3)
    assert results[0]["name"] == expected, results
    assert results[0]["score"] > 0


def test_search_builds_no_schema_and_respects_top_k(toolset: ToolSet) -> None:
    """Search returns at most top_k summaries, best first, from what tools know without their schemas."""
    results = catalog.search(toolset, "pet", top_k=2)
    assert len(results) == 2
    assert results[0]["score"] >= results[1]["score"]
    assert set(results[0]) == {"name", "method", "path", "summary", "tags", "upstream", "score"}
    assert built(toolset) == set()


def test_search_uses_argument_names(toolset: ToolSet) -> None:
    """An argument name that appears nowhere else finds its tool (here a header parameter)."""
    assert catalog.search(toolset, "api key", top_k=1)[0]["name"] == "deletePet"


def test_search_without_matches_is_empty(toolset: ToolSet) -> None:
    """A question that shares no word with any tool finds nothing, and top_k 0 asks for nothing."""
    assert catalog.search(toolset, "zebra quantum", top_k=5) == []
    assert catalog.search(toolset, "pet", top_k=0) == []


def test_terms_split_names_and_drop_stop_words() -> None:
    """camelCase, snake_case and plurals are split and folded the same way on both sides."""
    assert catalog.terms("getPetsByID") == ["get", "pet", "id"]
    assert catalog.terms("ticket_lookup HTTPServer categories") == ["ticket", "lookup", "http", "server", "category"]


def test_a_search_index_is_reusable(toolset: ToolSet) -> None:
    """An index built once answers many questions."""
    index = catalog.SearchIndex(toolset.tools.values())
    assert index.search("login", 1)[0][0].name == "loginUser"
    assert index.search("inventory", 1)[0][0].name == "get_store_inventory"


def test_searches_of_one_toolset_share_an_index(toolset: ToolSet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is built once per set of tools (not on every call), and again when the tools change."""
    built: list[int] = []

    class Counting(catalog.SearchIndex):
        def __init__(self, tools: Any) -> None:
            built.append(1)
            super().__init__(tools)

    monkeypatch.setattr(catalog, "SearchIndex", Counting)
    monkeypatch.setattr(catalog, "_last_index", None)
    assert catalog.search(toolset, "login", 1)[0]["name"] == "loginUser"
    assert catalog.search(toolset, "inventory", 1)[0]["name"] == "get_store_inventory"
    assert len(built) == 1
    fewer = ToolSet(dict(toolset.upstreams), {k: v for k, v in toolset.tools.items() if k != "loginUser"})
    assert all(hit["name"] != "loginUser" for hit in catalog.search(fewer, "login user", 5))
    assert len(built) == 2


# --- exports -------------------------------------------------------------------------------------


def assert_object_schema(schema: dict[str, Any]) -> None:
    """What every consumer requires: a valid 2020-12 object schema, no top-level union, nothing unknown."""
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    assert isinstance(schema["properties"], dict)
    assert not {"oneOf", "anyOf", "allOf", "enum", "not", "$schema", "$id"} & set(schema)
    for node in walk(schema):
        assert not any(key.startswith("x-") for key in node)
        if node.get("type") == "array":
            assert "items" in node
        ref = node.get("$ref")
        assert ref is None or ref.startswith("#/$defs/")


def walk(node: Any) -> list[dict[str, Any]]:
    """Every mapping inside a schema (subschemas and property maps alike)."""
    if isinstance(node, dict):
        return [node, *(n for value in node.values() for n in walk(value))]
    if isinstance(node, list):
        return [n for value in node for n in walk(value)]
    return []


def test_openai_export_follows_the_function_calling_rules(toolset: ToolSet) -> None:
    """Names, 1024-character descriptions and object parameters as OpenAI requires."""
    exported = catalog.to_openai(toolset.tools.values())
    assert len(exported) == len(toolset.tools)
    for item in exported:
        assert item["type"] == "function"
        function = item["function"]
        assert OPENAI_NAME.match(function["name"])
        assert 0 < len(function["description"]) <= catalog.OPENAI_DESCRIPTION_LIMIT
        assert_object_schema(function["parameters"])
    lookup = next(i["function"] for i in exported if i["function"]["name"] == "ticket_lookup")
    assert "TICKET-123" not in json.dumps(lookup["parameters"])  # examples are left out
    escalate = next(i["function"] for i in exported if i["function"]["name"] == "ticket_escalate")
    assert escalate["description"].endswith("…")


def test_anthropic_export_follows_the_tool_rules(toolset: ToolSet) -> None:
    """Names, object input_schema and property keys as the Messages API requires."""
    for item in catalog.to_anthropic(toolset.tools.values()):
        assert set(item) == {"name", "description", "input_schema"}
        assert ANTHROPIC_NAME.match(item["name"])
        assert_object_schema(item["input_schema"])
        assert all(ANTHROPIC_KEY.match(key) for key in item["input_schema"]["properties"])


def test_mcp_export_gives_tools_list_entries(toolset: ToolSet) -> None:
    """MCP entries have name, description, an object inputSchema and method-derived annotations."""
    exported = {item["name"]: item for item in catalog.to_mcp(toolset.tools.values())}
    for item in exported.values():
        assert MCP_NAME.match(item["name"])
        assert_object_schema(item["inputSchema"])
    assert exported["getPetById"]["annotations"] == {"readOnlyHint": True, "openWorldHint": True}
    assert exported["deletePet"]["annotations"]["destructiveHint"] is True
    assert exported["updatePet"]["annotations"]["idempotentHint"] is True
    assert exported["ticket_lookup"]["inputSchema"]["properties"]["ticket_id"]["examples"] == ["TICKET-123"]


def test_exported_schemas_lose_what_consumers_reject(toolset: ToolSet) -> None:
    """$schema, $id, x-* keys, outside $refs and examples go; a top-level anyOf is merged; $defs refs stay."""
    schema = catalog.to_anthropic([toolset.tools["ticket_lookup"]])[0]["input_schema"]
    properties = schema["properties"]
    assert properties["ticket_id"] == {"type": "string"}
    assert properties["labels"] == {"type": "array", "items": {}}
    assert properties["link"] == {"description": "A related link"}
    assert properties["parent"] == {"$ref": "#/$defs/ticket"}
    assert properties["examples"]["description"] == "a property that happens to be named examples"
    assert properties["reference"] == {"type": "string"}
    assert "required" not in schema  # a union variant's requirement is not a requirement of the whole


def test_exports_take_definitions_as_schemas_returns_them(toolset: ToolSet) -> None:
    """Definitions fetched through the catalog export the same as the tools themselves."""
    definitions = catalog.schemas(toolset, ["createPet", "ticket_lookup"])["tools"]
    tools = [toolset.tools["createPet"], toolset.tools["ticket_lookup"]]
    assert catalog.to_openai(definitions) == catalog.to_openai(tools)
    assert catalog.to_mcp(definitions) == catalog.to_mcp(tools)


def test_exports_do_not_change_the_tools_schemas(toolset: ToolSet) -> None:
    """Cleaning for export works on copies: the worker still validates against the full schema."""
    tool = toolset.tools["ticket_lookup"]
    catalog.to_openai([tool])
    assert "$schema" in tool.input_schema
    assert tool.input_schema["properties"]["ticket_id"]["examples"] == ["TICKET-123"]
