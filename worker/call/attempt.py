"""One attempt at an upstream: within the rate limit, the circuit and the time left (the call holds its turn)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import cast

from yarl import URL

from worker import errors, metrics, tracing
from worker.call import ratelimit
from worker.call.admission import MAX_RATE_WAIT_S
from worker.call.circuit import CircuitBreaker
from worker.call.runtime import Runtime, pool_spec
from worker.definitions.model import Upstream
from worker.http.egress import EgressPolicy
from worker.http.transport import Limits, PreparedRequest, RedirectCheck, Response


@dataclass(frozen=True, slots=True)
class Attempt:
    """What each attempt of one call needs."""

    runtime: Runtime
    request: PreparedRequest
    upstream: Upstream
    deadline: float
    check: RedirectCheck
    trusted: URL | None
    breaker: CircuitBreaker | None

    async def send(self, limits: Limits, number: int = 1) -> Response:
        """Attempt `number`; its outcome is told to the breaker (and its span, when tracing)."""
        with tracing.attempting(self.request.method, self.request.url, number) as span:
            response = await self._send(limits)
            tracing.responded(span, response.status)
            return response

    async def _send(self, limits: Limits) -> Response:
        rate = self.upstream.rate_limit
        if rate is not None and self.runtime.redis is not None:
            horizon = min(self.deadline, time.time() + MAX_RATE_WAIT_S)
            await ratelimit.acquire(self.runtime.redis, self.upstream.name, rate.per_second, rate.burst, horizon)
        budget = min(self.upstream.timeout_s, self.deadline - time.time())
        if budget <= 0:
            raise errors.TimedOut("The call ran out of time before the upstream answered.")
        self._check_credential()
        request = self.request
        if tracing.enabled():  # the upstream's spans join the call's trace
            request = replace(request, headers=tracing.propagation(request.headers))
        try:
            async with asyncio.timeout(budget):
                response = await self.runtime.transport.send(
                    request, pool_spec(self.upstream), limits, self.check, self.trusted
                )
        except TimeoutError:
            self._record(failed=True)
            raise errors.TimedOut(f"The upstream did not answer within {budget:.3g} seconds.") from None
        except errors.TransportError:
            self._record(failed=True)
            raise
        self._record(failed=response.status >= 500)
        return response

    def _check_credential(self) -> None:
        """After the waits (rate limit, a retry's backoff): an access token about to expire is not sent, as
        the upstream would refuse it (and may count the failed authentication); the call renews it."""
        send_by = self.request.credential_send_by
        if send_by and time.time() >= send_by:
            raise errors.CredentialExpiring("The access token would expire before the upstream received it.")

    def _record(self, failed: bool) -> None:
        if self.breaker is None:
            return
        if failed:
            self.breaker.record_failure()
        else:
            self.breaker.record_success()
        metrics.set_circuit_state(self.upstream.name, cast(metrics.CircuitState, self.breaker.state))


def breaker_for(runtime: Runtime, upstream: Upstream, trusted: URL | None) -> CircuitBreaker | None:
    """The upstream's breaker, told of this call; the generic tool reaches many hosts, so no one breaker
    speaks for them."""
    if trusted is None:
        return None
    circuit = upstream.circuit
    breaker = runtime.breakers.get(upstream.name, circuit.threshold, circuit.cooldown_s)
    try:
        breaker.before_call()
    finally:
        metrics.set_circuit_state(upstream.name, cast(metrics.CircuitState, breaker.state))
    return breaker


def redirect_check(trusted: URL | None, upstream: Upstream, policy: EgressPolicy) -> RedirectCheck:
    """Each hop stays on the upstream's origin, or (where allowed) passes the egress policy."""

    def check(target: URL) -> None:
        if target.scheme not in {"http", "https"}:
            raise errors.EgressBlocked("Blocked by the egress policy: redirect to a non-HTTP scheme.")
        if trusted is not None and target.origin() == trusted:
            return
        if trusted is not None and not upstream.allow_offsite_redirects:
            raise errors.EgressBlocked("Blocked by the egress policy: the upstream redirected to another host.")
        policy.check_url(str(target))

    return check
