"""Deciding on parked calls, as the REST API, the CLI (and a console page) do it: list what waits,
approve or deny one, each decision in the audit trail. The state lives in Redis (worker/queue/approvals.py),
so any gateway process, or the command line, decides on any call. With shards, a call is parked on its
tenant's shard: every shard is listed, and a decision is made on the shard that holds the call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
import structlog

from worker.gateway.identity.audit import AuditTrail, Decision, now_iso
from worker.gateway.identity.principals import Principal
from worker.queue import approvals
from worker.queue.publisher import Publisher

T = TypeVar("T")
log = structlog.get_logger("toolworker.approvals")
# How long a listing or a decision waits for each shard (one away is left out rather than waited for).
SHARD_WAIT_S = 10.0


class NotAllowed(PermissionError):
    """The principal's grant does not include `approve`."""


class Decisions:
    def __init__(self, clients: Sequence[aioredis.Redis], publish: _Publish, audit: AuditTrail | None) -> None:
        """`clients`: one per shard; `publish(client)`: the publisher of a denial's envelope on that shard."""
        self._shards = [(client, publish(client)) for client in clients]
        self._audit = audit

    async def waiting(self, principal: Principal) -> list[dict[str, Any]]:
        """The calls waiting for a decision (callId, tool, principal, tenant, method, target, arguments,
        header names, since, expires), oldest expiry first."""
        _check(principal)
        return await self.parked()

    async def parked(self) -> list[dict[str, Any]]:
        """What waits, for a reader whose grant was checked already (the console's page); a shard that does
        not answer is left out (and logged) unless none answers."""
        found = await self._on_each(approvals.waiting)
        listed = [parked for shard in found if not isinstance(shard, BaseException) for parked in shard]
        return [parked.listing() for parked in sorted(listed, key=_expiry)]

    async def decide(
        self, principal: Principal, call_id: str, decision: approvals.Decision, reason: str
    ) -> dict[str, Any]:
        """Approve or deny one parked call; raises NotAllowed, approvals.NotParked (unknown or decided)."""
        _check(principal)
        client, publisher = await self._holder(call_id)
        parked = await approvals.decide(client, publisher, call_id, decision, principal.name, reason)
        tool = parked.fields.get("tool", "")
        if self._audit is not None:
            self._audit.record(Decision(now_iso(), principal.name, principal.tenant, tool, call_id, decision, reason))
        return {"callId": call_id, "tool": tool, "decision": decision, "decidedBy": principal.name, "reason": reason}

    async def _holder(self, call_id: str) -> tuple[aioredis.Redis, Publisher]:
        """The shard that has the call (the first one when none has it: its decide says so)."""
        if len(self._shards) == 1:
            return self._shards[0]
        key = approvals.approval_key(call_id)
        held = await self._on_each(lambda client: client.exists(key))  # a count, or a shard's error
        found = [shard for shard, count in zip(self._shards, held, strict=True) if count == 1]
        return found[0] if found else self._shards[0]

    async def _on_each(self, step: Callable[[aioredis.Redis], Awaitable[T]]) -> list[T | BaseException]:
        """`step` on every shard at once, each within SHARD_WAIT_S: the answers, or the errors of the shards
        that did not answer (logged); raises the first error when no shard answered."""
        steps = (asyncio.wait_for(step(client), SHARD_WAIT_S) for client, _ in self._shards)
        answers = await asyncio.gather(*steps, return_exceptions=True)
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        if len(errors) == len(answers):
            raise errors[0]
        for error in errors:
            log.warning("approvals.shard_unanswered", error=str(error) or type(error).__name__)
        return answers


_Publish = Callable[[aioredis.Redis], Publisher]


def _expiry(parked: approvals.ParkedCall) -> float:
    return float(parked.fields.get("expires") or 0)


def _check(principal: Principal) -> None:
    if not principal.grant.may("approve"):
        raise NotAllowed(f"The principal {principal.name!r} may not decide on calls (its grants lack `approve`).")
