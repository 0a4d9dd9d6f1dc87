"""Render a tool's request from its templates and the model's arguments: a pure function, no I/O.

Placement rules (docs/guides/definitions.md): a path value is one percent-encoded segment; query
arrays repeat the key and entries naming an absent argument are dropped; header values may not hold CR, LF or NUL;
a structured body keeps each `${name}` leaf's JSON type; a text body with a JSON content type gets
JSON-escaped values; arguments no template names go to the query (GET-like) or the JSON body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus, urlencode
from weakref import WeakKeyDictionary

from yarl import URL

from worker.call.headers import check_header_count, checked_header, checked_header_value
from worker.definitions.model import QUERY_METHODS, Body, Tool, Upstream
from worker.definitions.templates import Arg, Env, MissingEnv, Template, resolve_env
from worker.errors import InvalidArguments, MalformedURL, ToolMisconfigured
from worker.http.transport import PreparedRequest
from worker.redaction import is_secret_header


def render(
    tool: Tool,
    upstream: Upstream,
    arguments: Mapping[str, Any],
    call_headers: Mapping[str, str],
    environ: Mapping[str, str],
    placeholders: bool = False,
) -> PreparedRequest:
    """The request to send; with `placeholders`, each `${env:...}`/`${file:...}` is left as its name (what
    the request is, whatever the process's settings and secrets: the cache's key, worker/call/cache.py)."""
    ctx = _Placeholders(arguments) if placeholders else _Context(arguments, environ)
    spec = tool.request
    extra = {}
    if spec.send_unreferenced:
        referenced = _referenced(tool)
        extra = {k: v for k, v in arguments.items() if k not in referenced}
    query = _render_query(spec.query, ctx)
    body_value = _render_body(spec.body, spec.content_type, ctx)
    if extra and spec.method in QUERY_METHODS:
        query.extend(query_pairs(name, value) for name, value in extra.items())
    elif extra and (body_value is None or isinstance(body_value, dict)):
        body_value = {**extra, **(body_value or {})}
    url = _render_url(upstream, spec.path, [p for pairs in query for p in pairs], ctx)
    headers, secret_names, dropped = _render_headers(tool, upstream, call_headers, ctx)
    body = _encode_body(body_value, spec.content_type)
    if body is not None and not any(name.lower() == "content-type" for name, _ in headers):
        headers.append(("Content-Type", spec.content_type))
    return PreparedRequest(
        method=spec.method,
        url=url,
        headers=tuple(headers),
        body=body,
        secrets=frozenset(ctx.secrets),
        secret_headers=frozenset(secret_names),
        dropped_headers=tuple(dropped),
    )


# Per tool (a definitions version's tools go with it), what every call of the tool would work out again.
_referenced_by_tool: WeakKeyDictionary[Tool, frozenset[str]] = WeakKeyDictionary()


def _referenced(tool: Tool) -> frozenset[str]:
    """The arguments the tool's request templates name."""
    referenced = _referenced_by_tool.get(tool)
    if referenced is None:
        referenced = frozenset(name for template in tool.request.templates for name in template.arg_names)
        _referenced_by_tool[tool] = referenced
    return referenced


def render_secret(template: Template, environ: Mapping[str, str]) -> str:
    """A credential's template (`${env:...}`, `${file:...}`, literal text; no arguments) as text."""
    return _Context({}, environ).interpolate(template)


class _Context:
    """Argument and environment lookups for one rendering, collecting the secrets it meets."""

    def __init__(self, arguments: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        self.arguments = arguments
        self.environ = environ
        self.secrets: set[str] = set()

    def has_all(self, template: Template) -> bool:
        return all(name in self.arguments and self.arguments[name] is not None for name in template.arg_names)

    def env(self, part: Env | Arg, secret: bool = True) -> str:
        if isinstance(part, Arg):  # load-time checks keep arguments out of base URLs
            raise ToolMisconfigured("This tool's base URL names an argument.")
        try:
            value = resolve_env(part, self.environ)
        except MissingEnv as exc:
            raise ToolMisconfigured(
                f"This tool cannot be used: the worker lacks the setting {exc.args[0]}. Tell the operator."
            ) from None
        if secret:
            self.secrets.add(value)
        return value

    def interpolate(self, template: Template, encode: Any = None) -> str:
        out = []
        for part in template.parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Env):
                out.append(self.env(part))
            else:
                value = self.arguments.get(part.name)
                text = "" if value is None else to_text(value)
                out.append(encode(value, text) if encode else text)
        return "".join(out)


