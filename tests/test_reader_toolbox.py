"""SentinelAI's upstream -> tools YAML, read as its HttpToolReaders reads it (PhonePe/sentinel-ai).

templates.yml is sentinel-ai-toolbox-remote-http/src/test/resources/templates.yml, sqlite-api.yml is
sentinel-ai-examples/src/main/resources/http-tools/sqlite-api.yml and docs-example.yml is the example in
docs/docs/calling-remote-services.md, all copied unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from worker.call.rendering import render
from worker.definitions.file_store import load
from worker.definitions.model import ToolSet
from worker.definitions.readers import Document, parse_file, readers
from worker.definitions.readers.toolbox import (
    handlebars_text,
    parameter_schema,
    substitutor_text,
    upstream_url_variable,
)

FIXTURES = Path(__file__).parent / "fixtures" / "toolbox"
ENVIRON = {
    "TOOLWORKER_UPSTREAM_TEST_URL": "http://test.example:8080",
    "TOOLWORKER_UPSTREAM_SQLITE_API_URL": "http://localhost:9090",
    "SUPPORT_TOKEN": "support-token-1234",
}
TICKET = {"ticketId": "1", "status": "s", "comment": "c", "notify": True}


def rendered(toolset: ToolSet, name: str, arguments: dict[str, Any]) -> tuple[Any, ...]:
    tool = toolset.tools[name]
    request = render(tool, toolset.upstreams[tool.upstream], arguments, {}, ENVIRON)
    return request.method, request.url, request.headers, request.body


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toolbox.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["templates.yml", "sqlite-api.yml"])
def test_sentinelai_files_load_unchanged(name: str) -> None:
    """SentinelAI's own YAML files load with no problem when the upstream URL comes from the environment."""
    toolset = load([FIXTURES / name], ENVIRON)
    assert toolset.problems == []
    assert toolset.unusable == {}
    assert len(toolset.tools) == {"templates.yml": 3, "sqlite-api.yml": 7}[name]


def test_templates_render_like_their_native_equivalent() -> None:
    """Each tool of templates.yml renders the same request as the same tool written natively."""
    toolbox = load([FIXTURES / "templates.yml"], ENVIRON)
    native = load([FIXTURES / "templates_native.yaml"], ENVIRON)
    calls = {"getName": {}, "getLocation": {"name": 'Ann "the" User'}, "getWeatherForCity": {"city": "San José/x"}}
    for name, arguments in calls.items():
        assert rendered(toolbox, name, arguments) == rendered(native, name, arguments)


def test_every_engine_and_header_renders_like_native() -> None:
    """TEXT, TEXT_SUBSTITUTOR and HANDLEBARS, repeated headers and a path query render as native templates do."""
    toolbox = load([FIXTURES / "support.yml"], ENVIRON)
    native = load([FIXTURES / "support_native.yaml"], ENVIRON)
    assert toolbox.problems == native.problems == []
    arguments = {"ticketId": "T/1 ?", "status": 'open "now"', "comment": "line\nbreak", "notify": True}
    assert rendered(toolbox, "ticket_update", arguments) == rendered(native, "ticket_update", arguments)


def test_repeated_header_is_set_to_its_last_template() -> None:
    """OkHttp's header() replaces, so the last of several templates for a header is the one sent."""
    toolset = load([FIXTURES / "support.yml"], ENVIRON)
    headers = dict(rendered(toolset, "ticket_update", TICKET)[2])
    assert headers["Accept"] == "application/json"


def test_text_templates_are_literal() -> None:
    """A TEXT template never substitutes: `${notify}` in it is sent as written."""
    toolset = load([FIXTURES / "support.yml"], ENVIRON)
    headers = dict(rendered(toolset, "ticket_update", TICKET)[2])
    assert headers["X-Note"] == "costs ${notify} dollars"


def test_url_encode_lookup_becomes_an_encoded_query_value() -> None:
    """sqlite-api.yml's `?conditions=${urlEncode:conditions}` becomes a query entry, encoded on the wire."""
    toolset = load([FIXTURES / "sqlite-api.yml"], ENVIRON)
    _, url, _, _ = rendered(toolset, "read_records", {"tableName": "orders", "conditions": '{"a":"b c"}'})
    assert url == "http://localhost:9090/api/sqlite/records/orders?conditions=%7B%22a%22%3A%22b%20c%22%7D"
    _, url, _, _ = rendered(toolset, "read_records", {"tableName": "orders", "conditions": ""})
    assert url == "http://localhost:9090/api/sqlite/records/orders?conditions="


