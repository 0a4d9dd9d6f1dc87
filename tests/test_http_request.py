"""The generic HTTP request tool: its schema and the pure rendering of a request from its arguments."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from worker.call.http_request import render_http_request
from worker.constants import HTTP_REQUEST_TOOL, REDACTED
from worker.definitions.builtin import http_request_tool
from worker.errors import EgressBlocked, InvalidArguments, MalformedURL, ToolError
from worker.http.egress import EgressPolicy
from worker.http.transport import PreparedRequest

SCHEMA = http_request_tool("toolworker").input_schema
POLICY = EgressPolicy.parse("api.example.com, *.example.org, 127.0.0.1")
API = "https://api.example.com/v1/items"


def render(**arguments: Any) -> PreparedRequest:
    return render_http_request({"url": API, **arguments}, POLICY)


def header(request: PreparedRequest, name: str) -> str | None:
    return next((value for key, value in request.headers if key.lower() == name.lower()), None)


# --- the schema ----------------------------------------------------------------------------------


def test_schema_is_valid_json_schema() -> None:
    """The tool's input schema is a valid draft 2020-12 object schema that requires `url`."""
    Draft202012Validator.check_schema(SCHEMA)
    assert HTTP_REQUEST_TOOL == "http_request"
    assert SCHEMA["required"] == ["url"]


@pytest.mark.parametrize(
    ("arguments", "valid"),
    [
        ({"url": API}, True),
        ({"url": API, "method": "POST", "body": {"a": 1}, "headers": {"X-A": "1"}}, True),
        ({"url": API, "body": "text"}, True),
        ({"url": API, "body": [1, 2]}, True),
        ({"url": API, "body": None}, True),
        ({}, False),
        ({"url": API, "method": "TRACE"}, False),
        ({"url": API, "method": "get"}, False),
        ({"url": API, "body": 3}, False),
        ({"url": API, "headers": {"X-A": 1}}, False),
        ({"url": API, "extra": True}, False),
    ],
)
def test_schema_accepts_and_rejects(arguments: dict[str, Any], valid: bool) -> None:
    """The schema admits the documented argument shapes and nothing else."""
    assert Draft202012Validator(SCHEMA).is_valid(arguments) is valid


# --- the egress policy ---------------------------------------------------------------------------


def test_off_without_allow_list() -> None:
    """With no allow-list the tool refuses every call and says how to turn it on."""
    with pytest.raises(EgressBlocked, match="TOOLWORKER_EGRESS_ALLOW") as caught:
        render_http_request({"url": API}, EgressPolicy.parse(""))
    assert caught.value.exit_code == 77
    assert "off" in caught.value.message


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://evil.example.com/", EgressBlocked),
        ("http://169.254.169.254/latest/meta-data/", EgressBlocked),
        ("http://0x7f000002:8080/", EgressBlocked),
        ("http://[::ffff:10.0.0.1]/", EgressBlocked),
        ("ftp://api.example.com/", EgressBlocked),
        ("api.example.com/v1", MalformedURL),
        ("http:///v1", MalformedURL),
        ("", InvalidArguments),
    ],
)
def test_url_checked_by_policy(url: str, error: type[ToolError]) -> None:
    """The URL goes through the egress policy before anything is rendered."""
    with pytest.raises(error):
        render_http_request({"url": url}, POLICY)


@pytest.mark.parametrize("url", [API, "https://a.example.org/x", "http://127.0.0.1:9000/", "http://[::ffff:7f00:1]/"])
def test_listed_hosts_pass(url: str) -> None:
    """Listed names, wildcard subdomains and listed addresses (in any form) render."""
    assert render_http_request({"url": url}, POLICY).url == url


def test_missing_url() -> None:
    """A call without `url` is invalid arguments."""
    with pytest.raises(InvalidArguments, match="url"):
        render_http_request({"method": "GET"}, POLICY)


# --- method and URL ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "method"), [(None, "GET"), ("GET", "GET"), ("post", "POST"), ("Delete", "DELETE")])
def test_method(given: str | None, method: str) -> None:
    """The method defaults to GET and is upper-cased."""
    arguments = {} if given is None else {"method": given}
    assert render(**arguments).method == method


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "", 7])
def test_method_refused(method: Any) -> None:
    """Methods outside the allowed set are invalid arguments."""
    with pytest.raises(InvalidArguments, match="method"):
        render(method=method)


def test_get_keeps_query_and_no_body() -> None:
    """A GET keeps its query string in the URL and has no body."""
    request = render(url=f"{API}?q=a+b&page=2")
    assert (request.method, request.url, request.body) == ("GET", f"{API}?q=a+b&page=2", None)


# --- the body -------------------------------------------------------------------------------------------


def test_object_body_as_json() -> None:
    """An object body is sent as compact UTF-8 JSON with Content-Type application/json."""
    request = render(method="POST", body={"name": "café", "n": 1, "tags": ["a"]})
    assert json.loads(request.body or b"") == {"name": "café", "n": 1, "tags": ["a"]}
    assert request.body == '{"name":"café","n":1,"tags":["a"]}'.encode()
    assert header(request, "Content-Type") == "application/json"


def test_array_body_as_json() -> None:
    """An array body is sent as JSON too."""
    request = render(method="PUT", body=[1, {"a": None}])
    assert request.body == b'[1,{"a":null}]'
    assert header(request, "Content-Type") == "application/json"


def test_object_body_as_form() -> None:
    """With a form Content-Type an object body is sent as k=v&k2=v2."""
    request = render(
        method="POST",
        headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"},
        body={"a": "x y", "b": 2, "c": [1, 2], "d": True, "e": None},
    )
    assert request.body == b"a=x+y&b=2&c=1&c=2&d=true"
    assert header(request, "Content-Type") == "application/x-www-form-urlencoded; charset=utf-8"


