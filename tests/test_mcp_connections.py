"""An MCP session's HTTP client at its seam: httpx above, aiohttp sending, against a local aiohttp server.

What the SDK and worker/mcp_client/failures.py read must be what httpx's own transport gives: the headers the
client set (once each), a compressed body decoded once, a streamed body chunk by chunk, and aiohttp's
failures as the httpx errors that name them (refused: ConnectError; a connection never accepted within the
connect timeout: ConnectTimeout; silent: ReadTimeout; cut off: RemoteProtocolError). And the guards of the HTTP
tools' pools hold here too: a response nobody asked for, sent on an idle connection, is never read as the
next request's answer, and cookies are httpx's alone (aiohttp keeps none of its own to add).
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from collections.abc import AsyncIterator

import httpx2
import pytest
from aiohttp import web

from tests.support.hostile import HostileUpstream
from worker import errors
from worker.dev.embedded import free_port
from worker.mcp_client.challenges import Watch
from worker.mcp_client.connections import http_client
from worker.mcp_client.failures import mapped


async def _headers(request: web.Request) -> web.Response:
    return web.json_response({"headers": [[k, v] for k, v in request.headers.items()], "body": await request.text()})


async def _cookie(_: web.Request) -> web.Response:
    response = web.json_response({})
    response.set_cookie("route", "b7")
    return response


async def _gzipped(_: web.Request) -> web.Response:
    body = gzip.compress(b'{"ok": true}')
    return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


async def _events(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(3):
        await response.write(f"data: {i}\n\n".encode())
        await asyncio.sleep(0.01)
    return response


async def _silent(_: web.Request) -> web.Response:
    await asyncio.sleep(1)
    return web.Response(text="late")


async def _cut(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Length": "1000"})
    await response.prepare(request)
    await response.write(b"partial")
    assert request.transport is not None
    request.transport.close()
    return response


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/headers", _headers)
    app.router.add_get("/gzip", _gzipped)
    app.router.add_get("/cookie", _cookie)
    app.router.add_get("/events", _events)
    app.router.add_get("/silent", _silent)
    app.router.add_get("/cut", _cut)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _client(timeout: float = 5.0) -> httpx2.AsyncClient:
    return http_client(
        {"Authorization": "Bearer t", "MCP-Protocol-Version": "2026-07-28"}, httpx2.Timeout(timeout), Watch()
    )


async def test_requests_carry_the_clients_headers_once_and_bodies_are_read_as_httpx_reads_them(server: str) -> None:
    async with _client() as client:
        sent = (await client.post(f"{server}/headers", json={"jsonrpc": "2.0"})).json()
        names = [name.lower() for name, _ in sent["headers"]]
        assert sorted(set(names)) == sorted(names)  # none twice
        assert dict((k.lower(), v) for k, v in sent["headers"])["authorization"] == "Bearer t"
        assert "mcp-protocol-version" in names and sent["body"] == '{"jsonrpc":"2.0"}'
        assert (await client.get(f"{server}/gzip")).json() == {"ok": True}
        async with client.stream("GET", f"{server}/events") as response:
            received = b"".join([chunk async for chunk in response.aiter_bytes()])
        assert received == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_failures_are_the_httpx_errors_the_worker_maps_to_exit_codes(server: str) -> None:
    async with _client(timeout=0.3) as client:
        refused = f"http://127.0.0.1:{free_port()}/"
        with pytest.raises(httpx2.ConnectError) as caught:
            await client.get(refused)
        assert isinstance(mapped(caught.value, "s"), errors.ConnectFailed)
        with socket.socket() as full:  # a backlog of none, taken by one connection: the next SYN is dropped
            full.bind(("127.0.0.1", 0))
            full.listen(0)
            with socket.create_connection(full.getsockname()):
                connect_only = httpx2.Timeout(30.0, connect=0.3)
                started = time.monotonic()
                with pytest.raises(httpx2.ConnectTimeout) as unanswered:
                    await client.get(f"http://127.0.0.1:{full.getsockname()[1]}/", timeout=connect_only)
                assert time.monotonic() - started < 15  # the connect timeout's, not the pool's 30 s
        assert isinstance(mapped(unanswered.value, "s"), errors.TimedOut)
        with pytest.raises(httpx2.ReadTimeout) as late:
            await client.get(f"{server}/silent")
        assert isinstance(mapped(late.value, "s"), errors.TimedOut)
        with pytest.raises(httpx2.RemoteProtocolError) as cut:
            await client.get(f"{server}/cut")
        assert isinstance(mapped(cut.value, "s"), errors.ReceiveFailed)


async def test_a_response_sent_on_an_idle_connection_is_not_the_next_requests_answer() -> None:
    """The server writes an extra response on the kept-alive connection after its answer: the connection is
    dropped, and every later request gets its own answer."""
    hostile = HostileUpstream().start()
    try:
        async with _client() as client:
            assert (await client.get(f"{hostile.url}/case/inject")).content == b"first"
            await asyncio.to_thread(hostile.injected.wait, 10)
            await asyncio.to_thread(hostile.poisoned_dropped.wait, 10)
            answers = [(await client.get(f"{hostile.url}/case/echo-{n}")).content for n in ("a", "b", "c")]
        assert answers == [b"a", b"b", b"c"]
        assert hostile.poisoned_dropped.is_set()
    finally:
        hostile.stop()


async def test_the_cookies_sent_are_those_httpx_holds(server: str) -> None:
    """A cookie the server sets is sent back once; one httpx no longer holds is not sent (aiohttp keeps none)."""
    named = server.replace("127.0.0.1", "localhost")  # a host name: cookie jars keep no cookie of an address
    async with _client() as client:
        await client.get(f"{named}/cookie")
        kept = (await client.post(f"{named}/headers", json={})).json()
        client.cookies.clear()
        cleared = (await client.post(f"{named}/headers", json={})).json()
    assert [value for name, value in kept["headers"] if name.lower() == "cookie"] == ["route=b7"], kept
    assert [value for name, value in cleared["headers"] if name.lower() == "cookie"] == [], cleared
