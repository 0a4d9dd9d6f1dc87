"""Request rendering (placement rules, secrets): a pure function from definition and arguments."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from worker.call.arguments import ArgumentSchema
from worker.call.rendering import render
from worker.constants import REDACTED
from worker.definitions.model import Source, Tool, Upstream
from worker.definitions.readers.native import ToolModel, build_tool
from worker.definitions.readers.upstreams import UpstreamModel, build_upstream
from worker.errors import InvalidArguments, ToolMisconfigured
from worker.http.transport import PreparedRequest
from worker.redaction import redact

BASE = "https://api.example.com/v1"
TOKEN = "env-token-0123456789"


def upstream_from(base_url: str = BASE, **fields: Any) -> Upstream:
    """An upstream as the native format would define it."""
    model = UpstreamModel.model_validate({"base_url": base_url, **fields})
    return build_upstream("api", model, Source("test.yaml", 1))


def tool_from(properties: dict[str, Any] | None = None, **request: Any) -> Tool:
    """A tool as the native format would define it; every argument is declared as-is."""
    schema = {"type": "object", "properties": {name: {} for name in properties or {}}}
    model = ToolModel.model_validate({"name": "t", "upstream": "api", "input_schema": schema, "request": request})
    return build_tool(model, Source("test.yaml", 1))


def rendered(
    arguments: dict[str, Any] | None = None,
    *,
    upstream: Upstream | None = None,
    call_headers: dict[str, str] | None = None,
    environ: dict[str, str] | None = None,
    **request: Any,
) -> PreparedRequest:
    """Render a one-off tool whose request is `request`."""
    return render(
        tool_from(arguments, **request),
        upstream or upstream_from(),
        arguments or {},
        call_headers or {},
        {"TOKEN": TOKEN} if environ is None else environ,
    )


def header(prepared: PreparedRequest, name: str) -> str | None:
    values = [value for key, value in prepared.headers if key.lower() == name.lower()]
    assert len(values) <= 1, f"header {name} sent {len(values)} times"
    return values[0] if values else None


def header_names(prepared: PreparedRequest) -> set[str]:
    return {name.lower() for name, _ in prepared.headers}


def query_of(prepared: PreparedRequest) -> list[tuple[str, str]]:
    return list(URL(prepared.url, encoded=True).query.items())


# --- path -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "segment"),
    [
        ("TICKET-123", "TICKET-123"),
        ("../x", "..%2Fx"),
        ("../../admin", "..%2F..%2Fadmin"),
        ("a?b=1", "a%3Fb%3D1"),
        ("a#frag", "a%23frag"),
        ("a/b", "a%2Fb"),
        ("100%", "100%25"),
        ("%2F", "%252F"),
        ("a b", "a%20b"),
        ("café ☕", "caf%C3%A9%20%E2%98%95"),
        ("user@host:80", "user%40host%3A80"),
        ("a\\b", "a%5Cb"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        (42, "42"),
    ],
)
def test_path_value_is_one_encoded_segment(value: Any, segment: str) -> None:
    """A path argument is percent-encoded as exactly one segment: no traversal, query or fragment."""
    prepared = rendered({"id": value}, path="/items/${id}")
    assert prepared.url == f"{BASE}/items/{segment}"
    parsed = URL(prepared.url, encoded=True)
    assert parsed.raw_query_string == "" and parsed.raw_fragment == ""
    assert parsed.raw_path.startswith("/v1/items/")
    assert unquote(parsed.raw_path.rsplit("/", 1)[1]) == str(value)


def test_path_value_in_the_middle_of_a_segment() -> None:
    """A value between literals stays inside its segment."""
    prepared = rendered({"id": "a/b"}, path="/items/v-${id}.json")
    assert prepared.url == f"{BASE}/items/v-a%2Fb.json"


@pytest.mark.parametrize("arguments", [{"id": ""}, {}, {"id": None}])
def test_path_value_empty_or_absent_is_refused(arguments: dict[str, Any]) -> None:
    """An empty or absent path argument is an argument error naming the argument (exit 65)."""
    with pytest.raises(InvalidArguments) as info:
        render(tool_from({"id": None}, path="/items/${id}"), upstream_from(), arguments, {}, {})
    assert info.value.exit_code == 65
    assert "`id`" in info.value.message


def test_base_url_path_is_kept() -> None:
    """The tool's path is appended to the base URL's own path, with one slash between them."""
    assert rendered(path="/tickets").url == f"{BASE}/tickets"
    assert rendered(upstream=upstream_from(BASE + "/"), path="tickets").url == f"{BASE}/tickets"
    assert rendered().url == BASE


# --- query ------------------------------------------------------------------------------------


def test_query_static_and_argument() -> None:
    """Query entries are rendered in order, with static values kept."""
    prepared = rendered({"status": "open"}, query={"expand": "history", "status": "${status}"})
    assert query_of(prepared) == [("expand", "history"), ("status", "open")]


def test_query_array_repeats_the_key() -> None:
    """An array value repeats the query key once per element."""
    prepared = rendered({"tags": ["a", "b c", 3]}, query={"tag": "${tags}"})
    assert query_of(prepared) == [("tag", "a"), ("tag", "b c"), ("tag", "3")]


@pytest.mark.parametrize("template", ["${status}", "state:${status}"])
def test_query_entry_naming_an_absent_argument_is_dropped(template: str) -> None:
    """A query entry whose template names an absent optional argument is left out."""
    prepared = render(
        tool_from({"status": None}, query={"status": template, "fixed": "yes"}), upstream_from(), {}, {}, {}
    )
    assert query_of(prepared) == [("fixed", "yes")]


def test_query_values_cannot_add_parameters() -> None:
    """Query values are encoded: `&`, `=` and `#` stay inside the value."""
    value = "x&admin=true#frag"
    prepared = rendered({"q": value}, query={"q": "${q}"})
    assert query_of(prepared) == [("q", value)]
    assert URL(prepared.url, encoded=True).raw_fragment == ""


def test_query_interpolation_in_longer_value() -> None:
    """A placeholder inside a longer query value is interpolated."""
    prepared = rendered({"name": "ann & bob"}, query={"filter": "name eq '${name}'"})
    assert query_of(prepared) == [("filter", "name eq 'ann & bob'")]


def test_query_booleans_and_numbers() -> None:
    """Booleans read as true/false and numbers as JSON in the query string."""
    prepared = rendered({"flag": True, "n": 2.5}, query={"flag": "${flag}", "n": "${n}"})
    assert query_of(prepared) == [("flag", "true"), ("n", "2.5")]


# --- headers ----------------------------------------------------------------------------------


def test_header_template_rendered() -> None:
    """Header templates interpolate arguments."""
    prepared = rendered({"lang": "fr"}, headers={"Accept-Language": "${lang}", "Accept": "application/json"})
    assert header(prepared, "Accept-Language") == "fr"
    assert header(prepared, "Accept") == "application/json"


def test_header_entry_naming_an_absent_argument_is_dropped() -> None:
    """A header entry whose template names an absent optional argument is not sent."""
    tool = tool_from({"lang": None}, headers={"Accept-Language": "${lang}", "Accept": "application/json"})
    prepared = render(tool, upstream_from(), {}, {}, {})
    assert header(prepared, "Accept-Language") is None
    assert header(prepared, "Accept") == "application/json"


@pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "a\nb", "a\rb", "a\x00b"])
def test_header_value_with_cr_lf_nul_is_refused(value: str) -> None:
    """CR, LF and NUL in a rendered header value are refused with exit 65."""
    with pytest.raises(InvalidArguments) as info:
        rendered({"lang": value}, headers={"Accept-Language": "${lang}"})
    assert info.value.exit_code == 65


# --- body -------------------------------------------------------------------------------------


def test_structured_body_keeps_json_types() -> None:
    """A leaf that is exactly `${name}` keeps the argument's JSON type; absent leaves are dropped."""
    arguments = {"n": 3, "flag": False, "items": [1, "two", None], "obj": {"k": [True]}, "ratio": 0.5, "s": "x"}
    body = {
        "n": "${n}",
        "flag": "${flag}",
        "items": "${items}",
        "obj": "${obj}",
        "ratio": "${ratio}",
        "s": "${s}",
        "missing": "${missing}",
        "nested": {"list": ["${n}", "${missing}", "lit"], "fixed": 7, "null": None},
    }
    tool = tool_from({**arguments, "missing": None}, method="POST", body=body)
    prepared = render(tool, upstream_from(), arguments, {}, {})
    assert prepared.body is not None
    assert json.loads(prepared.body) == {
        **arguments,
        "nested": {"list": [3, "lit"], "fixed": 7, "null": None},
    }
    assert header(prepared, "Content-Type") == "application/json"


