"""The native REST API under `/v1` (described by document.py), plus `/healthz` and `/metrics`.

    POST   /v1/calls              one call: 200 with its envelope, or 202 with its callId (wait: false,
                                  or no envelope within waitSeconds)
    GET    /v1/calls/{callId}     its envelope (200), still pending (202), unknown (404); ?waitSeconds=S
    DELETE /v1/calls/{callId}     take a call that has not started off the queue (200), else 409/404
    POST   /v1/batches            many calls at once, answered in order
    GET    /v1/tools              the catalog (?tag=T, ?format=summary|openai|anthropic|mcp)
    GET    /v1/tools/search       ?question=Q&top_k=N (&format=...)
    GET    /v1/tools/{name}       one tool's full definition
    GET    /v1/approvals          the calls parked for a human's approval (the `approve` grant)
    POST   /v1/approvals/{callId} {decision: approve|deny, reason}: decide on one (the `approve` grant)
    GET    /healthz               200 when a worker answers a ping, else 503
    GET    /metrics               the gateway's Prometheus metrics

A call whose tool needs approval answers 202 at once (`status: awaiting_approval`): it is parked until
decided. Errors are `{"error": {"type", "message"}}`: 400 not JSON, 403 a decision without the `approve`
grant or a callback URL TOOLWORKER_CALLBACK_ALLOW refuses, 404 unknown tool or call, 409 a callId reused
for another call (or a call decided already), 422 a body of the wrong shape, 503 the fleet cannot take
calls.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.definitions import catalog
from worker.envelope import ToolResult
from worker.errors import CallbackRefused, TenantQueueFull, UnknownTool
from worker.gateway import metrics
from worker.gateway.calls import (
    MAX_CALL_ID_CHARS,
    QUEUE_FULL_RETRY_AFTER_S,
    CallIdConflict,
    Calls,
    CallSpec,
    Submitted,
)
from worker.gateway.decisions import NotAllowed
from worker.gateway.health import FleetUnavailable
from worker.gateway.identity.principals import access_token_of, principal_of
from worker.gateway.rest.bodies import BadBody, json_body, parse
from worker.protocol import MAX_CALLBACK_URL_CHARS
from worker.queue.approvals import NotParked

Format = Literal["summary", "openai", "anthropic", "mcp"]
EXPORTS: dict[str, Callable[[Any], list[dict[str, Any]]]] = {
    "openai": catalog.to_openai,
    "anthropic": catalog.to_anthropic,
    "mcp": catalog.to_mcp,
}
MAX_BATCH = 1000
MAX_WAIT_S = 3600.0
AWAITING_APPROVAL = "awaiting_approval"


class CallbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(min_length=1, max_length=MAX_CALLBACK_URL_CHARS)


class CallBody(BaseModel):
    """One call as `/v1/calls` and `/v1/batches` take it: strictly as the document says (no `"5"` for 5, no
    `false` for 0)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tool: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Per-call headers; kept only where the tool's upstream lists them in overridable_headers.
    headers: dict[str, str] = Field(default_factory=dict)
    callId: str | None = Field(None, min_length=1, max_length=MAX_CALL_ID_CHARS)
    timeoutSeconds: float | None = Field(None, gt=0, le=86_400)
    wait: bool = True
    waitSeconds: float | None = Field(None, ge=0, le=MAX_WAIT_S)
    # Where the envelope is POSTed once published (signed webhooks; TOOLWORKER_CALLBACK_ALLOW).
    callback: CallbackBody | None = None


class DecisionBody(BaseModel):
    """A decision on a parked call."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "deny"]
    reason: str = Field("", max_length=1000)


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    calls: list[CallBody] = Field(min_length=1, max_length=MAX_BATCH)
    wait: bool = True
    waitSeconds: float | None = Field(None, ge=0, le=MAX_WAIT_S)


def error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status)


def pending(call_id: str, status: int = 202, state: str = "pending") -> JSONResponse:
    body = {"callId": call_id, "status": state, "location": f"/v1/calls/{call_id}"}
    return JSONResponse(body, status_code=status, headers={"Location": f"/v1/calls/{call_id}"})


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Handler:
    """Turn the gateway's errors into their JSON answers, in one place."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except BadBody as exc:
            return error(exc.status, "invalid_request", exc.message, problems=exc.problems)
        except UnknownTool as exc:
            return error(404, "unknown_tool", str(exc))
        except CallIdConflict as exc:
            return error(409, "call_id_conflict", str(exc))
        except FleetUnavailable as exc:
            return error(503, "unavailable", f"The tool fleet cannot take calls now: {exc}")
        except CallbackRefused as exc:
            return error(403, "callback_refused", exc.message)
        except TenantQueueFull as exc:
            response = error(429, exc.type, exc.message, tenant=exc.tenant, maxQueued=exc.limit)
            response.headers["Retry-After"] = str(QUEUE_FULL_RETRY_AFTER_S)
            return response
        except NotAllowed as exc:
            return error(403, "forbidden", str(exc))
        except NotParked as exc:
            return error(404 if exc.state is None else 409, "not_parked", str(exc), state=exc.state)

    return run


