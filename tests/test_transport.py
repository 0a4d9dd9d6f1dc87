"""The HTTP seam against real local aiohttp servers (127.0.0.1 only): redirects, caps, decoding, failures."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from worker import errors
from worker.constants import DEFAULT_MAX_CONCURRENCY
from worker.http import transport as transport_module
from worker.http.egress import EgressPolicy
from worker.http.transport import (
    EGRESS_POOL_CONNECTIONS,
    HttpTransport,
    KeepAliveConnector,
    Limits,
    PoolSpec,
    PreparedRequest,
    Response,
)

LIMITS = Limits(max_bytes=1024 * 1024, connect_timeout_s=5)
SECRET_HEADERS = {"Authorization": "Bearer sekrit-1", "X-Api-Key": "sekrit-2"}
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def allow(target: URL) -> None:
    """A redirect check that lets every hop through."""


POOL = PoolSpec(name="local", verify_tls=True, max_connections=DEFAULT_MAX_CONCURRENCY, timeout_s=10.0)


def request(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> PreparedRequest:
    return PreparedRequest(
        method=method,
        url=url,
        headers=tuple((headers or {}).items()),
        body=body,
        secrets=frozenset(),
        secret_headers=frozenset(),
    )


async def streamed(req: web.Request) -> web.StreamResponse:
    """n bytes without a Content-Length (chunked)."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(req)
    left = int(req.match_info["n"])
    while left > 0:
        await response.write(b"x" * min(left, 65536))
        left -= 65536
    await response.write_eof()
    return response


def make_app(hits: list[str], peers: list[int]) -> web.Application:
    """An upstream with redirect, echo, sized, compressed and cookie endpoints; records each path hit and
    the client port it came from."""

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        hits.append(request.path)
        peers.append(request.transport.get_extra_info("peername")[1] if request.transport else 0)
        return await handler(request)

    async def redirects(req: web.Request) -> web.Response:
        left = int(req.match_info["n"])
        if left == 0:
            return web.Response(text="done")
        raise web.HTTPFound(f"/r/{left - 1}")

    async def echo(req: web.Request) -> web.Response:
        body = await req.read()
        return web.json_response({"method": req.method, "headers": dict(req.headers), "body": body.decode()})

    async def redirect_to(req: web.Request) -> web.Response:
        status = int(req.query.get("status", "302"))
        body = b"x" * int(req.query.get("body", "0"))
        return web.Response(status=status, headers={"Location": req.query["url"]}, body=body)

    async def sized(req: web.Request) -> web.Response:
        return web.Response(body=b"x" * int(req.match_info["n"]), content_type="text/plain")

    async def compressed(req: web.Request) -> web.Response:
        raw = b"a" * int(req.match_info["n"])
        encoding = req.match_info["encoding"]
        payload = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
        return web.Response(body=payload, headers={"Content-Encoding": encoding, "Content-Type": "text/plain"})

    async def set_cookie(req: web.Request) -> web.Response:
        response = web.Response(text="cookie set")
        response.set_cookie("sid", "abc123", path="/")
        return response

    async def latin1(req: web.Request) -> web.Response:
        return web.Response(body="café".encode("latin-1"), headers={"Content-Type": "text/plain; charset=iso-8859-1"})

    app = web.Application(middlewares=[record])
    app.router.add_get("/r/{n}", redirects)
    app.router.add_route("*", "/echo", echo)
    app.router.add_route("*", "/redirect-to", redirect_to)
    app.router.add_get("/bytes/{n}", sized)
    app.router.add_get("/stream/{n}", streamed)
    app.router.add_get("/{encoding:gzip|deflate}/{n}", compressed)
    app.router.add_get("/set-cookie", set_cookie)
    app.router.add_get("/latin1", latin1)
    return app


class Site:
    def __init__(self, server: TestServer, hits: list[str], peers: list[int]) -> None:
        self.server = server
        self.hits = hits
        self.peers = peers

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


@pytest.fixture
async def transport() -> AsyncIterator[HttpTransport]:
    # Hops that leave the request's own origin go through the egress-checked pool: allow the loopback tests.
    transport = HttpTransport(EgressPolicy.parse("127.0.0.1"))
    yield transport
    await transport.close()


async def start_site() -> Site:
    hits: list[str] = []
    peers: list[int] = []
    server = TestServer(make_app(hits, peers), host="127.0.0.1", port=0)
    await server.start_server()
    return Site(server, hits, peers)


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    started = await start_site()
    yield started
    await started.server.close()


