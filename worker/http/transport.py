"""The only module that speaks HTTP: pooled aiohttp sessions, redirects, capped reads, error mapping.

Its input is a `PreparedRequest` (rendered without I/O by worker/call/) and the `PoolSpec` of the pool to
send it on, its output a `Response`; aiohttp's exceptions leave it translated into the tree of
worker/errors.py (`translate`). It knows nothing of tool definitions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, cast

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.connector import Connection
from aiohttp.resolver import AsyncResolver
from aiohttp.tracing import Trace
from yarl import URL

from worker import errors
from worker.constants import DEFAULT_MAX_CONCURRENCY, MAX_REDIRECTS, REDACTED
from worker.envelope import valid_text
from worker.http.egress import EgressPolicy, egress_error, make_connector
from worker.redaction import is_secret_header, redact

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK_BYTES = 64 * 1024
# What is left of a body after the read cap is read and dropped if it is at most this and comes this fast.
_DRAIN_MAX_BYTES = 1024 * 1024
_DRAIN_MAX_S = 0.1
# aiohttp's parser messages for a response head over its limits (max_line_size, max_headers).
_MALFORMED = (
    ("Too many headers", "too many header lines"),
    ("Got more than", "a status or header line over the size limit"),
)
# Called with each redirect target; raises EgressBlocked when the hop is not allowed.
RedirectCheck = Callable[[URL], None]


# The egress-checked pool (the generic tool, off-site redirects) serves many hosts: its own size.
EGRESS_POOL_CONNECTIONS = DEFAULT_MAX_CONCURRENCY
# A pool left behind by a new definitions set is closed once the calls it may still serve are over.
_RETIRE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ready to send, with what must be hidden wherever it is echoed."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes | None
    # Values to redact wherever they would be echoed; header names whose values are secret.
    secrets: frozenset[str]
    secret_headers: frozenset[str]
    dropped_headers: tuple[str, ...] = ()
    # The last moment the access token on it may be sent (epoch seconds; 0: none, or no expiry): its expiry
    # less its send margin (worker/call/renewal.py).
    credential_send_by: float = 0.0

    def redacted_headers(self) -> dict[str, str]:
        return {
            name: REDACTED if name.lower() in self.secret_headers else redact(value, self.secrets)
            for name, value in self.headers
        }


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    content_type: str | None
    charset: str | None
    body: bytes
    # False when the read stopped at max_response_bytes.
    complete: bool
    url: str
    retry_after: str | None = None
    # What paginated and cached calls read of the head (RFC 8288 links, RFC 9111 directives).
    link: str | None = None
    cache_control: str | None = None


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What a pool of connections to one upstream is built with."""

    name: str
    verify_tls: bool
    max_connections: int
    # The longest one request on it may run (a retired pool stays open this long for its last calls).
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Limits:
    max_bytes: int
    connect_timeout_s: float


class _GuardedHandler(ResponseHandler):
    """aiohttp's protocol, told when it sits idle in the pool: bytes that arrive then (a response nobody
    asked for) would be read as the answer to the next request sent on it, so the connection is closed
    at once, and the pool, which reuses only connected ones, drops it."""

    idle = False

    def data_received(self, data: bytes) -> None:
        if self.idle and data:
            self.close()
            return
        super().data_received(data)