def test_structured_body_interpolates_longer_strings() -> None:
    """Inside a longer string a value is interpolated as text."""
    prepared = rendered({"name": 'Ann "A"', "n": 3}, method="POST", body={"greeting": "hi ${name}, you have ${n}"})
    assert prepared.body is not None
    assert json.loads(prepared.body) == {"greeting": 'hi Ann "A", you have 3'}


def test_structured_body_null_argument_is_dropped() -> None:
    """An argument given as null counts as absent in a structured body."""
    prepared = rendered({"note": None, "title": "t"}, method="POST", body={"note": "${note}", "title": "${title}"})
    assert prepared.body is not None
    assert json.loads(prepared.body) == {"title": "t"}


@pytest.mark.parametrize(
    "value",
    ['x", "admin": true, "y": "', 'x\\", "admin": true}', "a\\", '"', "\\u0022", "line\nbreak\ttab\x01", "é☕"],
)
def test_text_json_body_cannot_break_out(value: str) -> None:
    """In a text body with a JSON content type, values are JSON-escaped and stay in their string."""
    prepared = rendered({"title": value}, method="POST", body='{"title": "${title}", "kind": "note"}')
    assert prepared.body is not None
    assert json.loads(prepared.body) == {"title": value, "kind": "note"}


def test_text_json_body_with_a_json_suffix_type() -> None:
    """`application/*+json` content types get JSON escaping too."""
    value = 'x", "admin": "1'
    prepared = rendered(
        {"title": value},
        method="POST",
        body='{"title": "${title}"}',
        content_type="application/vnd.api+json; charset=utf-8",
    )
    assert prepared.body is not None
    assert json.loads(prepared.body) == {"title": value}
    assert header(prepared, "Content-Type") == "application/vnd.api+json; charset=utf-8"


