"""Hostile inputs against a real worker process, each case with its expected exit code.

SSRF through the generic `http_request` tool, injection through defined tools, upstreams that attack
the worker (a decompression bomb, endless and dripping bodies), then a check that the worker still
answers and leaked no secret. Traffic goes to loopback only: private, link-local and metadata
addresses appear only as strings that the egress policy refuses before connecting, and every name
the worker resolves goes to this module's own DNS server on 127.0.0.1. The module's workers use
databases 11-13 of the session's Redis-compatible server, so other modules' workers never see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
import redis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, SECRET_TOKEN, start_worker, stop_worker, worker_env
from tests.support.servers import DnsServer, echo
from worker.client import ToolClient
from worker.constants import DEFAULT_QUEUE, TASK_EXECUTE
from worker.dev.embedded import EmbeddedRedis
from worker.envelope import ToolResult
from worker.protocol import task_message

pytestmark = pytest.mark.integration

# Secrets the worker must never echo: its ${env:...} value, call-header values, URL and header credentials.
ENV_SECRET = f"env-secret-{uuid.uuid4().hex}"
CALL_TOKEN = f"call-token-{uuid.uuid4().hex}"
FORGED_AUTH = f"Bearer forged-{uuid.uuid4().hex}"
URL_PASSWORD = f"url-password-{uuid.uuid4().hex}"
GENERIC_AUTH = f"generic-credential-{uuid.uuid4().hex}"
SECRETS = (ENV_SECRET, SECRET_TOKEN, CALL_TOKEN, FORGED_AUTH, URL_PASSWORD, GENERIC_AUTH)

SECURITY_FIXTURES = FIXTURES / "security"  # definitions, and a self-signed certificate for 127.0.0.1
MAX_OUTPUT_CHARS = 2000  # the `hostile` upstream's max_output_chars
TOOL_TIMEOUT_S = 1.5  # the `hostile` and `slowhead` upstreams' timeout_seconds
DRIP_INTERVAL_S = 0.2
GIB = 1 << 30
MIB = 1 << 20
SERVER_NAME = web.AppKey("server_name", str)
# Headers the upstream receives from a plain `item` call with a trace value, and no others.
ITEM_HEADER_NAMES = {"host", "authorization", "x-trace", "accept", "accept-encoding", "user-agent"}


# --- the suite's own servers --------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request as a server of this module received it."""

    server: str
    method: str
    path: str  # raw, without the query
    query: list[tuple[str, str]]
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


