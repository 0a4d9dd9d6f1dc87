"""The native REST API under `/v1`, plus `/healthz` and `/metrics`: the handlers, and their table (OPERATIONS).

    POST   /v1/calls              one call: 200 with its envelope, or 202 with its callId (wait: false,
                                  or no envelope within waitSeconds)
    GET    /v1/calls/{callId}     its envelope (200), still pending (202), unknown (404); ?waitSeconds=S
    DELETE /v1/calls/{callId}     take a call that has not started off the queue (200), else 409/404
                                  (both only for the principal that made the call, or one with `operate`)
    POST   /v1/batches            many calls at once, answered in order
    POST   /v1/code               a program (code mode): its value, printed output and tool calls
    GET    /v1/tools              the catalog (?tag=T, ?format=summary|openai|anthropic|mcp)
    GET    /v1/tools/search       ?question=Q&top_k=N (&format=...)
    GET    /v1/tools/{name}       one tool's full definition
    GET    /v1/approvals          the calls parked for a human's approval (the `approve` grant)
    POST   /v1/approvals/{callId} {decision: approve|deny, reason}: decide on one (the `approve` grant)
    GET    /healthz               200 when a worker answers a ping, else 503
    GET    /metrics               the gateway's Prometheus metrics (not in the document)

A call whose tool needs approval answers 202 at once (`status: awaiting_approval`): it is parked until
decided. Errors are `{"error": {"type", "message"}}`: 400 not JSON, 403 a decision without the `approve`
grant or a callback URL TOOLWORKER_CALLBACK_ALLOW refuses, 404 unknown tool or call, 409 a callId reused
for another call (or a call decided already), 422 a body or parameter of the wrong shape, 503 the fleet
cannot take calls.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Body, Path, Query
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.constants import PROGRAM_TOOL
from worker.definitions import catalog
from worker.envelope import ToolResult
from worker.errors import CallbackRefused, UnknownTool
from worker.gateway import metrics
from worker.gateway.calls import MAX_CALL_ID_CHARS, CallIdConflict, Calls, CallSpec, Submitted
from worker.gateway.identity.principals import Principal, access_token_of, principal_of
from worker.gateway.rest.models import (
    Approvals,
    BatchRequest,
    BatchResults,
    CallRequest,
    CodeRequest,
    Decided,
    Decision,
    Envelope,
    Error,
    Health,
    Pending,
    SearchQuery,
    ToolList,
    ToolsQuery,
    WaitQuery,
    Withdrawn,
)
from worker.gateway.rest.operations import Answer, Operation, error, served

EXPORTS: dict[str, Callable[[Any], list[dict[str, Any]]]] = {
    "openai": catalog.to_openai,
    "anthropic": catalog.to_anthropic,
    "mcp": catalog.to_mcp,
}
AWAITING_APPROVAL = "awaiting_approval"
CallId = Annotated[str, Path(max_length=MAX_CALL_ID_CHARS)]


def pending(call_id: str, status: int = 202, state: str = "pending") -> JSONResponse:
    body = {"callId": call_id, "status": state, "location": f"/v1/calls/{call_id}"}
    return JSONResponse(body, status_code=status, headers={"Location": f"/v1/calls/{call_id}"})


class Rest:
    def __init__(self, calls: Calls, default_timeout_s: float) -> None:
        self.calls = calls
        self.default_timeout_s = default_timeout_s

    def routes(self) -> list[Route]:
        return [*served(OPERATIONS, self), Route("/metrics", self.metrics, methods=["GET"])]

    # --- calls ------------------------------------------------------------------------------------

    async def create_call(self, request: Request, body: Annotated[CallRequest, Body()]) -> Response:
        return await self._create(request, body)

    async def run_code(self, request: Request, body: Annotated[CodeRequest, Body()]) -> Response:
        """Code mode: a program run as a call of `run_code` (its envelope's `output` and `calls` say more)."""
        call = CallRequest(
            tool=PROGRAM_TOOL,
            arguments={"code": body.code},
            timeoutSeconds=body.timeoutSeconds,
            waitSeconds=body.waitSeconds,
            callback=body.callback,
        )
        return await self._create(request, call)

    async def _create(self, request: Request, body: CallRequest) -> Response:
        started = time.perf_counter()
        spec = self._spec(body, request)
        submitted = await self.calls.submit(spec)
        parked = self.calls.needs_approval(submitted.tool)
        envelope = await self._answer(submitted, body.wait and not parked, body.waitSeconds, body.timeoutSeconds)
        metrics.observe("rest", envelope, time.perf_counter() - started)
        if envelope is None:
            self.calls.hold(submitted)
            return pending(submitted.call_id, state=AWAITING_APPROVAL if parked else "pending")
        return JSONResponse(envelope.to_dict())

    async def get_call(self, request: Request, callId: CallId, query: Annotated[WaitQuery, Query()]) -> Response:
        principal = principal_of(request.scope)
        known = await self.calls.tool_of(callId, principal) is not None
        envelope = await self._envelope(callId, principal, query.waitSeconds if known else 0.0, known)
        if envelope is not None:
            return JSONResponse(envelope.to_dict())
        return pending(callId) if known else error(404, "unknown_call", f"No call {callId!r} is known.")

    async def withdraw_call(self, request: Request, callId: CallId) -> Response:
        principal = principal_of(request.scope)
        tool = await self.calls.tool_of(callId, principal)
        if tool is None and await self._envelope(callId, principal, 0.0, known=False) is None:
            return error(404, "unknown_call", f"No call {callId!r} is waiting.")
        if tool is not None and await self.calls.withdraw(callId, tool, principal.tenant):
            metrics.WITHDRAWN.inc()
            return JSONResponse({"callId": callId, "withdrawn": True})
        if tool == PROGRAM_TOOL and await self.calls.cancel_program(callId, principal.tenant):
            # answered 75 by a worker; its calls not started are withdrawn
            return JSONResponse({"callId": callId, "withdrawn": True, "cancelled": True})
        if tool is not None and await self.calls.cancel_upstream_task(callId):
            # answered 75 by the worker that polls the call's task at its MCP server, which it cancels
            return JSONResponse({"callId": callId, "withdrawn": True, "cancelled": True})
        return error(409, "already_started", "The call was taken by a worker already; it runs to its end.")

    async def _envelope(self, call_id: str, principal: Principal, wait_s: float, known: bool) -> ToolResult | None:
        """The call's envelope for `principal`: its own call's (`known`), or any call's for an operator (one
        the gateway holds no claim of: enqueued elsewhere, or its claim expired); never another's."""
        if not known and not principal.grant.may("operate"):
            return None
        envelope = await self.calls.wait(call_id, wait_s)
        if envelope is None or self.calls.visible(principal).tool(envelope.tool) is None:
            return None
        return envelope

    async def create_batch(self, request: Request, body: Annotated[BatchRequest, Body()]) -> Response:
        await self.calls.health.admit()  # one answer for the whole batch when the fleet is away
        outcomes = await asyncio.gather(*(self._batch_item(call, body, request) for call in body.calls))
        return JSONResponse({"results": outcomes})

    async def _batch_item(self, call: CallRequest, batch: BatchRequest, request: Request) -> dict[str, Any]:
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
            self.calls.hold(submitted)
            return {"callId": submitted.call_id, "status": AWAITING_APPROVAL if parked else "pending"}
        return envelope.to_dict()

    def _spec(self, body: CallRequest, request: Request) -> CallSpec:
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

    async def decide(self, request: Request, callId: CallId, body: Annotated[Decision, Body()]) -> Response:
        principal = principal_of(request.scope)
        return JSONResponse(await self.calls.decisions.decide(principal, callId, body.decision, body.reason))

    # --- catalog ----------------------------------------------------------------------------------

    async def list_tools(self, request: Request, query: Annotated[ToolsQuery, Query()]) -> Response:
        snapshot = self.calls.visible(principal_of(request.scope))
        rows = catalog.list_tools(snapshot.toolset, query.tag)
        return self._tools(rows, request, query.format, {"version": snapshot.version})

    async def search_tools(self, request: Request, query: Annotated[SearchQuery, Query()]) -> Response:
        toolset = self.calls.visible(principal_of(request.scope)).toolset
        rows = catalog.search(toolset, query.question.strip(), query.top_k)
        return self._tools(rows, request, query.format, {})

    async def get_tool(self, request: Request, name: Annotated[str, Path()]) -> Response:
        tool = self.calls.resolve(name, principal_of(request.scope))
        return JSONResponse(catalog.definition(tool))

    def _tools(self, rows: list[dict[str, Any]], request: Request, fmt: str, extra: dict[str, Any]) -> Response:
        if fmt == "summary":
            return JSONResponse({**extra, "tools": rows})
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


# The answers most operations share.
ERRORS = {
    400: Answer("The body is not JSON.", Error),
    401: Answer("A bearer token is required.", Error),
    422: Answer("The body or a parameter has the wrong shape.", Error),
}
UNAVAILABLE = Answer("The fleet cannot take calls now.", Error)
FORBIDDEN = Answer("The principal's grants lack `approve`.", Error)

OPERATIONS = [
    Operation(
        "POST",
        "/v1/calls",
        Rest.create_call,
        "createCall",
        "Run a tool call through the queue and answer with its envelope (or its callId)",
        {
            200: Answer("The call's envelope (whatever its exitCode).", Envelope),
            202: Answer("Not answered yet (wait false, or waitSeconds ran out).", Pending),
            403: Answer("The callback URL is not allowed (callback_refused).", Error),
            404: Answer("No such tool.", Error),
            409: Answer("The callId names another call.", Error),
            503: UNAVAILABLE,
            **ERRORS,
        },
    ),
    Operation(
        "GET",
        "/v1/calls/{callId}",
        Rest.get_call,
        "getCall",
        "The envelope of a call, optionally waiting for it",
        {
            200: Answer("The call's envelope.", Envelope),
            202: Answer("Queued or running.", Pending),
            404: Answer("No call of this id is known.", Error),
            **ERRORS,
        },
    ),
    Operation(
        "DELETE",
        "/v1/calls/{callId}",
        Rest.withdraw_call,
        "withdrawCall",
        "Take a call that no worker has started off the queue",
        {
            200: Answer("Withdrawn: it will not run.", Withdrawn),
            404: Answer("No such call is waiting.", Error),
            409: Answer("A worker took it already; it runs to its end.", Error),
            **ERRORS,
        },
    ),
    Operation(
        "POST",
        "/v1/batches",
        Rest.create_batch,
        "createBatch",
        "Run many calls at once; the answers come in order",
        {200: Answer("One envelope (or pending entry) per call.", BatchResults), 503: UNAVAILABLE, **ERRORS},
    ),
    Operation(
        "POST",
        "/v1/code",
        Rest.run_code,
        "runCode",
        "Run a program whose tool calls are sent to the fleet (code mode)",
        {
            200: Answer("The program's envelope: result, output, calls.", Envelope),
            202: Answer("Not answered yet (waitSeconds ran out).", Pending),
            403: Answer("The callback URL is not allowed (callback_refused).", Error),
            404: Answer("Code mode is off, or the principal may not run code.", Error),
            503: UNAVAILABLE,
            **ERRORS,
        },
    ),
    Operation(
        "GET",
        "/v1/tools",
        Rest.list_tools,
        "listTools",
        "The tools the gateway offers, optionally by tag",
        {200: Answer("Light summaries, or the chosen export.", ToolList), **ERRORS},
    ),
    Operation(
        "GET",
        "/v1/tools/search",
        Rest.search_tools,
        "searchTools",
        "The tools that best match a question, best first",
        {200: Answer("Summaries with a score, or the chosen export.", ToolList), **ERRORS},
    ),
    Operation(
        "GET",
        "/v1/tools/{name}",
        Rest.get_tool,
        "getTool",
        "One tool's full definition, input schema included",
        {200: Answer("The definition.", dict[str, Any]), 404: Answer("No such tool.", Error), **ERRORS},
    ),
    Operation(
        "GET",
        "/v1/approvals",
        Rest.list_approvals,
        "listApprovals",
        "The calls waiting for a human's approval, oldest expiry first",
        {200: Answer("What waits.", Approvals), 403: FORBIDDEN, 401: ERRORS[401]},
    ),
    Operation(
        "POST",
        "/v1/approvals/{callId}",
        Rest.decide,
        "decideApproval",
        "Approve (it runs once) or deny (answered with exit code 77) a parked call",
        {
            200: Answer("Decided.", Decided),
            403: FORBIDDEN,
            404: Answer("No call of this id waits or was decided.", Error),
            409: Answer("The call was decided already (or expired): error.state says.", Error),
            **ERRORS,
        },
    ),
    Operation(
        "GET",
        "/healthz",
        Rest.health,
        "health",
        "Whether the fleet can take calls (a worker answers a ping)",
        {200: Answer("Ready.", Health), 503: Answer("Redis or every worker is away.", Health)},
        open=True,
    ),
]
