"""Answers, piece by piece: the JSON-aware cut, output schemas per MCP revision, cache rules, Link headers,
and the definitions' `pagination:`, `cache:` and `output_schema:`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.call import cache, truncation
from worker.call.pagination import first_request, next_link
from worker.definitions.file_store import load as load_toolset
from worker.definitions.model import Auth
from worker.envelope import ToolResult
from worker.errors import EgressBlocked, InvalidArguments
from worker.gateway.mcp import output as mcp_output
from worker.http.transport import Response

SHAPES = Path(__file__).parent / "fixtures" / "answers" / "answers.yaml"
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=8), inner, max_size=8),
    max_leaves=60,
)


@given(JSON_VALUES, st.integers(min_value=40, max_value=400))
def test_a_cut_is_valid_json_within_the_limit(value: object, limit: int) -> None:
    """Whatever the value, the cut is JSON no longer than the limit; a value that fits is left whole."""
    cut = truncation.fit(value, limit)
    text = truncation.dumps(cut.value)
    assert json.loads(text) == cut.value and len(text) <= limit
    assert (cut.value == value and not cut.notes) == (len(truncation.dumps(value)) <= limit)


def test_arrays_keep_whole_leading_items_and_strings_a_marker() -> None:
    """An array keeps whole leading items (no marker inside it); a long string keeps its head and a marker."""
    cut = truncation.fit({"data": [{"id": n} for n in range(100)], "text": "t" * 30}, 120)
    assert cut.value["data"] == [{"id": n} for n in range(len(cut.value["data"]))]
    assert cut.note == f"kept {len(cut.value['data'])} of 100 items at $.data"
    long = truncation.fit({"body": "x" * 1000}, 100)
    assert long.value["body"].endswith("…[cut from 1000 characters]") and "$.body" in long.note


def test_legacy_revisions_get_object_roots() -> None:
    """Before 2026-07-28, an array schema and value are wrapped as {"items": ...}; a scalar is not structured."""
    array = {"type": "array", "items": {"$ref": "#/$defs/x"}, "$defs": {"x": {"type": "integer"}}}
    wrapped = mcp_output.legacy_schema(array)
    assert wrapped == {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/x"}}},
        "required": ["items"],
        "$defs": {"x": {"type": "integer"}},
    }
    assert mcp_output.legacy_schema({"type": "string"}) is None
    envelope = ToolResult("c", "t", structured=[1, 2])
    assert mcp_output.structured_content(envelope, "2025-11-25") == (True, {"items": [1, 2]})
    assert mcp_output.structured_content(envelope, "2026-07-28") == (True, [1, 2])
    assert mcp_output.structured_content(ToolResult("c", "t", structured=3), "2025-06-18") == (False, None)


@pytest.mark.parametrize(
    ("directives", "ttl"),
    [(None, 30), ("max-age=5", 5), ("public, max-age=600", 30), ("no-store", None), ("private", None),
     ("no-cache", None), ("max-age=0", None)],
)  # fmt: skip
def test_cache_control_decides_how_long(directives: str | None, ttl: int | None) -> None:
    """no-store, private and no-cache keep an answer out; a shorter max-age wins over ttl_seconds."""
    response = Response(200, "OK", "application/json", None, b"{}", True, "http://h/", cache_control=directives)
    assert cache.storable_ttl(ToolResult("c", "t"), response, 30) == ttl
    assert cache.storable_ttl(ToolResult("c", "t", exit_code=22), response, 30) is None


def test_cache_keys_differ_per_credential_and_hold_no_secret() -> None:
    """Another per-call credential, another key; the upstream's own secrets are named, never in the key."""
    toolset = load_toolset([SHAPES], {"TEST_UPSTREAM_URL": "http://127.0.0.1:1"})
    tool = toolset.tools["get_item"]
    upstream = toolset.upstreams[tool.upstream]
    fake = object()
    alice = cache.lookup(tool, upstream, {"id": 1}, {"X-User-Token": "alice"}, fake)  # type: ignore[arg-type]
    bob = cache.lookup(tool, upstream, {"id": 1}, {"X-User-Token": "bob"}, fake)  # type: ignore[arg-type]
    shared = cache.lookup(tool, upstream, {"id": 1}, {}, fake)  # type: ignore[arg-type]
    assert alice is not None and bob is not None and shared is not None
    assert len({alice.key, bob.key, shared.key}) == 3
    assert cache.credential_identity({}, upstream, None) == cache.SHARED_CREDENTIALS
    assert cache.credential_identity({"X-Other": "v"}, upstream, "alice") == cache.SHARED_CREDENTIALS  # not taken


def test_cache_keys_of_an_upstream_that_acts_for_its_users_differ_per_user() -> None:
    """Where the vault's tokens of the call's user go upstream, the user is part of the key: never shared."""
    toolset = load_toolset([SHAPES], {"TEST_UPSTREAM_URL": "http://127.0.0.1:1"})
    tool = toolset.tools["get_item"]
    acting = dataclasses.replace(toolset.upstreams[tool.upstream], auth=Auth("oauth2_user"))
    fake = object()
    keys = {
        user: cache.lookup(tool, acting, {"id": 1}, {}, fake, user).key  # type: ignore[arg-type, union-attr]
        for user in ("alice", "bob")
    }
    assert keys["alice"] != keys["bob"]
    assert cache.credential_identity({}, acting, "alice") != cache.SHARED_CREDENTIALS


