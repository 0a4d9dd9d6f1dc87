"""OAuth2 client credentials through real workers: one token per lifetime for the whole fleet, refreshed
ahead of expiry, renewed once on a 401, and a clear envelope when the token endpoint is down.

A local token server issues short-lived tokens and counts its requests; the API accepts only a valid,
unexpired, unrevoked token. Figures worth reading are printed (`-s`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import start_worker, stop_worker, wait_ready, worker_env
from tests.support.servers import DnsServer, ServerThread
from worker.client import AsyncToolClient
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.envelope import ToolResult

pytestmark = pytest.mark.integration

LIFETIME_S = 3.0
CLIENT_ID, CLIENT_SECRET = "toolworker-test", "client-secret-5f2a9c"
DEFINITIONS = """
upstreams:
  api:
    base_url: ${env:TEST_OAUTH_URL}
    auth:
      type: oauth2_client_credentials
      token_url: ${env:TEST_OAUTH_URL}/token
      client_id: ${env:OAUTH_CLIENT_ID}
      client_secret: ${env:OAUTH_CLIENT_SECRET}
      scope: items.read
  down:
    base_url: ${env:TEST_OAUTH_URL}
    timeout_seconds: 2
    auth:
      type: oauth2_client_credentials
      token_url: ${env:TEST_CLOSED_URL}/token
      client_id: ${env:OAUTH_CLIENT_ID}
      client_secret: ${env:OAUTH_CLIENT_SECRET}
tools:
  - name: get_item
    upstream: api
    input_schema: {type: object, properties: {id: {type: string}}, required: [id]}
    request: {method: GET, path: "/items/${id}"}
  - name: get_item_down
    upstream: down
    input_schema: {type: object, properties: {id: {type: string}}, required: [id]}
    request: {method: GET, path: "/items/${id}"}