class _Placeholders(_Context):
    """Settings and secrets as their names: the same rendering in every process, with no value in it."""

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        super().__init__(arguments, {})

    def env(self, part: Env | Arg, secret: bool = True) -> str:
        if isinstance(part, Arg):
            raise ToolMisconfigured("This tool's base URL names an argument.")
        return f"${{env:{part.name}}}"


def to_text(value: Any) -> str:
    """How an argument reads inside a URL, a header or a text body."""
    if isinstance(value, str):
        return value
    if type(value) is int:  # as JSON writes it (not a bool, nor an int's subclass with a str of its own)
        return int.__repr__(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(to_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(value)


def _path_segment(name: str, value: Any) -> str:
    if value is None:
        raise InvalidArguments(f"`{name}` is required (it is part of the URL path).")
    text = to_text(value)
    if text == "":
        raise InvalidArguments(f"`{name}` must not be empty (it is part of the URL path).")
    if text in {".", ".."}:  # a segment of dots alone would be read as a relative path step
        return text.replace(".", "%2E")
    return quote(text, safe="")


def _render_url(upstream: Upstream, path: Template, query: list[tuple[str, str]], ctx: _Context) -> str:
    base = _render_base_url(upstream.base_url, ctx)
    segments = []
    for part in path.parts:
        if isinstance(part, str):
            segments.append(part)
        elif isinstance(part, Env):
            segments.append(ctx.env(part))
        else:
            segments.append(_path_segment(part.name, ctx.arguments.get(part.name)))
    rendered_path = "".join(segments)
    url = base.rstrip("/") + "/" + rendered_path.lstrip("/") if rendered_path else base
    if query:
        url += ("&" if "?" in url else "?") + urlencode(query, quote_via=quote)
    if not isinstance(ctx, _Placeholders):  # a base URL of placeholders is no URL: not sent, only named
        _check_url(url, base)
    return url


def _render_base_url(template: Template, ctx: _Context) -> str:
    """Where to connect is configuration, not a credential: only a password in it is a secret."""
    base = "".join(part if isinstance(part, str) else ctx.env(part, secret=False) for part in template.parts)
    password = _password(base)
    if password:
        ctx.secrets.add(password)
    return base


# A process renders a few base URLs many times: each is parsed once.
_BASE_URLS_CACHED = 1024


@lru_cache(maxsize=_BASE_URLS_CACHED)
def _password(base: str) -> str | None:
    try:
        return URL(base).password
    except ValueError:
        return None


def _check_url(url: str, base: str) -> None:
    origin = _base_origin(base)
    if url == base or url.startswith(base.rstrip("/") + "/"):
        # The base URL's authority, then a slash: nothing after it can name another host.
        _checked_origin(origin, origin)
        return
    _checked_origin(_origin(url), origin)


def _checked_origin(parsed: tuple[str, str | None, int | None], origin: tuple[str, str | None, int | None]) -> None:
    scheme, host, _ = parsed
    if scheme not in {"http", "https"} or not host:
        raise MalformedURL(f"The request URL is malformed (scheme {scheme!r}, host {host!r}).")
    if parsed != origin:
        raise InvalidArguments("The arguments may not change the host the tool talks to.")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    """Scheme, host and port; MalformedURL when the text is no URL."""
    try:
        parsed = URL(url, encoded=True)
        return parsed.scheme, parsed.host, parsed.port
    except ValueError as exc:
        raise MalformedURL(f"The request URL is malformed: {exc}") from None


_base_origin = lru_cache(maxsize=_BASE_URLS_CACHED)(_origin)


def _render_query(templates: Mapping[str, Template], ctx: _Context) -> list[list[tuple[str, str]]]:
    pairs = []
    for name, template in templates.items():
        if not ctx.has_all(template):
            continue
        single = template.single_arg
        if single is not None:
            pairs.append(query_pairs(name, ctx.arguments[single]))
        else:
            pairs.append([(name, ctx.interpolate(template))])
    return pairs


def query_pairs(name: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, list):
        return [(name, to_text(v)) for v in value]
    return [] if value is None else [(name, to_text(value))]


def _render_headers(
    tool: Tool, upstream: Upstream, call_headers: Mapping[str, str], ctx: _Context
) -> tuple[list[tuple[str, str]], set[str], list[str]]:
    merged: dict[str, tuple[str, str]] = {}
    secret_names: set[str] = set()
    for name, template in [*upstream.headers.items(), *tool.request.headers.items()]:
        if not ctx.has_all(template):
            continue
        value = ctx.interpolate(template)
        if template.env_names or is_secret_header(name):
            secret_names.add(name.lower())
            ctx.secrets.add(value)
        merged[name.lower()] = (name, checked_header_value(name, value))
    dropped = []
    check_header_count(call_headers)
    for name, value in call_headers.items():
        lower = _checked_call_header(name, value, upstream)
        if lower is None:
            dropped.append(name)
            continue
        secret_names.add(lower)
        ctx.secrets.add(value)
        merged[lower] = (name, value)
    return list(merged.values()), secret_names, dropped


def _checked_call_header(name: str, value: Any, upstream: Upstream) -> str | None:
    """The lower-case name of an allowed call header, None for one this upstream does not take."""
    lower = checked_header(name, value, "Call header")
    return lower if lower in upstream.overridable_headers else None


def _render_body(body: Body, content_type: str, ctx: _Context) -> Any:
    if body.kind == "text":
        single = body.value.single_arg
        if single is not None and ctx.arguments.get(single) is None:
            return None  # the whole body is an absent optional argument: send none
        if is_json(content_type):
            return _render_json_text(body.value, ctx)
        return ctx.interpolate(body.value, _form_encode if is_form(content_type) else None)
    if body.kind == "structured":
        value = _render_tree(body.value, ctx)
        return None if value is _ABSENT else value
    return None


def _form_encode(value: Any, text: str) -> str:
    return quote_plus(text)


def _render_json_text(template: Template, ctx: _Context) -> str:
    """A JSON text template: a value inside a string literal is escaped, elsewhere it is one JSON value."""
    out: list[str] = []
    in_string = False
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            in_string = _ends_inside_string(part, in_string)
            continue
        value = ctx.env(part) if isinstance(part, Env) else ctx.arguments.get(part.name)
        out.append(_json_in_string(value) if in_string else _json_value(value))
    return "".join(out)


def _ends_inside_string(text: str, in_string: bool) -> bool:
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and in_string:
            escaped = True
        elif char == '"':
            in_string = not in_string
    return in_string


def _json_in_string(value: Any) -> str:
    text = "" if value is None else to_text(value)
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _json_value(value: Any) -> str:
    """Exactly one JSON value: a string that already is JSON text is kept as that value."""
    if isinstance(value, str):
        try:
            return json.dumps(json.loads(value), ensure_ascii=False, separators=(",", ":"))
        except ValueError:
            pass
    return json.dumps(value, ensure_ascii=False)


_ABSENT = object()


def _render_tree(node: Any, ctx: _Context) -> Any:
    if isinstance(node, Template):
        if not ctx.has_all(node):
            return _ABSENT
        single = node.single_arg
        return ctx.arguments[single] if single is not None else ctx.interpolate(node)
    if isinstance(node, dict):
        rendered = {key: _render_tree(value, ctx) for key, value in node.items()}
        return {key: value for key, value in rendered.items() if value is not _ABSENT}
    if isinstance(node, list):
        return [v for v in (_render_tree(value, ctx) for value in node) if v is not _ABSENT]
    return node


def _encode_body(value: Any, content_type: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if is_form(content_type) and isinstance(value, dict):
        return urlencode([pair for k, v in value.items() for pair in query_pairs(k, v)]).encode()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def is_json(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def is_form(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"
