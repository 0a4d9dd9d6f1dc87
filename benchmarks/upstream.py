"""The benchmark upstream, run as its own process: fixed latency and body size per request."""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web


def make_app(latency_ms: float, body_bytes: int) -> web.Application:
    body = b'{"data": "' + b"x" * max(0, body_bytes - 12) + b'"}'

    async def handle(request: web.Request) -> web.Response:
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
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
