"""The MCP front end: one `mcp` SDK server for Streamable HTTP (`/mcp`) and stdio (`toolworker mcp`).

The SDK answers every protocol revision from one server: the 2026-07-28 one (no handshake,
`server/discover`, cache hints, `subscriptions/listen`) and clients that still send `initialize`.

- `tools/list`: the catalog by name, in pages behind opaque cursors (keyset: the last name given), with
  annotations from the HTTP method; cached by 2026 clients until the next look for a new definitions
  version. A new version reaches them on their `subscriptions/listen` stream, and legacy stdio clients
  as `notifications/tools/list_changed`.
- `tools/call`: one queued call (or one answered from the cache without the queue). The text is the
  envelope's `result` (on failure its error message, then the body), with a second text block for what
  the model should know (what was cut, how to continue a listing, a note); `isError` is exitCode != 0;
  `structuredContent` is the parsed JSON answer, and a tool with a response schema lists it as
  `outputSchema` (output.py: each protocol generation's shapes, and an answer that does not conform
  is a tool error, never a structuredContent a client would reject). `_meta["toolworker/call"]` carries
  callId, statusCode, exitCode, truncated, attempts and durationMs (and pages, next_cursor, cached, age).
  `_meta["toolworker/callId"]` on the request (or an `Idempotency-Key` header) names the call, so a
  request sent again is answered from the same call. An unknown tool is a
  JSON-RPC error; arguments the tool's schema refuses are a tool error naming the field (the worker's).
- A tool that needs approval (docs/guides/approvals.md) asks the human through the client before anything
  is enqueued (asking.py: an `input_required` result on 2026-07-28, `elicitation/create` before); accept
  enqueues it approved, anything else sends nothing; a client that cannot be asked is told how approval
  is granted instead (a tool error).
- Cancellation (the request's stream closed, or `notifications/cancelled`) takes a call that has not
  started off the queue (waiting.py).
- A call whose MCP upstream asks its caller something (relay.py): on 2026-07-28 the request ends with
  `input_required`, and the retry that carries the answer and the `requestState` follows the same call on.
- A tool that acts for its user at an upstream the user has not connected: the user is asked to connect
  first (consent.py, through asking.py), and the call goes on once connected.
- Discovery mode (`--mode discovery`) lists four meta-tools instead of the catalog (discovery.py).
- Tasks (tasks.py): a call whose client asks for a task (2026-07-28: the tasks extension in the request's
  client capabilities; 2025-11-25: `params.task`) and whose tool allows it is answered with a task at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types
import structlog
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request

from worker import tracing
from worker.constants import PROGRAM_TOOL
from worker.definitions.model import Tool
from worker.errors import TenantQueueFull, UnknownTool
from worker.gateway import metrics, version
from worker.gateway.calls import CallIdConflict, Calls, CallSpec, Submitted, check_call_id
from worker.gateway.catalog import Snapshot
from worker.gateway.health import FleetUnavailable
from worker.gateway.identity.audit import now_iso
from worker.gateway.identity.principals import LOCAL, Principal, access_token_of, principal_of
from worker.gateway.mcp import asking, code_mode, discovery
from worker.gateway.mcp import output as mcp_output
from worker.gateway.mcp import relay as upstream_relay
from worker.gateway.mcp.consent import consent_to_call
from worker.gateway.mcp.relay import LogLevels
from worker.gateway.mcp.results import CALL_META_KEY, text_result, tool_result
from worker.gateway.mcp.sessions import Handshakes
from worker.gateway.mcp.task_listen import TaskListen
from worker.gateway.mcp.tasks import McpTasks, TaskServer
from worker.gateway.mcp.waiting import Waiting
from worker.queue import approvals
from worker.settings import Settings

log = structlog.get_logger("toolworker.gateway.mcp")
Mode = Literal["all", "discovery", "code"]
Context = ServerRequestContext[Any, Any]

CALL_ID_META_KEY = "toolworker/callId"
IDEMPOTENCY_HEADER = "idempotency-key"
INSTRUCTIONS = (
    "Tools of a toolworker fleet: every call runs on a worker through a queue. A tool result's "
    f"_meta['{CALL_META_KEY}'] holds its callId, statusCode, exitCode and attempts."
)
# The key of the approval question among a request's input requests (2026-07-28).
APPROVAL_INPUT_KEY = "toolworker/approval"
HOW_TO_APPROVE = (
    "The tool {tool} needs a human's approval before it runs, and this client cannot be asked here (asking "
    "takes elicitation: a 2026-07-28 client that declares it, or an earlier one on stdio; over HTTP this "
    "endpoint does not send requests to an earlier client). Nothing was sent. Use such a client, or make the "
    "call through REST (POST /v1/calls): it is parked until a principal with the `approve` grant approves it "
    "(POST /v1/approvals/{{callId}}, or `toolworker approvals approve`)."
)
_CURSOR_PREFIX = "after:"


@dataclass
class Options:
    """What the command line chooses: the tags offered (all tools when empty) and the MCP mode."""

    tags: Sequence[str] = ()
    mode: Mode = "all"


class McpFront:
    """The handlers of the MCP server, over the gateway's calls and catalog."""

    def __init__(
        self, calls: Calls, mode: Mode, page_size: int, timeout_s: float, tasks: McpTasks | None = None
    ) -> None:
        self.calls = calls
        self.tasks = tasks
        self.mode = mode
        self.page_size = page_size
        self.timeout_s = timeout_s
        self.bus = InMemorySubscriptionBus()
        self.levels = LogLevels(Handshakes(calls.redis))
        self.front = "mcp"
        self._legacy_session: ServerSession | None = None  # stdio: the one connection, for list_changed
        self._background: set[asyncio.Task[Any]] = set()
        self.waiting = Waiting(calls, timeout_s, self._spawn)
        calls.catalog.on_change(self._changed)

    def server(self) -> Server[Any]:
        server: Server[Any] = TaskServer(
            "toolworker",
            version=version(),
            instructions=INSTRUCTIONS,
            get_tool_input_schema=self._input_schema,
            on_subscriptions_listen=TaskListen(self.bus, self.tasks.watch if self.tasks is not None else None),
        )
        if not tracing.enabled():  # the SDK's span of each request, a no-op that only costs time when not tracing
            server.middleware.clear()  # the SDK's documented opt-out (its one default is that span)
        # Registered by method: the handlers answer with the wire's dicts (the SDK validates them once).
        server.add_request_handler("tools/list", types.PaginatedRequestParams, self.list_tools)
        server.add_request_handler("tools/call", types.CallToolRequestParams, self.call_tool)
        # Declares the logging capability: an MCP upstream's log messages reach the caller (relay.py).
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self.levels.set_level)
        if self.tasks is not None:
            self.tasks.install(server, self.call_tool)
        return server

    @classmethod
    def of(cls, calls: Calls, settings: Settings, mode: Mode) -> McpFront:
        """The MCP front end as the gateway's settings make it (HTTP and stdio alike), with its tasks."""
        timeout_s = settings.gateway_call_timeout_seconds
        return cls(calls, mode, settings.gateway_page_size, timeout_s, McpTasks.of(calls, settings))

    # --- tools/list -------------------------------------------------------------------------------

    async def list_tools(self, ctx: Context, params: types.PaginatedRequestParams) -> dict[str, Any]:
        self._remember(ctx)
        last = _decode_cursor(params.cursor)
        if self.mode != "all":  # meta-tools (and run_code when offered), not the catalog
            tools: list[Mapping[str, Any]] = self._meta_listing(ctx)
            next_name = None
        else:
            snapshot = self.calls.visible(_principal(ctx))
            names, next_name = snapshot.after(last, self.page_size)
            tools = [mcp_output.listed(entry, ctx.protocol_version) for entry in snapshot.mcp_tools(names)]
        result: dict[str, Any] = {
            "tools": tools,
            "ttlMs": self.calls.catalog.ttl_ms,
            "cacheScope": "public",
            "resultType": "complete",
        }
        if next_name is not None:
            result["nextCursor"] = _encode_cursor(next_name)
        return result

    def _meta_listing(self, ctx: Context) -> list[Mapping[str, Any]]:
        snapshot = self.calls.visible(_principal(ctx))
        if self.mode == "code":
            return code_mode.listed(snapshot)
        return [*discovery.META_TOOLS, *snapshot.mcp_tools([PROGRAM_TOOL])]

    @staticmethod
    def _input_schema(name: str) -> Mapping[str, Any] | None:
        """For the SDK's `Mcp-Param-*` header check: the offered schemas never annotate a parameter as a
        header (exports drop `x-*` keys), so there is nothing to compare, and no list to walk for it."""
        return None

    # --- tools/call -------------------------------------------------------------------------------

    async def call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> dict[str, Any]:
        self._remember(ctx)
        name, arguments = params.name, dict(params.arguments or {})
        if self.mode == "discovery" and name in discovery.META_TOOL_NAMES:
            return await self._meta_tool(ctx, params, name, arguments)
        if self.mode == "code" and name != PROGRAM_TOOL:
            return self._code_meta_tool(ctx, name, arguments)
        return await self._call(ctx, params, name, arguments)

    def _code_meta_tool(self, ctx: Context, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Code mode offers its meta-tools and run_code only: tools are called from programs."""
        if name not in code_mode.META_TOOL_NAMES:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}")
        try:
            return text_result(code_mode.answer(name, arguments, self.calls.visible(_principal(ctx))), False)
        except discovery.InvalidMetaArguments as exc:
            return text_result(str(exc), is_error=True)

    async def _meta_tool(
        self, ctx: Context, params: types.CallToolRequestParams, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        snapshot: Snapshot = self.calls.visible(_principal(ctx))
        try:
            if name != discovery.CALL_TOOL:
                return text_result(discovery.answer(name, arguments, snapshot), is_error=False)
            discovery.check(name, arguments)
        except discovery.InvalidMetaArguments as exc:
            return text_result(str(exc), is_error=True)
        return await self._call(ctx, params, arguments["name"], dict(arguments.get("arguments") or {}))

    async def _call(
        self, ctx: Context, params: types.CallToolRequestParams, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        started = time.perf_counter()
        headers = _request_headers(ctx)
        principal = _principal(ctx)
        resume = upstream_relay.Resume.of(ctx.params)
        if resume is not None:
            return await self._resume(ctx, resume, name, arguments, principal, started)
        asked = await consent_to_call(ctx, self.calls, name, principal)
        if asked is not None:
            return asked
        try:
            call_id = check_call_id(_meta(params).get(CALL_ID_META_KEY) or headers.get(IDEMPOTENCY_HEADER))
            trace = tracing.context_from(_meta(params))
            approved_by = await self._approval(ctx, name, arguments)
            if isinstance(approved_by, dict):  # the question, or the reason nothing was sent
                return approved_by
            token = _access_token(ctx)
            relay = upstream_relay.wanted(ctx, self.levels.level(ctx))
            spec = CallSpec(
                name, arguments, headers, call_id, self.timeout_s, trace, principal, approved_by, token, relay=relay
            )
            task = await self._task(ctx, params, spec)
            if task is not None:
                return task
            submitted = await self.calls.submit(spec)
        except UnknownTool as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {exc.name}") from None
        except (CallIdConflict, ValueError) as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None
        except FleetUnavailable as exc:
            return text_result(f"The tool fleet cannot take calls now ({exc}). Try again later.", is_error=True)
        except TenantQueueFull as exc:
            return text_result(exc.message, is_error=True)
        return await self._answer(ctx, submitted, relay, started)

    async def _resume(
        self,
        ctx: Context,
        resume: upstream_relay.Resume,
        name: str,
        arguments: dict[str, Any],
        principal: Principal,
        started: float,
    ) -> dict[str, Any]:
        """A 2026-07-28 caller's retry with its answer to what the call's upstream asked: the answer handed to
        the worker, and the same call followed on (only by the principal that made it, with its arguments)."""
        try:
            tool = self.calls.resolve(name, principal)
        except UnknownTool as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {exc.name}") from None
        if not await self.calls.made_by(resume.call_id, name, arguments, principal):
            raise upstream_relay.unknown_state()
        await resume.answer(self.calls.client.redis_of(principal.tenant), ctx.params or {})
        submitted = Submitted(resume.call_id, tool, True, principal, now_iso(), started)
        relay = upstream_relay.wanted(ctx, self.levels.level(ctx))
        return await self._answer(ctx, submitted, relay, started, resume.after)

    async def _answer(
        self, ctx: Context, submitted: Submitted, relay: Mapping[str, Any] | None, started: float, after: str = "0-0"
    ) -> dict[str, Any]:
        """The call's tool result, or what its upstream asks a 2026-07-28 caller (input_required)."""
        try:
            envelope = await self.waiting.envelope(ctx, submitted, relay, after)
        except upstream_relay.Asked as asked:  # the call goes on; the caller's retry follows it
            return asked.result
        if envelope is None:
            self.calls.hold(submitted)
        metrics.observe(self.front, envelope, time.perf_counter() - started)
        entry = self._entry(ctx, submitted.tool)
        return tool_result(envelope, submitted.call_id, self.timeout_s, submitted.tool, entry, ctx.protocol_version)

    def _entry(self, ctx: Context, tool: Tool) -> Mapping[str, Any] | None:
        """The tool's `tools/list` entry as this client was given it (its outputSchema, if any)."""
        if self.mode != "all":  # called through a meta-tool, or run_code: no output schema
            return None
        entries = self.calls.visible(_principal(ctx)).mcp_tools([tool.name])
        return mcp_output.listed(entries[0], ctx.protocol_version) if entries else None

    async def _approval(self, ctx: Context, name: str, arguments: dict[str, Any]) -> str | dict[str, Any] | None:
        """None when the tool needs no approval; who approved when the human accepted; else the result to
        answer with (the question on 2026-07-28, a decline, or how approval is granted)."""
        principal = _principal(ctx)
        tool = self.calls.resolve(name, principal)
        if not self.calls.needs_approval(tool):
            return None
        target = approvals.target(tool, self.calls.catalog.snapshot.upstream(tool), arguments)
        question = f"Allow this tool call? {name}: {target}, arguments {json.dumps(arguments, ensure_ascii=False)}"
        answer = await asking.ask_to_confirm(ctx, APPROVAL_INPUT_KEY, question)
        if answer.action == "unsupported":
            return text_result(HOW_TO_APPROVE.format(tool=name), is_error=True)
        if answer.result is not None:  # the question (2026-07-28)
            return dict(answer.result)
        if not answer.accepted:
            text = f"The user did not approve this call to {name} ({answer.action}); it was not sent."
            return text_result(text, is_error=True)
        log.info("gateway.call_approved", tool=name, principal=principal.name)
        return principal.name

    async def _task(self, ctx: Context, params: types.CallToolRequestParams, spec: CallSpec) -> dict[str, Any] | None:
        """The task answering this call, when its client asked for one and its tool allows it (tasks.py decides;
        raises UnknownTool for a tool not granted, MCPError for a task mode the request does not meet)."""
        if self.tasks is None:
            return None
        tool = self.calls.resolve(spec.tool, spec.principal)
        generation = self.tasks.requested(ctx, params, tool)
        if generation is None:
            return None
        if spec.call_id is not None:
            raise ValueError("A task's id is made by the gateway: a task request cannot name a callId.")
        return await self.tasks.create(spec, tool, generation, params)

    # --- list changes -----------------------------------------------------------------------------

    def _changed(self, snapshot: Snapshot) -> None:
        self._spawn(self._announce(snapshot.version))

    async def _announce(self, definitions_version: int) -> None:
        await self.bus.publish(ToolsListChanged())
        session = self._legacy_session
        if session is not None:
            try:
                await session.send_tool_list_changed()
            except Exception as exc:  # a client gone meanwhile: nothing to tell
                log.info("gateway.list_changed_not_sent", error=str(exc))
        log.info("gateway.tools_list_changed", version=definitions_version)

    def _remember(self, ctx: Context) -> None:
        """On stdio with a handshake-era client, the session to send `notifications/tools/list_changed` on."""
        if ctx.request is None and ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            self._legacy_session = ctx.session

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)  # referenced until done: a bare task may be collected
        task.add_done_callback(self._background.discard)


def _meta(params: types.RequestParams) -> Mapping[str, Any]:
    meta = params.meta
    return meta if isinstance(meta, Mapping) else {}


def _principal(ctx: Context) -> Principal:
    """Who sent the request (over HTTP, as the Guard admitted it; on stdio, the local operator)."""
    return principal_of(ctx.request.scope) if isinstance(ctx.request, Request) else LOCAL


def _access_token(ctx: Context) -> str | None:
    return access_token_of(ctx.request.scope) if isinstance(ctx.request, Request) else None


def _request_headers(ctx: Context) -> Mapping[str, str]:
    """The HTTP request's headers (looked up by lower-case name); none on stdio."""
    return ctx.request.headers if isinstance(ctx.request, Request) else {}


def _encode_cursor(last_name: str) -> str:
    return base64.urlsafe_b64encode((_CURSOR_PREFIX + last_name).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> str | None:
    """The last name of the previous page; a cursor this server did not give is error -32602."""
    if cursor is None:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    if not text.startswith(_CURSOR_PREFIX):
        raise MCPError(code=types.INVALID_PARAMS, message="Invalid cursor")
    return text[len(_CURSOR_PREFIX) :]