@pytest.fixture
async def other_site() -> AsyncIterator[Site]:
    """A second local server: a different origin (another port)."""
    started = await start_site()
    yield started
    await started.server.close()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[StreamHandler], Awaitable[str]]]:
    """Start a bare TCP server on loopback with a given connection handler; returns its URL."""
    servers: list[asyncio.Server] = []

    async def start(handler: StreamHandler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback port that is bound but not listening: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def send(
    transport: HttpTransport,
    req: PreparedRequest,
    limits: Limits = LIMITS,
    check: Callable[[URL], None] = allow,
) -> Response:
    return await transport.send(req, POOL, limits, check, URL(req.url, encoded=True).origin())


# --- redirects ---------------------------------------------------------------------------------


async def test_five_redirects_are_followed(transport: HttpTransport, site: Site) -> None:
    """Up to five redirects are followed to the final answer."""
    response = await send(transport, request("GET", site.url("/r/5")))
    assert response.status == 200 and response.body == b"done" and response.complete
    assert response.url.endswith("/r/0")
    assert len(site.hits) == 6


async def test_sixth_redirect_is_too_many(transport: HttpTransport, site: Site) -> None:
    """A sixth redirect ends the call with TooManyRedirects (exit 47)."""
    with pytest.raises(errors.TooManyRedirects) as info:
        await send(transport, request("GET", site.url("/r/6")))
    assert info.value.exit_code == 47
    assert "/r/0" not in site.hits


async def test_303_turns_post_into_get_without_body(transport: HttpTransport, site: Site) -> None:
    """A 303 after a POST is followed with a GET that has no body."""
    target = site.url("/redirect-to") + "?status=303&url=/echo"
    req = request("POST", target, {"Content-Type": "application/json"}, b'{"a": 1}')
    response = await send(transport, req)
    echoed = json.loads(response.body)
    assert echoed["method"] == "GET" and echoed["body"] == ""
    assert "Content-Type" not in echoed["headers"]
    assert echoed["headers"].get("Content-Length", "0") == "0"


async def test_307_keeps_method_and_body(transport: HttpTransport, site: Site) -> None:
    """A 307 is followed with the same method and body."""
    target = site.url("/redirect-to") + "?status=307&url=/echo"
    response = await send(transport, request("POST", target, {"Content-Type": "application/json"}, b'{"a": 1}'))
    echoed = json.loads(response.body)
    assert echoed["method"] == "POST" and echoed["body"] == '{"a": 1}'


async def test_same_origin_redirect_keeps_credentials(transport: HttpTransport, site: Site) -> None:
    """A redirect within the same origin keeps the Authorization header."""
    target = site.url("/redirect-to") + "?url=/echo"
    response = await send(transport, request("GET", target, SECRET_HEADERS))
    assert json.loads(response.body)["headers"]["Authorization"] == "Bearer sekrit-1"


async def test_cross_origin_redirect_drops_credentials(transport: HttpTransport, site: Site, other_site: Site) -> None:
    """A redirect to another origin (another port) drops Authorization and other secret headers."""
    checked: list[URL] = []
    target = str(URL(site.url("/redirect-to")).with_query(url=other_site.url("/echo")))
    headers = {**SECRET_HEADERS, "X-Trace": "t-1"}
    response = await send(transport, request("GET", target, headers), check=checked.append)
    echoed = json.loads(response.body)
    assert "Authorization" not in echoed["headers"]
    assert "X-Api-Key" not in echoed["headers"]
    assert echoed["headers"]["X-Trace"] == "t-1"
    assert [str(url) for url in checked] == [other_site.url("/echo")]
    assert other_site.hits == ["/echo"]


async def test_refused_redirect_stops_the_chain(transport: HttpTransport, site: Site, other_site: Site) -> None:
    """A redirect check that raises stops the chain before the next hop is requested."""

    def refuse(target: URL) -> None:
        raise errors.EgressBlocked("Blocked by the egress policy.")

    target = str(URL(site.url("/redirect-to")).with_query(url=other_site.url("/echo")))
    with pytest.raises(errors.EgressBlocked):
        await send(transport, request("GET", target), check=refuse)
    assert other_site.hits == []


# --- body caps and decoding ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "cap", "complete"),
    [(1000, 999, False), (1000, 1000, True), (1000, 1001, True), (200_000, 100_000, False), (0, 1, True)],
)
async def test_body_capped_at_max_bytes(
    transport: HttpTransport, site: Site, size: int, cap: int, complete: bool
) -> None:
    """At most max_bytes are read; `complete` says whether the whole body fit."""
    response = await send(transport, request("GET", site.url(f"/bytes/{size}")), Limits(cap, 5))
    assert response.body == b"x" * min(size, cap)
    assert response.complete is complete


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("/bytes/600000", True),
        ("/bytes/3000000", False),
        ("/stream/400000", True),
        ("/stream/3000000", False),
    ],
)
async def test_a_small_rest_of_a_capped_body_is_drained_and_the_connection_kept(
    transport: HttpTransport, site: Site, path: str, kept: bool
) -> None:
    """Past the cap, up to 1 MiB more is read and dropped so that the next call reuses the connection;
    a larger rest (by its Content-Length, or as it streams) drops the connection."""
    capped = await send(transport, request("GET", site.url(path)), Limits(100_000, 5))
    assert capped.body == b"x" * 100_000
    assert not capped.complete
    await transport.drained()
    await send(transport, request("GET", site.url("/bytes/10")))
    assert len(site.peers) == 2
    assert (site.peers[0] == site.peers[1]) is kept


