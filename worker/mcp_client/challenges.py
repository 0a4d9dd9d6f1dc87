"""What an MCP server's HTTP answers say about the credential a session sends: the SDK turns a 401 or 403 into
a bare JSON-RPC error, so the session's HTTP client carries a `Watch` (an httpx2 auth flow that only looks at
the answers) that keeps the last challenge (`WWW-Authenticate`) for the failure to be read with. It also keeps
the session id the server gave (`Mcp-Session-Id`, 2025-11-25), and for a session resumed by another worker
sends every request after the handshake on the session resumed instead of the one the handshake opened.

    403 WWW-Authenticate: Bearer error="insufficient_scope", scope="files.read files.write"
        └▶ Challenged(403, Challenge(scope=..., error="insufficient_scope")): a step-up
           (worker/call/mcp_authorization.py)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import httpx2

from worker import errors
from worker.mcp_client.authorization import Challenge

INSUFFICIENT_SCOPE = "insufficient_scope"
SESSION_HEADER = "mcp-session-id"


class Challenged(errors.ToolFailed):
    """A request the server refused for its credential (401 or 403), with the server's challenge."""

    def __init__(self, server: str, status: int, challenge: Challenge) -> None:
        super().__init__(f"The MCP server {server!r} refused the request's credential (HTTP {status}).")
        self.status = status
        self.challenge = challenge

    @property
    def step_up(self) -> bool:
        """A 403 asking for more scope (RFC 6750 §3.1): a token with it may succeed."""
        return self.status == 403 and self.challenge.error == INSUFFICIENT_SCOPE


class Watch(httpx2.Auth):
    """Sends every request as it is (on the session `resume` names, once the handshake gave one); keeps the
    challenge of the last 401 or 403 answer, and the session id the server gave."""

    def __init__(self, resume: str | None = None) -> None:
        self.last: tuple[int, Challenge] | None = None
        self.session_id: str | None = None
        self._resume = resume

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if self._resume is not None and SESSION_HEADER in request.headers:  # `initialize` carries none
            request.headers[SESSION_HEADER] = self._resume
        response = yield request
        self.session_id = response.headers.get(SESSION_HEADER, self.session_id)
        status = response.status_code
        if status in (401, 403):
            self.last = (status, Challenge.of(status, response.headers.get("WWW-Authenticate")))

    def take(self, server: str) -> Challenged | None:
        """The challenge seen since the last `take`, as the failure to raise; None when there was none."""
        last, self.last = self.last, None
        return None if last is None else Challenged(server, *last)
