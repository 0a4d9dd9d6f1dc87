"""The remembered MCP handshake at its seam (fakeredis): a session keeps what `initialize` declared, for its
principal only, until it is ended; what is not a handshake is none."""

from __future__ import annotations

import fakeredis
import pytest

from worker.gateway.mcp.sessions import SESSION_KEY_PREFIX, Handshake, Handshakes

PARAMS = {
    "protocolVersion": "2025-11-25",
    "clientInfo": {"name": "desk", "version": "3.1"},
    "capabilities": {"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {"listChanged": True}},
}


async def test_a_session_keeps_the_handshake_for_its_principal_until_ended() -> None:
    """Recalled by its principal with every capability it declared; another principal, a forged id and an
    ended session find nothing; only a digest of the id is stored."""
    redis = fakeredis.FakeAsyncRedis()
    handshakes = Handshakes(redis, ttl_s=60)
    handshake = Handshake.of(PARAMS)
    assert handshake is not None
    session_id = await handshakes.remember(handshake, "alice")
    recalled = await handshakes.recall(session_id, "alice")
    assert recalled is not None and recalled.protocol_version == "2025-11-25"
    assert recalled.client_info == {"name": "desk", "version": "3.1"}
    elicitation = recalled.capabilities.elicitation
    assert elicitation is not None and elicitation.url is not None and recalled.capabilities.sampling is not None
    assert await handshakes.recall(session_id, "bob") is None
    assert await handshakes.recall(session_id + "x", "alice") is None
    keys = [key.decode() for key in await redis.keys(SESSION_KEY_PREFIX + "*")]
    assert len(keys) == 1 and session_id not in keys[0] and 0 < await redis.ttl(keys[0]) <= 60
    await handshakes.forget(session_id)
    assert await handshakes.recall(session_id, "alice") is None


@pytest.mark.parametrize(
    "params",
    [{}, {**PARAMS, "protocolVersion": 7}, {**PARAMS, "clientInfo": "x"}, {**PARAMS, "capabilities": {"roots": 5}}],
)
def test_what_is_not_a_handshake_is_none(params: dict[str, object]) -> None:
    """Missing or mistyped version, client info or capabilities: no handshake (the SDK answers the error)."""
    assert Handshake.of(params) is None