def test_text_form_body_encodes_values() -> None:
    """In a form text body, values are form-encoded and cannot add fields."""
    value = "x&role=admin=1 +%"
    prepared = rendered(
        {"name": value},
        method="POST",
        body="name=${name}&kind=note",
        content_type="application/x-www-form-urlencoded",
    )
    assert prepared.body is not None
    assert parse_qs(prepared.body.decode(), strict_parsing=True) == {"name": [value], "kind": ["note"]}


def test_text_form_body_with_a_number() -> None:
    """In a form text body, a number argument is rendered as its text."""
    prepared = rendered(
        {"n": 3, "ok": True},
        method="POST",
        body="n=${n}&ok=${ok}",
        content_type="application/x-www-form-urlencoded",
    )
    assert prepared.body is not None
    assert parse_qs(prepared.body.decode(), strict_parsing=True) == {"n": ["3"], "ok": ["true"]}


def test_structured_body_with_form_content_type() -> None:
    """A structured body with the form content type is sent form-encoded, arrays repeating the key."""
    prepared = rendered(
        {"name": "a&b", "tags": ["x", "y"]},
        method="POST",
        body={"name": "${name}", "tag": "${tags}"},
        content_type="application/x-www-form-urlencoded",
    )
    assert prepared.body is not None
    assert parse_qs(prepared.body.decode(), strict_parsing=True) == {"name": ["a&b"], "tag": ["x", "y"]}
    assert header(prepared, "Content-Type") == "application/x-www-form-urlencoded"


def test_text_plain_body_is_interpolated_verbatim() -> None:
    """A text body of another content type takes the values as they are."""
    prepared = rendered({"msg": 'hi "there"'}, method="POST", body="say: ${msg}", content_type="text/plain")
    assert prepared.body == b'say: hi "there"'
    assert header(prepared, "Content-Type") == "text/plain"


def test_no_body_no_content_type() -> None:
    """A request without a body has no body and no Content-Type."""
    prepared = rendered(path="/x")
    assert prepared.body is None
    assert header(prepared, "Content-Type") is None


