"""The HTTP connections of an MCP session: the SDK's httpx client, its requests sent with aiohttp.

The SDK speaks HTTP through an httpx client it can be given; what that client sends its requests with is a
transport of its own. httpx's (httpcore, h11, anyio's socket streams) cost a worker about a third of the SDK's
CPU per call (yappi, a direct SDK session on `benchmarks/mcp_upstream.py`'s server); aiohttp, which the
HTTP tools send with already, parses with its C parser and writes each request at once. httpx keeps what is
above the transport: the session's headers, the auth flow that watches for challenges (challenges.py), the
content decoding, the SDK's own redirect rule. aiohttp's failures are handed up as the httpx errors httpcore
would raise for them, so the SDK and failures.py read them as before.

Each request of a Streamable HTTP session is a POST of its own, so a session keeps as many connections as calls
run on it at once (LIMIT). Like the HTTP tools' sessions (worker/http/transport.py), these ignore the
environment's proxies and netrc.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import lru_cache

import aiohttp
import httpx2

from worker.http.transport import KeepAliveConnector

# The connections a session keeps open to its server: as many as calls run at once.
LIMIT = 100
# Headers httpx sets that aiohttp writes itself (from the URL and the body).
_OWN_HEADERS = frozenset({b"host", b"content-length", b"transfer-encoding"})


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """httpx's transport interface over one aiohttp session."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._session is None:  # made on the loop that sends, as aiohttp asks
            # The HTTP tools' guard: a connection that receives bytes while idle in the pool is dropped.
            connector = KeepAliveConnector(limit=LIMIT, limit_per_host=LIMIT)
            # httpx sets every header, keeps the cookies and decodes the body: aiohttp adds nothing of its own.
            skip = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=skip,
            )
        headers = [
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw if k.lower() not in _OWN_HEADERS
        ]
        body = await request.aread()
        try:
            response = await self._session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                timeout=_timeout(**request.extensions.get("timeout", {})),
            )
        except Exception as exc:
            raise _as_httpx(exc, request) from exc
        return httpx2.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode("latin-1")},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Body(httpx2.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx2.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except Exception as exc:
            raise _as_httpx(exc, self._request) from exc

    async def aclose(self) -> None:
        self._response.release()  # back to the pool when read to its end, else closed


@lru_cache(maxsize=32)
def _timeout(
    connect: float | None = None, read: float | None = None, write: float | None = None, pool: float | None = None
) -> aiohttp.ClientTimeout:
    """httpx's timeouts as aiohttp's: a connection made (connect), one waited for from the pool, connecting
    included (pool), each read (read). aiohttp writes a request's body without a time of its own."""
    return aiohttp.ClientTimeout(total=None, connect=pool, sock_connect=connect, sock_read=read)


def _as_httpx(exc: Exception, request: httpx2.Request) -> Exception:
    """The httpx error httpcore raises for what aiohttp raised (anything else as it is)."""
    error: type[httpx2.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        error = httpx2.ConnectTimeout
    elif isinstance(exc, TimeoutError):
        error = httpx2.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        error = httpx2.ConnectError
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        error = httpx2.RemoteProtocolError
    elif isinstance(exc, aiohttp.ClientError | OSError):
        error = httpx2.ReadError
    else:
        return exc
    return error(str(exc) or type(exc).__name__, request=request)


def http_client(headers: dict[str, str], timeout: httpx2.Timeout, auth: httpx2.Auth) -> httpx2.AsyncClient:
    """The httpx client of one MCP session (what the SDK's `create_mcp_http_client` makes, sent with aiohttp)."""
    transport = AiohttpTransport()
    return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, transport=transport, trust_env=False)
