"""What the MCP client needs to know of a server: where, how to reach it, within which times."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One MCP server as the client reaches it; its headers may hold a credential (never logged)."""

    name: str
    url: str
    transport: str = "streamable_http"  # or "sse" (the 2024-11-05 HTTP+SSE transport)
    headers: tuple[tuple[str, str], ...] = ()
    connect_timeout_s: float = 3.0
    timeout_s: float = 30.0
    # A session that declares the tasks extension (worker/mcp_client/tasks.py): its calls may become tasks.
    tasks: bool = False
    # The 2025-11-25 session another worker opened, whose task this one polls (its tasks are bound to it):
    # after the handshake, requests are sent on it (challenges.Watch).
    session: str | None = None
