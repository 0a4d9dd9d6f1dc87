"""`kind: http` tool objects (SPEC §2.2.2): one URL per tool, arguments as query or JSON body."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker import constants
from worker.call.rendering import render
from worker.definitions.file_store import load
from worker.definitions.model import ToolSet
from worker.definitions.readers import parse_file, readers

FIXTURES = Path(__file__).parent / "fixtures" / "kind_http"
ENVIRON = {"SUPPORT_TOKEN": "support-token-1234", "CRM_KEY": "crm-key-5678"}


def rendered(toolset: ToolSet, name: str, arguments: dict[str, Any]) -> tuple[Any, ...]:
    tool = toolset.tools[name]
    request = render(tool, toolset.upstreams[tool.upstream], arguments, {}, ENVIRON)
    return request.method, request.url, request.headers, request.body


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "tool.json"
    path.write_text(json.dumps(data))
    return path


def http_tool(**config: Any) -> dict[str, Any]:
    return {"kind": "http", "name": "t", "config": {"url": "https://api.example.com/x", **config}}


def test_single_object_file_loads() -> None:
    """A JSON file with one object is one tool with an upstream of its own."""
    toolset = load([FIXTURES / "ticket_lookup.json"], ENVIRON)
    assert toolset.problems == []
    tool = toolset.tools["ticket_lookup"]
    upstream = toolset.upstreams["http:ticket_lookup"]
    assert tool.upstream == "http:ticket_lookup"
    assert tool.description.startswith("Look up a support ticket")
    assert (upstream.timeout_s, upstream.max_output_chars) == (5, 8000)


def test_get_sends_arguments_as_query_like_native() -> None:
    """GET appends the arguments to the URL's own query, as the equivalent native tool does."""
    arguments = {"ticket_id": "T 1", "expand": ["history", "owner"]}
    kind_http = rendered(load([FIXTURES / "ticket_lookup.json"], ENVIRON), "ticket_lookup", arguments)
    native = rendered(load([FIXTURES / "ticket_lookup_native.yaml"], ENVIRON), "ticket_lookup", arguments)
    assert kind_http == native
    query = "source=agent&ticket_id=T%201&expand=history&expand=owner"
    assert kind_http[1] == f"https://api.example.com/tickets/search?{query}"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("create_lead", {"email": "a@example.com", "score": 7, "tags": ["vip"]}),
        ("delete_lead", {"lead_id": 42}),
    ],
)
def test_list_file_renders_like_native(name: str, arguments: dict[str, Any]) -> None:
    """Each object of a YAML list renders the same request as its native equivalent."""
    kind_http = load([FIXTURES / "crm.yaml"], ENVIRON)
    native = load([FIXTURES / "crm_native.yaml"], ENVIRON)
    assert kind_http.problems == native.problems == []
    assert rendered(kind_http, name, arguments) == rendered(native, name, arguments)


def test_post_is_the_default_and_sends_a_json_body() -> None:
    """Without a method the tool POSTs its arguments as a JSON object, keeping their types."""
    toolset = load([FIXTURES / "crm.yaml"], ENVIRON)
    method, url, headers, body = rendered(toolset, "create_lead", {"email": "e", "score": 3})
    assert (method, url) == ("POST", "https://crm.example.com/api/leads")
    assert json.loads(body) == {"email": "e", "score": 3}
    assert ("Content-Type", "application/json") in headers
    assert ("X-Api-Key", "crm-key-5678") in headers


@pytest.mark.parametrize(("method", "in_query"), [("GET", True), ("HEAD", True), ("OPTIONS", True), ("PUT", False)])
def test_method_decides_where_arguments_go(tmp_path: Path, method: str, in_query: bool) -> None:
    """GET, HEAD, DELETE and OPTIONS put arguments in the query; POST, PUT and PATCH in the body."""
    toolset = load([write(tmp_path, http_tool(method=method))], {})
    _, url, _, body = rendered(toolset, "t", {"q": "x"})
    assert (url.endswith("?q=x"), body is None) == (in_query, in_query)


def test_defaults(tmp_path: Path) -> None:
    """Defaults: POST, a 10 second timeout and 16000 characters of output."""
    toolset = load([write(tmp_path, http_tool())], {})
    upstream = toolset.upstreams["http:t"]
    assert toolset.tools["t"].request.method == "POST"
    assert upstream.timeout_s == constants.DEFAULT_UPSTREAM_TIMEOUT_S == 10
    assert upstream.max_output_chars == constants.DEFAULT_MAX_OUTPUT_CHARS == 16000


def test_arguments_in_the_url_are_refused_with_their_line(tmp_path: Path) -> None:
    """The URL and headers may read the environment but not arguments: a problem at the object's config."""
    path = tmp_path / "tools.yaml"
    path.write_text(
        "- kind: http\n"
        "  name: ok\n"
        "  config: {url: 'https://api.example.com/ok'}\n"
        "- kind: http\n"
        "  name: bad\n"
        "  config:\n"
        "    url: https://api.example.com/${id}\n",
    )
    toolset = load([path], {})
    [problem] = toolset.problems
    assert problem.source.line == 6
    assert "not arguments" in problem.message
    assert "ok" in toolset.tools
    assert "bad" in toolset.unusable


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (http_tool(method="FETCH"), "bad method"),
        ({**http_tool(), "name": "has space"}, "name"),
        ({**http_tool(), "kind": "mcp"}, "kind"),
        ({"kind": "http", "name": "t"}, "config"),
        (http_tool(timeout_seconds=0), "timeout_seconds"),
        (http_tool(headers={"X-Id": "${id}"}), "not arguments"),
    ],
)
def test_invalid_objects_are_reported(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    """Bad methods, names, kinds, timeouts and argument templates are load problems."""
    toolset = load([write(tmp_path, data)], {})
    assert toolset.tools == {}
    assert len(toolset.problems) == 1
    assert message in toolset.problems[0].message


def test_invalid_schema_is_checked_centrally(tmp_path: Path) -> None:
    """An invalid input_schema is reported by the store like any other format's."""
    toolset = load([write(tmp_path, {**http_tool(), "input_schema": {"type": 5}})], {})
    [problem] = toolset.problems
    assert "invalid input_schema" in problem.message


@pytest.mark.parametrize("name", ["ticket_lookup.json", "crm.yaml", "ticket_lookup_native.yaml"])
def test_exactly_one_reader_accepts_each_file(name: str) -> None:
    """A `kind: http` file is taken by its reader only, and the native equivalents by the native reader."""
    doc = parse_file(FIXTURES / name, {})
    accepting = [reader.name for reader in readers() if reader.accepts(doc)]
    assert accepting == (["native"] if name.endswith("_native.yaml") else ["kind: http"])
