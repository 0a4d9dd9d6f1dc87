"""What the vault adds to a call: an `oauth2_user` upstream against the same upstream with a static bearer
token, in the worker's own send path (`run_call`, a real Redis, a real HTTP upstream in another process).

Three cases, one call at a time (light load), taking turns round after round; each figure is the median
of its rounds:

- static bearer: the token is a setting (no Redis read for it);
- vault: the user's token set read from Redis and opened (AES-GCM) on every call;
- vault + refresh: every call finds its token due and refreshes it (fleet lock, refresh grant at a token
  endpoint, the new set sealed and stored): the worst case. Before each call, untimed, the bench stores a
  token past 80% of its life and still usable (one that expires at once is never sent: the send margin).

Rows: p50 per call and CPU per call (the worker process's user+system time during each call), and what the
vault adds to the static case's figures.

    .venv/bin/python -m benchmarks.vault [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from worker import logs
from worker.call.delegated import UserTokens
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.call.vault import Keyring, TokenSet, Vault
from worker.connections import connect
from worker.definitions import file_store
from worker.dev.embedded import EmbeddedRedis, free_port
from worker.http.transport import HttpTransport
from worker.protocol import ToolCall

CASES = ("static bearer", "vault", "vault + refresh")
TOOLS = {"static bearer": "static_me", "vault": "vault_me", "vault + refresh": "refreshed_me"}
USER = "bench-user"
KEYS = "bench:" + base64.b64encode(b"b" * 32).decode()
DEFINITIONS = """
upstreams:
  static: {{base_url: "{url}", auth: {{type: bearer, token: static-token}}}}
  vault:
    base_url: "{url}"
    auth: {{type: oauth2_user, authorization_url: "{url}/authorize", token_url: "{url}/token", client_id: c}}
  refreshed:
    base_url: "{url}"
    auth: {{type: oauth2_user, authorization_url: "{url}/authorize", token_url: "{url}/token", client_id: c}}
tools:
  - {{name: static_me, upstream: static, description: d, request: {{method: GET, path: /me}}}}
  - {{name: vault_me, upstream: vault, description: d, request: {{method: GET, path: /me}}}}
  - {{name: refreshed_me, upstream: refreshed, description: d, request: {{method: GET, path: /me}}}}
"""


def _serve(port: int) -> None:
    """The upstream and its token endpoints, in a process of their own (their CPU is not the worker's)."""
    count = 0

    async def me(request: web.Request) -> web.Response:
        return web.json_response({"sub": USER})

    async def token(request: web.Request, lifetime_s: float) -> web.Response:
        nonlocal count
        count += 1
        body = {"access_token": f"at-{count}", "refresh_token": f"rt-{count}", "expires_in": lifetime_s}
        return web.json_response(body)

    async def long_token(request: web.Request) -> web.Response:
        return await token(request, 3600)

    app = web.Application()
    app.router.add_get("/me", me)
    app.router.add_post("/token", long_token)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _measure(
    runtime: Runtime, tool: str, calls: int, before: Callable[[], Awaitable[None]] | None = None
) -> tuple[float, float]:
    """p50 milliseconds and CPU milliseconds per call, `calls` calls one at a time (`before` each, untimed)."""
    durations, cpu_s = [], 0.0
    for n in range(calls):
        if before is not None:
            await before()
        cpu_started, started = time.process_time(), time.perf_counter()
        envelope = await run_call(ToolCall(callId=f"{tool}-{n}", tool=tool, user=USER), runtime)
        durations.append(time.perf_counter() - started)
        cpu_s += time.process_time() - cpu_started
        assert envelope.exit_code == 0, envelope.to_dict()
    return statistics.median(durations) * 1000, cpu_s * 1000 / calls


def _due(vault: Vault, upstream: str) -> Callable[[], Awaitable[None]]:
    """Before a call: the user's token for `upstream` due for its refresh (past 80% of its life) and still
    usable, so that the call refreshes it. A token that expires at once is never sent (its send margin)."""

    async def put() -> None:
        now = time.time()
        await vault.put(USER, upstream, TokenSet("at-0", "rt-0", now + 100, (), now - 1000))

    return put


async def _bench(redis_url: str, url: str, directory: Path, rounds: int, calls: int) -> dict[str, Any]:
    (directory / "bench.yaml").write_text(DEFINITIONS.format(url=url))
    toolset = file_store.load([directory])
    redis = connect(redis_url)
    keyring = Keyring.parse(KEYS)
    vault = Vault(redis, keyring)
    now = time.time()
    await vault.put(USER, "vault", TokenSet("at-0", "rt-0", now + 3600, (), now))
    runtime = Runtime(toolset, {}, HttpTransport(), redis=redis, users=UserTokens(redis, keyring, None, 1000))
    figures: dict[str, list[tuple[float, float]]] = {case: [] for case in CASES}
    before = {"vault + refresh": _due(vault, "refreshed")}
    for case in CASES:  # warm: pools, imports
        await _measure(runtime, TOOLS[case], 20, before.get(case))
    for _ in range(rounds):
        for case in CASES:
            figures[case].append(await _measure(runtime, TOOLS[case], calls, before.get(case)))
    await runtime.close()
    await redis.aclose()
    medians = {
        case: (statistics.median(p for p, _ in rows), statistics.median(c for _, c in rows))
        for case, rows in figures.items()
    }
    static_p50, static_cpu = medians["static bearer"]
    return {
        case: {
            "p50_ms": round(p50, 3),
            "cpu_ms_per_call": round(cpu, 3),
            "added_p50_ms": round(p50 - static_p50, 3),
            "added_cpu_ms_per_call": round(cpu - static_cpu, 3),
        }
        for case, (p50, cpu) in medians.items()
    }


def run(redis_url: str | None = None, quick: bool = False, rounds: int = 5) -> dict[str, Any]:
    """The three cases on `redis_url` (a server of its own when None)."""
    logs.configure("console", "WARNING")  # a log line per call would weigh on every case alike
    calls = 100 if quick else 400
    rounds = 2 if quick else rounds
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            own = EmbeddedRedis(Path(tmp) / "redis").start() if redis_url is None else None
            try:
                _wait_port(port)
                url = redis_url or (own.url if own else "")
                return asyncio.run(_bench(url, f"http://127.0.0.1:{port}", Path(tmp), rounds, calls))
            finally:
                if own is not None:
                    own.stop()
    finally:
        server.terminate()
        server.join(10)


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("the benchmark's upstream did not start")


def print_section(results: dict[str, Any]) -> None:
    print("\n" + report(results))


def report(results: dict[str, Any]) -> str:
    lines = [f"{'vault: one call at a time':<28}{'p50 ms':>9}{'CPU ms/call':>13}{'+p50 ms':>10}{'+CPU ms':>10}"]
    for case, row in results.items():
        lines.append(
            f"{case:<28}{row['p50_ms']:>9.3f}{row['cpu_ms_per_call']:>13.3f}"
            f"{row['added_p50_ms']:>10.3f}{row['added_cpu_ms_per_call']:>10.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    results = run(None, args.quick, args.rounds)
    print(report(results))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
