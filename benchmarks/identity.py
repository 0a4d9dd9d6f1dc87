"""The gateway's cost of knowing who calls: OAuth 2.1 access tokens (JWT) against static bearer tokens.

One gateway process with an access file naming both a static token and an issuer; the same calls
(MCP `tools/call` and `POST /v1/calls`, as in gateway.py) sent with one or the other. An access token
costs the gateway a JWS check (RS256, 2048-bit key, the issuer's key kept in memory) on every request;
the issuer here is a small HTTP server in this process serving its OpenID metadata and JWKS, which the
gateway fetches once. Rows: calls/s at 64 in flight and p50 at light load, each case next to its static
twin in the same run; the cases take turns, round after round, and each figure is the median of its
rounds (on a shared machine one round says little).

    .venv/bin/python -m benchmarks.identity [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from benchmarks.harness import processes
from benchmarks.harness.constants import CONCURRENCY, RAW_CONCURRENCY, UPSTREAM_BODY_BYTES, UPSTREAM_LATENCY_MS
from benchmarks.harness.load import gateway_row, mcp, rest
from benchmarks.harness.meter import Sample
from worker.dev.embedded import EmbeddedRedis
from worker.gateway.identity.oauth import JwtVerifier
from worker.gateway.identity.principals import OAuthSpec, static_tokens
from worker.settings import Settings

STATIC_TOKEN = "bench-static-token-0123456789abcdef"
AUDIENCE = "http://127.0.0.1/mcp"
KID = "bench-key"
CASES = ("REST POST /v1/calls", "MCP tools/call (2026-07-28)")
Measure = Callable[[int, int], Awaitable[Sample]]


@contextmanager
def issuer() -> Iterator[tuple[str, rsa.RSAPrivateKey]]:
    """An issuer's metadata and JWKS over HTTP on loopback; yields its URL and signing key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())), "kid": KID, "alg": "RS256", "use": "sig"}
    documents: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = documents.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *_: Any) -> None:  # quiet
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    documents["/.well-known/openid-configuration"] = json.dumps({"issuer": url, "jwks_uri": url + "/jwks"}).encode()
    documents["/jwks"] = json.dumps({"keys": [jwk]}).encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield url, key
    finally:
        server.shutdown()


def access_token(issuer_url: str, key: rsa.RSAPrivateKey) -> str:
    now = int(time.time())
    claims = {
        "iss": issuer_url,
        "aud": AUDIENCE,
        "sub": "bench-agent",
        "iat": now,
        "exp": now + 3600,
        "scope": "tools.all",
    }
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": KID})


def access_file(directory: Path, issuer_url: str) -> Path:
    path = directory / "access.yaml"
    path.write_text(
        f"tokens:\n  bench: {{token: {STATIC_TOKEN}, tools: ['*']}}\n"
        f"oauth:\n  issuer: {issuer_url}\n  audience: {AUDIENCE}\n  scopes:\n    tools.all: {{tools: ['*']}}\n"
    )
    return path


def run(redis_url: str, calls: int, light_calls: int, rounds: int = 3) -> dict[str, Any]:
    """Each case with a static token and with an access token, against one worker and one gateway."""
    processes.flush(redis_url)
    with (
        tempfile.TemporaryDirectory() as tmp,
        issuer() as (issuer_url, key),
        processes.upstream(UPSTREAM_LATENCY_MS, UPSTREAM_BODY_BYTES) as upstream,
        processes.toolworker(redis_url, upstream.url, 64, RAW_CONCURRENCY) as worker_pid,
        processes.gateway(
            redis_url,
            processes.definitions(Path(tmp) / "definitions", RAW_CONCURRENCY),
            TOOLWORKER_GATEWAY_ACCESS=str(access_file(Path(tmp), issuer_url)),
        ) as (url, pid),
    ):
        tokens = {"static token": STATIC_TOKEN, "JWT": access_token(issuer_url, key)}
        cases = [
            (f"{name}, {kind}", _measure(name, url, {"Authorization": f"Bearer {token}"}))
            for name in CASES
            for kind, token in tokens.items()
        ]
        heavy, light = [], []
        for turn in range(rounds):
            heavy.append(
                _round(cases, turn, lambda case, m: gateway_row(case, (pid, worker_pid), m, calls, CONCURRENCY))
            )
            light.append(_round(cases, turn, lambda case, m: gateway_row(case, (pid, worker_pid), m, light_calls, 1)))
    return {
        "check_us": check_costs(),
        "rounds": rounds,
        "rows": _against_static(_medians(heavy), "calls_per_s"),
        "light_load": _against_static(_medians(light), "p50_ms"),
    }


