"""Real local servers for the tests: an HTTP upstream with misbehaving endpoints and an NXDOMAIN DNS server."""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import json
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from aiohttp import web


@dataclass
class UpstreamState:
    hits: list[tuple[str, str]] = field(default_factory=list)
    streamed_bytes: int = 0
    in_flight: int = 0
    max_in_flight: int = 0

    def hits_to(self, prefix: str) -> int:
        return sum(1 for _, path in self.hits if path.startswith(prefix))


async def echo(request: web.Request) -> web.Response:
    """The request as the upstream saw it: method, raw path, query pairs, headers and body."""
    body = await request.read()
    return web.json_response(
        {
            "method": request.method,
            "path": request.raw_path.split("?", 1)[0],
            "query": [[k, v] for k, v in request.query.items()],
            "headers": dict(request.headers),
            "body": body.decode("utf-8", "replace"),
        }
    )


def make_upstream(state: UpstreamState) -> web.Application:
    @web.middleware
    async def record(request: web.Request, handler: Callable[..., object]) -> web.StreamResponse:
        state.hits.append((request.method, request.path_qs))
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await handler(request)  # type: ignore[misc]
        finally:
            state.in_flight -= 1

    async def status(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"upstream says {code}")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("delay", "5")))
        return web.json_response({"slow": True})

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        chunk = b"x" * 65536
        total = int(request.query.get("mb", "50")) * 1024 * 1024
        while state.streamed_bytes < total:
            await response.write(chunk)
            state.streamed_bytes += len(chunk)
        await response.write_eof()
        return response

    async def redirect_loop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/redirect-loop")

    async def gzipped(request: web.Request) -> web.Response:
        payload = gzip.compress(json.dumps({"compressed": True, "text": "hello " * 100}).encode())
        return web.Response(body=payload, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    async def latin1(request: web.Request) -> web.Response:
        return web.Response(
            body="café crème".encode("latin-1"), headers={"Content-Type": "text/plain; charset=iso-8859-1"}
        )

    app = web.Application(middlewares=[record])
    app.router.add_route("*", "/echo{tail:.*}", echo)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/slow", slow)
    app.router.add_get("/huge", huge)
    app.router.add_get("/redirect-loop", redirect_loop)
    app.router.add_get("/gzip", gzipped)
    app.router.add_get("/latin1", latin1)
    return app


class ServerThread:
    """Runs an aiohttp application on 127.0.0.1 in a thread with its own loop."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test upstream did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self._app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        # A listen queue as deep as a real server's: a worker opens a connection per call of a burst at once,
        # and aiohttp's default of 128 would drop the rest of 200 SYNs (each then retried a second later).
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class DnsServer:
    """A DNS server on 127.0.0.1 answering A and AAAA from a table, with TTL 0; other names are NXDOMAIN
    (with no table, every name: the worker resolves only through it, so no query leaves loopback)."""

    def __init__(self, records: dict[str, list[str]] | None = None) -> None:
        self.records = dict(records or {})
        self.queries: list[tuple[str, int]] = []
        self._sock = _bound_udp()
        self.port = self._sock.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> DnsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        self._sock.close()

    def a_queries(self, name: str) -> int:
        return sum(1 for queried, qtype in self.queries if queried == name and qtype == 1)

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            reply = self._reply(data)
            if reply is not None:
                self._sock.sendto(reply, peer)

    def _reply(self, data: bytes) -> bytes | None:
        parsed = _question(data)
        if parsed is None:
            return None
        name, qtype, end = parsed
        self.queries.append((name, qtype))
        addresses = self.records.get(name)
        version = {1: 4, 28: 6}.get(qtype)
        packed = [ip.packed for ip in map(ipaddress.ip_address, addresses or []) if ip.version == version]
        ident, flags = struct.unpack(">HH", data[:4])
        rcode = 3 if addresses is None else 0
        # QR and RA set; opcode and RD copied; one question, the answers, nothing else.
        header = struct.pack(">HHHHHH", ident, 0x8080 | (flags & 0x7900) | rcode, 1, len(packed), 0, 0)
        answers = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", qtype, 1, 0, len(rdata)) + rdata for rdata in packed)
        return header + data[12:end] + answers


def _bound_udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    return sock


def _question(data: bytes) -> tuple[str, int, int] | None:
    """The first question's name, type and end offset; None for a packet that is not a query."""
    labels, offset = [], 12
    while offset < len(data) and data[offset]:
        length = data[offset]
        labels.append(data[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    end = offset + 5
    if len(data) < end or data[2] & 0x80:
        return None
    return ".".join(labels).lower(), struct.unpack(">H", data[offset + 1 : offset + 3])[0], end


def closed_port() -> int:
    """A loopback port with nothing listening (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class TcpServer:
    """A bare asyncio TCP server on 127.0.0.1, on a loop in a thread of its own, for upstreams that
    misbehave below HTTP; a subclass answers each connection in `handle`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def start(self) -> Self:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(asyncio.start_server(self.handle, "127.0.0.1", 0), self._loop)
        self._server = started.result(10)
        return self

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