# --- unreferenced arguments ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "OPTIONS"])
def test_unreferenced_arguments_go_to_the_query(method: str) -> None:
    """For GET-like methods, arguments no template names are sent as query parameters."""
    prepared = rendered({"id": "7", "city": "Paris", "tags": ["a", "b"]}, method=method, path="/w/${id}")
    assert prepared.url.startswith(f"{BASE}/w/7?")
    assert sorted(query_of(prepared)) == [("city", "Paris"), ("tags", "a"), ("tags", "b")]
    assert prepared.body is None


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_unreferenced_arguments_go_to_the_json_body(method: str) -> None:
    """For POST/PUT/PATCH, arguments no template names form a JSON body object, types kept."""
    prepared = rendered({"id": "7", "city": "Paris", "n": 2, "ok": True}, method=method, path="/w/${id}")
    assert prepared.body is not None
    assert json.loads(prepared.body) == {"city": "Paris", "n": 2, "ok": True}
    assert query_of(prepared) == []
    assert header(prepared, "Content-Type") == "application/json"


def test_unreferenced_arguments_merge_into_structured_body_template_wins() -> None:
    """Unreferenced arguments are merged into a structured body; the template's keys win."""
    prepared = rendered(
        {"title": "t", "kind": "evil", "extra": 1},
        method="POST",
        body={"title": "${title}", "kind": "fixed"},
    )
    assert prepared.body is not None
    assert json.loads(prepared.body) == {"title": "t", "kind": "fixed", "extra": 1}


def test_referenced_arguments_are_not_repeated() -> None:
    """An argument used by a template is not also sent as an unreferenced one."""
    prepared = rendered({"id": "7", "q": "x"}, path="/w/${id}", query={"search": "${q}"})
    assert query_of(prepared) == [("search", "x")]


# --- secrets -----------------------------------------------------------------------------------


def test_env_header_is_secret() -> None:
    """`${env:...}` values are recorded as secrets and their headers as secret headers."""
    upstream = upstream_from(headers={"Authorization": "Bearer ${env:TOKEN}", "X-Tenant": "${env:TENANT}"})
    prepared = render(tool_from(), upstream, {}, {}, {"TOKEN": TOKEN, "TENANT": "tenant-4242"})
    assert header(prepared, "Authorization") == f"Bearer {TOKEN}"
    assert {TOKEN, "tenant-4242"} <= prepared.secrets
    assert {"authorization", "x-tenant"} <= {name.lower() for name in prepared.secret_headers}


def test_env_value_outside_headers_is_secret() -> None:
    """An `${env:...}` value used in the query or body is a secret too."""
    prepared = rendered(method="POST", query={"key": "${env:TOKEN}"}, body={"k": "${env:TOKEN}"})
    assert TOKEN in prepared.secrets
    assert TOKEN not in redact(prepared.url, prepared.secrets)


def test_env_default_is_used() -> None:
    """An unset variable with a default renders the default."""
    prepared = render(tool_from(headers={"X-Region": "${env:REGION:-eu}"}), upstream_from(), {}, {}, {})
    assert header(prepared, "X-Region") == "eu"


def test_base_url_from_env_is_not_a_secret() -> None:
    """Where to connect is configuration: an env base URL is not redacted."""
    upstream = upstream_from("${env:API_URL}")
    prepared = render(tool_from(path="/x"), upstream, {}, {}, {"API_URL": "http://127.0.0.1:8765"})
    assert prepared.url == "http://127.0.0.1:8765/x"
    assert "http://127.0.0.1:8765" not in prepared.secrets
    assert redact(prepared.url, prepared.secrets) == prepared.url


def test_base_url_password_is_a_secret() -> None:
    """A password in the base URL is a secret, redacted wherever the URL is shown."""
    upstream = upstream_from("https://user:pa55-w0rd-x@api.example.com")
    prepared = render(tool_from(path="/x"), upstream, {}, {}, {})
    assert "pa55-w0rd-x" in prepared.secrets
    assert "pa55-w0rd-x" not in redact(prepared.url, prepared.secrets)