class Rest:
    def __init__(self, calls: Calls, default_timeout_s: float) -> None:
        self.calls = calls
        self.default_timeout_s = default_timeout_s

    def routes(self) -> list[Route]:
        return [
            Route("/v1/calls", guarded(self.create_call), methods=["POST"]),
            Route("/v1/calls/{call_id}", guarded(self.get_call), methods=["GET"]),
            Route("/v1/calls/{call_id}", guarded(self.withdraw_call), methods=["DELETE"]),
            Route("/v1/batches", guarded(self.create_batch), methods=["POST"]),
            Route("/v1/tools", guarded(self.list_tools), methods=["GET"]),
            Route("/v1/tools/search", guarded(self.search_tools), methods=["GET"]),
            Route("/v1/tools/{name}", guarded(self.get_tool), methods=["GET"]),
            Route("/v1/approvals", guarded(self.list_approvals), methods=["GET"]),
            Route("/v1/approvals/{call_id}", guarded(self.decide), methods=["POST"]),
            Route("/healthz", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]

    # --- calls ------------------------------------------------------------------------------------

    async def create_call(self, request: Request) -> Response:
        body = parse(CallBody, await json_body(request))
        started = time.perf_counter()
        spec = self._spec(body, request)
        submitted = await self.calls.submit(spec)
        parked = self.calls.needs_approval(submitted.tool)
        envelope = await self._answer(submitted, body.wait and not parked, body.waitSeconds, body.timeoutSeconds)
        metrics.observe("rest", envelope, time.perf_counter() - started)
        if envelope is None:
            await self.calls.hold(submitted, spec)
            return pending(submitted.call_id, state=AWAITING_APPROVAL if parked else "pending")
        return JSONResponse(envelope.to_dict())

    async def get_call(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        wait_s = _float_param(request, "waitSeconds", 0.0, MAX_WAIT_S)
        principal = principal_of(request.scope)
        known = await self.calls.tool_of(call_id, principal) is not None
        envelope = await self.calls.wait(call_id, wait_s if known else 0.0)
        if envelope is not None and self.calls.visible(principal).tool(envelope.tool) is not None:
            return JSONResponse(envelope.to_dict())
        return pending(call_id) if known else error(404, "unknown_call", f"No call {call_id!r} is known.")

    async def withdraw_call(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        principal = principal_of(request.scope)
        tool = await self.calls.tool_of(call_id, principal)
        if tool is None and await self.calls.wait(call_id, 0.0) is None:
            return error(404, "unknown_call", f"No call {call_id!r} is waiting.")
        if tool is not None and await self.calls.withdraw(call_id, tool, principal.tenant):
            metrics.WITHDRAWN.inc()
            return JSONResponse({"callId": call_id, "withdrawn": True})
        return error(409, "already_started", "The call was taken by a worker already; it runs to its end.")

    async def create_batch(self, request: Request) -> Response:
        body = parse(BatchBody, await json_body(request))
        await self.calls.health.admit()  # one answer for the whole batch when the fleet is away
        outcomes = await asyncio.gather(*(self._batch_item(call, body, request) for call in body.calls))
        return JSONResponse({"results": outcomes})

    async def _batch_item(self, call: CallBody, batch: BatchBody, request: Request) -> dict[str, Any]:
        spec = self._spec(call, request)
        try:
            submitted = await self.calls.submit(spec)
        except (UnknownTool, CallbackRefused) as exc:
            call_id = call.callId or str(uuid.uuid4())
            return ToolResult.failure(call_id, call.tool, exc).to_dict()
        except CallIdConflict as exc:
            return {
                "callId": call.callId,
                "tool": call.tool,
                "error": {"type": "call_id_conflict", "message": str(exc)},
            }
        parked = self.calls.needs_approval(submitted.tool)
        envelope = await self._answer(submitted, batch.wait and not parked, batch.waitSeconds, call.timeoutSeconds)
        if envelope is None:
            await self.calls.hold(submitted, spec)
            return {"callId": submitted.call_id, "status": AWAITING_APPROVAL if parked else "pending"}
        return envelope.to_dict()

    def _spec(self, body: CallBody, request: Request) -> CallSpec:
        headers = {**request.headers, **{k.lower(): v for k, v in body.headers.items()}}
        timeout_s = body.timeoutSeconds or self.default_timeout_s
        callback = body.callback.url if body.callback else None
        principal, subject_token = principal_of(request.scope), access_token_of(request.scope)
        return CallSpec(
            body.tool,
            body.arguments,
            headers,
            body.callId,
            timeout_s,
            principal=principal,
            subject_token=subject_token,
            callback=callback,
        )

    async def _answer(
        self, submitted: Submitted, wait: bool, wait_s: float | None, timeout_s: float | None
    ) -> ToolResult | None:
        if submitted.envelope is not None:  # answered from the cache: ready, whether or not asked to wait
            return submitted.envelope
        if not wait:
            return None
        budget = wait_s if wait_s is not None else (timeout_s or self.default_timeout_s)
        return await self.calls.answer(submitted, budget)

    # --- approvals --------------------------------------------------------------------------------

    async def list_approvals(self, request: Request) -> Response:
        return JSONResponse({"approvals": await self.calls.decisions.waiting(principal_of(request.scope))})

    async def decide(self, request: Request) -> Response:
        body = parse(DecisionBody, await json_body(request))
        call_id, principal = request.path_params["call_id"], principal_of(request.scope)
        return JSONResponse(await self.calls.decisions.decide(principal, call_id, body.decision, body.reason))

    # --- catalog ----------------------------------------------------------------------------------

    async def list_tools(self, request: Request) -> Response:
        snapshot = self.calls.visible(principal_of(request.scope))
        tags = request.query_params.getlist("tag")
        if not all(tags):
            raise BadBody(422, "The query parameter `tag` must not be empty.")
        rows = catalog.list_tools(snapshot.toolset, tags)
        return self._tools(rows, request, {"version": snapshot.version})

    async def search_tools(self, request: Request) -> Response:
        question = request.query_params.get("question", "").strip()
        if not question:
            raise BadBody(422, "The query parameter `question` is required.")
        top_k = _int_param(request, "top_k", 5, 1, 50)
        rows = catalog.search(self.calls.visible(principal_of(request.scope)).toolset, question, top_k)
        return self._tools(rows, request, {})

    async def get_tool(self, request: Request) -> Response:
        tool = self.calls.resolve(request.path_params["name"], principal_of(request.scope))
        return JSONResponse(catalog.definition(tool))

    def _tools(self, rows: list[dict[str, Any]], request: Request, extra: dict[str, Any]) -> Response:
        fmt = request.query_params.get("format", "summary")
        if fmt == "summary":
            return JSONResponse({**extra, "tools": rows})
        if fmt not in EXPORTS:
            raise BadBody(422, "`format` must be summary, openai, anthropic or mcp.")
        # The tools themselves, as this principal may see them: their kind sets the MCP hints.
        tools = self.calls.visible(principal_of(request.scope)).toolset.tools
        return JSONResponse({**extra, "tools": EXPORTS[fmt]([tools[r["name"]] for r in rows])})

    # --- operations -------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        status = await self.calls.health.status()
        body = {"status": "ready" if status.ready else "unavailable", "message": status.message}
        return JSONResponse(body, status_code=200 if status.ready else 503)

    async def metrics(self, request: Request) -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")


def _int_param(request: Request, name: str, default: int, lowest: int, highest: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.lstrip("-").isdigit() or not lowest <= int(raw) <= highest:
        raise BadBody(422, f"The query parameter `{name}` must be an integer from {lowest} to {highest}.")
    return int(raw)


def _float_param(request: Request, name: str, default: float, highest: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadBody(422, f"The query parameter `{name}` must be a number.") from None
    if not 0 <= value <= highest:
        raise BadBody(422, f"The query parameter `{name}` must be between 0 and {highest:g}.")
    return value
