"""One tool call, start to envelope: admit it, hand it to the handler of its tool's kind, record it.

run_call ─▶ admission (deadline, arguments) ─▶ handler by kind
              defined tool / http_request: turn ─▶ render ─▶ attempts with retries ─▶ shaping
              catalog tools: answered from the definitions
"""

from __future__ import annotations

import time

import structlog

from worker import errors, metrics
from worker.call import ratelimit
from worker.call.admission import call_deadline, encoded_size, validate_arguments
from worker.call.catalog_tools import CatalogTool, catalog_tools
from worker.call.handlers import DefinedTool, Job, ToolHandler
from worker.call.http_request import HttpRequestTool, http_request_tool
from worker.call.runtime import Runtime
from worker.constants import (
    KIND_CATALOG,
    KIND_DEFINED,
    KIND_HTTP_REQUEST,
    TENANT_RATE_LIMIT_KEY_PREFIX,
    WORKER_UPSTREAM,
)
from worker.definitions.model import ToolSet, Upstream
from worker.definitions.templates import Template
from worker.envelope import ToolResult
from worker.http.egress import EgressPolicy
from worker.protocol import ToolCall

log = structlog.get_logger("toolworker.call")

HANDLERS: dict[str, ToolHandler] = {
    KIND_DEFINED: DefinedTool(),
    KIND_HTTP_REQUEST: HttpRequestTool(),
    KIND_CATALOG: CatalogTool(),
}


async def run_call(call: ToolCall, runtime: Runtime, received_at: float | None = None) -> ToolResult:
    """Run one call; every outcome, including a bug in the worker, is an envelope."""
    started = time.perf_counter()
    envelope = ToolResult(call_id=call.call_id, tool=call.tool)
    # Each call runs in an asyncio task of its own, so its context (and these bindings) die with it.
    structlog.contextvars.bind_contextvars(callId=call.call_id, tool=call.tool, tenant=call.tenant)
    try:
        await _admit_and_answer(call, runtime, envelope, time.time() if received_at is None else received_at)
    except errors.ToolError as exc:
        envelope.error = {"type": exc.type, "message": exc.message}
        envelope.exit_code = exc.exit_code
    except Exception:
        log.exception("call.internal_error")
        envelope.error = {"type": "internal_error", "message": "The worker failed while running this tool."}
        envelope.exit_code = errors.InternalError.exit_code
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


async def _admit_and_answer(call: ToolCall, runtime: Runtime, envelope: ToolResult, received_at: float) -> None:
    deadline = call_deadline(call, received_at)
    tool, upstream = runtime.resolve(call.tool)
    structlog.contextvars.bind_contextvars(upstream=upstream.name)
    arguments = validate_arguments(call.arguments, runtime.validator(tool))
    if call.headers:
        encoded_size(call.headers)  # refuses text that is not valid Unicode
    await _tenant_rate(call.tenant, runtime, deadline)
    await HANDLERS[tool.kind].answer(Job(call, tool, upstream, arguments, deadline), runtime, envelope)


async def _tenant_rate(name: str, runtime: Runtime, deadline: float) -> None:
    """Wait for the call's slot under its tenant's rate limit (shared by the fleet); 75 past its deadline."""
    rate = runtime.toolset.tenant(name).rate_limit
    if rate is not None and runtime.redis is not None:
        await ratelimit.acquire(
            runtime.redis, name, rate.per_second, rate.burst, deadline, TENANT_RATE_LIMIT_KEY_PREFIX, "The tenant's"
        )


def served_toolset(toolset: ToolSet, policy: EgressPolicy) -> ToolSet:
    """The toolset a worker serves: the defined tools, the catalog tools, `http_request` if enabled."""
    served = ToolSet(
        dict(toolset.upstreams),
        dict(toolset.tools),
        list(toolset.problems),
        dict(toolset.unusable),
        dict(toolset.tenants),
    )
    served.upstreams[WORKER_UPSTREAM] = Upstream(WORKER_UPSTREAM, Template.literal(""))
    extra = catalog_tools(WORKER_UPSTREAM) + ([http_request_tool(WORKER_UPSTREAM)] if policy.enabled else [])
    for tool in extra:
        served.tools.setdefault(tool.name, tool)
    return served
