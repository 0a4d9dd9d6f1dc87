"""Deciding on parked calls, as the REST API, the CLI (and a console page) do it: list what waits,
approve or deny one, each decision in the audit trail. The state lives in Redis (worker/queue/approvals.py),
so any gateway process, or the command line, decides on any call."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from worker.gateway.audit import AuditTrail, Decision, now_iso
from worker.gateway.identity import Principal
from worker.queue import approvals
from worker.queue.publisher import Publisher


class NotAllowed(PermissionError):
    """The principal's grant does not include `approve`."""


class Decisions:
    def __init__(self, client: aioredis.Redis, publisher: Publisher, audit: AuditTrail | None) -> None:
        self._client, self._publisher, self._audit = client, publisher, audit

    async def waiting(self, principal: Principal) -> list[dict[str, Any]]:
        """The calls waiting for a decision (callId, tool, principal, tenant, method, target, arguments,
        header names, since, expires), oldest expiry first."""
        _check(principal)
        return await self.parked()

    async def parked(self) -> list[dict[str, Any]]:
        """What waits, for a reader whose grant was checked already (the console's page)."""
        return [parked.listing() for parked in await approvals.waiting(self._client)]

    async def decide(
        self, principal: Principal, call_id: str, decision: approvals.Decision, reason: str
    ) -> dict[str, Any]:
        """Approve or deny one parked call; raises NotAllowed, approvals.NotParked (unknown or decided)."""
        _check(principal)
        parked = await approvals.decide(self._client, self._publisher, call_id, decision, principal.name, reason)
        tool = parked.fields.get("tool", "")
        if self._audit is not None:
            self._audit.record(Decision(now_iso(), principal.name, principal.tenant, tool, call_id, decision, reason))
        return {"callId": call_id, "tool": tool, "decision": decision, "decidedBy": principal.name, "reason": reason}


def _check(principal: Principal) -> None:
    if not principal.grant.may("approve"):
        raise NotAllowed(f"The principal {principal.name!r} may not decide on calls (its grants lack `approve`).")
