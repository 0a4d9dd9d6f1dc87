"""The REST API's types: the bodies and queries its routes read, and the answers they give.

The routes read their inputs with these models (operations.py) and the OpenAPI document is generated from
the same ones (document.py): a field's bounds and descriptions are written once, here. Bodies are strict
(no `"5"` for 5, no `false` for 0) and refuse unknown fields; queries are read from strings, and ignore
parameters they do not name. The answers are described, not validated: the routes build them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from worker.gateway.calls import MAX_CALL_ID_CHARS
from worker.protocol import MAX_CALLBACK_URL_CHARS

MAX_BATCH = 1000
MAX_WAIT_S = 3600.0
Format = Literal["summary", "openai", "anthropic", "mcp"]
_INTEGER = re.compile(r"-?[0-9]+")


def _whole_number(value: Any) -> Any:
    """A query's integer as the document types it: digits only (pydantic alone would take "5.0" or "1_0")."""
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        raise ValueError("Input should be a valid integer")
    return value


QueryInt = Annotated[int, BeforeValidator(_whole_number)]
WaitSeconds = Annotated[float | None, Field(ge=0, le=MAX_WAIT_S)]

# --- bodies ---------------------------------------------------------------------------------------


class Callback(BaseModel):
    """Where the envelope is POSTed once published, signed per Standard Webhooks (webhook-id,
    webhook-timestamp, webhook-signature), retried with backoff; the host must be on the gateway's
    TOOLWORKER_CALLBACK_ALLOW, else the call is refused (403 callback_refused; in a batch, that call's
    envelope says exitCode 77)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(
        min_length=1,
        max_length=MAX_CALLBACK_URL_CHARS,
        description="An absolute http:// or https:// URL (checked against the allow-list).",
    )


class CallRequest(BaseModel):
    """One call as `/v1/calls` and `/v1/batches` take it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tool: str = Field(min_length=1, max_length=256, description="The tool's name.")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="The tool's arguments, as its input schema says."
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Per-call headers; kept only where the tool's upstream lists them as overridable.",
    )
    callId: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CALL_ID_CHARS,
        description="Names the call: sent again, it is answered from the same call.",
    )
    timeoutSeconds: float | None = Field(None, gt=0, le=86_400, description="The call's whole budget.")
    wait: bool = Field(True, description="false: answer 202 with the callId at once.")
    waitSeconds: WaitSeconds = None
    callback: Callback | None = None


class CodeRequest(BaseModel):
    """A program (code mode, docs/guides/code-mode.md): its tool calls are `await tools.<name>(...)`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    code: str = Field(min_length=1, max_length=100_000, description="The program's text.")
    timeoutSeconds: float | None = Field(None, gt=0, le=86_400, description="The program's whole budget.")
    waitSeconds: WaitSeconds = None
    callback: Callback | None = None


class BatchRequest(BaseModel):
    """Many calls at once, answered in order."""

    model_config = ConfigDict(extra="forbid", strict=True)

    calls: list[CallRequest] = Field(min_length=1, max_length=MAX_BATCH)
    wait: bool = True
    waitSeconds: WaitSeconds = None


class Decision(BaseModel):
    """A decision on a parked call."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "deny"]
    reason: str = Field("", max_length=1000, description="In the audit trail; a denial's envelope.")


# --- queries --------------------------------------------------------------------------------------


class WaitQuery(BaseModel):
    waitSeconds: float = Field(
        0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="How long to wait for the envelope before answering 202 (default: do not wait).",
    )


class ToolsQuery(BaseModel):
    tag: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Only the tools with this tag (repeat for any of several)."
    )
    format: Format = Field("summary", description="summary (light rows), or an export for an LLM API.")


class SearchQuery(BaseModel):
    question: str = Field(min_length=1, pattern=r"\S")
    top_k: QueryInt = Field(5, ge=1, le=50)
    format: Format = Field("summary", description="summary (light rows), or an export for an LLM API.")


class TicketQuery(BaseModel):
    ticket: str = Field(min_length=1)


class CallbackQuery(BaseModel):
    state: str = Field(min_length=1)
    code: str | None = Field(None, min_length=1)
    iss: str | None = Field(None, min_length=1)
    error: str | None = Field(None, min_length=1)


# --- answers --------------------------------------------------------------------------------------


class Described(BaseModel):
    """An answer's shape, for the document; what a route sends may carry more."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(Described):
    type: str
    message: str


class Error(Described):
    error: ErrorDetail


class Envelope(Described):
    """The result envelope of a call (exitCode 0: the upstream answered 2xx)."""

    callId: str
    tool: str
    method: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    statusCode: int | None = None
    contentType: str | None = None
    result: str = Field(description="What the model reads.")
    error: ErrorDetail | None = None
    exitCode: int
    truncated: bool = False
    attempts: int = 0
    durationMs: float = 0
    structuredContent: Any = Field(
        None,
        description="The JSON body parsed (as `result` reads, cut or not), when it arrived whole and conforms "
        "to the tool's output schema; null otherwise (see `note`).",
    )
    truncation: str | None = Field(None, description="What a JSON-aware cut kept.")
    note: str | None = Field(None, description="What else the model should know of this answer.")
    pages: int | None = Field(None, description="Pages read (paginated tools).")
    next_cursor: str | None = Field(
        None, description="More pages remain: pass this as the tool's pagination argument to continue."
    )
    cached: bool = Field(False, description="Answered from the cache, without an upstream request.")
    age: int | None = Field(None, description="Seconds since a cached answer was stored.")
    output: str | None = Field(None, description="A program's printed text (code mode).")
    calls: list[dict[str, Any]] | None = Field(
        None, description="A program's tool calls, one line each: callId, tool, exitCode, durationMs."
    )


class Pending(Described):
    callId: str
    status: Literal["pending", "awaiting_approval"] = Field(
        description="awaiting_approval: the tool needs a human's approval; the call is parked."
    )
    location: str


class Withdrawn(Described):
    callId: str
    withdrawn: bool
    cancelled: bool = Field(False, description="A program cancelled while its tool calls ran (code mode): answered 75.")


class BatchResults(Described):
    """One envelope (or pending entry) per call, in order."""

    results: list[dict[str, Any]]


class ToolList(Described):
    version: int | None = None
    tools: list[dict[str, Any]]


class Health(Described):
    status: Literal["ready", "unavailable"]
    message: str | None = None


class ParkedCall(Described):
    """A call waiting for a human's approval (header values never shown)."""

    callId: str
    tool: str
    principal: str | None = Field(None, description="Who made it (null: a queue producer).")
    tenant: str
    method: str
    target: str = Field(description="Method, upstream and path with its arguments.")
    arguments: dict[str, Any]
    headers: dict[str, Literal["[redacted]"]]
    since: AwareDatetime | None = None
    expires: AwareDatetime | None = None


class Approvals(Described):
    approvals: list[ParkedCall]


class Decided(Described):
    callId: str
    tool: str
    decision: Literal["approve", "deny"]
    decidedBy: str
    reason: str


class Connection(Described):
    """A user's grant to an upstream that acts for them (never a token)."""

    upstream: str
    scopes: list[str]
    expiresAt: AwareDatetime | None = None


class ConnectionList(Described):
    connections: list[Connection]


class ClientMetadataDocument(Described):
    """The fleet's client at an MCP server's authorization server, named by this document's own URL."""

    client_id: str
    client_name: str
    redirect_uris: list[str]
    grant_types: list[str]
    response_types: list[str]
    token_endpoint_auth_method: Literal["none"]


class Removed(Described):
    upstream: str
    removed: bool
    revokedAtServer: bool
