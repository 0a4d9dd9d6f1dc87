"""The `upstreams:` section of a native file (also what an `openapi:` entry's upstream is built from)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from worker import constants
from worker.definitions.model import (
    METHODS,
    NO_APPROVAL,
    Approval,
    Auth,
    CachePolicy,
    CircuitPolicy,
    McpServer,
    RateLimit,
    RetryPolicy,
    Source,
    Upstream,
)
from worker.definitions.readers.document import StrictModel
from worker.definitions.templates import Template


class RetryModel(StrictModel):
    attempts: int = Field(1, ge=1, le=10)
    backoff_seconds: float = Field(0.2, ge=0)
    max_backoff_seconds: float = Field(10.0, ge=0)
    statuses: list[Annotated[int, Field(ge=100, le=599)]] = [502, 503, 504]
    unsafe_methods: bool = False


class CircuitModel(StrictModel):
    threshold: int = Field(constants.DEFAULT_CIRCUIT_THRESHOLD, ge=1)
    cooldown_seconds: float = Field(constants.DEFAULT_CIRCUIT_COOLDOWN_S, ge=0)


class RateLimitModel(StrictModel):
    per_second: float = Field(gt=0)
    burst: int = Field(1, ge=1)


class ApprovalModel(StrictModel):
    """`approval: {methods: [POST, DELETE]}`: the calls with these methods wait for a human's approval."""

    methods: list[str] = Field(min_length=1)


# `approval:` of an upstream or a tool: `always`, `never` (a tool opting out) or `{methods: [...]}`.
ApprovalSetting = Literal["always", "never"] | ApprovalModel


def build_approval(setting: ApprovalSetting | None) -> Approval | None:
    if setting is None:
        return None
    if setting == "always":
        return Approval(always=True)
    if setting == "never":
        return NO_APPROVAL
    methods = frozenset(m.upper() for m in setting.methods)
    unknown = sorted(methods - METHODS)
    if unknown:
        raise ValueError(f"approval: unknown method {', '.join(unknown)} (one of {', '.join(sorted(METHODS))})")
    return Approval(methods)


class CacheModel(StrictModel):
    ttl_seconds: int = Field(ge=1, le=7 * 86_400)
    methods: list[str] = ["GET", "HEAD"]