def test_post_tools_have_no_cache_lookup() -> None:
    """A cache on an upstream applies to its GET tools only (methods default to GET and HEAD)."""
    toolset = load_toolset([SHAPES], {"TEST_UPSTREAM_URL": "http://127.0.0.1:1"})
    upstream = toolset.upstreams["cached_api"]
    fake = object()
    assert cache.lookup(toolset.tools["create_item"], upstream, {}, {}, fake) is None  # type: ignore[arg-type]
    assert cache.lookup(toolset.tools["read_item"], upstream, {}, {}, fake) is not None  # type: ignore[arg-type]


def test_link_header_next() -> None:
    """rel="next" is found among other relations and made absolute."""
    header = '<https://api.test/x?page=3>; rel="last", </x?page=2>; rel="next prefetch"'
    assert next_link(header, "https://api.test/x?page=1") == "https://api.test/x?page=2"
    assert next_link('<https://api.test/x?page=3>; rel="last"', "https://api.test/x") is None
    assert next_link(None, "https://api.test/x") is None


def test_continuations_become_the_page_request() -> None:
    """A cursor and an offset become query parameters; a next URL elsewhere is refused (exit 77)."""
    toolset = load_toolset([SHAPES], {"TEST_UPSTREAM_URL": "http://127.0.0.1:1"})
    users, items, issues = (toolset.tools[n] for n in ("list_users", "list_items", "list_issues"))
    api = toolset.upstreams["api"]
    environ = {"TEST_UPSTREAM_URL": "http://127.0.0.1:1", "TEST_SECRET_TOKEN": "s"}
    assert first_request(users, api, {"cursor": "c10"}, {}, environ).url.endswith("/users.list?limit=10&cursor=c10")
    assert first_request(items, api, {"offset": 20}, {}, environ).url.endswith("/items?offset=20&limit=10")
    assert first_request(items, api, {}, {}, environ).url.endswith("/items?offset=0&limit=10")
    with pytest.raises(EgressBlocked):
        first_request(issues, api, {"cursor": "http://127.0.0.2:1/repos?page=2"}, {}, environ)
    with pytest.raises(InvalidArguments):  # the rest of the upstream's host is not reached this way
        first_request(issues, api, {"cursor": "http://127.0.0.1:1/admin/users?page=2"}, {}, environ)
    same = first_request(issues, api, {"cursor": "http://127.0.0.1:1/repos/acme/app/issues?page=2"}, {}, environ)
    assert same.url == "http://127.0.0.1:1/repos/acme/app/issues?page=2"
    assert "cursor" in issues.input_schema["properties"]  # the continuation argument, described for the model


def test_the_issue_shapes_are_valid_definitions() -> None:
    """The four shapes of the contract load without a problem, with what they say."""
    toolset = load_toolset([SHAPES], {"TEST_UPSTREAM_URL": "http://127.0.0.1:1"})
    assert toolset.problems == []
    assert toolset.tools["list_issues"].pagination.style == "link"  # type: ignore[union-attr]
    assert toolset.tools["get_item"].cache.ttl_s == 30  # type: ignore[union-attr]
    assert toolset.tools["get_item"].output_schema["required"] == ["id"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ("pagination: {style: cursor, items: data}", "needs `next`"),
        ("pagination: {style: offset, param: offset}", "needs `param` and `limit`"),
        ("pagination: {style: pages}", "style"),
        ("pagination: {style: link, items: 'a[['}", "JMESPath"),
        ("cache: {ttl_seconds: 0}", "ttl_seconds"),
        ("cache: {ttl_seconds: 5, methods: [FETCH]}", "FETCH"),
        ("output_schema: {type: 12}", "output_schema"),
    ],
)
def test_bad_blocks_are_problems(tmp_path: Path, block: str, problem: str) -> None:
    """A bad pagination, cache or output_schema block is a problem naming what is wrong."""
    path = tmp_path / "bad.yaml"
    path.write_text(
        "upstreams: {api: {base_url: 'http://127.0.0.1:1'}}\n"
        f"tools:\n  - name: t\n    upstream: api\n    request: {{path: /x}}\n    {block}\n"
    )
    toolset = load_toolset([path], {})
    assert "t" not in toolset.tools
    assert any(problem in p.message for p in toolset.problems), [p.message for p in toolset.problems]


def test_the_envelope_carries_the_answer_fields_only_where_they_say_something() -> None:
    """A plain envelope has none of them; a hit from the cache says `cached` and its age, even an age of 0."""
    plain = ToolResult("c-1", "t").to_dict()
    assert not {"structuredContent", "truncation", "note", "pages", "next_cursor", "cached", "age"} & set(plain)
    hit = ToolResult("c-1", "t", cached=True, age=0, structured={"a": 1}).to_dict()
    assert hit["cached"] is True and hit["age"] == 0 and hit["structuredContent"] == {"a": 1}
    assert ToolResult.from_dict(hit).age == 0 and ToolResult.from_dict(plain).structured is None