@pytest.mark.parametrize(
    ("where", "fields", "request_fields"),
    [
        ("header", {"headers": {"Authorization": "Bearer ${env:NOPE}"}}, {}),
        ("base_url", {"base_url": "${env:NOPE}"}, {}),
        ("path", {}, {"path": "/${env:NOPE}/x"}),
        ("query", {}, {"query": {"k": "${env:NOPE}"}}),
        ("body", {}, {"method": "POST", "body": {"k": "${env:NOPE}"}}),
    ],
)
def test_missing_env_is_a_configuration_error(where: str, fields: dict[str, Any], request_fields: Any) -> None:
    """An `${env:...}` without default naming an unset variable is exit 78, naming the variable."""
    upstream = upstream_from(**{"base_url": BASE, **fields})
    with pytest.raises(ToolMisconfigured) as info:
        render(tool_from(**request_fields), upstream, {}, {}, {})
    assert info.value.exit_code == 78
    assert "NOPE" in info.value.message


# --- call headers ------------------------------------------------------------------------------


def test_allowed_call_header_is_sent_and_secret() -> None:
    """A call header listed in overridable_headers is sent, case-insensitively, and treated as a secret."""
    upstream = upstream_from(overridable_headers=["X-User-Token"])
    prepared = render(tool_from(), upstream, {}, {"x-user-token": "user-secret-77"}, {})
    assert header(prepared, "X-User-Token") == "user-secret-77"
    assert "user-secret-77" in prepared.secrets
    assert "x-user-token" in {name.lower() for name in prepared.secret_headers}
    assert prepared.redacted_headers()["x-user-token"] == REDACTED
    assert prepared.dropped_headers == ()


def test_call_header_overrides_the_tool_header() -> None:
    """An allowed call header replaces the tool's header of the same name (one header sent)."""
    upstream = upstream_from(overridable_headers=["accept"])
    tool = tool_from(headers={"Accept": "application/json"})
    prepared = render(tool, upstream, {}, {"ACCEPT": "text/csv"}, {})
    assert header(prepared, "Accept") == "text/csv"


def test_unlisted_call_header_is_dropped() -> None:
    """A call header the upstream does not list is not sent and is reported as dropped."""
    upstream = upstream_from(headers={"Authorization": "Bearer ${env:TOKEN}"}, overridable_headers=["X-User-Token"])
    prepared = render(tool_from(), upstream, {}, {"Authorization": "Bearer forged", "X-Other": "1"}, {"TOKEN": TOKEN})
    assert header(prepared, "Authorization") == f"Bearer {TOKEN}"
    assert header(prepared, "X-Other") is None
    assert set(prepared.dropped_headers) == {"Authorization", "X-Other"}


@pytest.mark.parametrize(
    "name", ["Host", "content-length", "Transfer-Encoding", "Connection", "TE", "Upgrade", "Trailer", "Keep-Alive"]
)
def test_framing_call_headers_are_refused(name: str) -> None:
    """Host and framing headers can never be set by a call, even when listed as overridable."""
    upstream = upstream_from(overridable_headers=[name])
    with pytest.raises(InvalidArguments) as info:
        render(tool_from(), upstream, {}, {name: "1"}, {})
    assert info.value.exit_code == 65


@pytest.mark.parametrize("name", ["", "X Space", "X:Colon", "X\r\nY", "X\x00", "Ünïcode", "X(y)"])
def test_invalid_call_header_names_are_refused(name: str) -> None:
    """A call header whose name is not an HTTP token is refused with exit 65."""
    with pytest.raises(InvalidArguments):
        render(tool_from(), upstream_from(overridable_headers=["X-A"]), {}, {name: "1"}, {})


@pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "a\nb", "a\x00"])
def test_call_header_value_with_cr_lf_nul_is_refused(value: str) -> None:
    """A call header value with CR, LF or NUL is refused with exit 65."""
    with pytest.raises(InvalidArguments):
        render(tool_from(), upstream_from(overridable_headers=["X-A"]), {}, {"X-A": value}, {})


