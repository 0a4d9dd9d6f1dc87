"""Over MCP, consent before a call to an `oauth2_user` upstream is enqueued: a user who has not connected
it is asked to (asking.py, URL mode), and the call goes on once the client says the user is done and the
vault has the connection. Otherwise the tool error gives the connect link, as a worker's 67 would.
"""

from __future__ import annotations

from typing import Any

from worker.definitions.model import Upstream
from worker.gateway.calls import Calls
from worker.gateway.identity.delegation import Delegation
from worker.gateway.identity.principals import Principal
from worker.gateway.mcp.asking import Context, answered, ask_to_visit

CONNECT_KEY_PREFIX = "connect:"


async def consent_to_call(ctx: Context, calls: Calls, name: str, principal: Principal) -> dict[str, Any] | None:
    """Before a call of the tool `name` that acts for its user: the user's consent, asked for through the client
    if needed (None: the call may go on; an unknown tool is answered by the submission)."""
    tool = calls.visible(principal).tool(name)
    if tool is None or calls.delegation is None:
        return None
    return await consent_first(ctx, calls.delegation, calls.catalog.snapshot.upstream(tool), principal.name)


async def consent_first(ctx: Context, delegation: Delegation, upstream: Upstream, user: str) -> dict[str, Any] | None:
    """None when the call may go on; else what to answer now (an `input_required` result or a tool error)."""
    auth = upstream.auth
    if auth is None or auth.type != "oauth2_user" or not delegation.enabled:
        return None
    if await delegation.connected(user, upstream.name):
        return None
    key = CONNECT_KEY_PREFIX + upstream.name
    prior = answered(ctx, key)  # a 2026-07-28 retry carries the answer
    if prior is None:
        url = await delegation.links.link(user, upstream.name)
        message = (
            f"This tool acts for you at {upstream.name!r}, which you have not connected yet. Open the link to grant "
            "access; the call goes on once you are done."
        )
        prior = await ask_to_visit(ctx, key, message, url)
        if prior.action == "pending" and prior.result is not None:
            return dict(prior.result)
    if prior.accepted and await delegation.connected(user, upstream.name):
        return None
    return await not_connected(delegation, upstream, user)


async def not_connected(delegation: Delegation, upstream: Upstream, user: str) -> dict[str, Any]:
    """The tool error of a call not sent for want of the user's connection: a new connect link in it."""
    url = await delegation.links.link(user, upstream.name)
    text = (
        f"This tool acts for the user {user!r}, who has not connected {upstream.name!r}. Ask the user to open this "
        f"link to grant access, then call the tool again: {url}"
    )
    meta = {"toolworker/call": {"exitCode": 67, "connectUrl": url}}
    return {"content": [{"type": "text", "text": text}], "isError": True, "resultType": "complete", "_meta": meta}
