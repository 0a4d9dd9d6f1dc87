"""Deciding on parked calls, as the REST API, the CLI (and a console page) do it: list what waits,
approve or deny one, each decision in the audit trail. The state lives in Redis (worker/queue/approvals.py),
so any gateway process, or the command line, decides on any call. With shards, a call is parked on its
tenant's shard: every shard is listed, and a decision is made on the shard that holds the call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from worker.gateway.audit import AuditTrail, Decision, now_iso
from worker.gateway.identity import Principal
from worker.queue import approvals
from worker.queue.publisher import Publisher


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
        """What waits, for a reader whose grant was checked already (the console's page)."""
        found = await asyncio.gather(*(approvals.waiting(client) for client, _ in self._shards))
        listed = [parked for shard in found for parked in shard]
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
        if len(self._shards) > 1:
            key = approvals.approval_key(call_id)
            held = await asyncio.gather(*(client.exists(key) for client, _ in self._shards))
            return next((shard for shard, count in zip(self._shards, held, strict=True) if count), self._shards[0])
        return self._shards[0]


_Publish = Callable[[aioredis.Redis], Publisher]


def _expiry(parked: approvals.ParkedCall) -> float:
    return float(parked.fields.get("expires") or 0)


def _check(principal: Principal) -> None:
    if not principal.grant.may("approve"):
        raise NotAllowed(f"The principal {principal.name!r} may not decide on calls (its grants lack `approve`).")