"""


@dataclass
class Authority:
    """The token server's and the API's state."""

    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)
    revoked: set[str] = field(default_factory=set)
    token_requests: list[float] = field(default_factory=list)
    unauthorized: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/token", self.token)
        app.router.add_get("/items/{id}", self.item)
        return app

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if (form.get("client_id"), form.get("client_secret")) != (CLIENT_ID, CLIENT_SECRET):
            return web.json_response({"error": "invalid_client"}, status=401)
        self.token_requests.append(time.monotonic())
        token = f"tok-{len(self.token_requests)}-{time.monotonic_ns()}"
        self.issued[token] = time.monotonic() + LIFETIME_S
        return web.json_response({"access_token": token, "token_type": "Bearer", "expires_in": LIFETIME_S})

    async def item(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token in self.revoked or self.issued.get(token, 0) < time.monotonic():
            self.unauthorized += 1
            return web.json_response({"error": "invalid_token"}, status=401)
        return web.json_response({"id": request.match_info["id"]})


@dataclass
class Fleet:
    authority: Authority
    redis_url: str
    logs: list[Path]

    def log_text(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in self.logs)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, dns_server: DnsServer) -> Iterator[Fleet]:
    """Two worker processes of their own, a Redis-compatible server, the token server and its API."""
    directory = tmp_path_factory.mktemp("oauth")
    (directory / "defs").mkdir()
    (directory / "defs" / "tools.yaml").write_text(DEFINITIONS)
    authority = Authority()
    server = ServerThread(authority.app()).start()
    redis = EmbeddedRedis(directory / "redis").start()
    env = worker_env(redis.url, server.url, dns_server.address, directory / "defs")
    env.update(TEST_OAUTH_URL=server.url, OAUTH_CLIENT_ID=CLIENT_ID, OAUTH_CLIENT_SECRET=CLIENT_SECRET)
    env.update(TEST_CLOSED_URL=f"http://127.0.0.1:{free_port()}", TOOLWORKER_LOG_LEVEL="DEBUG")
    logs = [directory / f"worker-{i}.log" for i in range(2)]
    workers = [start_worker(env, log) for log in logs]
    try:
        for process, log in zip(workers, logs, strict=True):
            wait_ready(process, log)  # the calls go to both, not to the first one up (a busy machine starts slowly)
        yield Fleet(authority, redis.url, logs)
    finally:
        for process in workers:
            stop_worker(process)
        redis.stop()
        server.stop()


async def waves(url: str, count: int, per_wave: int, gap_s: float) -> list[ToolResult]:
    """`count` calls in waves of `per_wave` (messages of 10, so both workers take some), `gap_s` apart."""
    client = AsyncToolClient(url, max_batch=10)
    try:
        results: list[ToolResult] = []
        for wave in range(count // per_wave):
            started = time.monotonic()
            specs = [("get_item", {"id": f"w{wave}-{i}"}) for i in range(per_wave)]
            results += await asyncio.gather(*(client.acall(tool, args, timeout=30) for tool, args in specs))
            await asyncio.sleep(max(0.0, gap_s - (time.monotonic() - started)))
        return results
    finally:
        await client.aclose()


def test_one_token_per_lifetime_for_the_fleet(fleet: Fleet) -> None:
    """1,000 calls over three token lifetimes through two workers: none fails, and the token server sees one
    request per lifetime (each after four fifths of the one before)."""
    warm_up = asyncio.run(waves(fleet.redis_url, 20, 20, 0.5))  # warm both workers up
    assert [r.exit_code for r in warm_up] == [0] * 20  # so a token is current: the gaps start from it
    authority = fleet.authority
    before, unauthorized_before = len(authority.token_requests), authority.unauthorized
    started = time.monotonic()
    results = asyncio.run(waves(fleet.redis_url, 1000, 100, 0.9))
    span_s = time.monotonic() - started
    requests = authority.token_requests[before:]
    gaps = [round(b - a, 2) for a, b in zip(authority.token_requests[before - 1 :], requests, strict=False)]
    durations = sorted(r.duration_ms for r in results)
    print(
        f"\n[oauth] calls=1000 span_s={span_s:.1f} lifetime_s={LIFETIME_S} token_requests={len(requests)} "
        f"gaps_s={gaps} call_ms_p50={durations[500]:.1f} p99={durations[990]:.1f} max={durations[-1]:.1f}"
    )
    assert [r.exit_code for r in results] == [0] * 1000, {r.exit_code for r in results}
    assert authority.unauthorized == unauthorized_before
    assert span_s > 2.5 * LIFETIME_S  # the calls crossed three expiries
    assert len(requests) <= span_s / (0.8 * LIFETIME_S) + 1
    assert min(gaps) >= 0.8 * LIFETIME_S - 0.3, gaps  # never two fetches for one lifetime


def test_a_revoked_token_is_renewed_once_and_the_call_succeeds(fleet: Fleet) -> None:
    """A token revoked at the server: one 401, one token request, and the call's envelope is a success."""
    asyncio.run(waves(fleet.redis_url, 10, 10, 0))
    authority = fleet.authority
    authority.revoked.update(authority.issued)
    requests, unauthorized = len(authority.token_requests), authority.unauthorized
    (result,) = asyncio.run(waves(fleet.redis_url, 1, 1, 0))
    assert result.exit_code == 0 and result.attempts == 2
    assert (len(authority.token_requests) - requests, authority.unauthorized - unauthorized) == (1, 1)


def test_a_token_endpoint_that_is_down_is_exit_69_within_the_deadline(fleet: Fleet) -> None:
    """Nothing listening at the token URL: the call ends with 69 well within its timeout, and is not sent."""

    async def call() -> ToolResult:
        client = AsyncToolClient(fleet.redis_url)
        try:
            return await client.acall("get_item_down", {"id": "x"}, timeout=10)
        finally:
            await client.aclose()

    started = time.monotonic()
    result = asyncio.run(call())
    assert result.exit_code == 69 and time.monotonic() - started < 10
    assert "token endpoint" in (result.error or {})["message"]


def test_no_secret_in_logs_or_envelopes(fleet: Fleet) -> None:
    """The client secret and every token issued appear in no worker log line (debug level) and no envelope."""
    results = asyncio.run(waves(fleet.redis_url, 20, 20, 0))
    texts = [fleet.log_text(), *(json.dumps(r.to_dict()) for r in results)]
    secrets = [CLIENT_SECRET, *fleet.authority.issued]
    assert not [s for s in secrets for text in texts if s in text]
