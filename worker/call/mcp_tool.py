"""The handler of an MCP upstream's tools: `tools/call` on the server's session (worker/mcp_client/), in the
call's turn at its upstream, within the call's deadline (past it the SDK sends `notifications/cancelled`).

    answer ─▶ turn ─▶ server_spec (URL, headers, credential) ─▶ sessions.call_tool ─▶ Answer(mcp=result)
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from worker import errors, logs, metrics
from worker.call.admission import Turn
from worker.call.job import Answer, Job
from worker.call.mcp_server import server_spec
from worker.call.runtime import Runtime
from worker.http.transport import PreparedRequest


class McpTool:
    """Sends the call to the MCP server its tool was listed by, under the server's own name for it."""

    async def answer(self, job: Job, runtime: Runtime) -> Answer:
        request: PreparedRequest | None = None
        try:
            async with Turn(runtime.turns(job.upstream), job.upstream, job.deadline, job.call.tenant):
                spec, request = await server_spec(
                    job.upstream,
                    job.call,
                    runtime.environ,
                    runtime.tokens,
                    job.deadline,
                    runtime.transport,
                    runtime.users,
                )
                request = described(request, job)
                logs.bind_secrets(request.secrets)
                with metrics.in_flight(job.tool.name, job.upstream.name):
                    result = await runtime.mcp.call_tool(
                        spec, remote_name(job), job.arguments, job.deadline - time.time()
                    )
        except errors.ToolError as exc:
            return Answer(request, attempts=0 if request is None else 1, error=exc)
        return Answer(request, attempts=1, mcp=result.model_dump(mode="json", by_alias=True, exclude_none=True))


def remote_name(job: Job) -> str:
    return job.tool.remote_name or job.tool.name


def described(request: PreparedRequest, job: Job) -> PreparedRequest:
    """The request as the envelope describes it: the `tools/call` it carries."""
    params: dict[str, Any] = {"name": remote_name(job), "arguments": job.arguments}
    body = json.dumps({"method": "tools/call", "params": params}, ensure_ascii=False).encode()
    return replace(request, body=body)
