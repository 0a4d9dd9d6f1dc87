"""The generic HTTP request tool (`http_request`, alias `HttpRequestTool`; docs/guides/security.md).

The model names the method, URL, body and headers itself, so every request is checked against the
egress policy, and the tool is off until an allow-list is configured. Rendering is pure, like
`rendering.render`: it turns the arguments into a `PreparedRequest` without any I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from yarl import URL

from worker.call.handlers import HttpHandler
from worker.call.headers import check_header_count, checked_header
from worker.call.job import Job
from worker.call.rendering import is_form, is_json, query_pairs
from worker.call.runtime import Runtime
from worker.definitions.model import METHODS
from worker.errors import EgressBlocked, InvalidArguments
from worker.http.egress import EgressPolicy
from worker.http.transport import PreparedRequest
from worker.redaction import is_secret_header

_OFF = (
    "The http_request tool is off: it stays off until the operator sets the egress allow-list"
    " (TOOLWORKER_EGRESS_ALLOW)."
)
# Methods whose URL query moves into a form body when no body is given.
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_JSON = "application/json"
_FORM = "application/x-www-form-urlencoded"
_TEXT = "text/plain; charset=utf-8"

_Headers = dict[str, tuple[str, str]]  # lower-case name -> (name as given, value)


class HttpRequestTool(HttpHandler):
    """The model's own request; every hop passes the egress policy (no origin is trusted)."""

    async def prepare(self, job: Job, runtime: Runtime, stale: str | None = None) -> tuple[PreparedRequest, str | None]:
        return render_http_request(job.arguments, runtime.policy), None

    def trusted_origin(self, request: PreparedRequest) -> URL | None:
        return None


def render_http_request(arguments: Mapping[str, Any], policy: EgressPolicy) -> PreparedRequest:
    """The request the model asked for, once the egress policy allows its URL."""
    if not policy.enabled:
        raise EgressBlocked(_OFF)
    method = _method(arguments.get("method"))
    url = _url(arguments.get("url"))
    policy.check_url(url)
    headers = _headers(arguments.get("headers"))
    parsed = URL(url)
    if parsed.user is not None or parsed.password is not None:
        raise InvalidArguments("Credentials in the URL are not allowed; send them in a header instead.")
    target, body, content_type = _payload(method, parsed, arguments.get("body"), _content_type(headers))
    if content_type is not None:
        headers["content-type"] = ("Content-Type", content_type)
    return PreparedRequest(
        method=method,
        url=str(target),
        headers=tuple(headers.values()),
        body=body,
        secrets=frozenset(_secrets(headers, parsed)),
        secret_headers=frozenset(lower for lower in headers if is_secret_header(lower)),
    )


def _method(value: Any) -> str:
    method = "GET" if value is None else value
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise InvalidArguments(f"`method` must be one of {', '.join(sorted(METHODS))}.")
    return method.upper()


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArguments("`url` is required: an absolute http:// or https:// URL.")
    return value.strip()


def _headers(value: Any) -> _Headers:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArguments("`headers` must be an object of header names to string values.")
    check_header_count(value)
    headers: _Headers = {}
    for name, header_value in value.items():
        headers[checked_header(name, header_value)] = (name, header_value)
    return headers


def _content_type(headers: _Headers) -> str | None:
    entry = headers.get("content-type")
    return entry[1] if entry else None


def _payload(method: str, url: URL, body: Any, content_type: str | None) -> tuple[URL, bytes | None, str | None]:
    """The URL, the body bytes, and the Content-Type to set (None: leave the headers as they are)."""
    if body is None or body == "":
        return _query_as_form(method, url)
    if isinstance(body, str):
        return url, body.encode(), None if content_type else _TEXT
    if isinstance(body, dict | list) and content_type and is_form(content_type):
        return url, _form(body), None
    if isinstance(body, dict | list):
        encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        return url, encoded, None if content_type and is_json(content_type) else _JSON
    raise InvalidArguments("`body` must be a string, a JSON object, an array or null.")


def _query_as_form(method: str, url: URL) -> tuple[URL, bytes | None, str | None]:
    if method not in _BODY_METHODS or not url.raw_query_string:
        return url, None, None
    # The query is already form-encoded: move its bytes as they are.
    return url.with_query(None), url.raw_query_string.encode(), _FORM


def _form(body: dict[str, Any] | list[Any]) -> bytes:
    if not isinstance(body, dict):
        raise InvalidArguments("A form-encoded `body` must be an object of names to values.")
    return urlencode([pair for key, value in body.items() for pair in query_pairs(key, value)]).encode()


def _secrets(headers: _Headers, url: URL) -> set[str]:
    """Values to redact: secret headers (and their credential after the scheme), secret query values."""
    found: set[str] = set()
    for lower, (_, value) in headers.items():
        if is_secret_header(lower):
            found.add(value)
            scheme, _, credential = value.partition(" ")
            if credential.strip() and scheme.isalpha():
                found.add(credential.strip())
    found.update(value for key, value in url.query.items() if is_secret_header(key))
    found.discard("")
    return found
