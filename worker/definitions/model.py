"""The validated, format-independent model of upstreams and tools that every reader produces."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol

from worker import constants
from worker.definitions.templates import Template

JSON = Any
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
QUERY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# What OpenAI and Anthropic accept as a tool name.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

# JSON Schema keywords whose values are subschemas: one, a list of them, a map of names to them. Walked
# by the OpenAPI reader (its dialect to 2020-12) and by the catalog's exports.
SUBSCHEMA_KEYWORDS = frozenset(
    {"items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else"}
    | {"unevaluatedItems", "unevaluatedProperties", "additionalItems"}
)
SUBSCHEMA_LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
SUBSCHEMA_MAP_KEYWORDS = frozenset({"properties", "patternProperties", "dependentSchemas"})
# Where a schema keeps subschemas for `$ref`s to name.
DEFINITIONS_KEYWORDS = frozenset({"$defs", "definitions"})
# Whether an MCP client may (optional), must (required) or must not (forbidden) run a call of the tool as a
# task (SPEC §13). A tool that declares nothing is `optional`: every call goes through the queue and its
# envelope is stored under its callId, so any call can outlive the connection that made it.
TASK_MODES = ("forbidden", "optional", "required")
DEFAULT_TASK_MODE = "optional"


@dataclass(frozen=True, slots=True)
class Source:
    """Where a definition was read from, for error messages."""

    file: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 1
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    statuses: frozenset[int] = frozenset({502, 503, 504})
    # POST/PATCH are retried only when the upstream opts in; they then carry Idempotency-Key.
    unsafe_methods: bool = False


@dataclass(frozen=True, slots=True)
class CircuitPolicy:
    """Open after `threshold` consecutive failures; try again after `cooldown_s`."""

    threshold: int = constants.DEFAULT_CIRCUIT_THRESHOLD
    cooldown_s: float = constants.DEFAULT_CIRCUIT_COOLDOWN_S


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A rate shared by every worker (through Redis): `per_second` on average, bursts of `burst`."""

    per_second: float
    burst: int = 1


@dataclass(frozen=True, slots=True)
class Approval:
    """Which calls of a tool wait for a human's approval (SPEC 13, docs/guides/approvals.md): every call
    (`always`), those whose method is one of `methods`, or none (`never`, a tool opting out of its
    upstream's rule)."""

    methods: frozenset[str] = frozenset()
    always: bool = False

    def requires(self, method: str) -> bool:
        return self.always or method in self.methods


