"""What the console shows of features that keep their own state: calls waiting for approval, and users'
connections (their tokens in the vault). Each is a small protocol the feature implements; the console
shows its page, and its link in the nav, only when it is given one (`Extensions`).

    approvals    waiting() -> the calls parked for a decision; decide(callId, approve|deny, reason, principal)
    connections  connections(user) -> a user's connections (none without a user): never a token
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from worker.gateway.decisions import Decisions
from worker.gateway.identity.delegation import Delegation
from worker.gateway.identity.principals import Principal
from worker.queue.approvals import NotParked

Decision = Literal["approve", "deny"]


@dataclass(frozen=True)
class WaitingCall:
    call_id: str
    tool: str
    principal: str
    tenant: str
    since: str  # when it was parked (UTC, ISO 8601)
    why: str = ""  # what the policy that parked it says


class NotWaiting(LookupError):
    """The call is not waiting (decided already, expired, or never parked)."""


class Approvals(Protocol):
    async def waiting(self) -> list[WaitingCall]: ...

    async def decide(self, call_id: str, decision: Decision, reason: str, principal: Principal) -> None:
        """Approve or deny a parked call; raises NotWaiting."""
        ...


@dataclass(frozen=True)
class Connection:
    """A user's connection to an upstream, as an operator may see it: no token, no secret."""

    user: str
    upstream: str
    scopes: tuple[str, ...] = ()
    status: str = ""  # e.g. connected, expired, revoked
    expires_at: str = ""


class Connections(Protocol):
    """Users are kept by digest in the vault, so the page asks for one user's connections by name."""

    async def connections(self, user: str | None) -> list[Connection]: ...


@dataclass(frozen=True)
class Extensions:
    approvals: Approvals | None = None
    connections: Connections | None = None


class ParkedCalls:
    """The approvals the gateway keeps (decisions.py), as the console's page reads and decides them."""

    def __init__(self, decisions: Decisions) -> None:
        self._decisions = decisions

    async def waiting(self) -> list[WaitingCall]:
        return [
            WaitingCall(row["callId"], row["tool"], row["principal"] or "", row["tenant"], row["since"], _why(row))
            for row in await self._decisions.parked()
        ]

    async def decide(self, call_id: str, decision: Decision, reason: str, principal: Principal) -> None:
        try:
            await self._decisions.decide(principal, call_id, decision, reason)
        except NotParked as exc:
            raise NotWaiting(str(exc)) from exc


def _why(row: dict[str, str]) -> str:
    return f"{row['method']} {row['target']}".strip()


class UserConnections:
    """The vault's connections (identity/delegation.py), as the console's page shows them: one user's, by name."""

    def __init__(self, delegation: Delegation) -> None:
        self._delegation = delegation

    async def connections(self, user: str | None) -> list[Connection]:
        if not user:
            return []
        return [
            Connection(user, c.upstream, c.scopes, "connected", str(c.to_dict()["expiresAt"] or ""))
            for c in await self._delegation.connections(user)
        ]
