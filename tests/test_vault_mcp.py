"""Consent over MCP, with the SDK's own client: URL-mode elicitation (-32042 over stateless HTTP for a
2025-11-25 client that declared it), an `input_required` URL elicitation (2026-07-28), and the tool error
with the link for a client that can do neither. What each client saw is printed (pytest -s)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.gateway_stack import start_gateway, text_of
from tests.support.round_robin import RoundRobin
from tests.support.vault_stack import VaultStack, bearer, consent, link_in, vault_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
__all__ = ["vault_stack"]


def token_of(user: str) -> str:
    return f"{user}-static-token-0123456789"


@asynccontextmanager
async def mcp_client(
    stack: VaultStack, user: str, mode: str, callback: Any = None, url: str | None = None
) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers=bearer(token_of(user)), timeout=60) as http:
        transport = streamable_http_client((url or stack.url) + "/mcp", http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=callback) as client:
            yield client


async def test_a_2025_client_with_url_elicitation_gets_32042_then_the_call_runs(vault_stack: VaultStack) -> None:
    """A 2025-11-25 client that declared URL elicitation is asked with -32042 (stateless HTTP has no
    back-channel); after the user consents, the same call runs with the user's token."""

    async def never(context: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("no elicitation/create over stateless HTTP")

    async with mcp_client(vault_stack, "henry", "legacy", never) as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("whoami", {})
        assert raised.value.error.code == -32042
        elicitation = raised.value.error.data["elicitations"][0]
        code, url = raised.value.error.code, elicitation["url"]
        print(f"2025-11-25 client with elicitation: error {code}, {elicitation['mode']} {url}")
        page = await asyncio.to_thread(consent, elicitation["url"], "henry-account")
        assert page.status_code == 200, page.text
        result = await client.call_tool("whoami", {})
    assert not result.is_error and json.loads(text_of(result)) == {"sub": "henry-account"}


async def test_a_2026_client_answers_an_input_required_url_elicitation(vault_stack: VaultStack) -> None:
    """A 2026-07-28 client gets an input_required result carrying a URL elicitation; its callback sends the
    user to the link, answers accept, and the retried call runs."""
    seen: list[Any] = []

    async def browse(context: Any, params: Any) -> types.ElicitResult:
        seen.append(params)
        page = await asyncio.to_thread(consent, params.url, "ivy-account")
        assert page.status_code == 200, page.text
        return types.ElicitResult(action="accept")

    async with mcp_client(vault_stack, "ivy", "auto", browse) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("whoami", {})
    print(f"2026-07-28 client: input_required, {seen[0].mode} {seen[0].url}; then {text_of(result)}")
    assert [p.mode for p in seen] == ["url"] and "/v1/connections/people/authorize" in seen[0].url
    assert not result.is_error and json.loads(text_of(result)) == {"sub": "ivy-account"}


async def test_a_client_without_elicitation_gets_the_link_in_a_tool_error(vault_stack: VaultStack) -> None:
    """A (2026-07-28) client that declared no elicitation gets a tool error giving the connect link; after
    the user consents, calling again works."""
    async with mcp_client(vault_stack, "judy", "auto") as client:
        first = await client.call_tool("whoami", {})
        print(f"client without elicitation: isError={first.is_error}: {text_of(first)}")
        assert first.is_error
        page = await asyncio.to_thread(consent, link_in(text_of(first)), "judy-account")
        assert page.status_code == 200, page.text
        second = await client.call_tool("whoami", {})
    assert not second.is_error and json.loads(text_of(second)) == {"sub": "judy-account"}


async def test_a_stdio_client_is_asked_with_elicitation_create(vault_stack: VaultStack) -> None:
    """On stdio a 2025-11-25 client that declared URL elicitation gets `elicitation/create` (mode url) and,
    once it answers accept, the call runs for the local user."""
    seen: list[Any] = []

    async def browse(context: Any, params: Any) -> types.ElicitResult:
        seen.append(params)
        page = await asyncio.to_thread(consent, params.url, "local-account")
        assert page.status_code == 200, page.text
        return types.ElicitResult(action="accept")

    stdio = StdioServerParameters(command=sys.executable, args=["-m", "worker", "mcp"], env=vault_stack.env)
    async with Client(stdio, mode="legacy", elicitation_callback=browse) as client:
        result = await client.call_tool("whoami", {})
    print(f"stdio 2025-11-25 client: elicitation/create {seen[0].mode} {seen[0].url}; then {text_of(result)}")
    assert [p.mode for p in seen] == ["url"]
    assert not result.is_error and json.loads(text_of(result)) == {"sub": "local-account"}


async def test_a_2025_client_without_elicitation_gets_the_link_in_a_tool_error(
    vault_stack: VaultStack, tmp_path: Path
) -> None:
    """A 2025-11-25 client over HTTP that declared no elicitation in `initialize` gets a tool error with the
    connect link, not -32042, though its requests go round-robin to two gateway processes: its session
    carries what it declared to whichever one answers."""
    second_gateway = start_gateway(vault_stack.gateway.env, tmp_path / "gateway-2.log")
    proxy = RoundRobin([vault_stack.url, second_gateway.url])
    server = proxy.start()
    try:
        async with mcp_client(vault_stack, "leo", "legacy", url=server.url) as client:
            assert client.protocol_version == "2025-11-25"
            first = await client.call_tool("whoami", {})
            print(f"2025-11-25 client without elicitation: isError={first.is_error}: {text_of(first)}")
            assert first.is_error and first.meta is not None
            assert first.meta["toolworker/call"]["exitCode"] == 67  # type: ignore[index]
            page = await asyncio.to_thread(consent, link_in(text_of(first)), "leo-account")
            assert page.status_code == 200, page.text
            second = await client.call_tool("whoami", {})
    finally:
        server.stop()
        second_gateway.stop()
    assert not second.is_error and json.loads(text_of(second)) == {"sub": "leo-account"}
    assert all(proxy.served[backend] >= 2 for backend in proxy.backends), proxy.served


def test_a_session_id_not_issued_here_is_refused_with_404(vault_stack: VaultStack) -> None:
    """A forged session id, and one issued to another principal, are 404 (Streamable HTTP: start a new
    session); the issued one is accepted (no standing GET stream: 405), and after DELETE it is 404 too."""
    url, headers = (
        vault_stack.url + "/mcp",
        {**bearer(token_of("mia")), "Accept": "application/json, text/event-stream"},
    )
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    opened = httpx2.post(url, json=initialize, headers=headers, timeout=30)
    session = opened.headers["mcp-session-id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}

    def post(session_id: str, token: str = token_of("mia")) -> int:
        with_session = {**headers, **bearer(token), "Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"}
        return httpx2.post(url, json=ping, headers=with_session, timeout=30).status_code

    assert opened.status_code == 200 and len(session) >= 40
    assert post(session) == 200
    stream = httpx2.get(url, headers={**headers, "Mcp-Session-Id": session}, timeout=30)
    assert stream.status_code == 405
    assert post("forged-" + session[7:]) == 404
    assert post(session, token_of("leo")) == 404
    ended = httpx2.delete(url, headers={**headers, "Mcp-Session-Id": session}, timeout=30)
    assert ended.status_code == 200 and post(session) == 404