def _round(
    cases: list[tuple[str, Measure]], turn: int, row: Callable[[str, Measure], dict[str, Any]]
) -> list[dict[str, Any]]:
    """One turn of every case, in the cases' order; within each static/JWT pair the first to run alternates
    from turn to turn (what runs second meets a warmer or a busier process)."""
    rows: dict[str, dict[str, Any]] = {}
    for pair in zip(cases[::2], cases[1::2], strict=True):
        for case, measure in pair if turn % 2 == 0 else pair[::-1]:
            rows[case] = row(f"{case}, 64 in flight", measure)
    return [rows[case] for case, _ in cases]


def check_costs(repeats: int = 2000) -> dict[str, float]:
    """The gateway's verifier on its own, in µs a token: the full check, a token already verified, and a
    static token's match (for scale)."""
    with issuer() as (issuer_url, key):
        spec = OAuthSpec.model_validate(
            {"issuer": issuer_url, "audience": AUDIENCE, "scopes": {"tools.all": {"tools": ["*"]}}}
        )
        verifier = JwtVerifier(spec, AUDIENCE)
        token = access_token(issuer_url, key)
        full_s = asyncio.run(_timed(verifier.claims, token, repeats))
        kept_s = asyncio.run(_timed(verifier.principal, token, repeats * 10))
    tokens = static_tokens(Settings(gateway_tokens=STATIC_TOKEN), None)
    started = time.perf_counter()
    for _ in range(repeats * 10):
        tokens.match(STATIC_TOKEN.encode())
    static_s = (time.perf_counter() - started) / (repeats * 10)
    return {"full_check": round(full_s * 1e6, 1), "kept": round(kept_s * 1e6, 2), "static": round(static_s * 1e6, 2)}


async def _timed(check: Callable[[str], Awaitable[Any]], token: str, repeats: int) -> float:
    await check(token)  # the keys fetched, the token kept
    started = time.perf_counter()
    for _ in range(repeats):
        await check(token)
    return (time.perf_counter() - started) / repeats


def _medians(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per case, the median of each figure over the rounds (failures summed)."""
    merged = []
    for same_case in zip(*rounds, strict=True):
        row = dict(same_case[0])
        for figure in ("calls_per_s", "p50_ms", "p95_ms", "gateway_cpu_ms_per_call", "worker_cpu_ms_per_call"):
            row[figure] = round(statistics.median(r[figure] for r in same_case), 3)
        row["failures"] = sum(r["failures"] for r in same_case)
        row["first_error"] = next((r["first_error"] for r in same_case if r["first_error"]), "")
        merged.append(row)
    return merged


def _measure(case: str, url: str, auth: dict[str, str]) -> Measure:
    if case.startswith("REST"):
        return lambda n, c: rest(url, n, c, auth)
    return lambda n, c: mcp(url, n, c, auth)


def _against_static(rows: list[dict[str, Any]], figure: str) -> list[dict[str, Any]]:
    """Each JWT row with its figure less its static twin's (the rows come in pairs: static, JWT)."""
    for static, signed in zip(rows[::2], rows[1::2], strict=True):
        signed["jwt_minus_static"] = round(signed[figure] - static[figure], 2)
    return rows


def print_section(results: dict[str, Any]) -> None:
    costs = results["check_us"]
    print(
        f"\nidentity: an access token's check {costs['full_check']} µs, once kept {costs['kept']} µs "
        f"(a static token's match {costs['static']} µs)"
    )
    print(
        "identity: the same gateway with a static token and with an OAuth access token (RS256 JWT); "
        f"medians of {results['rounds']} rounds"
    )
    print(f"  {'case':<64} {'calls/s':>8} {'p50 ms':>7} {'p95 ms':>7} {'gateway CPU ms/call':>20} {'JWT - static':>13}")
    for title, rows in (("64 in flight", results["rows"]), ("light load, one call at a time", results["light_load"])):
        print(f"  {title}")
        for row in rows:
            delta = row.get("jwt_minus_static")
            shown = "" if delta is None else f"{delta:+.2f}"
            print(
                f"  {row['case']:<64} {row['calls_per_s']:>8.0f} {row['p50_ms']:>7.2f} {row['p95_ms']:>7.2f}"
                f" {row['gateway_cpu_ms_per_call']:>20.3f} {shown:>13}"
                + (f"  {row['failures']} failed: {row['first_error']}" if row["failures"] else "")
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3, help="turns each case takes (figures are medians)")
    args = parser.parse_args(argv)
    calls, light_calls = (600, 50) if args.quick else (5000, 200)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            print("identity: static tokens and JWT", file=sys.stderr, flush=True)
            results = run(server.url, calls, light_calls, args.rounds)
        finally:
            server.stop()
    print_section(results)


if __name__ == "__main__":
    main()
