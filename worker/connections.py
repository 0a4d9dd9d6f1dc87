"""Every Redis connection of toolworker, built from the one URL (`TOOLWORKER_REDIS_URL`).

    redis://, rediss://, unix://     redis-py's own forms: one server (a managed endpoint that moves on
                                     failover needs nothing more: the clients reconnect)
    sentinel://[:password@]host:port[;sentinel://host:port...]/db
                                     kombu's form for Redis Sentinel: the Sentinels to ask, and the
                                     primary's password and db; the master's name, the Sentinels' own
                                     password and TLS come from TOOLWORKER_REDIS_SENTINEL_*

A client on a Sentinel URL is redis-py's `Sentinel(...).master_for(name)`: each of its connections asks
the Sentinels where the primary is when it (re)connects, and one that finds its server demoted to a
replica drops itself, so a failover is followed like a restart. Every such client has a pool: a client
with a single fixed connection would reconnect to the old primary's address.

Celery and kombu take the same URL with `transport_options(...)`; the broker transport is in
worker/queue/broker.py. `execute_replicated` is the one place writes wait for replicas (WAIT).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel as sentinel
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.redaction import mask_url
from worker.settings import Settings, get_settings

SENTINEL_SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379


class RedisUnavailable(Exception):
    """Redis cannot be used with these settings; the message says why, with the password masked."""


class NotReplicated(RedisError):
    """The primary took a write, but fewer replicas than TOOLWORKER_REDIS_MIN_REPLICAS confirmed it in time."""


@dataclass(frozen=True)
class SentinelUrl:
    nodes: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None


def is_sentinel(url: str) -> bool:
    return url.partition("://")[0].lower() == SENTINEL_SCHEME


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The Sentinels of a kombu Sentinel URL; the primary's db and credentials are the first ones given."""
    nodes: list[tuple[str, int]] = []
    db, username, password = None, None, None
    for part in url.split(";"):
        parsed = urlsplit(part.strip())
        if parsed.scheme.lower() != SENTINEL_SCHEME or not parsed.hostname:
            raise ValueError(f"not a Sentinel address: {mask_url(part)!r} (expected sentinel://host:port)")
        nodes.append((parsed.hostname, parsed.port or DEFAULT_SENTINEL_PORT))
        username = username or (unquote(parsed.username) if parsed.username else None)
        password = password or (unquote(parsed.password) if parsed.password else None)
        path = parsed.path.strip("/")
        if db is None and path:
            if not path.isdigit():
                raise ValueError(f"the database of {mask_url(part)!r} is not a number")
            db = int(path)
    return SentinelUrl(tuple(nodes), db or 0, username, password)


# redis-py reconnects a dropped connection where it is next used (send_packed_command) to the address it
# had, not through the Sentinels as a new connection does: after a failover, to the dead or deposed primary,
# retrying until the retries run out (over a minute with connect()'s), while the calls it publishes wait.
# These connections reconnect through the Sentinels there too.
#
# A primary cut off from its replicas (a partition: Sentinel promoted one of them meanwhile) refuses writes
# with NOREPLICAS when the servers run with `min-replicas-to-write` (docs/guides/high-availability.md). redis-py
# follows a demoted primary's READONLY to the new one; these connections follow NOREPLICAS the same way:
# the connection is dropped and the command fails as a connection error, which the caller's retries send
# through the Sentinels again.
class _SentinelConnection(sentinel.SentinelManagedConnection):
    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()  # type: ignore[no-untyped-call]  # redis-py's connections are unannotated
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]  # (as above)

    def cut(self) -> None:
        """Fail whatever waits on this connection now (from any thread): its socket is shut down."""
        sock: Any = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):  # (closed meanwhile)
                sock.shutdown(socket.SHUT_RDWR)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not _cut_off(self, exc):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]  # redis-py's connections are unannotated
            raise RedisConnectionError(f"the primary refuses writes: {_one_line(exc)}") from exc


class _SentinelSSLConnection(_SentinelConnection, redis.SSLConnection):
    pass


class _AsyncSentinelConnection(aiosentinel.SentinelManagedConnection):
    _loop: asyncio.AbstractEventLoop | None = None  # the one it is used on

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]  # redis-py's connections are unannotated
        await super().send_packed_command(command, check_health)

    def cut(self) -> None:
        """Fail whatever waits on this connection now (from any thread): its transport is aborted on its loop."""
        writer, loop = self._writer, self._loop
        if writer is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # (the loop is closed)
                loop.call_soon_threadsafe(writer.transport.abort)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not _cut_off(self, exc):
                raise
            await self.disconnect()
            raise RedisConnectionError(f"the primary refuses writes: {_one_line(exc)}") from exc