class AuthModel(StrictModel):
    """`auth:` of an upstream; which fields a type needs is checked by `build_auth`."""

    type: Literal["bearer", "basic", "api_key", "oauth2_client_credentials", "oauth2_user", "oauth2_token_exchange"]
    token: str | None = None
    username: str | None = None
    password: str | None = None
    value: str | None = None
    in_: Literal["header", "query"] = Field("header", alias="in")
    name: str | None = Field(None, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
    token_url: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    scope: str | None = None
    audience: str | None = None
    extra_params: dict[str, str] = {}
    auth_method: Literal["body", "basic"] = "body"
    per_call_header: str | None = Field(None, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
    issuer: str | None = Field(None, pattern=r"^https?://")
    authorization_url: str | None = None
    revocation_url: str | None = None
    scopes: list[Annotated[str, Field(pattern=r"^[\x21\x23-\x5b\x5d-\x7e]+$")]] = []


_REQUIRED = {
    "bearer": ("token",),
    "basic": ("username", "password"),
    "api_key": ("name", "value"),
    "oauth2_client_credentials": ("token_url", "client_id", "client_secret"),
    "oauth2_user": ("client_id",),
    "oauth2_token_exchange": ("token_url", "audience", "client_id", "client_secret"),
}

# What an MCP server's authorization discovery finds, so its upstream's `auth:` may leave it out.
_DISCOVERED = {"oauth2_client_credentials": ("token_url",)}


class McpModel(StrictModel):
    """`mcp:` of an upstream that is an MCP server; `include`/`exclude` are globs on the server's tool names."""

    url: str = Field(pattern=r"^(https?://|\$\{env:)")
    include: list[str] = ["*"]
    exclude: list[str] = []
    prefix: str | None = Field(None, max_length=63)
    refresh_seconds: float = Field(constants.DEFAULT_MCP_REFRESH_S, ge=1)
    pin: bool = False
    transport: Literal["streamable_http", "sse"] = "streamable_http"
    tasks: bool = False


class UpstreamModel(StrictModel):
    base_url: str | None = None
    mcp: McpModel | None = None
    timeout_seconds: float = Field(constants.DEFAULT_UPSTREAM_TIMEOUT_S, gt=0)
    connect_timeout_seconds: float = Field(constants.DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    headers: dict[str, str] = {}
    verify_tls: bool = True
    max_concurrency: int = Field(constants.DEFAULT_MAX_CONCURRENCY, ge=1)
    retry: RetryModel = RetryModel()
    max_output_chars: int = Field(constants.DEFAULT_MAX_OUTPUT_CHARS, ge=1)
    max_response_bytes: int = Field(constants.DEFAULT_MAX_RESPONSE_BYTES, ge=1)
    queue: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    overridable_headers: list[str] = []
    allow_offsite_redirects: bool = False
    circuit: CircuitModel = CircuitModel()
    rate_limit: RateLimitModel | None = None
    auth: AuthModel | None = None
    approval: ApprovalSetting | None = None
    cache: CacheModel | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> UpstreamModel:
        if (self.base_url is None) == (self.mcp is None):
            raise ValueError("an upstream has either base_url (an HTTP API) or mcp: (an MCP server), not both")
        return self


def build_cache(model: CacheModel | None) -> CachePolicy | None:
    """A `cache:` block (on a tool or an upstream); methods are named in capitals, from the HTTP methods."""
    if model is None:
        return None
    methods = frozenset(method.upper() for method in model.methods)
    unknown = sorted(methods - METHODS)
    if unknown or not methods:
        raise ValueError(f"cache methods must be HTTP methods (not {', '.join(unknown) or 'none'})")
    return CachePolicy(model.ttl_seconds, methods)


def build_auth(name: str, model: AuthModel, mcp: bool = False) -> Auth:
    """An upstream's `auth:`; on an MCP server the OAuth endpoints may be left to discovery (SPEC §18)."""
    required = _REQUIRED[model.type]
    if mcp and model.type in _DISCOVERED:
        required = tuple(f for f in required if f not in _DISCOVERED[model.type])
    if mcp and model.type == "oauth2_user" and model.issuer is None and model.authorization_url is None:
        required = ()  # the client too: a metadata document or a dynamic registration (SPEC §18)
    missing = [f for f in required if getattr(model, f) is None]
    # A bearer credential may come only from each call (an end user's token).
    if model.type == "bearer" and model.per_call_header:
        missing = []
    endpoints = model.authorization_url is not None and model.token_url is not None
    if model.type == "oauth2_user" and model.issuer is None and not endpoints and not mcp:
        missing.append("issuer (or authorization_url and token_url)")
    if mcp and model.type == "oauth2_user" and (model.authorization_url is None) != (model.token_url is None):
        missing.append("authorization_url and token_url together")
    if missing:
        raise ValueError(f"upstream {name!r}: auth {model.type} needs {', '.join(missing)}")
    if model.type in ("oauth2_user", "oauth2_token_exchange") and model.per_call_header:
        raise ValueError(f"upstream {name!r}: auth {model.type} takes its token from the vault, not per_call_header")

    def template(text: str | None) -> Template | None:
        parsed = None if text is None else Template.parse(text)
        if parsed is not None and parsed.arg_names:
            raise ValueError(f"upstream {name!r}: auth may use ${{env:...}} and ${{file:...}} but not arguments")
        return parsed

    return Auth(
        type=model.type,
        token=template(model.token),
        username=template(model.username),
        password=template(model.password),
        value=template(model.value),
        location=model.in_,
        name=model.name or "",
        token_url=template(model.token_url),
        client_id=template(model.client_id),
        client_secret=template(model.client_secret),
        scope=model.scope,
        audience=model.audience,
        extra_params={k: Template.parse(v) for k, v in model.extra_params.items()},
        auth_method=model.auth_method,
        per_call_header=model.per_call_header.lower() if model.per_call_header else None,
        issuer=model.issuer,
        authorization_url=template(model.authorization_url),
        revocation_url=template(model.revocation_url),
        scopes=tuple(model.scopes),
    )


def build_mcp(name: str, model: McpModel) -> McpServer:
    url = Template.parse(model.url)
    if url.arg_names:
        raise ValueError(f"upstream {name!r}: mcp url may use ${{env:...}} but not arguments")
    return McpServer(
        url=url,
        include=tuple(model.include),
        exclude=tuple(model.exclude),
        prefix=model.prefix,
        refresh_s=model.refresh_seconds,
        pin=model.pin,
        transport=model.transport,
        tasks=model.tasks,
    )


def build_upstream(name: str, model: UpstreamModel, source: Source) -> Upstream:
    mcp = None if model.mcp is None else build_mcp(name, model.mcp)
    base_url = mcp.url if mcp is not None else Template.parse(model.base_url or "")
    if base_url.arg_names:
        raise ValueError(f"upstream {name!r}: base_url may use ${{env:...}} but not arguments")
    retry = model.retry
    return Upstream(
        name=name,
        base_url=base_url,
        timeout_s=model.timeout_seconds,
        connect_timeout_s=model.connect_timeout_seconds,
        headers={k: Template.parse(v) for k, v in model.headers.items()},
        verify_tls=model.verify_tls,
        max_concurrency=model.max_concurrency,
        retry=RetryPolicy(
            attempts=retry.attempts,
            backoff_s=retry.backoff_seconds,
            max_backoff_s=retry.max_backoff_seconds,
            statuses=frozenset(retry.statuses),
            unsafe_methods=retry.unsafe_methods,
        ),
        max_output_chars=model.max_output_chars,
        max_response_bytes=model.max_response_bytes,
        queue=model.queue,
        overridable_headers=frozenset(h.lower() for h in model.overridable_headers),
        allow_offsite_redirects=model.allow_offsite_redirects,
        circuit=CircuitPolicy(model.circuit.threshold, model.circuit.cooldown_seconds),
        rate_limit=RateLimit(model.rate_limit.per_second, model.rate_limit.burst) if model.rate_limit else None,
        auth=build_auth(name, model.auth, model.mcp is not None) if model.auth else None,
        approval=build_approval(model.approval),
        cache=build_cache(model.cache),
        source=source,
        mcp=mcp,
    )
