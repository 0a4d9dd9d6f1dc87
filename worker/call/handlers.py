"""One handler per tool kind. The kinds that send HTTP (a defined tool, `http_request`) share the path
from the call's turn to its envelope, and differ in how the request is prepared and whom it may reach."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog
from yarl import URL

from worker import logs, metrics
from worker.call.admission import Turn
from worker.call.attempt import Attempt, breaker_for, redirect_check
from worker.call.auth import authorize
from worker.call.rendering import render
from worker.call.retries import send_with_retries
from worker.call.runtime import Runtime
from worker.call.shaping import describe_request, read_limit, shape_result
from worker.definitions.model import IDEMPOTENT_METHODS, Tool, Upstream
from worker.envelope import ToolResult
from worker.http.transport import PreparedRequest, Response
from worker.protocol import ToolCall

log = structlog.get_logger("toolworker.call")


@dataclass(frozen=True, slots=True)
class Job:
    """A call admitted to run: its tool and upstream resolved, its arguments valid, its deadline known."""

    call: ToolCall
    tool: Tool
    upstream: Upstream
    arguments: dict[str, Any]
    deadline: float


class ToolHandler(Protocol):
    async def answer(self, job: Job, runtime: Runtime, envelope: ToolResult) -> None:
        """Fill the envelope, or raise a ToolError."""


class HttpHandler(ABC):
    """Sends the request its kind prepares: in the call's turn, with retries, shaped into the envelope."""

    async def answer(self, job: Job, runtime: Runtime, envelope: ToolResult) -> None:
        turn = Turn(runtime.turns(job.upstream), job.upstream, job.deadline, job.call.tenant)
        await turn.take()
        try:
            request, token = await self.prepare(job, runtime)
            response = await self._send(job, runtime, envelope, request, turn)
            if response.status == 401 and token is not None:  # the token was revoked: one more, then once again
                sent = envelope.attempts
                request, _ = await self.prepare(job, runtime, stale=token)
                response = await self._send(job, runtime, envelope, request, turn)
                envelope.attempts += sent
            shape_result(envelope, response, job.tool, job.upstream, request.secrets)
        finally:
            turn.give_back()

    async def _send(
        self, job: Job, runtime: Runtime, envelope: ToolResult, request: PreparedRequest, turn: Turn
    ) -> Response:
        logs.bind_secrets(request.secrets)
        if request.dropped_headers:
            log.info("call.headers_dropped", headers=list(request.dropped_headers))
        describe_request(envelope, request, job.upstream)
        trusted = self.trusted_origin(request)
        check = redirect_check(trusted, job.upstream, runtime.policy)
        breaker = breaker_for(runtime, job.upstream, trusted)
        attempt = Attempt(runtime, request, job.upstream, job.deadline, check, trusted, breaker, turn)
        with metrics.in_flight(job.tool.name, job.upstream.name):
            return await send_with_retries(attempt, envelope, read_limit(job.tool, job.upstream))

    @abstractmethod
    async def prepare(self, job: Job, runtime: Runtime, stale: str | None = None) -> tuple[PreparedRequest, str | None]:
        """The request to send, and the OAuth2 token on it (None: none, or not one a 401 could renew);
        `stale` is a token the upstream refused."""

    @abstractmethod
    def trusted_origin(self, request: PreparedRequest) -> URL | None:
        """The origin reached without the egress check (trusted configuration); None: check every hop."""


class DefinedTool(HttpHandler):
    """A tool rendered from its definition's templates; it reaches its own upstream only."""

    async def prepare(self, job: Job, runtime: Runtime, stale: str | None = None) -> tuple[PreparedRequest, str | None]:
        request = render(job.tool, job.upstream, job.arguments, job.call.headers, runtime.environ)
        request, token = await authorize(
            request, job.upstream, job.call, runtime.environ, runtime.tokens, job.deadline, stale
        )
        return with_idempotency_key(request, job.upstream, job.call), token

    def trusted_origin(self, request: PreparedRequest) -> URL | None:
        return URL(request.url, encoded=True).origin()


def with_idempotency_key(request: PreparedRequest, upstream: Upstream, call: ToolCall) -> PreparedRequest:
    """Unsafe methods are retried only on opt-in, and then carry the callId so the upstream can dedupe."""
    if request.method in IDEMPOTENT_METHODS or not upstream.retry.unsafe_methods:
        return request
    if any(name.lower() == "idempotency-key" for name, _ in request.headers):
        return request
    return replace(request, headers=(*request.headers, ("Idempotency-Key", call.call_id)))