def _cut_off(connection: Any, exc: ResponseError) -> bool:
    """NOREPLICAS from a server the Sentinels named as the primary."""
    return str(exc).startswith("NOREPLICAS") and bool(connection.connection_pool.is_master)


class _AsyncSentinelSSLConnection(_AsyncSentinelConnection, aioredis.SSLConnection):
    pass


class _PrimaryWatch:
    """Where the Sentinels say the primary is, asked every second by a thread of its own (one per process
    and set of Sentinels), for the connections of this process to it.

    A primary that crashed resets its connections; one that froze, or that a partition cut off, never does:
    a command waiting on it (a take, a publish, an enqueue) would wait for ever, for no socket timeout
    can be shorter than the longest blocking read. When the Sentinels name another primary, every
    connection still on the old one is cut (its socket shut down, from here, whichever thread or loop
    reads it): its command fails as a connection error, and its retry goes through the Sentinels to the
    new primary. The thread ends once no connection is left to watch."""

    connections: weakref.WeakSet[_SentinelConnection | _AsyncSentinelConnection]

    def __init__(self, service_name: str, nodes: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        self.connections = weakref.WeakSet()
        self._service_name = service_name
        timeouts = {"socket_timeout": _WATCH_INTERVAL_S, "socket_connect_timeout": _WATCH_INTERVAL_S}
        kwargs = {**sentinel_kwargs, **timeouts, "retry": None}
        self._sentinels = sentinel.Sentinel(nodes, sentinel_kwargs=kwargs)
        self._primary: tuple[str, int] | None = None

    def _run(self, key: tuple[Any, ...]) -> None:
        while True:
            time.sleep(_WATCH_INTERVAL_S)
            with _watch_lock:
                if not self.connections:
                    _watches.pop(key, None)
                    self._sentinels.close()
                    return
            try:
                primary = self._sentinels.discover_master(self._service_name)
            except (RedisError, OSError, ValueError):
                continue  # none named now (a failover under way): ask again
            if self._primary is not None and primary != self._primary:
                self._cut(self._primary)
            self._primary = primary

    def _cut(self, address: tuple[str, int]) -> None:
        for connection in list(self.connections):
            if (connection.host, connection.port) == address:
                connection.cut()


_WATCH_INTERVAL_S = 1.0
_watches: dict[tuple[Any, ...], _PrimaryWatch] = {}
_watch_lock = threading.Lock()


def _watch(service_name: str, manager: Any) -> _PrimaryWatch:
    """The watch of this process for the primary `manager`'s Sentinels name `service_name`."""
    addresses = [client.connection_pool.connection_kwargs for client in manager.sentinels]
    nodes = [(address["host"], address["port"]) for address in addresses]
    key = (os.getpid(), service_name, tuple(nodes))
    with _watch_lock:
        watch = _watches.get(key)
        if watch is None:
            watch = _watches[key] = _PrimaryWatch(service_name, nodes, dict(manager.sentinel_kwargs or {}))
            threading.Thread(target=watch._run, args=(key,), name="toolworker-primary-watch", daemon=True).start()
        return watch


class _Watched:
    """A pool whose connections the process's _PrimaryWatch cuts when the primary moves."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        self._watch = _watch(service_name, sentinel_manager)
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[call-arg]  # a mixin: the pool's own

    def make_connection(self) -> Any:
        connection = super().make_connection()  # type: ignore[misc]  # (the pool's, as above)
        self._watch.connections.add(connection)
        return connection


class SentinelPool(_Watched, sentinel.SentinelConnectionPool):
    """Connections that follow a failover mid-command (above), watched (_PrimaryWatch); closing the client
    closes its connections to the Sentinels too."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        # TLS as redis-py says it (ssl=True) or as kombu does (an SSL connection class)
        tls = kwargs.pop("ssl", False) or issubclass(kwargs.pop("connection_class", object), redis.SSLConnection)
        kwargs["connection_class"] = _SentinelSSLConnection if tls else _SentinelConnection
        super().__init__(service_name, sentinel_manager, **kwargs)

    def disconnect(self, inuse_connections: bool = True) -> None:
        super().disconnect(inuse_connections)
        self.sentinel_manager.close()


class _AsyncSentinelPool(_Watched, aiosentinel.SentinelConnectionPool):
    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        tls = kwargs.pop("ssl", False)
        kwargs.setdefault("connection_class", _AsyncSentinelSSLConnection if tls else _AsyncSentinelConnection)
        super().__init__(service_name, sentinel_manager, **kwargs)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        await self.sentinel_manager.aclose()


class _BlockingAsyncSentinelPool(_AsyncSentinelPool, aioredis.BlockingConnectionPool):
    """Waits for a free connection under load, as `connect()`'s pool does on a plain URL."""


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A client on `url` (any form above); `options` are redis-py's (timeouts, retry) and apply to the
    primary's connections, and their socket timeouts to the Sentinels' too."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    master: redis.Redis = _master(url, sentinel.Sentinel, SentinelPool, options)
    return master


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """`sync_client` for redis.asyncio."""
    if not is_sentinel(url):
        return aioredis.Redis.from_url(url, **options)
    client: aioredis.Redis = _master(url, aiosentinel.Sentinel, _AsyncSentinelPool, options)
    return client


def connect(url: str, max_connections: int = 32) -> aioredis.Redis:
    """A client that rides out a Redis restart or a failover (reconnects with backoff for about a minute)
    and queues for a connection under load instead of failing."""
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "timeout": 30,
        # Tries at most a second apart (a failover is over in seconds; a try further apart would only add
        # to the outage), for about a minute.
        "retry": Retry(EqualJitterBackoff(cap=1.0, base=0.1), retries=80),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError, ConnectionResetError],
        "health_check_interval": 30,
        "socket_keepalive": True,
    }
    if is_sentinel(url):
        master: aioredis.Redis = _master(url, aiosentinel.Sentinel, _BlockingAsyncSentinelPool, options)
        return master
    pool = aioredis.BlockingConnectionPool.from_url(url, **options)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes its connections


