"""One handler per tool kind. The kinds that send HTTP (a defined tool, `http_request`) share the path
from the call's turn to its answer, and differ in how the request is prepared and whom it may reach.

    answer ─▶ turn ─▶ prepare ─▶ send_with_retries ─▶ (a 401 on an OAuth2 token, or a user's token that
                                   │                   would expire before it is sent: prepare, send again)
                                   └─ attempt: rate limit, circuit, time left ─▶ transport
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from functools import lru_cache
from typing import Protocol

import structlog
from yarl import URL

from worker import errors, logs, metrics
from worker.call.admission import Turn
from worker.call.attempt import Attempt, breaker_for, redirect_check
from worker.call.auth import authorize
from worker.call.job import Answer, Job
from worker.call.pagination import first_request
from worker.call.retries import Tried, send_with_retries
from worker.call.runtime import Runtime
from worker.call.shaping import read_limit
from worker.definitions.model import IDEMPOTENT_METHODS, Upstream
from worker.http.transport import PreparedRequest
from worker.protocol import ToolCall

log = structlog.get_logger("toolworker.call")


class ToolHandler(Protocol):
    async def answer(self, job: Job, runtime: Runtime) -> Answer:
        """How the call ended; a ToolError raised here ends it without a request to describe."""


class HttpHandler(ABC):
    """Sends the request its kind prepares, in the call's turn, with retries."""

    async def answer(self, job: Job, runtime: Runtime) -> Answer:
        request: PreparedRequest | None = None
        attempts = 0
        try:
            async with Turn(runtime.turns(job.upstream), job.upstream, job.deadline, job.call.tenant) as turn:
                request, token = await self.prepare(job, runtime)
                tried = await self._send(job, runtime, request, turn)
                if token is not None and _renew(tried):
                    attempts = tried.attempts  # the token was revoked or is expiring: a new one, and once again
                    request, _ = await self.prepare(job, runtime, stale=token)
                    tried = await self._send(job, runtime, request, turn)
        except errors.ToolError as exc:  # refused before an attempt: no turn in time, no token, the circuit
            return Answer(request, attempts=attempts, error=exc)
        return Answer(request, tried.response, attempts=attempts + tried.attempts, error=tried.error)

    async def _send(self, job: Job, runtime: Runtime, request: PreparedRequest, turn: Turn) -> Tried:
        logs.bind_secrets(request.secrets)
        if request.dropped_headers:
            log.info("call.headers_dropped", headers=list(request.dropped_headers))
        trusted = self.trusted_origin(request)
        check = redirect_check(trusted, job.upstream, runtime.policy)
        breaker = breaker_for(runtime, job.upstream, trusted)
        attempt = Attempt(runtime, request, job.upstream, job.deadline, check, trusted, breaker)
        with metrics.in_flight(job.tool.name, job.upstream.name):
            return await send_with_retries(attempt, turn, read_limit(job.tool, job.upstream))

    @abstractmethod
    async def prepare(self, job: Job, runtime: Runtime, stale: str | None = None) -> tuple[PreparedRequest, str | None]:
        """The request to send, and the OAuth2 token on it (None: none, or not one a 401 could renew);
        `stale` is a token the upstream refused."""

    @abstractmethod
    def trusted_origin(self, request: PreparedRequest) -> URL | None:
        """The origin reached without the egress check (trusted configuration); None: check every hop."""


def _renew(tried: Tried) -> bool:
    """Whether the call's OAuth2 token must be renewed: the upstream refused it (401), or it was about to
    expire when the call's turn to send came (it was not sent)."""
    refused = tried.response is not None and tried.response.status == 401
    return refused or isinstance(tried.error, errors.CredentialExpiring)


class DefinedTool(HttpHandler):
    """A tool rendered from its definition's templates; it reaches its own upstream only."""

    async def prepare(self, job: Job, runtime: Runtime, stale: str | None = None) -> tuple[PreparedRequest, str | None]:
        request = first_request(job.tool, job.upstream, job.arguments, job.call.headers, runtime.environ)
        request, token = await authorize(
            request,
            job.upstream,
            job.call,
            runtime.environ,
            runtime.tokens,
            job.deadline,
            runtime.transport,
            stale,
            runtime.users.token,
        )
        return with_idempotency_key(request, job.upstream, job.call), token

    def trusted_origin(self, request: PreparedRequest) -> URL | None:
        return origin_of(request.url)


def origin_of(url: str) -> URL:
    """The origin of a URL, parsed once per origin: from the text before its path, query or fragment (where
    urllib and yarl end the authority), so that the path, which differs from call to call, is not parsed."""
    start = url.find("//")
    if start < 0:
        return URL(url, encoded=True).origin()
    ends = [end for end in (url.find(mark, start + 2) for mark in "/?#") if end >= 0]
    return _origin(url[: min(ends, default=len(url))])


@lru_cache(maxsize=1024)
def _origin(prefix: str) -> URL:
    return URL(prefix, encoded=True).origin()


def with_idempotency_key(request: PreparedRequest, upstream: Upstream, call: ToolCall) -> PreparedRequest:
    """Unsafe methods are retried only on opt-in, and then carry the callId so the upstream can dedupe."""
    if request.method in IDEMPOTENT_METHODS or not upstream.retry.unsafe_methods:
        return request
    if any(name.lower() == "idempotency-key" for name, _ in request.headers):
        return request
    return replace(request, headers=(*request.headers, ("Idempotency-Key", call.call_id)))