def test_jolt_transformer_is_applied_to_responses() -> None:
    """The JOLT transformer of getWeatherForCity reshapes the parsed response."""
    transform = load([FIXTURES / "templates.yml"], ENVIRON).tools["getWeatherForCity"].transform
    assert transform is not None
    assert transform({"location": "Bangalore", "weatherValue": "sunny"}) == {"weather": "sunny"}


def test_undeclared_parameter_is_reported_at_the_tool() -> None:
    """docs-example.yml's body names `${name}` where the parameter is `userName`: a problem with file and line."""
    toolset = load([FIXTURES / "docs-example.yml"], ENVIRON)
    [problem] = toolset.problems
    assert problem.source.file.endswith("docs-example.yml")
    assert problem.source.line == 12
    assert "'name'" in problem.message
    assert "getLocation" in toolset.unusable
    assert "getName" in toolset.tools


def test_schema_requires_every_parameter_and_nothing_else() -> None:
    """Like SentinelAI's HttpToolBox, every parameter is required and other arguments are refused."""
    schema = load([FIXTURES / "sqlite-api.yml"], ENVIRON).tools["update_records"].input_schema
    assert schema["required"] == ["tableName", "data", "conditions"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["data"] == {
        "type": "string",
        "description": "JSON object with column names and new values to set",
    }


@pytest.mark.parametrize(
    ("kind", "good", "bad"),
    [
        ("BYTE", [-128, 127], [128, -129, 1.5]),
        ("SHORT", [-32768, 32767], [32768, -32769]),
        ("INTEGER", [-(2**31), 2**31 - 1], [2**31, "1"]),
        ("LONG", [-(2**63), 2**63 - 1], [2**63]),
        ("FLOAT", [1.5, 2], ["1.5"]),
        ("DOUBLE", [1e300], [True]),
        ("BOOLEAN", [True], [1, "true"]),
        ("STRING", ["x", ""], [1]),
        ("CHARACTER", ["x"], ["", "xy"]),
        ("STRING_ARRAY", [["a", "b"], []], ["a", [1]]),
        ("BYTE_ARRAY", [[1, -128]], [[128]]),
        ("CHARACTER_ARRAY", [["a", "b"]], [["ab"]]),
    ],
)
def test_parameter_types_map_to_json_schema(kind: str, good: list[Any], bad: list[Any]) -> None:
    """Each SentinelAI parameter type accepts what its Java type holds: integer widths, one-character strings."""
    validator = jsonschema.Draft202012Validator(parameter_schema(kind))
    assert all(validator.is_valid(value) for value in good)
    assert not any(validator.is_valid(value) for value in bad)


def test_upstream_url_variable_name() -> None:
    """The fallback variable is TOOLWORKER_UPSTREAM_<NAME>_URL with non-alphanumerics as underscores."""
    assert upstream_url_variable("sqlite-api") == "TOOLWORKER_UPSTREAM_SQLITE_API_URL"
    assert upstream_url_variable("crm.v2") == "TOOLWORKER_UPSTREAM_CRM_V2_URL"


def test_url_in_the_file_is_the_base_url(tmp_path: Path) -> None:
    """An upstream's `url` is its base URL, and wins over the environment."""
    path = write(
        tmp_path,
        "test:\n"
        "  url: https://api.example.com/base\n"
        "  tools:\n"
        "    - metadata: {name: ping, description: Ping}\n"
        "      definition: {method: GET, path: {type: TEXT, content: /ping}}\n",
    )
    toolset = load([path], ENVIRON)
    assert toolset.problems == []
    assert rendered(toolset, "ping", {})[1] == "https://api.example.com/base/ping"


def test_without_url_the_upstream_is_unknown() -> None:
    """With no `url`, no variable and no native upstream of that name, every tool reports an unknown upstream."""
    toolset = load([FIXTURES / "templates.yml"], {})
    assert len(toolset.problems) == 3
    assert all("unknown upstream 'test'" in problem.message for problem in toolset.problems)


def test_native_upstream_of_the_same_name_supplies_the_url(tmp_path: Path) -> None:
    """A native `upstreams:` entry in another file gives the toolbox upstream its base URL."""
    native = tmp_path / "upstreams.yaml"
    native.write_text("upstreams:\n  test:\n    base_url: https://native.example.com\n")
    toolset = load([FIXTURES / "templates.yml", native], {})
    assert toolset.problems == []
    assert rendered(toolset, "getName", {})[1] == "https://native.example.com/api/v1/name"


def test_only_referenced_arguments_are_sent(tmp_path: Path) -> None:
    """As in SentinelAI, a parameter that no template names is not sent."""
    path = write(
        tmp_path,
        "svc:\n"
        "  url: https://svc.example.com\n"
        "  tools:\n"
        "    - metadata:\n"
        "        name: find\n"
        "        description: Find\n"
        "        parameters:\n"
        "          q: {description: Query, type: STRING}\n"
        "          unused: {description: Unused, type: INTEGER}\n"
        "      definition: {method: GET, path: {type: TEXT_SUBSTITUTOR, content: '/find?q=${q}'}}\n",
    )
    toolset = load([path], {})
    assert rendered(toolset, "find", {"q": "a b", "unused": 3})[1] == "https://svc.example.com/find?q=a%20b"


def test_body_is_sent_for_post_and_put_only(tmp_path: Path) -> None:
    """OkHttp sends no body for GET, HEAD and DELETE, so a body defined there is not sent."""
    path = write(
        tmp_path,
        "svc:\n"
        "  url: https://svc.example.com\n"
        "  tools:\n"
        "    - metadata: {name: drop, description: Drop}\n"
        "      definition:\n"
        "        method: DELETE\n"
        "        path: {type: TEXT, content: /things}\n"
        "        body: {type: TEXT, content: '{\"all\": true}'}\n",
    )
    toolset = load([path], {})
    assert rendered(toolset, "drop", {})[3] is None


def test_handlebars_blocks_are_refused_with_their_line(tmp_path: Path) -> None:
    """A Handlebars block helper cannot become a native template: a problem at the body's line."""
    path = write(
        tmp_path,
        "svc:\n"
        "  url: https://svc.example.com\n"
        "  tools:\n"
        "    - metadata:\n"
        "        name: notify\n"
        "        description: Notify\n"
        "        parameters:\n"
        "          names: {description: Names, type: STRING_ARRAY}\n"
        "      definition:\n"
        "        method: POST\n"
        "        path: {type: TEXT, content: /notify}\n"
        "        body:\n"
        "          type: HANDLEBARS\n"
        "          content: '{{#each names}}{{this}}{{/each}}'\n",
    )
    toolset = load([path], {})
    [problem] = toolset.problems
    assert problem.source.line == 12
    assert "{{#each names}}" in problem.message
    assert "only simple variables" in problem.message
    assert "notify" in toolset.unusable


def test_unsupported_jolt_operation_is_refused(tmp_path: Path) -> None:
    """A transformer with a JOLT operation other than shift, default or remove is a load problem."""
    path = write(
        tmp_path,
        "svc:\n"
        "  url: https://svc.example.com\n"
        "  tools:\n"
        "    - metadata: {name: get, description: Get}\n"
        "      definition: {method: GET, path: {type: TEXT, content: /x}}\n"
        "      transformer:\n"
        "        type: JOLT\n"
        '        config: \'[{"operation": "modify-overwrite-beta", "spec": {}}]\'\n',
    )
    toolset = load([path], {})
    [problem] = toolset.problems
    assert problem.source.line == 8
    assert "modify-overwrite-beta" in problem.message
    assert "shift, default, remove" in problem.message


@pytest.mark.parametrize(
    ("definition", "line", "message"),
    [
        ("{method: PATCH, path: {type: TEXT, content: /x}}", 5, "definition.method"),
        ("{method: GET, path: {type: text, content: /x}}", 5, "definition.path.type"),
        ("{method: GET, path: {type: TEXT, content: /x}, timeout: 3}", 5, "definition.timeout"),
        ("{method: GET}", 5, "definition.path"),
    ],
)
def test_format_errors_are_reported_with_their_line(tmp_path: Path, definition: str, line: int, message: str) -> None:
    """Keys and enum values are as strict as Jackson reads them, and each error has a line."""
    path = write(
        tmp_path,
        "svc:\n"
        "  url: https://svc.example.com\n"
        "  tools:\n"
        "    - metadata: {name: get, description: Get}\n"
        f"      definition: {definition}\n",
    )
    toolset = load([path], {})
    assert [p.source.line for p in toolset.problems] == [line]
    assert message in toolset.problems[0].message


def test_bad_tool_name_and_url_are_reported(tmp_path: Path) -> None:
    """Tool names follow the provider rule and the upstream url must be http(s) with a host."""
    path = write(
        tmp_path,
        "svc:\n"
        "  url: ftp://svc.example.com\n"
        "  tools:\n"
        "    - metadata: {name: 'get thing', description: Get}\n"
        "      definition: {method: GET, path: {type: TEXT, content: /x}}\n",
    )
    toolset = load([path], {})
    lines = sorted((p.source.line, p.message) for p in toolset.problems)
    assert [line for line, _ in lines] == [2, 4]
    assert "http(s) URL" in lines[0][1]
    assert "metadata.name" in lines[1][1]


@pytest.mark.parametrize(
    "name",
    ["templates.yml", "sqlite-api.yml", "support.yml", "docs-example.yml", "templates_native.yaml"],
)
def test_exactly_one_reader_accepts_each_file(name: str) -> None:
    """Readers are unambiguous: a toolbox file is taken by the toolbox reader only, a native file by native only."""
    doc: Document = parse_file(FIXTURES / name, {})
    accepting = [reader.name for reader in readers() if reader.accepts(doc)]
    assert accepting == (["native"] if name.endswith("_native.yaml") else ["toolbox"])


def test_upstream_named_kind_is_read_as_a_toolbox(tmp_path: Path) -> None:
    """An upstream called `kind` does not make the file look like a `kind: http` object."""
    path = write(
        tmp_path,
        "kind:\n"
        "  url: https://kind.example.com\n"
        "  tools:\n"
        "    - metadata: {name: ping, description: Ping}\n"
        "      definition: {method: GET, path: {type: TEXT, content: /ping}}\n",
    )
    toolset = load([path], {})
    assert toolset.problems == []
    assert rendered(toolset, "ping", {})[1] == "https://kind.example.com/ping"


@pytest.mark.parametrize(
    ("content", "native"),
    [
        ("/users/${id}", "/users/${id}"),
        ("$${id} is ${id}", "$${id} is ${id}"),
        ("${city:-Bangalore}", "${city}"),
        ("?q=${urlEncode:q}&r=${urlEncoder:r}", "?q=${q}&r=${r}"),
        ("Bearer ${env:TOKEN}", "Bearer ${env:TOKEN}"),
    ],
)
def test_text_substitutor_syntax_becomes_native(content: str, native: str) -> None:
    """StringSubstitutor's `${x}`, `$${` escape, defaults and URL-encoding lookups map onto native templates."""
    assert substitutor_text(content) == native


def test_unknown_substitutor_lookup_is_refused() -> None:
    """A StringSubstitutor lookup other than env and urlEncode has no native meaning."""
    with pytest.raises(ValueError, match="'base64Encoder'"):
        substitutor_text("${base64Encoder:x}")


@pytest.mark.parametrize(
    ("content", "native"),
    [
        ('{"name": "{{name}}"}', '{"name": "${name}"}'),
        ("{{{ raw }}} and {{ spaced }}", "${raw} and ${spaced}"),
        ("a{{! a comment }}b", "ab"),
        ("\\{{literal}} costs ${x}", "{{literal}} costs $${x}"),
    ],
)
def test_handlebars_variables_become_native(content: str, native: str) -> None:
    """Simple Handlebars variables become `${x}`; comments vanish; literal `${` is escaped."""
    assert handlebars_text(content) == native


@pytest.mark.parametrize(
    "content", ["{{#if a}}x{{/if}}", "{{> partial}}", "{{upper name}}", "{{user.name}}", "{{this}}", "{{@index}}"]
)
def test_handlebars_beyond_variables_is_refused(content: str) -> None:
    """Block helpers, partials, helpers with arguments, paths and data variables are refused."""
    with pytest.raises(ValueError, match="only simple variables"):
        handlebars_text(content)