def _master(url: str, sentinel_class: Any, pool_class: Any, options: dict[str, Any]) -> Any:
    """redis-py's (or redis.asyncio's) client on the primary the Sentinels of `url` name."""
    settings = get_settings()
    target = parse_sentinel_url(url)
    manager = sentinel_class(list(target.nodes), sentinel_kwargs=sentinel_kwargs(settings, options))
    kwargs = _primary_kwargs(target, settings, options)
    return manager.master_for(settings.redis_sentinel_master, connection_pool_class=pool_class, **kwargs)


def sentinel_kwargs(settings: Settings, options: dict[str, Any]) -> dict[str, Any]:
    """How to talk to the Sentinels: their password and TLS, and the caller's socket timeouts."""
    kwargs = {key: value for key, value in options.items() if key.startswith("socket_")}
    password = settings.redis_sentinel_password.get_secret_value()
    if password:
        kwargs["password"] = password
    if settings.redis_sentinel_tls:
        kwargs["ssl"] = True
    return kwargs


def _primary_kwargs(target: SentinelUrl, settings: Settings, options: dict[str, Any]) -> dict[str, Any]:
    kwargs = {"db": target.db, "username": target.username, "password": target.password, **options}
    if settings.redis_sentinel_tls:
        kwargs["ssl"] = True
    return kwargs


def transport_options(url: str) -> dict[str, Any]:
    """What kombu's Sentinel transport and Celery's Sentinel result backend need besides the URL."""
    if not is_sentinel(url):
        return {}
    settings = get_settings()
    return {"master_name": settings.redis_sentinel_master, "sentinel_kwargs": sentinel_kwargs(settings, {})}