class KeepAliveConnector(aiohttp.TCPConnector):
    """A TCPConnector that never hands out a pooled connection holding unread bytes (as urllib3 does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._factory = cast("partial[ResponseHandler]", partial(_GuardedHandler, loop=self._loop))

    def _release(self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False) -> None:
        super()._release(key, protocol, should_close=should_close)
        if isinstance(protocol, _GuardedHandler) and protocol.is_connected():  # kept in the pool
            protocol.idle = True

    async def _get(self, key: ConnectionKey, traces: list[Trace]) -> Connection | None:
        connection = await super()._get(key, traces)
        if connection is not None and isinstance(connection.protocol, _GuardedHandler):
            connection.protocol.idle = False
        return connection


@dataclass(slots=True)
class _Pool:
    session: aiohttp.ClientSession
    # The longest a request on it may still run once it is retired.
    linger_s: float


class HttpTransport:
    """Connection pools reused by every call on this loop: one per upstream (its own, trusted host),
    and one egress-checked pool for everything else (the generic tool, off-site redirects).

    A pool is keyed by the settings it was built with, so a new definitions set that changes an
    upstream's `verify_tls` or `max_concurrency` gets a pool of its own; `retire` closes the old one."""

    def __init__(self, policy: EgressPolicy | None = None, dns_servers: list[str] | None = None) -> None:
        self._pools: dict[tuple[object, ...], _Pool] = {}
        self._policy = policy or EgressPolicy.parse("")
        self._dns_servers = dns_servers or []
        self._background: set[asyncio.Task[None]] = set()

    def session(self, spec: PoolSpec, checked: bool) -> aiohttp.ClientSession:
        key = _pool_key(spec, checked)
        pool = self._pools.get(key)
        if pool is None or pool.session.closed:
            limit = EGRESS_POOL_CONNECTIONS if checked else spec.max_connections
            pool = self._pools[key] = _Pool(self._new_session(spec, checked, limit), spec.timeout_s)
        else:
            pool.linger_s = max(pool.linger_s, spec.timeout_s)
        return pool.session

    def retire(self, specs: Iterable[PoolSpec]) -> None:
        """Close, once their calls are over, the pools that none of these specs uses any more."""
        keep = {key for spec in specs for key in (_pool_key(spec, False), _pool_key(spec, True))}
        for key in [key for key in self._pools if key not in keep]:
            pool = self._pools.pop(key)
            self._in_background(_close_later(pool.session, pool.linger_s + _DRAIN_MAX_S + _RETIRE_GRACE_S))

    def _new_session(self, spec: PoolSpec, checked: bool, limit: int) -> aiohttp.ClientSession:
        options: dict[str, Any] = {
            "limit": limit,
            "limit_per_host": 0,
            "ssl": spec.verify_tls,
            "ttl_dns_cache": 60,
            "resolver": AsyncResolver(nameservers=self._dns_servers) if self._dns_servers else None,
        }
        # The checked pool sees the resolved address of every connection attempt (DNS rebinding too).
        connector = (
            make_connector(self._policy, KeepAliveConnector, **options) if checked else KeepAliveConnector(**options)
        )
        session = aiohttp.ClientSession(
            connector=connector,
            # Calls from different users share this pool: never carry cookies between them.
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
            headers={"User-Agent": "toolworker"},
        )
        # aiohttp sends a GET, HEAD, OPTIONS, PUT or DELETE again, once and silently, when its connection
        # breaks before the response, even after the upstream read and acted on it: a call would reach the
        # upstream twice behind its `retry:` policy's back. Whether to send again is that policy's to say.
        # (No public setting: aiohttp's own test client turns it off the same way.)
        session._retry_connection = False
        return session

    async def send(
        self,
        request: PreparedRequest,
        spec: PoolSpec,
        limits: Limits,
        check_redirect: RedirectCheck,
        trusted_origin: URL | None,
    ) -> Response:
        """Send one attempt, following up to MAX_REDIRECTS redirects; the caller bounds the total time.

        Hops to `trusted_origin` (a defined tool's upstream) use its pool; any other goes through the
        egress-checked pool."""
        method, url, headers, body = request.method, URL(request.url, encoded=True), list(request.headers), request.body
        for _ in range(MAX_REDIRECTS + 1):
            session = self.session(spec, checked=url.origin() != trusted_origin)
            response, location, resp = await _send_once(session, method, url, headers, body, limits)
            if location is None:
                self._release(resp)
                return response
            await _drain_or_close(resp)  # the call goes on: the next hop may reuse this connection
            target = url.join(URL(location))
            check_redirect(target)
            if target.origin() != url.origin():  # like browsers and requests: credentials stay with their origin
                headers = [(k, v) for k, v in headers if not is_secret_header(k)]
            if response.status == 303 or (response.status in {301, 302} and method == "POST"):
                method, body = "GET", None
                headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            url = target
        raise errors.TooManyRedirects(f"The upstream redirected more than {MAX_REDIRECTS} times; giving up.")

    def _release(self, resp: aiohttp.ClientResponse) -> None:
        """Return a response's connection to its pool; an unread rest of its body (past the read cap) is
        drained by a task of its own, so that the call's answer does not wait for it."""
        if resp.content.is_eof():  # the whole body is here, read or not
            resp.release()
            return
        self._in_background(_drain_or_close(resp))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)  # referenced: a bare task may be collected
        task.add_done_callback(self._background.discard)

    async def drained(self) -> None:
        """Wait for the drains (each takes at most _DRAIN_MAX_S) and pool closings under way."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        for task in [task for task in self._background if not task.done()]:
            task.cancel()  # a retired pool waiting to close is closed below, at once
        await self.drained()
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.session.close()


async def _send_once(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: list[tuple[str, str]],
    body: bytes | None,
    limits: Limits,
) -> tuple[Response, str | None, aiohttp.ClientResponse]:
    """One request; returns the response still holding its connection (see `HttpTransport._release`)."""
    # sock_connect, not connect: waiting for a free pooled connection (max_concurrency) is not a connect
    # failure; the caller's per-attempt budget bounds that wait.
    timeout = _connect_timeout(limits.connect_timeout_s)
    host = url.host or ""
    try:
        resp = await session.request(
            method, url, headers=headers, data=body, allow_redirects=False, timeout=timeout, max_line_size=16384
        )
        try:
            location = _header(resp, "Location") if resp.status in _REDIRECTS else None
            data, complete = (b"", True) if location is not None else await _read_capped(resp, limits.max_bytes, host)
        except BaseException:
            resp.close()
            raise
    except aiohttp.InvalidURL as exc:
        raise errors.MalformedURL(f"The request URL is malformed: {exc}") from None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:  # TLS errors are OSErrors (and ValueErrors) too
        raise translate(exc, host) from exc
    except ValueError as exc:  # aiohttp refuses some header/URL combinations before sending
        raise errors.InvalidArguments(f"The request cannot be sent: {exc}") from None
    return _response(resp, data, complete), location, resp


@lru_cache(maxsize=64)
def _connect_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    """The attempt's aiohttp timeout (immutable): one per connect timeout, not one per request."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_s)


