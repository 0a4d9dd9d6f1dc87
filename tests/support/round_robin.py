"""A round-robin HTTP proxy in front of several gateway processes: each request (not each connection) goes
to the next one, its answer streamed back as it comes (event streams included), so a client's requests
of one session land on every process in turn."""

from __future__ import annotations

import itertools
from collections import Counter

import aiohttp
from aiohttp import web

from tests.support.servers import ServerThread

# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp sets itself.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "transfer-encoding", "host", "content-length"})


class RoundRobin:
    """The proxy's backends (base URLs) and how many requests each was given."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.served: Counter[str] = Counter()
        self._next = itertools.cycle(backends)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    def start(self) -> ServerThread:
        return ServerThread(self.app()).start()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        backend = next(self._next)
        self.served[backend] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        timeout = aiohttp.ClientTimeout(total=120)
        async with (
            aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session,
            session.request(
                request.method, backend + request.path_qs, headers=headers, data=await request.read()
            ) as upstream,
        ):
            answer = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in _NOT_FORWARDED:
                    answer.headers.add(name, value)
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer
