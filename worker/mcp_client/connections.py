"""The HTTP connections of an MCP session: the SDK's httpx client, with a cheaper look at idle connections.

Each request of a Streamable HTTP session is a POST of its own, so a session keeps as many connections as calls
run on it at once. Before each request, and after each answer, httpcore looks at every idle connection of the
pool for a server that closed it (its socket readable), asking anyio for the socket each time: anyio builds
every attribute of the stream, a `getpeername` among them, to hand one back. With 32 calls at once that was a
tenth of a worker's time on MCP calls (py-spy, `benchmarks/mcp_upstream.py --profile`). Here each connection
keeps the socket it was opened with, and the look is the one `poll` httpcore makes.

Like the HTTP tools' sessions (worker/http/transport.py), these ignore the environment's proxies and netrc.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream
from httpcore2._backends.auto import AutoBackend
from httpcore2._utils import is_socket_readable

# The connections a session keeps open to its server: as many as calls run at once (httpx keeps 20 idle by
# default, closing the 21st after each answer and opening another for the next call).
LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=100)


class _Probed(AsyncNetworkStream):
    """A connection whose readability is looked at on the socket it was opened with."""

    def __init__(self, stream: AsyncNetworkStream) -> None:
        self._stream = stream
        self._socket = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> AsyncNetworkStream:
        return _Probed(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return is_socket_readable(self._socket)
        return self._stream.get_extra_info(info)


class _Backend(AsyncNetworkBackend):
    """httpcore's own backend, its connections `_Probed`."""

    def __init__(self) -> None:
        self._backend = AutoBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        return _Probed(await self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> AsyncNetworkStream:
        return _Probed(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def http_client(headers: dict[str, str], timeout: httpx2.Timeout, auth: httpx2.Auth) -> httpx2.AsyncClient:
    """The httpx client of one MCP session (what the SDK's `create_mcp_http_client` makes, with the pool above)."""
    transport = httpx2.AsyncHTTPTransport(limits=LIMITS, trust_env=False)
    pool: httpcore2.AsyncConnectionPool = transport._pool  # the transport's own (it has no proxy)
    pool._network_backend = _Backend()
    return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, transport=transport, trust_env=False)
