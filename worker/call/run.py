"""One tool call, start to envelope: admit it, hand it to the handler of its tool's kind, record it.

run_call ─▶ admit (deadline, tool, arguments) ─▶ cache hit? ─▶ handler by kind ─▶ Answer ─▶ shaping.envelope
              defined tool / http_request: turn ─▶ prepare ─▶ attempts with retries   (─▶ cache store)
              a paginated tool: the handler once per page (pagination.py), the items merged
              catalog tools: answered from the definitions
"""

from __future__ import annotations

import time

import structlog

from worker import errors, logs, metrics
from worker.call import cache, call_headers, pagination, ratelimit, shaping
from worker.call.admission import call_deadline
from worker.call.arguments import encoded_size
from worker.call.catalog_tools import CatalogTool
from worker.call.handlers import DefinedTool, ToolHandler
from worker.call.http_request import HttpRequestTool
from worker.call.job import Answer, Job
from worker.call.runtime import Runtime
from worker.constants import KIND_CATALOG, KIND_DEFINED, KIND_HTTP_REQUEST, KIND_MCP, TENANT_RATE_LIMIT_KEY_PREFIX
from worker.envelope import ToolResult
from worker.protocol import ToolCall

log = structlog.get_logger("toolworker.call")

HANDLERS: dict[str, ToolHandler] = {
    KIND_DEFINED: DefinedTool(),
    KIND_HTTP_REQUEST: HttpRequestTool(),
    KIND_CATALOG: CatalogTool(),
}


def handler_of(kind: str) -> ToolHandler:
    """The handler of a tool kind; an MCP tool's is made by the first MCP call, which loads the MCP SDK (a
    worker that serves HTTP tools alone goes without its 32 MB)."""
    if kind == KIND_MCP and kind not in HANDLERS:
        from worker.call.mcp_tool import McpTool

        HANDLERS[kind] = McpTool()
    return HANDLERS[kind]


async def run_call(call: ToolCall, runtime: Runtime, received_at: float | None = None) -> ToolResult:
    """Run one call; every outcome, including a bug in the worker, is an envelope."""
    started = time.perf_counter()
    # Each call runs in an asyncio task of its own, so its context (and these bindings) die with it. A call
    # made through the gateway names by whom too (a name, never a credential).
    principal = {} if call.principal is None else {"principal": call.principal}
    logs.bind_call(callId=call.call_id, tool=call.tool, tenant=call.tenant, **principal)
    try:
        job = await admit(call, runtime, time.time() if received_at is None else received_at)
        envelope = await _answered(job, runtime)
    except errors.ToolError as exc:
        envelope = ToolResult.failure(call.call_id, call.tool, exc)
    except Exception:
        log.exception("call.internal_error")
        error = errors.InternalError("The worker failed while running this tool.")
        envelope = ToolResult.failure(call.call_id, call.tool, error)
    envelope.duration_ms = round((time.perf_counter() - started) * 1000, 3)
    metrics.observe_call(envelope, runtime.upstream_of(call.tool))
    log.info(
        "call.finished",
        exitCode=envelope.exit_code,
        statusCode=envelope.status_code,
        attempts=envelope.attempts,
        durationMs=envelope.duration_ms,
    )
    return envelope


async def _answered(job: Job, runtime: Runtime) -> ToolResult:
    """The envelope of an admitted call: from the cache when its tool is cached and the answer is there."""
    tool = job.tool
    cached = cache.lookup(tool, job.upstream, job.arguments, job.call.headers, runtime.redis, job.call.user)
    if cached is not None:
        hit = await cached.get(job.call.call_id)
        metrics.observe_cache(tool.name, hit=hit is not None)
        if hit is not None:
            return hit
    answer = await _answer(job, runtime)
    envelope = shaping.envelope(job, answer)
    if cached is not None:
        await cached.put(envelope, answer.response)
    return envelope


async def _answer(job: Job, runtime: Runtime) -> Answer:
    """The handler's answer; a paginated tool's, page after page."""
    handler = handler_of(job.tool.kind)
    if job.tool.pagination is None or job.tool.kind != KIND_DEFINED:
        return await handler.answer(job, runtime)
    budget_chars = job.tool.max_output_chars or job.upstream.max_output_chars
    return await pagination.answer(job, lambda page: handler.answer(page, runtime), budget_chars)


async def admit(call: ToolCall, runtime: Runtime, received_at: float) -> Job:
    """The call as a job its handler can run: in time, its tool known, its arguments and headers valid,
    within its tenant's rate limit."""
    deadline = call_deadline(call, received_at)
    call = call_headers.opened(call, runtime.users.keyring)
    tool, upstream = runtime.resolve(call.tool)
    logs.bind_call(upstream=upstream.name)
    arguments = runtime.arguments_schema(tool).check(call.arguments)
    if call.headers:
        encoded_size(call.headers)  # refuses text that is not valid Unicode
    await _tenant_rate(call.tenant, runtime, deadline)
    return Job(call, tool, upstream, arguments, deadline)


async def _tenant_rate(name: str, runtime: Runtime, deadline: float) -> None:
    """Wait for the call's slot under its tenant's rate limit (shared by the fleet); 75 past its deadline."""
    rate = runtime.toolset.tenant(name).rate_limit
    if rate is not None and runtime.redis is not None:
        await ratelimit.acquire(
            runtime.redis, name, rate.per_second, rate.burst, deadline, TENANT_RATE_LIMIT_KEY_PREFIX, "The tenant's"
        )