def test_redacted_headers() -> None:
    """Secret headers show `[redacted]`; the others show their values."""
    upstream = upstream_from(headers={"Authorization": "Bearer ${env:TOKEN}", "X-Api-Key": "static-key-123"})
    tool = tool_from(headers={"Accept": "application/json", "Cookie": "sid=abcdef"})
    prepared = render(tool, upstream, {}, {}, {"TOKEN": TOKEN})
    shown = {name.lower(): value for name, value in prepared.redacted_headers().items()}
    assert shown == {
        "authorization": REDACTED,
        "x-api-key": REDACTED,
        "cookie": REDACTED,
        "accept": "application/json",
    }
    assert TOKEN not in json.dumps(prepared.redacted_headers())


def test_redact() -> None:
    """`redact` replaces every occurrence of every secret, longest first."""
    text = "a=tok-1234 b=tok-1234-long c=tok-1234"
    assert redact(text, {"tok-1234", "tok-1234-long"}) == f"a={REDACTED} b={REDACTED} c={REDACTED}"
    assert redact("nothing here", {"tok-1234"}) == "nothing here"
    assert redact("abc", set()) == "abc"


@pytest.mark.parametrize("arguments", [{"v": "\ud800"}, {"v": ["ok", "\udfff"]}, {"v": {"k": "a\ud800b"}}])
def test_lone_surrogate_argument_is_an_argument_error(arguments: dict[str, Any]) -> None:
    """Text that JSON can carry but UTF-8 cannot encode is refused at validation, before any rendering."""
    with pytest.raises(InvalidArguments, match="not valid Unicode"):
        ArgumentSchema({}).check(arguments)


# --- property: arguments cannot change where the request goes ---------------------------------

_TRICKY = "/?#@:\\%&=;.,[] \t\r\n\x00\x7fé☕\u2028" + "ab"
_text = st.text(alphabet=st.sampled_from(_TRICKY) | st.characters(exclude_categories=["Cs"]), max_size=30)
_value = st.one_of(_text, st.integers(), st.booleans(), st.lists(st.one_of(_text, st.integers()), max_size=4))
_ORIGINS = ["https://api.example.com/v1", "http://127.0.0.1:8080", "http://[::1]:9000/base/"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    origin=st.sampled_from(_ORIGINS),
    method=st.sampled_from(["GET", "POST"]),
    arguments=st.fixed_dictionaries({"p": _value, "q": _value, "h": _value, "b": _value, "extra": _value}),
)
def test_arguments_never_change_origin_or_header_names(origin: str, method: str, arguments: dict[str, Any]) -> None:
    """Whatever the arguments, the URL keeps the upstream's scheme/host/port and no header is added."""
    upstream = upstream_from(origin, headers={"Authorization": "Bearer ${env:TOKEN}"})
    tool = tool_from(
        {"p": None, "q": None, "h": None, "b": None, "extra": None},
        method=method,
        path="/items/${p}/x",
        query={"q": "${q}", "mixed": "a${q}b"},
        headers={"Accept": "application/json", "X-Trace": "t-${h}"},
        body={"value": "${b}", "text": "pre ${b} post"} if method == "POST" else None,
    )
    try:
        prepared = render(tool, upstream, arguments, {}, {"TOKEN": TOKEN})
    except InvalidArguments:
        return
    parsed, base = URL(prepared.url, encoded=True), URL(origin, encoded=True)
    assert (parsed.scheme, parsed.host, parsed.port) == (base.scheme, base.host, base.port)
    assert parsed.raw_path.startswith(base.raw_path.rstrip("/") + "/items/")
    assert parsed.raw_path.endswith("/x")
    assert parsed.raw_fragment == ""
    expected = {"authorization", "accept", "x-trace"} | ({"content-type"} if method == "POST" else set())
    assert header_names(prepared) == expected


def test_call_header_count_and_size_are_capped() -> None:
    """More than 64 call headers, or a header value over 8 KiB, is an argument error (65)."""
    from worker.call.headers import MAX_HEADER_VALUE_CHARS, MAX_HEADERS, check_header_count, checked_header_value

    with pytest.raises(InvalidArguments, match="Too many headers"):
        check_header_count({f"X-H{i}": "v" for i in range(MAX_HEADERS + 1)})
    with pytest.raises(InvalidArguments, match="too long"):
        checked_header_value("X-Big", "v" * (MAX_HEADER_VALUE_CHARS + 1))
    assert checked_header_value("X-Ok", "v" * MAX_HEADER_VALUE_CHARS) == "v" * MAX_HEADER_VALUE_CHARS