def _response(resp: aiohttp.ClientResponse, body: bytes, complete: bool) -> Response:
    """What the call keeps of a response; its texts made valid Unicode here, where bytes became text."""
    return Response(
        status=resp.status,
        reason=valid_text(resp.reason or ""),
        content_type=_header(resp, "Content-Type"),
        charset=None if resp.charset is None else valid_text(resp.charset),
        body=body,
        complete=complete,
        url=valid_text(str(resp.url)),
        retry_after=_header(resp, "Retry-After"),
        link=_header(resp, "Link"),
        cache_control=_header(resp, "Cache-Control"),
    )


def _header(resp: aiohttp.ClientResponse, name: str) -> str | None:
    """A response header's value as valid Unicode: aiohttp carries bytes that are not UTF-8 as lone
    surrogates (surrogateescape); `valid_text` reads them as Latin-1."""
    value = resp.headers.get(name)
    return None if value is None else valid_text(value)


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int, host: str) -> tuple[bytes, bool]:
    """Read at most max_bytes (after decompression); the rest, if any, stays unread."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.content.iter_chunked(_CHUNK_BYTES):
            room = max_bytes - size
            if len(chunk) > room:
                chunks.append(chunk[:room])
                return b"".join(chunks), False
            chunks.append(chunk)
            size += len(chunk)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, OSError) as exc:
        raise errors.ReceiveFailed(f"The connection to {host} broke while the response was being received.") from exc
    return b"".join(chunks), True


async def _drain_or_close(resp: aiohttp.ClientResponse) -> None:
    """Read and drop a small, quick rest of a body so that its connection serves the next call, else drop
    the connection. A new connection costs more than reading a few hundred KB (1 MB bodies cut at the
    default cap, 100 ms upstream: 30-40% more calls/s, 20% less CPU a call)."""
    drained = False
    try:
        rest = None if resp.content_length is None else resp.content_length - resp.content.total_bytes
        if rest is None or rest <= _DRAIN_MAX_BYTES:
            budget = _DRAIN_MAX_BYTES
            async with asyncio.timeout(_DRAIN_MAX_S):
                while budget >= 0 and (chunk := await resp.content.readany()):
                    budget -= len(chunk)
            drained = budget >= 0
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    finally:
        if drained:
            resp.release()  # the whole body is read: the connection goes back to the pool
        else:
            resp.close()


def _pool_key(spec: PoolSpec, checked: bool) -> tuple[object, ...]:
    # The checked pool is shared by every caller with the same TLS setting.
    if checked:
        return ("(egress-checked)", spec.verify_tls)
    return (spec.name, spec.verify_tls, spec.max_connections)


async def _close_later(session: aiohttp.ClientSession, delay_s: float) -> None:
    try:
        await asyncio.sleep(delay_s)
    finally:
        await session.close()


def _malformed(parser_message: str) -> str:
    """What was wrong with a response aiohttp could not parse, in our words: its own message quotes the
    upstream's bytes, which are no text for the model (nor for the log)."""
    for prefix, what in _MALFORMED:
        if parser_message.startswith(prefix):
            return what
    return "a malformed status line or header, or more bytes than its Content-Length announced"


def translate(exc: BaseException, host: str) -> errors.ToolError:
    """Map an aiohttp/asyncio failure before or during the response head onto the exit-code tree."""
    if isinstance(exc, errors.ToolError):
        return exc
    blocked = egress_error(exc)
    if blocked is not None:
        return blocked
    if isinstance(exc, asyncio.TimeoutError):  # also aiohttp's ServerTimeoutError / ConnectionTimeoutError
        return errors.TimedOut(f"The request to {host} timed out.")
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return errors.HostNotFound(f"The host {host} could not be resolved.")
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return errors.TLSFailed(f"The TLS connection to {host} failed (certificate or handshake).")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return errors.ConnectFailed(f"Could not connect to {host}.")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return errors.EmptyResponse(f"{host} closed the connection without sending a response.")
    if isinstance(exc, aiohttp.ClientResponseError):  # aiohttp's parser refused what came as the response
        return errors.ReceiveFailed(f"The response from {host} is not valid HTTP: {_malformed(exc.message)}.")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return errors.ReceiveFailed(f"Receiving the response from {host} failed.")
    return errors.InternalError("The request failed inside the worker.")