async def test_a_capped_call_does_not_wait_for_the_rest_of_its_body(
    transport: HttpTransport, raw_server: Callable[[StreamHandler], Awaitable[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capped answer returns at once; the rest of the body is drained (or not) on its own time, so a
    call never times out there. The upstream here stalls after the first chunk."""
    monkeypatch.setattr(transport_module, "_DRAIN_MAX_S", 60.0)
    stalled = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4000\r\n" + b"x" * 0x4000 + b"\r\n")
        await writer.drain()
        await stalled.wait()
        writer.close()

    url = await raw_server(stall)
    response = await asyncio.wait_for(send(transport, request("GET", url + "/x"), Limits(1000, 5)), 10)
    assert response.body == b"x" * 1000 and not response.complete
    stalled.set()  # the connection breaks: the drain gives up and drops it
    await asyncio.wait_for(transport.drained(), 10)


@pytest.mark.parametrize("body", [0, 300_000])
async def test_a_redirect_body_is_drained_and_the_connection_kept(
    transport: HttpTransport, site: Site, body: int
) -> None:
    """A redirect's own body is read and dropped so that the connection serves the next call."""
    response = await send(transport, request("GET", site.url(f"/redirect-to?url=/bytes/10&body={body}")))
    assert response.body == b"x" * 10
    await transport.drained()
    await send(transport, request("GET", site.url("/bytes/10")))
    assert len(site.peers) == 3 and len(set(site.peers)) == 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize(("cap", "complete"), [(4999, False), (5000, True), (1000, False)])
async def test_compressed_body_is_decoded_and_counted_decompressed(
    transport: HttpTransport, site: Site, encoding: str, cap: int, complete: bool
) -> None:
    """gzip and deflate bodies are decoded, and the cap counts decompressed bytes."""
    response = await send(transport, request("GET", site.url(f"/{encoding}/5000")), Limits(cap, 5))
    assert response.body == b"a" * min(cap, 5000)
    assert response.complete is complete


async def test_response_metadata(transport: HttpTransport, site: Site) -> None:
    """The response carries status, reason, content type and charset."""
    response = await send(transport, request("GET", site.url("/latin1")))
    assert (response.status, response.reason) == (200, "OK")
    assert response.content_type == "text/plain; charset=iso-8859-1"
    assert response.charset == "iso-8859-1"
    assert response.body.decode(response.charset) == "café"


# --- failures ----------------------------------------------------------------------------------


async def test_close_without_response_is_empty_response(
    transport: HttpTransport, raw_server: Callable[[StreamHandler], Awaitable[str]]
) -> None:
    """A server that closes the connection without answering is EmptyResponse (exit 52), and is sent the
    request once: it may have acted on it, and sending it again is the upstream's retry policy's to decide."""
    received = []

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()
        await writer.wait_closed()

    url = await raw_server(hang_up)
    with pytest.raises(errors.EmptyResponse) as info:
        await send(transport, request("GET", url + "/x"))
    assert info.value.exit_code == 52
    assert len(received) == 1


async def test_connection_lost_mid_body_is_receive_failed(
    transport: HttpTransport, raw_server: Callable[[StreamHandler], Awaitable[str]]
) -> None:
    """A connection that breaks before the declared Content-Length arrived is ReceiveFailed (exit 56)."""

    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    url = await raw_server(cut_short)
    with pytest.raises(errors.ReceiveFailed) as info:
        await send(transport, request("GET", url + "/x"))
    assert info.value.exit_code == 56


async def test_nothing_listening_is_connect_failed(transport: HttpTransport, refused_url: str) -> None:
    """A refused connection is ConnectFailed (exit 7)."""
    with pytest.raises(errors.ConnectFailed) as info:
        await send(transport, request("GET", refused_url + "/x"))
    assert info.value.exit_code == 7


# --- isolation between calls ---------------------------------------------------------------------


async def test_cookies_are_not_carried_between_requests(transport: HttpTransport, site: Site) -> None:
    """A cookie set by one response is not sent with the next request on the same pool."""
    first = await send(transport, request("GET", site.url("/set-cookie")))
    assert first.status == 200
    second = await send(transport, request("GET", site.url("/echo")))
    assert "Cookie" not in json.loads(second.body)["headers"]


async def test_close_then_send_opens_a_new_session(transport: HttpTransport, site: Site) -> None:
    """After close, the transport can still send (a new pool is opened)."""
    await send(transport, request("GET", site.url("/bytes/3")))
    await transport.close()
    response = await send(transport, request("GET", site.url("/bytes/3")))
    assert response.body == b"xxx"


async def test_changed_pool_settings_get_a_pool_of_their_own(transport: HttpTransport, site: Site) -> None:
    """A new definitions set that changes an upstream's max_concurrency (its pool's connections) or
    verify_tls gets a new pool; the old one is closed once retired."""
    first = dataclasses.replace(POOL, max_connections=5, timeout_s=0.05)
    old = transport.session(first, checked=False)
    assert old.connector is not None and old.connector.limit == 5
    second = dataclasses.replace(first, max_connections=7)
    new = transport.session(second, checked=False)
    assert new is not old and new.connector is not None and new.connector.limit == 7
    transport.retire([second])
    await transport.drained()
    assert old.closed and not new.closed
    assert transport.session(dataclasses.replace(second, verify_tls=False), checked=False) is not new


async def test_the_egress_pool_is_not_sized_by_its_first_user(transport: HttpTransport, site: Site) -> None:
    """The egress-checked pool serves many upstreams: its size is its own, whoever opens it first."""
    narrow = dataclasses.replace(POOL, max_connections=1)
    checked = transport.session(narrow, checked=True)
    assert checked.connector is not None and checked.connector.limit == EGRESS_POOL_CONNECTIONS


class Injector:
    """A raw upstream that answers each request with its own path; on the first connection, 0.3 s after
    its first answer, it writes a response nobody asked for on the idle keep-alive connection. It notes
    when the client drops that connection."""

    INJECTED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\ninjected"
    INJECT_AFTER_S = 0.3
    WAIT_FOR_DROP_S = 2.0

    def __init__(self) -> None:
        self.injected = asyncio.Event()
        self.dropped = asyncio.Event()
        self.connections = 0
        self.all_closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.all_closed.clear()
        poisoner = not self.injected.is_set()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                answer = head.split(b" ", 2)[1]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
                await writer.drain()
                if poisoner and not self.injected.is_set():
                    await asyncio.sleep(self.INJECT_AFTER_S)  # the upstream's own misbehaviour, not a wait
                    writer.write(self.INJECTED)
                    await writer.drain()
                    self.injected.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            if poisoner:
                self.dropped.set()
        finally:
            writer.close()
            self.connections -= 1
            if not self.connections:
                self.all_closed.set()

    async def settled(self) -> None:
        """Wait for the injection, then (bounded) for the client to drop the poisoned connection."""
        await asyncio.wait_for(self.injected.wait(), 10)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.dropped.wait(), self.WAIT_FOR_DROP_S)


async def test_a_pooled_connection_that_received_bytes_while_idle_is_not_reused(
    transport: HttpTransport, raw_server: Callable[[StreamHandler], Awaitable[str]]
) -> None:
    """A response the upstream sends on an idle keep-alive connection is never read as the next call's
    answer: every call gets its own answer, in order, and the poisoned connection is dropped."""
    injector = Injector()
    url = await raw_server(injector.handle)
    first = await send(transport, request("GET", url + "/call-1"))
    await injector.settled()
    answers = [first.body] + [(await send(transport, request("GET", f"{url}/call-{n}"))).body for n in (2, 3, 4)]
    await transport.close()
    await asyncio.wait_for(injector.all_closed.wait(), 10)
    assert answers == [b"/call-1", b"/call-2", b"/call-3", b"/call-4"]
    assert injector.dropped.is_set()


async def test_both_pools_drop_connections_that_received_bytes_while_idle(transport: HttpTransport, site: Site) -> None:
    """The egress-checked pool is built on the same guarded connector as an upstream's own pool."""
    for checked in (False, True):
        assert isinstance(transport.session(POOL, checked=checked).connector, KeepAliveConnector)


async def test_header_bytes_that_are_not_utf8_are_read_as_latin1(
    transport: HttpTransport, raw_server: Callable[[StreamHandler], Awaitable[str]]
) -> None:
    """A Latin-1 reason phrase and a Content-Type holding non-UTF-8 bytes come out as valid Unicode text,
    each byte read as Latin-1."""

    async def latin1_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 404 N\xe3o encontrado\r\nContent-Type: text/plain; charset=\xff\xfe\r\n"
            b"Retry-After: \xe9\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"
        )
        await writer.drain()
        writer.close()

    url = await raw_server(latin1_head)
    response = await send(transport, request("GET", url + "/x"))
    assert (response.status, response.reason, response.body) == (404, "Não encontrado", b"no")
    assert response.content_type == "text/plain; charset=ÿþ"
    assert response.retry_after == "é"
    for text in (response.reason, response.content_type, response.charset, response.retry_after):
        text.encode("utf-8")  # raises on a lone surrogate
