"""The benchmark upstream, run as its own process: a fixed latency and body size per request.

    python -m benchmarks.harness.upstream --port 8080 [--latency-ms 100] [--body-bytes 1048576]

Bodies are JSON (`{"data": "xxx…"}`) of exactly `--body-bytes` bytes, streamed in chunks so that a
100 MB body never sits in memory. `/ready` answers at once; `/_stats` reports the requests in flight
and the most there ever were (`?reset=1` starts counting again), so a benchmark can prove its load.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

from aiohttp import web

CHUNK_BYTES = 256 * 1024
_PREFIX = b'{"data": "'
_SUFFIX = b'"}'
_FILLER = b"x" * CHUNK_BYTES


@dataclass
class Stats:
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0

    def enter(self) -> None:
        self.in_flight += 1
        self.requests += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)


async def write_body(resp: web.StreamResponse, body_bytes: int) -> None:
    """The JSON body, its filler written from one shared chunk."""
    await resp.write(_PREFIX)
    filler_bytes = max(0, body_bytes - len(_PREFIX) - len(_SUFFIX))
    for start in range(0, filler_bytes, CHUNK_BYTES):
        await resp.write(_FILLER[: min(CHUNK_BYTES, filler_bytes - start)])
    await resp.write(_SUFFIX)


def make_app(latency_ms: float, body_bytes: int) -> web.Application:
    stats = Stats()
    length = max(body_bytes, len(_PREFIX) + len(_SUFFIX))

    async def handle(request: web.Request) -> web.StreamResponse:
        stats.enter()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = length
        try:
            if latency_ms:
                await asyncio.sleep(latency_ms / 1000)
            await resp.prepare(request)
            await write_body(resp, body_bytes)
            await resp.write_eof()
        except ConnectionError:  # the client stopped reading (a capped read): expected
            pass
        finally:
            stats.in_flight -= 1
        return resp

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def report(request: web.Request) -> web.Response:
        answer = web.json_response(dict(vars(stats)))
        if request.query.get("reset"):
            stats.max_in_flight, stats.requests = stats.in_flight, 0
        return answer

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/_stats", report)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--body-bytes", type=int, default=1024)
    args = parser.parse_args()
    web.run_app(
        make_app(args.latency_ms, args.body_bytes),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