NO_APPROVAL = Approval()


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant's share and limits (docs/concepts/tenants.md): `weight` while the fleet is contended, calls in
    flight across the fleet, calls waiting, and a rate shared by every worker. None: no limit."""

    name: str
    weight: int = 1
    max_in_flight: int | None = None
    max_queued: int | None = None
    rate_limit: RateLimit | None = None
    source: Source = Source("<builtin>")


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """Answers kept in Redis for `ttl_s` (an upstream's shorter `Cache-Control: max-age` wins), for these methods."""

    ttl_s: int
    methods: frozenset[str] = frozenset({"GET", "HEAD"})


PAGINATION_STYLES = ("link", "cursor", "offset")


@dataclass(frozen=True, slots=True)
class Pagination:
    """How a tool's pages follow each other (worker/call/pagination.py); `param` is also the argument a model
    passes back to continue (with the envelope's `next_cursor`)."""

    style: str  # one of PAGINATION_STYLES
    items: str = "@"  # JMESPath to a page's list
    max_pages: int = 5
    next: str | None = None  # cursor: JMESPath to the next cursor (or next URL) in the body
    param: str = "cursor"
    limit_param: str | None = None  # offset: the page size's query parameter
    limit: int | None = None


AUTH_TYPES = ("bearer", "basic", "api_key", "oauth2_client_credentials", "oauth2_user", "oauth2_token_exchange")
# Auth types whose token is an end user's, kept per (user, upstream) in the vault (worker/call/vault.py).
DELEGATED_AUTH_TYPES = frozenset({"oauth2_user", "oauth2_token_exchange"})


@dataclass(frozen=True, slots=True)
class Auth:
    """How requests to an upstream authenticate; the secrets are templates (`${env:...}`, `${file:...}`)."""

    type: str  # one of AUTH_TYPES
    token: Template | None = None  # bearer
    username: Template | None = None  # basic
    password: Template | None = None  # basic
    value: Template | None = None  # api_key
    location: str = "header"  # api_key: "header" or "query"
    name: str = ""  # api_key: the header or query parameter
    token_url: Template | None = None  # oauth2_client_credentials, and the rest
    client_id: Template | None = None
    client_secret: Template | None = None
    scope: str | None = None
    audience: str | None = None
    extra_params: Mapping[str, Template] = field(default_factory=dict)
    auth_method: str = "body"  # how the client authenticates at the token URL: "body" or "basic"
    # A call header (lower case) whose value, when the call has it, replaces the upstream's own credential.
    per_call_header: str | None = None
    # oauth2_user: the authorization server (its metadata, or its endpoints) and the scopes asked for;
    # oauth2_token_exchange: `scopes` and `audience` of the token asked for.
    issuer: str | None = None
    authorization_url: Template | None = None
    revocation_url: Template | None = None
    scopes: tuple[str, ...] = ()

    @property
    def delegated(self) -> bool:
        """Whether the credential is an end user's, from the vault."""
        return self.type in DELEGATED_AUTH_TYPES

    @property
    def templates(self) -> list[Template]:
        fields = (self.token, self.username, self.password, self.value, self.token_url, self.client_id)
        endpoints = (self.authorization_url, self.revocation_url)
        return [t for t in (*fields, *endpoints, self.client_secret, *self.extra_params.values()) if t is not None]


MCP_TRANSPORTS = ("streamable_http", "sse")


@dataclass(frozen=True, slots=True)
class McpServer:
    """An upstream that is an MCP server (docs/guides/mcp-upstreams.md): where it is, and which of its tools
    are served under which names."""

    url: Template
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    # None: `<upstream>_`; "" keeps the server's names.
    prefix: str | None = None
    refresh_s: float = constants.DEFAULT_MCP_REFRESH_S
    # A changed or new tool is withheld until an operator accepts it.
    pin: bool = False
    transport: str = "streamable_http"  # one of MCP_TRANSPORTS
    # Tools whose taskSupport is `optional` are called as upstream tasks too.
    tasks: bool = False


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    base_url: Template
    timeout_s: float = constants.DEFAULT_UPSTREAM_TIMEOUT_S
    connect_timeout_s: float = constants.DEFAULT_CONNECT_TIMEOUT_S
    headers: Mapping[str, Template] = field(default_factory=dict)
    verify_tls: bool = True
    max_concurrency: int = constants.DEFAULT_MAX_CONCURRENCY
    retry: RetryPolicy = RetryPolicy()
    max_output_chars: int = constants.DEFAULT_MAX_OUTPUT_CHARS
    max_response_bytes: int = constants.DEFAULT_MAX_RESPONSE_BYTES
    queue: str | None = None
    # Lower-case header names a call may override; Host and framing headers never.
    overridable_headers: frozenset[str] = frozenset()
    # Redirects may leave the upstream's scheme/host/port only when this is set.
    allow_offsite_redirects: bool = False
    circuit: CircuitPolicy = CircuitPolicy()
    rate_limit: RateLimit | None = None
    auth: Auth | None = None
    # The approval rule of its tools (a tool's own rule replaces it); None: calls run without one.
    approval: Approval | None = None
    cache: CachePolicy | None = None
    source: Source = Source("<builtin>")
    # An MCP server (its tools come from its `tools/list`); None: an HTTP API at `base_url`.
    mcp: McpServer | None = None


class Transform(Protocol):
    """A response transform: parsed JSON in, JSON-serialisable value out."""

    def __call__(self, data: JSON) -> JSON: ...


@dataclass(frozen=True, slots=True)
class Body:
    """A request body template: none, text (one template) or structured (a tree with template leaves)."""

    kind: str = "none"  # "none" | "text" | "structured"
    value: Any = None

    @property
    def templates(self) -> list[Template]:
        if self.kind == "text":
            return [self.value]
        if self.kind == "structured":
            return list(_tree_templates(self.value))
        return []


_NO_PATH = Template.literal("")


@dataclass(frozen=True, slots=True)
class RequestTemplate:
    method: str = "GET"
    path: Template = _NO_PATH
    query: Mapping[str, Template] = field(default_factory=dict)
    headers: Mapping[str, Template] = field(default_factory=dict)
    body: Body = Body()
    content_type: str = "application/json"
    # Arguments no template names go to the query (GET-like) or JSON body (POST-like).
    send_unreferenced: bool = True

    @property
    def templates(self) -> list[Template]:
        return [self.path, *self.query.values(), *self.headers.values(), *self.body.templates]


@dataclass(eq=False)
class Tool:
    name: str
    upstream: str
    request: RequestTemplate
    description: str = ""
    tags: tuple[str, ...] = ()
    transform: Transform | None = None
    max_output_chars: int | None = None
    source: Source = Source("<builtin>")
    # How it is answered: constants.KIND_DEFINED, KIND_HTTP_REQUEST or KIND_CATALOG (worker/call/handlers.py).
    kind: str = constants.KIND_DEFINED
    # One of TASK_MODES, or None for DEFAULT_TASK_MODE (see `task_mode`).
    task: str | None = None
    # The schema, or a factory that builds it on first use (large OpenAPI specs).
    schema: Mapping[str, JSON] | Callable[[], Mapping[str, JSON]] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    # Its own approval rule, replacing its upstream's; None: the upstream's.
    approval: Approval | None = None
    # What a 2xx JSON answer looks like (native `output_schema:`, an OpenAPI 2xx response), or a factory.
    output: Mapping[str, JSON] | Callable[[], Mapping[str, JSON] | None] | None = None
    pagination: Pagination | None = None
    # The tool's own; None: its upstream's (see `cache_policy`).
    cache: CachePolicy | None = None
    # An MCP upstream's tool: its name on the server, its title and annotations as the server gave them.
    remote_name: str | None = None
    title: str | None = None
    annotations: Mapping[str, JSON] | None = None

    @cached_property
    def input_schema(self) -> Mapping[str, JSON]:
        return self.schema() if callable(self.schema) else self.schema

    @cached_property
    def output_schema(self) -> Mapping[str, JSON] | None:
        return self.output() if callable(self.output) else self.output

    def cache_policy(self, upstream: Upstream) -> CachePolicy | None:
        """The tool's cache, else its upstream's; None: not cached."""
        return self.cache or upstream.cache

    @property
    def schema_is_lazy(self) -> bool:
        return callable(self.schema)

    @property
    def task_mode(self) -> str:
        """How MCP clients may run its calls as tasks: its own `task:`, else DEFAULT_TASK_MODE."""
        return self.task or DEFAULT_TASK_MODE

    @property
    def summary(self) -> str:
        return self.description.strip().split("\n", 1)[0]


def needs_approval(tool: Tool, upstream: Upstream) -> bool:
    """Whether a call of this tool waits for a human's approval: the tool's rule, else its upstream's."""
    rule = tool.approval if tool.approval is not None else upstream.approval
    return rule is not None and rule.requires(tool.request.method)


@dataclass(frozen=True, slots=True)
class Problem:
    source: Source
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


@dataclass
class ToolSet:
    """Everything a definitions store holds: usable tools, and why the others cannot be used."""

    upstreams: dict[str, Upstream] = field(default_factory=dict)
    tools: dict[str, Tool] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # Tool name -> why it cannot be used (exit 78 when called).
    unusable: dict[str, str] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)
    # What is worth saying but breaks nothing (an MCP upstream not listed yet, and why).
    notices: list[Problem] = field(default_factory=list)
    # MCP upstreams never listed: a call to their prefix + any name is sent to them (mcp_tools.unlisted_tool).
    unlisted: tuple[str, ...] = ()

    def tenant(self, name: str) -> Tenant:
        """A tenant's limits: its own, else the default tenant's (under its own name)."""
        found = self.tenants.get(name) or self.tenants.get(constants.DEFAULT_TENANT)
        return Tenant(name) if found is None else replace(found, name=name)

    def merge(self, other: ToolSet) -> None:
        for name, upstream in other.upstreams.items():
            existing = self.upstreams.get(name)
            if existing is not None and replace(upstream, source=existing.source) == existing:
                continue  # the same upstream declared again (a toolbox split over several files)
            if existing is not None:
                self.problems.append(Problem(upstream.source, f"duplicate upstream {name!r}"))
                continue
            self.upstreams[name] = upstream
        for name, tool in other.tools.items():
            if name in self.tools:
                first = self.tools[name].source
                self.problems.append(Problem(tool.source, f"duplicate tool name {name!r} (first at {first})"))
                continue
            self.tools[name] = tool
        for name, tenant in other.tenants.items():
            if name in self.tenants:
                first = self.tenants[name].source
                self.problems.append(Problem(tenant.source, f"duplicate tenant {name!r} (first at {first})"))
                continue
            self.tenants[name] = tenant
        self.problems.extend(other.problems)
        self.unusable.update(other.unusable)


def _tree_templates(node: Any) -> list[Template]:
    if isinstance(node, Template):
        return [node]
    if isinstance(node, Mapping):
        return [t for value in node.values() for t in _tree_templates(value)]
    if isinstance(node, list):
        return [t for value in node for t in _tree_templates(value)]
    return []