def gzip_bomb(inflated_bytes: int = GIB) -> bytes:
    """A valid gzip body of about 1 MB that inflates to `inflated_bytes` zeros (built from one repeated block)."""
    zeros = bytes(MIB)
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    # After a full flush the compressor restarts, so each further MiB of zeros compresses to the same bytes.
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    tail = compressor.flush()[:-8]  # the final empty block; its trailer would only cover two MiB
    crc = 0
    for _ in range(inflated_bytes // MIB):
        crc = zlib.crc32(zeros, crc)
    trailer = struct.pack("<II", crc, inflated_bytes & 0xFFFFFFFF)
    return head + block * (inflated_bytes // MIB - 1) + tail + trailer


class Servers:
    """The hostile upstream, canaries on addresses the worker must never reach, and a slow-header server,
    all on one event loop in a thread."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.stream_bytes = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="security-servers", daemon=True)
        self._runners: list[web.AppRunner] = []
        self._raw_servers: list[asyncio.Server] = []
        self._raw_tasks: set[asyncio.Task[None]] = set()
        self._bomb = gzip_bomb()

    def start(self) -> Servers:
        self._thread.start()
        self.run(self._start())
        return self

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 15.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            self.run(self._stop(), 15.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def since(self, count: int) -> list[Seen]:
        return self.seen[count:]

    def canary_hits(self) -> list[Seen]:
        return [s for s in self.seen if s.server.startswith("canary")]

    def marked(self, marker: str) -> list[Seen]:
        """Requests whose path carries the marker: an SSRF attempt that got through."""
        return [s for s in self.seen if marker in s.path]

    async def _start(self) -> None:
        tls_socket = _bound("127.0.0.1", 0)
        self.tls_port = tls_socket.getsockname()[1]
        self.upstream_port = await self._serve(self._hostile_app(), [_bound("127.0.0.1", 0)], tls_socket)
        self.canary_port = await self._serve(self._canary_app(), _canary_sockets(self.upstream_port))
        head_socket = _bound("127.0.0.1", 0)
        self.slow_head_port = head_socket.getsockname()[1]
        self._raw_servers.append(await asyncio.start_server(self._slow_head, sock=head_socket))

    async def _serve(self, app: web.Application, sockets: list[socket.socket], tls: socket.socket | None = None) -> int:
        """Serve the app on the sockets (and with a self-signed certificate on `tls`); the first one's port."""
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        for sock in sockets:
            await web.SockSite(runner, sock).start()
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(SECURITY_FIXTURES / "selfsigned.pem", SECURITY_FIXTURES / "selfsigned.key")
            await web.SockSite(runner, tls, ssl_context=context).start()
        port: int = sockets[0].getsockname()[1]
        return port

    async def _stop(self) -> None:
        for server in self._raw_servers:
            server.close()
        for task in list(self._raw_tasks):
            task.cancel()
        await asyncio.gather(*self._raw_tasks, return_exceptions=True)
        for server in self._raw_servers:
            await server.wait_closed()
        for runner in self._runners:
            await runner.cleanup()

    @web.middleware
    async def _record(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else b""
        local = request.transport.get_extra_info("sockname") if request.transport else None
        name = request.app[SERVER_NAME] if local is None else f"{request.app[SERVER_NAME]}@{local[0]}:{local[1]}"
        path = request.raw_path.split("?", 1)[0]
        self.seen.append(
            Seen(name, request.method, path, list(request.query.items()), list(request.headers.items()), body)
        )
        response: web.StreamResponse = await handler(request)
        return response

    def _hostile_app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app[SERVER_NAME] = "upstream"
        app.router.add_route("*", r"/echo{tail:[\s\S]*}", echo)
        app.router.add_get("/redirect", _redirect)
        app.router.add_get("/loop", _loop)
        app.router.add_get("/bomb", self._bomb_handler)
        app.router.add_get("/stream", self._stream_handler)
        app.router.add_get("/drip", _drip)
        app.router.add_get("/bad-utf8", _bad_utf8)
        return app

    def _canary_app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app[SERVER_NAME] = "canary"
        app.router.add_route("*", r"/{tail:[\s\S]*}", echo)
        return app

    async def _bomb_handler(self, request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "text/plain", "Content-Encoding": "gzip"}
        response = web.StreamResponse(headers=headers)
        response.content_length = len(self._bomb)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            await response.write(self._bomb)
            await response.write_eof()
        return response

    async def _stream_handler(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        chunk = b"x" * 65536
        with contextlib.suppress(ConnectionError):
            for _ in range(GIB // len(chunk)):
                await response.write(chunk)
                self.stream_bytes += len(chunk)
            await response.write_eof()
        return response

    async def _slow_head(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send a status line and then a header one byte every DRIP_INTERVAL_S, forever."""
        task = asyncio.current_task()
        assert task is not None
        self._raw_tasks.add(task)
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            head = b"HTTP/1.1 200 OK\r\nX-Drip: "
            index = 0
            while not writer.is_closing():
                writer.write(head[index : index + 1] if index < len(head) else b"a")
                await writer.drain()
                index += 1
                await asyncio.sleep(DRIP_INTERVAL_S)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()
            self._raw_tasks.discard(task)


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound(request.query["to"])


async def _loop(request: web.Request) -> web.Response:
    raise web.HTTPFound("/loop")


async def _drip(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        while True:
            await response.write(b".")
            await asyncio.sleep(DRIP_INTERVAL_S)
    return response


async def _bad_utf8(request: web.Request) -> web.Response:
    return web.Response(body=b"ok \xff\xfe \xc3\x28 end", headers={"Content-Type": "text/plain; charset=utf-8"})


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _canary_sockets(upstream_port: int) -> list[socket.socket]:
    """127.0.0.2:C and [::1]:C on one free port C, and 127.0.0.2 on the upstream's own port."""
    for _ in range(20):
        first = _bound("127.0.0.2", 0)
        try:
            ipv6 = _bound("::1", first.getsockname()[1])
        except OSError:
            first.close()
            continue
        return [first, ipv6, _bound("127.0.0.2", upstream_port)]
    raise RuntimeError("no port free on both 127.0.0.2 and ::1")


# --- the worker under attack --------------------------------------------------------------------


class Rig:
    """The worker under attack, the client that calls it, the servers it talks to, and every envelope it sent."""

    def __init__(
        self,
        client: ToolClient,
        redis_url: str,
        process: subprocess.Popen[bytes],
        log_path: Path,
        servers: Servers,
        dns: DnsServer,
    ) -> None:
        self.client = client
        self.redis_url = redis_url
        self.process = process
        self.log_path = log_path
        self.servers = servers
        self.dns = dns
        self.envelopes: list[dict[str, Any]] = []

    def __repr__(self) -> str:  # short: hypothesis prints it with every failing example
        return f"<Rig worker pid={self.process.pid} upstream=127.0.0.1:{self.up}>"

    @property
    def up(self) -> int:
        return self.servers.upstream_port

    @property
    def canary(self) -> int:
        return self.servers.canary_port

    def call(
        self, tool: str, arguments: dict[str, Any], headers: dict[str, str] | None = None, timeout_s: float = 30.0
    ) -> ToolResult:
        result = self.client.call(tool, arguments, headers=headers, timeout=timeout_s)
        self.envelopes.append(result.to_dict())
        return result

    def fill(self, value: Any, marker: str = "") -> Any:
        """Put the servers' ports and the case's marker into a case's strings."""
        if isinstance(value, str):
            for name, text in (
                ("up", self.up),
                ("canary", self.canary),
                ("tls", self.servers.tls_port),
                ("marker", marker),
            ):
                value = value.replace("{" + name + "}", str(text))
            return value
        if isinstance(value, dict):
            return {key: self.fill(item, marker) for key, item in value.items()}
        return value

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self, field_name: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        raise AssertionError(f"{field_name} missing from /proc/{self.process.pid}/status")


DNS_RECORDS = {
    "rebind.test": ["127.0.0.2"],
    "six.test": ["::1"],
    "mapped.test": ["::ffff:127.0.0.2"],
    "both.test": ["127.0.0.2", "127.0.0.1"],
    "flip.test": ["127.0.0.1"],
    "pin.test": ["127.0.0.1"],
}


def allow_list(servers: Servers) -> str:
    """The test upstream's address and ports, and names only: whatever they resolve to is checked."""
    listed = f"127.0.0.1:{servers.upstream_port} 127.0.0.1:{servers.tls_port}"
    return f"{listed} rebind.test six.test mapped.test both.test flip.test pin.test"


def database_url(redis_url: str, db: int) -> str:
    """A database of the session's server for this module alone: other modules' workers consume database 0."""
    return f"{redis_url.rsplit('/', 1)[0]}/{db}"


def flush(redis_url: str) -> None:
    """Empty a database of this module's own, so nothing left in it reaches a later worker."""
    r = redis.Redis.from_url(redis_url)
    try:
        r.flushdb()
    finally:
        r.close()


def launch_worker(redis_url: str, servers: Servers, dns: DnsServer, log_path: Path) -> subprocess.Popen[bytes]:
    """A real worker on this module's definitions, allow-list and DNS server."""
    upstream_url = f"http://127.0.0.1:{servers.upstream_port}"
    env = worker_env(redis_url, upstream_url, dns.address, SECURITY_FIXTURES)
    env.update(
        TOOLWORKER_EGRESS_ALLOW=allow_list(servers),
        SEC_UPSTREAM_URL=upstream_url,
        SEC_SLOWHEAD_URL=f"http://127.0.0.1:{servers.slow_head_port}",
        SEC_SECRET=ENV_SECRET,
    )
    return start_worker(env, log_path)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    running = Servers().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def dns() -> Iterator[DnsServer]:
    server = DnsServer(DNS_RECORDS).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rig(
    redis_server: EmbeddedRedis, servers: Servers, dns: DnsServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    redis_url = database_url(redis_server.url, 11)
    log_path = tmp_path_factory.mktemp("security-worker") / "worker.log"
    process = launch_worker(redis_url, servers, dns, log_path)
    client = ToolClient(redis_url)
    try:
        handle = Rig(client, redis_url, process, log_path, servers, dns)
        first = handle.call("item", {"item": "warm-up"}, timeout_s=60)
        assert first.exit_code == 0, (first.to_dict(), handle.log_text()[-3000:])
        yield handle
    finally:
        client.close()
        stop_worker(process)
        flush(redis_url)


# --- SSRF through the generic tool --------------------------------------------------------------


def via_redirect(target: str) -> str:
    """A URL on the allowed upstream that redirects to `target`."""
    return "http://127.0.0.1:{up}/redirect?to=" + quote(target, safe="{}")


# stage: "policy" = refused before any connection (no attempt made); "connect" = refused on the resolved
# address when connecting; "hop" = the allowed upstream answered with a redirect that was refused.
SSRF_REFUSED = [
    pytest.param("http://127.0.0.2:{canary}/{marker}", "policy", id="127.0.0.2 is a loopback address not listed"),
    pytest.param("http://127.0.0.2:{up}/{marker}", "policy", id="127.0.0.2 on the upstream's port is not listed"),
    pytest.param("http://127.0.0.1:{canary}/{marker}", "policy", id="the listed address on another port"),
    pytest.param("http://[::ffff:127.0.0.2]:{canary}/{marker}", "policy", id="IPv4-mapped 127.0.0.2"),
    pytest.param("http://[::ffff:7f00:2]:{canary}/{marker}", "policy", id="IPv4-mapped 127.0.0.2 in hex"),
    pytest.param("http://[::127.0.0.2]:{canary}/{marker}", "policy", id="IPv4-compatible 127.0.0.2"),
    pytest.param("http://[::1]:{canary}/{marker}", "policy", id="the IPv6 loopback"),
    pytest.param("http://[0:0:0:0:0:0:0:1]:{canary}/{marker}", "policy", id="the IPv6 loopback written out"),
    pytest.param("http://2130706434:{canary}/{marker}", "policy", id="127.0.0.2 as one decimal number"),
    pytest.param("http://0177.0.0.2:{canary}/{marker}", "policy", id="127.0.0.2 in octal"),
    pytest.param("http://0x7f000002:{canary}/{marker}", "policy", id="127.0.0.2 as one hex number"),
    pytest.param("http://0x7f.0.0.2:{canary}/{marker}", "policy", id="127.0.0.2 with a hex first part"),
    pytest.param("http://127.2:{canary}/{marker}", "policy", id="127.0.0.2 in short form"),
    pytest.param("http://localhost:{up}/{marker}", "policy", id="localhost although its address is listed"),
    pytest.param("http://0.0.0.0:{up}/{marker}", "policy", id="the unspecified address 0.0.0.0"),
    pytest.param("http://0:{up}/{marker}", "policy", id="the unspecified address in short form"),
    pytest.param("http://[::]:{up}/{marker}", "policy", id="the IPv6 unspecified address"),
    pytest.param("file:///etc/passwd", "policy", id="a file URL"),
    pytest.param("gopher://127.0.0.1:{up}/_GET%20/{marker}", "policy", id="a gopher URL to the listed address"),
    pytest.param("ftp://127.0.0.1:{up}/{marker}", "policy", id="an ftp URL to the listed address"),
    pytest.param("http://127.0.0.1:{up}@127.0.0.2:{canary}/{marker}", "policy", id="userinfo naming the listed host"),
    pytest.param("http://169.254.169.254/latest/meta-data/", "policy", id="the cloud metadata address"),
    pytest.param("http://[fd00:ec2::254]/latest/meta-data/", "policy", id="the IPv6 cloud metadata address"),
    pytest.param("http://[::ffff:169.254.169.254]/latest/", "policy", id="the metadata address IPv4-mapped"),
    pytest.param("http://10.0.0.1/{marker}", "policy", id="a private address"),
    pytest.param("http://[fe80::1%25eth0]:{canary}/{marker}", "policy", id="a link-local IPv6 address with a zone"),
    pytest.param(
        "http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54:{up}/{marker}",
        "policy",
        id="localhost in fullwidth letters",
    ),
    pytest.param("http://REBIND.TEST:{canary}/{marker}", "connect", id="a listed name in capitals"),
    pytest.param("http://rebind.test.:{canary}/{marker}", "connect", id="a listed name with a trailing dot"),
    pytest.param("http://rebind.test:{canary}/{marker}", "connect", id="a listed name resolving to 127.0.0.2"),
    pytest.param("http://six.test:{canary}/{marker}", "connect", id="a listed name resolving to ::1"),
    pytest.param("http://mapped.test:{canary}/{marker}", "connect", id="a listed name resolving to mapped 127.0.0.2"),
    pytest.param(via_redirect("http://127.0.0.2:{canary}/{marker}"), "hop", id="a redirect to 127.0.0.2"),
    pytest.param(via_redirect("http://[::1]:{canary}/{marker}"), "hop", id="a redirect to the IPv6 loopback"),
    pytest.param(via_redirect("http://rebind.test:{canary}/{marker}"), "hop", id="a redirect to a name for 127.0.0.2"),
    pytest.param(via_redirect("http://169.254.169.254/latest/"), "hop", id="a redirect to the metadata address"),
    pytest.param(via_redirect("file:///etc/passwd"), "hop", id="a redirect to a file URL"),
]


@pytest.mark.parametrize(("url", "stage"), SSRF_REFUSED)
def test_generic_tool_refuses(rig: Rig, url: str, stage: str) -> None:
    """The generic tool refuses the URL with exit 77, and nothing reaches the address it names."""
    marker = f"ssrf-{uuid.uuid4().hex}"
    before = len(rig.servers.seen)
    result = rig.call("http_request", {"url": rig.fill(url, marker)})
    assert result.exit_code == 77, result.to_dict()
    assert result.error is not None and result.error["type"] == "egress_blocked"
    assert rig.servers.marked(marker) == [] and rig.servers.canary_hits() == []
    seen = rig.servers.since(before)
    if stage == "policy":  # refused by the URL check: no attempt, no packet, nothing to wait for
        assert result.attempts == 0 and seen == [] and result.duration_ms < 250, result.to_dict()
    elif stage == "connect":  # the name was allowed; the address it resolved to was not
        assert result.attempts == 1 and seen == []
        assert "blocked by the egress policy" in result.error["message"]
    else:  # the first hop reached the allowed upstream, the redirect was refused
        assert result.attempts == 1 and [s.path for s in seen] == ["/redirect"]


def test_metadata_url_is_refused_without_a_connection(rig: Rig) -> None:
    """169.254.169.254 is refused by the URL check itself: no attempt, no resolver, no socket."""
    queries = len(rig.dns.queries)
    started = time.perf_counter()
    result = rig.call("http_request", {"url": "http://169.254.169.254/latest/meta-data/iam/"})
    assert result.exit_code == 77 and result.attempts == 0 and result.status_code is None
    assert result.duration_ms < 100, result.to_dict()
    assert len(rig.dns.queries) == queries
    assert time.perf_counter() - started < 5


def test_name_with_an_allowed_and_a_refused_address_reaches_only_the_allowed(rig: Rig) -> None:
    """A listed name resolving to 127.0.0.2 and 127.0.0.1 connects to 127.0.0.1 only (exit 0)."""
    for _ in range(3):  # the connector rotates the cached addresses: try each first
        marker = f"both-{uuid.uuid4().hex}"
        result = rig.call("http_request", {"url": rig.fill("http://both.test:{up}/echo/{marker}", marker)})
        assert result.exit_code == 0, result.to_dict()
        assert [s.server for s in rig.servers.marked(marker)] == [f"upstream@127.0.0.1:{rig.up}"]
    assert rig.servers.canary_hits() == []


def test_dns_rebinding_is_refused_at_connect_time(rig: Rig) -> None:
    """A listed name answered 127.0.0.1 and then (TTL 0) 127.0.0.2: the new answer is refused when connecting."""
    first = rig.call("http_request", {"url": rig.fill("http://flip.test:{up}/echo/before")})
    assert first.exit_code == 0, first.to_dict()
    assert rig.dns.a_queries("flip.test") == 1
    rig.dns.records["flip.test"] = ["127.0.0.2"]
    # A port the worker has not resolved this name for yet, so it must ask the DNS server again.
    second = rig.call("http_request", {"url": rig.fill("http://flip.test:{canary}/after")})
    assert rig.dns.a_queries("flip.test") == 2
    assert second.exit_code == 77 and second.attempts == 1, second.to_dict()
    assert second.error is not None and "loopback" in second.error["message"]
    assert rig.servers.canary_hits() == []


def test_rebinding_within_the_dns_cache_stays_on_the_checked_address(rig: Rig) -> None:
    """Rebound to 127.0.0.2, a name the worker resolved within the last minute stays on its checked 127.0.0.1."""
    first = rig.call("http_request", {"url": rig.fill("http://pin.test:{up}/echo/first")})
    assert first.exit_code == 0, first.to_dict()
    rig.dns.records["pin.test"] = ["127.0.0.2"]
    # aiohttp keeps answers for ttl_dns_cache (60 s) whatever their TTL, and reuses the open connection.
    second = rig.call("http_request", {"url": rig.fill("http://pin.test:{up}/echo/second")})
    assert second.exit_code == 0, second.to_dict()
    assert rig.dns.a_queries("pin.test") == 1
    assert [s.server for s in rig.servers.seen[-1:]] == [f"upstream@127.0.0.1:{rig.up}"]
    assert rig.servers.canary_hits() == []


def echo_url(path: str = "{marker}") -> str:
    return "http://127.0.0.1:{up}/echo/" + path


GENERIC_OTHER = [
    pytest.param({"url": echo_url(), "headers": {"X-A": "1\r\nX-Injected: 1"}}, 65, id="CRLF in a header"),
    pytest.param({"url": echo_url(), "headers": {"X-A": "1\x00X-Injected: 1"}}, 65, id="NUL in a header"),
    pytest.param({"url": echo_url(), "headers": {"Host": "127.0.0.2"}}, 65, id="a Host header"),
    pytest.param({"url": echo_url(), "headers": {"Transfer-Encoding": "chunked"}}, 65, id="a Transfer-Encoding header"),
    pytest.param({"url": echo_url(), "headers": {f"X-H{i}": "1" for i in range(65)}}, 65, id="65 headers"),
    pytest.param({"url": echo_url(), "headers": {"X-A": "a" * 8193}}, 65, id="a header value over 8 KiB"),
    pytest.param({"url": "http://127.0.0.1:{up}/loop"}, 47, id="a redirect loop on the listed host"),
    pytest.param(
        {"url": "https://127.0.0.1:{tls}/echo/{marker}"}, 35, id="a listed host with an untrusted certificate"
    ),
    # The listed address in other spellings: the same endpoint, or a form the HTTP client will not send.
    pytest.param({"url": "http://[::ffff:127.0.0.1]:{up}/echo/"}, 0, id="the listed address IPv4-mapped is allowed"),
    pytest.param({"url": "http://2130706433:{up}/echo/{marker}"}, 3, id="the listed address as a decimal number"),
    pytest.param({"url": "http://127.1:{up}/echo/{marker}"}, 3, id="the listed address in short form"),
    pytest.param({"url": "http://127.0.0.1.:{up}/echo/{marker}"}, 3, id="the listed address with a trailing dot"),
    # The policy reads 0x7f000001 as 127.0.0.1; the client takes it for a name, which our DNS does not know.
    pytest.param({"url": "http://0x7f000001:{up}/echo/{marker}"}, 6, id="the listed address as a hex number"),
    pytest.param({"url": "http://127.0.0.2:{canary}\\@127.0.0.1:{up}/{marker}"}, 3, id="a backslash before userinfo"),
    pytest.param(
        {"url": "http://127.0.0.1:{up}#@127.0.0.2:{canary}/{marker}"}, 22, id="a fragment hiding a second host"
    ),
]


@pytest.mark.parametrize(("arguments", "expected"), GENERIC_OTHER)
def test_generic_tool_other_attacks(rig: Rig, arguments: dict[str, Any], expected: int) -> None:
    """Header injection, redirect loops and odd spellings through the generic tool end with their exit codes."""
    marker = f"generic-{uuid.uuid4().hex}"
    result = rig.call("http_request", rig.fill(arguments, marker))
    assert result.exit_code == expected, result.to_dict()
    assert rig.servers.marked(marker) == [] and rig.servers.canary_hits() == []
    assert not any("X-Injected" in name for s in rig.servers.seen for name, _ in s.headers)


def test_generic_tool_credentials_are_redacted(rig: Rig) -> None:
    """An Authorization header given to the generic tool reaches the upstream (exit 0) but not the envelope."""
    result = rig.call("http_request", {"url": rig.fill(echo_url("")), "headers": {"Authorization": GENERIC_AUTH}})
    assert result.exit_code == 0, result.to_dict()
    [authorization] = rig.servers.seen[-1].header("Authorization")
    assert authorization == GENERIC_AUTH
    assert GENERIC_AUTH not in json.dumps(result.to_dict())


def test_generic_tool_refuses_credentials_in_the_url(rig: Rig) -> None:
    """A password in the URL is refused (65) before anything is sent, and not echoed."""
    before = len(rig.servers.seen)
    result = rig.call("http_request", {"url": rig.fill(f"http://user:{URL_PASSWORD}@127.0.0.1:{{up}}/echo/")})
    assert result.exit_code == 65, result.to_dict()
    assert len(rig.servers.seen) == before
    assert URL_PASSWORD not in json.dumps(result.to_dict())


def test_generic_tool_credentials_in_url_and_header_are_invalid_arguments(rig: Rig) -> None:
    """Credentials in both the URL and an Authorization header are invalid arguments (65), not a worker failure."""
    url = rig.fill(f"http://user:{URL_PASSWORD}@127.0.0.1:{{up}}/echo/")
    result = rig.call("http_request", {"url": url, "headers": {"Authorization": GENERIC_AUTH}})
    text = json.dumps(result.to_dict())
    assert URL_PASSWORD not in text and GENERIC_AUTH not in text
    assert result.exit_code == 65, result.to_dict()


def test_tls_verification_of_the_egress_pool_does_not_depend_on_the_first_caller(
    redis_server: EmbeddedRedis, servers: Servers, dns: DnsServer, tmp_path: Path
) -> None:
    """After a verify_tls-off upstream redirects off-site, the generic tool still refuses an untrusted certificate."""
    redis_url = database_url(redis_server.url, 13)  # a fresh worker: its egress pool is not made yet
    process = launch_worker(redis_url, servers, dns, tmp_path / "worker.log")
    try:
        with ToolClient(redis_url) as client:
            lax = client.call("lax_hop", {"to": f"https://127.0.0.1:{servers.tls_port}/echo/lax"}, timeout=60)
            generic = client.call("http_request", {"url": f"https://127.0.0.1:{servers.tls_port}/echo/generic"})
    finally:
        stop_worker(process)
        flush(redis_url)
    assert lax.exit_code == 0, lax.to_dict()  # that upstream opted out of verification: its own hop passes
    assert generic.exit_code == 35, generic.to_dict()


# --- defined tools: injection through arguments and call headers --------------------------------

Check = Callable[[list[Seen]], None]


def nothing_sent(seen: list[Seen]) -> None:
    assert seen == []


def path_is(path: str) -> Check:
    def check(seen: list[Seen]) -> None:
        assert [s.path for s in seen] == [path]

    return check


def query_is(*pairs: tuple[str, str]) -> Check:
    def check(seen: list[Seen]) -> None:
        assert [(s.path, s.query) for s in seen] == [("/echo/items/x", list(pairs))]

    return check


def header_is(name: str, value: str) -> Check:
    def check(seen: list[Seen]) -> None:
        assert [s.header(name) for s in seen] == [[value]]

    return check


def json_body_is(expected: dict[str, Any]) -> Check:
    def check(seen: list[Seen]) -> None:
        assert [json.loads(s.body) for s in seen] == [expected]

    return check


BREAKOUT = '"}, "admin": true, "x": "'
BACKSLASH_BREAKOUT = '\\"}, "admin": true, "x": "\\'
CRLF = f"{CALL_TOKEN}\r\nX-Injected: 1"

DEFINED = [
    pytest.param("item", {"item": "../admin"}, None, 0, path_is("/echo/items/..%2Fadmin"), id="path ../admin"),
    pytest.param("item", {"item": "..%2Fadmin"}, None, 0, path_is("/echo/items/..%252Fadmin"), id="path ..%2Fadmin"),
    pytest.param("item", {"item": "%2e%2e"}, None, 0, path_is("/echo/items/%252e%252e"), id="path %2e%2e"),
    pytest.param("item", {"item": ".."}, None, 0, path_is("/echo/items/%2E%2E"), id="path .. alone"),
    pytest.param(
        "item", {"item": "//127.0.0.2/x"}, None, 0, path_is("/echo/items/%2F%2F127.0.0.2%2Fx"), id="path //host"
    ),
    pytest.param("item", {"item": "?x=1#"}, None, 0, path_is("/echo/items/%3Fx%3D1%23"), id="path ?x=1#"),
    pytest.param("item", {"item": "x", "q": "1&admin=1"}, None, 0, query_is(("q", "1&admin=1")), id="query &admin=1"),
    pytest.param("item", {"item": "x", "q": "?x=1#"}, None, 0, query_is(("q", "?x=1#")), id="query ?x=1#"),
    pytest.param(
        "item", {"item": "x", "trace": "a\r\nX-Injected: 1"}, None, 65, nothing_sent, id="CRLF in a header argument"
    ),
    pytest.param(
        "item", {"item": "x", "trace": "a\nX-Injected: 1"}, None, 65, nothing_sent, id="LF in a header argument"
    ),
    pytest.param("item", {"item": "x", "trace": "a\x00b"}, None, 65, nothing_sent, id="NUL in a header argument"),
    pytest.param("item", {"item": "x"}, {"X-User-Token": CRLF}, 65, nothing_sent, id="CRLF in a call header"),
    pytest.param("item", {"item": "x"}, {"Host": "127.0.0.2"}, 65, nothing_sent, id="a Host call header"),
    pytest.param("item", {"item": "x"}, {"Content-Length": "0"}, 65, nothing_sent, id="a Content-Length call header"),
    pytest.param(
        "item", {"item": "x"}, {"Transfer-Encoding": "chunked"}, 65, nothing_sent, id="a Transfer-Encoding call header"
    ),
    pytest.param("item", {"item": "x"}, {"X Bad": "1"}, 65, nothing_sent, id="a call header name with a space"),
    pytest.param(
        "item",
        {"item": "x"},
        {"Authorization": FORGED_AUTH},
        0,
        header_is("Authorization", f"Bearer {ENV_SECRET}"),
        id="an Authorization call header is dropped",
    ),
    pytest.param(
        "item",
        {"item": "x"},
        {"X-User-Token": CALL_TOKEN},
        0,
        header_is("X-User-Token", CALL_TOKEN),
        id="an overridable call header is sent",
    ),
    pytest.param(
        "note",
        {"title": BREAKOUT},
        None,
        0,
        json_body_is({"title": BREAKOUT, "kind": "note"}),
        id="JSON breakout in a text body",
    ),
    pytest.param(
        "note",
        {"title": BACKSLASH_BREAKOUT},
        None,
        0,
        json_body_is({"title": BACKSLASH_BREAKOUT, "kind": "note"}),
        id="JSON breakout with backslashes",
    ),
    pytest.param("note", {"title": "x" * (MIB + 1)}, None, 65, nothing_sent, id="an argument over 1 MiB"),
    pytest.param("item", {"item": "x", "trace": "t" * 8193}, None, 65, nothing_sent, id="a header argument over 8 KiB"),
    pytest.param("item", {"item": "x"}, {"X-User-Token": "t" * 8193}, 65, nothing_sent, id="a call header over 8 KiB"),
    pytest.param("item", {"item": "x"}, {f"X-H{i}": "1" for i in range(65)}, 65, nothing_sent, id="65 call headers"),
    pytest.param(
        "hop",
        {"to": "http://127.0.0.2:{canary}/{marker}"},
        None,
        77,
        path_is("/redirect"),
        id="a redirect off the upstream's host",
    ),
    pytest.param(
        "hop",
        {"to": "//127.0.0.2:{canary}/{marker}"},
        None,
        77,
        path_is("/redirect"),
        id="a scheme-relative redirect off the host",
    ),
    pytest.param("hop", {"to": "file:///etc/passwd"}, None, 77, path_is("/redirect"), id="a redirect to a file URL"),
]


@pytest.mark.parametrize(("tool", "arguments", "headers", "expected", "sent"), DEFINED)
def test_defined_tool_attack(
    rig: Rig, tool: str, arguments: dict[str, Any], headers: dict[str, str] | None, expected: int, sent: Check
) -> None:
    """The attack ends with its exit code, and the upstream receives exactly what the definition intends."""
    marker = f"defined-{uuid.uuid4().hex}"
    before = len(rig.servers.seen)
    result = rig.call(tool, rig.fill(arguments, marker), headers=headers)
    assert result.exit_code == expected, result.to_dict()
    sent(rig.servers.since(before))
    assert rig.servers.marked(marker) == [] and rig.servers.canary_hits() == []


def test_redirect_loop(rig: Rig) -> None:
    """An upstream that redirects to itself forever is exit 47 after 5 hops."""
    before = len(rig.servers.seen)
    result = rig.call("loop", {})
    assert result.exit_code == 47, result.to_dict()
    assert [s.path for s in rig.servers.since(before)] == ["/loop"] * 6


def test_invalid_utf8_is_decoded_with_replacement(rig: Rig) -> None:
    """A body that is not the UTF-8 it claims is decoded with U+FFFD, exit 0."""
    result = rig.call("bad_utf8", {})
    assert result.exit_code == 0, result.to_dict()
    assert result.result == "ok \ufffd\ufffd \ufffd( end"


# --- upstreams that attack the worker -----------------------------------------------------------


def test_decompression_bomb_is_cut_at_max_response_bytes(rig: Rig) -> None:
    """A gzip body inflating to 1 GiB stops at max_response_bytes; the worker's memory stays flat."""
    rss_before = rig.rss_kib()
    result = rig.call("bomb", {})
    peak_after = rig.rss_kib("VmHWM")
    assert result.exit_code == 0, result.to_dict()
    assert result.truncated is True
    assert result.result == "\x00" * MAX_OUTPUT_CHARS
    assert (peak_after - rss_before) * 1024 < 200 * MIB, (rss_before, peak_after)


def test_endless_body_is_cut_at_max_response_bytes(rig: Rig) -> None:
    """A 1 GiB body stops at max_response_bytes (1 MiB) and the worker hangs up on the rest."""
    rig.servers.stream_bytes = 0
    rss_before = rig.rss_kib()
    result = rig.call("stream", {})
    assert result.exit_code == 0, result.to_dict()
    assert result.truncated is True and result.result == "x" * MAX_OUTPUT_CHARS
    # The upstream could push only what the socket buffers held before the worker hung up.
    assert rig.servers.stream_bytes < 64 * MIB
    assert (rig.rss_kib() - rss_before) * 1024 < 200 * MIB


@pytest.mark.parametrize(
    "tool",
    ["drip", "slow_head"],
    ids=["a body dripping one byte every 0.2 s", "a status line dripping one byte every 0.2 s"],
)
def test_slowloris_upstream_times_out(rig: Rig, tool: str) -> None:
    """An upstream that never finishes is exit 28 within the tool's timeout plus 2 s."""
    started = time.monotonic()
    result = rig.call(tool, {})
    elapsed_s = time.monotonic() - started
    assert result.exit_code == 28 and result.attempts == 1, result.to_dict()
    assert TOOL_TIMEOUT_S * 1000 <= result.duration_ms < (TOOL_TIMEOUT_S + 2) * 1000
    assert elapsed_s < TOOL_TIMEOUT_S + 2 + 1  # the envelope's round trip through Redis


# --- a message the queue's own decoder chokes on ------------------------------------------------


def raw_call_message(call_id: str, call_json: str) -> str:
    """A Celery message whose single argument is the given JSON text, written as it is."""
    message = json.loads(task_message(call_id, [None], DEFAULT_QUEUE, TASK_EXECUTE))
    message["body"] = f'[[{call_json}], {{}}, {{"callbacks": null, "errbacks": null, "chain": null, "chord": null}}]'
    return json.dumps(message)


def test_deeply_nested_arguments_get_an_envelope(
    redis_server: EmbeddedRedis, servers: Servers, dns: DnsServer, tmp_path: Path
) -> None:
    """Arguments nested 10,000 levels deep get exit 65, the worker lives on, and call headers stay out of its log."""
    # A worker and a database of its own: if the message kills workers, it kills only this one.
    redis_url = database_url(redis_server.url, 12)
    log_path = tmp_path / "worker.log"
    process = launch_worker(redis_url, servers, dns, log_path)
    r = redis.Redis.from_url(redis_url, socket_timeout=20)
    try:
        with ToolClient(redis_url) as client:
            assert client.call("item", {"item": "warm-up"}, timeout=60).exit_code == 0
            envelope = _send_deeply_nested(r, depth=10_000, token=CALL_TOKEN)
            after = client.call("item", {"item": "after"}, timeout=5)
    finally:
        stop_worker(process)
        r.close()
        flush(redis_url)  # the message may be back in the queue: keep it from the next worker
    assert CALL_TOKEN not in log_path.read_text(errors="replace"), "a call header's value is in the worker's log"
    assert envelope is not None, "no envelope: the call was lost"
    assert envelope["exitCode"] == 65, envelope
    assert CALL_TOKEN not in json.dumps(envelope)
    assert after.exit_code == 0, ("the worker stopped answering", after.to_dict())


def _send_deeply_nested(r: redis.Redis, depth: int, token: str) -> dict[str, Any] | None:
    """Enqueue a call with arguments `depth` levels deep (as raw text: json.dumps cannot write it); its envelope."""
    call_id, stream = str(uuid.uuid4()), f"security:replies:{uuid.uuid4().hex}"
    arguments = '{"data": ' + "[" * depth + "]" * depth + "}"
    # Any producer may order the keys as it likes; headers first puts them where a log excerpt would show them.
    call_json = (
        f'{{"callId": "{call_id}", "headers": {{"X-User-Token": "{token}"}}, "tool": "nested",'
        f' "replyTo": "{stream}", "arguments": {arguments}}}'
    )
    r.lpush(DEFAULT_QUEUE, raw_call_message(call_id, call_json))
    entries = r.xread({stream: "0-0"}, block=5_000, count=1)
    return json.loads(entries[0][1][0][1][b"envelope"]) if entries else None


# --- property: whatever the arguments, the request keeps its shape -------------------------------

_ARGUMENT_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # clean_environ only strips variables
)
@given(item=_ARGUMENT_TEXT.filter(bool), q=_ARGUMENT_TEXT, trace=_HEADER_TEXT)
def test_any_arguments_keep_path_prefix_host_and_header_names(rig: Rig, item: str, q: str, trace: str) -> None:
    """Generated path, query and header values reach the upstream inside their own slots, end to end."""
    before = len(rig.servers.seen)
    result = rig.call("item", {"item": item, "q": q, "trace": trace})
    assert result.exit_code == 0, result.to_dict()
    [seen] = rig.servers.since(before)
    assert seen.server == f"upstream@127.0.0.1:{rig.up}"
    assert seen.method == "GET" and seen.path.startswith("/echo/items/")
    segment = seen.path.removeprefix("/echo/items/")
    assert "/" not in segment and unquote(segment) == item
    assert seen.query == [("q", q)]
    assert seen.header("Host") == [f"127.0.0.1:{rig.up}"]
    assert {name.lower() for name, _ in seen.headers} == ITEM_HEADER_NAMES


# --- after the suite ----------------------------------------------------------------------------


def test_worker_still_answers_and_leaked_no_secret(rig: Rig) -> None:
    """After every hostile case the worker answers a normal call, and no secret is in its log or any envelope."""
    result = rig.call("item", {"item": "still-alive"})
    assert result.exit_code == 0, result.to_dict()
    assert rig.process.poll() is None
    log_text = rig.log_text()
    assert result.call_id in log_text  # the log file is the worker's, and it logs calls
    envelopes = json.dumps(rig.envelopes)
    assert len(rig.envelopes) > 40
    leaks = [secret for secret in SECRETS if secret in log_text or secret in envelopes]
    assert leaks == []
    assert rig.servers.canary_hits() == []