def celery_tls(url: str) -> dict[str, Any] | None:
    """Celery's `broker_use_ssl` / `redis_backend_use_ssl` for a Sentinel URL with TLS (rediss:// says it
    by itself)."""
    if is_sentinel(url) and get_settings().redis_sentinel_tls:
        return {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    return None


async def execute_replicated(pipe: Pipeline, min_replicas: int | None = None, raise_on_error: bool = True) -> list[Any]:
    """Run a pipeline; with TOOLWORKER_REDIS_MIN_REPLICAS, return only once that many replicas have its
    writes, else raise NotReplicated.

    WAIT goes in the same pipeline: it counts the writes of the connection it is sent on. It asks for every
    replica the primary had at the last look (ROLE, in the same round trip; before the first write on a
    pool, on its own), at least N: Sentinel may promote any of them, not only the N fastest; a slow one
    costs the timeout, and N still suffice."""
    settings = get_settings()
    needed = settings.redis_min_replicas if min_replicas is None else min_replicas
    if needed <= 0:
        return list(await pipe.execute(raise_on_error=raise_on_error))
    timeout_s = settings.redis_min_replicas_timeout_seconds
    pool = pipe.connection_pool
    if pool not in _replicas_seen:  # the first write on this pool: how many replicas there are, asked first
        _replicas_seen[pool] = replica_count(await aioredis.Redis(connection_pool=pool).role())
    pipe.wait(max(needed, _replicas_seen[pool]), int(timeout_s * 1000))
    pipe.execute_command("ROLE")
    *replies, acked, role = await pipe.execute(raise_on_error=raise_on_error)
    _replicas_seen[pool] = replica_count(role)
    if acked < needed:
        await _recheck_primary(pool)
        raise NotReplicated(
            f"the primary has the write but only {acked} of {needed} replicas confirmed it within {timeout_s:g} s"
            " (TOOLWORKER_REDIS_MIN_REPLICAS)"
        )
    return replies


def replica_count(role: Any) -> int:
    """How many replicas a primary's ROLE reply names (0 from a replica, or no reply)."""
    if not role or (role[0].decode() if isinstance(role[0], bytes) else role[0]) != "master":
        return 0
    return len(role[2])


async def _recheck_primary(pool: Any) -> None:
    """A primary that lost its replicas may have been deposed (Sentinel leaves it a primary for seconds
    after the switch): ask the Sentinels again; their pool drops its idle connections if it moved."""
    if isinstance(pool, aiosentinel.SentinelConnectionPool):
        with contextlib.suppress(RedisError):  # none named now: the next command reconnects with its retries
            await pool.get_master_address()


# Connection pool -> how many replicas its primary had at the last enqueue (ROLE).
_replicas_seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def check_reachable(url: str, timeout_s: float) -> None:
    """One PING, not retried: a command that starts (a worker, a call) fails at once with the true reason,
    where a client that rides out restarts would retry a wrong password or address for a minute or more.
    On a Sentinel URL, the Sentinels are asked first, all at once."""
    if is_sentinel(url):
        _check_sentinels(url, timeout_s)
    client = sync_client(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=None)
    where = mask_url(url)
    try:
        client.ping()
    except AuthenticationError as exc:
        raise RedisUnavailable(f"authentication failed at {where}: {_one_line(exc)}") from None
    except ResponseError as exc:  # a password given to a server that has none, a user without PING...
        raise RedisUnavailable(f"Redis at {where} refused the connection: {_one_line(exc)}") from None
    except (RedisConnectionError, RedisTimeoutError, OSError, ValueError) as exc:
        raise RedisUnavailable(f"cannot reach Redis at {where} within {timeout_s:g} s: {_one_line(exc)}") from None
    finally:
        client.close()


def _check_sentinels(url: str, timeout_s: float) -> None:
    """Raise RedisUnavailable unless a Sentinel names a primary that is up for the configured master."""
    try:
        target = parse_sentinel_url(url)
    except ValueError as exc:
        raise RedisUnavailable(str(exc)) from None
    name = get_settings().redis_sentinel_master
    options = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s, "retry": None}
    kwargs = sentinel_kwargs(get_settings(), options) | {"retry": None}
    with ThreadPoolExecutor(len(target.nodes)) as pool:
        states = list(pool.map(lambda node: _master_state(node, name, kwargs), target.nodes))
    if any(isinstance(state, dict) and _is_up(state) for state in states):
        return
    where = ", ".join(f"{host}:{port}" for host, port in target.nodes)
    raise RedisUnavailable(_sentinel_problem(states, where, name, timeout_s))


def _master_state(node: tuple[str, int], name: str, kwargs: dict[str, Any]) -> dict[str, Any] | RedisError | None:
    """What one Sentinel says of the master `name`: its state, None if it knows no such master, or the error."""
    client = redis.Redis(host=node[0], port=node[1], **kwargs)
    try:
        masters: Any = client.sentinel_masters()
    except RedisError as exc:
        return exc
    finally:
        client.close()
    state: dict[str, Any] | None = masters.get(name)
    return state


def _is_up(state: dict[str, Any]) -> bool:
    return bool(state.get("is_master")) and not state.get("is_sdown") and not state.get("is_odown")


def _sentinel_problem(states: list[Any], where: str, name: str, timeout_s: float) -> str:
    errors = [state for state in states if isinstance(state, RedisError)]
    denied = [error for error in errors if isinstance(error, AuthenticationError | ResponseError)]
    if denied:
        return f"authentication failed at the Sentinels {where}: {_one_line(denied[0])}"
    if len(errors) == len(states):
        return f"cannot reach any Sentinel at {where} within {timeout_s:g} s: {_one_line(errors[0])}"
    if any(isinstance(state, dict) for state in states):
        return f"the Sentinels at {where} report master {name!r} down"
    return f"no Sentinel at {where} knows a master named {name!r} (TOOLWORKER_REDIS_SENTINEL_MASTER)"


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:300]