def test_array_body_with_form_refused() -> None:
    """An array cannot be form-encoded."""
    with pytest.raises(InvalidArguments, match="body"):
        render(method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"}, body=[1])


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("application/vnd.api+json", "application/vnd.api+json"),
        ("application/json; charset=utf-8", "application/json; charset=utf-8"),
        ("text/plain", "application/json"),
    ],
)
def test_object_body_content_type(given: str, sent: str) -> None:
    """A JSON-type Content-Type is kept for an object body; any other becomes application/json."""
    request = render(method="POST", headers={"Content-Type": given}, body={"a": 1})
    assert header(request, "Content-Type") == sent
    assert [name.lower() for name, _ in request.headers].count("content-type") == 1


def test_string_body_as_is() -> None:
    """A string body is sent byte for byte with the caller's Content-Type."""
    text = '{"already": "json"} ünïcode'
    request = render(method="POST", headers={"Content-Type": "application/json"}, body=text)
    assert request.body == text.encode()
    assert header(request, "Content-Type") == "application/json"


def test_string_body_without_content_type() -> None:
    """A string body without a Content-Type is labelled as UTF-8 text."""
    request = render(method="POST", body="hello")
    assert header(request, "Content-Type") == "text/plain; charset=utf-8"


@pytest.mark.parametrize("body", [3, 2.5, True])
def test_scalar_body_refused(body: Any) -> None:
    """A number or boolean body is invalid arguments."""
    with pytest.raises(InvalidArguments, match="body"):
        render(method="POST", body=body)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("body", [None, ""])
def test_query_moves_to_form_body(method: str, body: str | None) -> None:
    """Without a body, the URL's query of a POST/PUT/PATCH/DELETE moves into a form body."""
    request = render(method=method, url=f"{API}?a=1&b=two%20words&c=x+y", body=body)
    assert request.url == API
    assert request.body == b"a=1&b=two%20words&c=x+y"
    assert header(request, "Content-Type") == "application/x-www-form-urlencoded"


def test_query_move_replaces_content_type() -> None:
    """The moved query's Content-Type replaces one the caller gave."""
    request = render(method="POST", url=f"{API}?a=1", headers={"Content-Type": "application/json"})
    assert header(request, "Content-Type") == "application/x-www-form-urlencoded"


@pytest.mark.parametrize(
    ("method", "body"),
    [("GET", None), ("HEAD", None), ("OPTIONS", None), ("POST", {"x": 1}), ("POST", "raw")],
)
def test_query_stays(method: str, body: Any) -> None:
    """The query stays in the URL for GET-like methods and when a body is given."""
    assert render(method=method, url=f"{API}?a=1", body=body).url == f"{API}?a=1"


def test_post_without_query_or_body() -> None:
    """A POST with neither query nor body has no body and no Content-Type."""
    request = render(method="POST")
    assert request.body is None
    assert header(request, "Content-Type") is None


# --- headers and secrets ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b"])
def test_header_injection_refused(value: str) -> None:
    """CR, LF or NUL in a header value is invalid arguments (exit 65)."""
    with pytest.raises(InvalidArguments, match="CR, LF or NUL") as caught:
        render(headers={"X-Note": value})
    assert caught.value.exit_code == 65


@pytest.mark.parametrize("name", ["Host", "content-length", "Transfer-Encoding", "Connection", "TE", "Upgrade"])
def test_framing_headers_refused(name: str) -> None:
    """Headers that change where or how the request is framed cannot be set."""
    with pytest.raises(InvalidArguments, match="may not be set"):
        render(headers={name: "x"})


@pytest.mark.parametrize("headers", [{"Bad Name": "x"}, {"X-Ok": 1}, {"": "x"}, {"X:Y": "x"}, ["X-A", "1"], "X-A: 1"])
def test_malformed_headers_refused(headers: Any) -> None:
    """Header names must be tokens and values strings, in an object."""
    with pytest.raises(InvalidArguments):
        render(headers=headers)


def test_headers_pass_through() -> None:
    """Ordinary headers are sent with the names as given; the last of names differing in case wins."""
    request = render(headers={"Accept": "application/json", "X-Trace": "1", "x-trace": "2"})
    assert request.headers == (("Accept", "application/json"), ("x-trace", "2"))


def test_secret_headers_recorded() -> None:
    """Secret header values, and the credential after an auth scheme, are kept for redaction."""
    request = render(
        headers={
            "Authorization": "Bearer sk-live-123456",
            "Cookie": "session=abcdef",
            "X-Api-Key": "key-987654",
            "Accept": "text/plain",
        }
    )
    assert request.secret_headers == {"authorization", "cookie", "x-api-key"}
    assert {"Bearer sk-live-123456", "sk-live-123456", "session=abcdef", "key-987654"} <= request.secrets
    assert "text/plain" not in request.secrets
    redacted = request.redacted_headers()
    assert redacted["Authorization"] == REDACTED
    assert redacted["Accept"] == "text/plain"


def test_url_secrets_recorded() -> None:
    """Values of secret-named query parameters are kept for redaction."""
    request = render(url="https://api.example.com/v1?api_key=abcd1234&page=2")
    assert "abcd1234" in request.secrets
    assert "2" not in request.secrets


@pytest.mark.parametrize("url", ["https://user:hunter22@api.example.com/v1", "https://user@api.example.com/v1"])
def test_credentials_in_the_url_are_refused(url: str) -> None:
    """Credentials in the URL are refused (65): aiohttp would turn them into Basic auth silently."""
    with pytest.raises(InvalidArguments, match="Credentials in the URL"):
        render(url=url)
