"""A hostile upstream: a raw socket server on 127.0.0.1 that breaks HTTP in the ways real servers do
(compression bombs, endless and slow bodies, lying lengths, header bombs, redirect loops, garbage
status lines, responses nobody asked for, header bytes that are not UTF-8).

Every request is `GET /case/<name>`; `<name>` picks the misbehaviour, and `echo-<token>` answers
`<token>`, so that a caller can tell its own answer from another's. Connections are kept alive.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Awaitable, Callable

import brotli

from tests.support.servers import TcpServer

# What a bomb expands to, and the size of a bomb on the wire is a few KB at most.
BOMB_BYTES = 64 * 1024 * 1024
INJECTED_BODY = b"injected"
INJECT_AFTER_S = 0.3  # as seen in the wild: the extra response comes a moment after the real one
SLOW_BYTE_EVERY_S = 1.0
HEADER_COUNT = 10_000
HEADER_VALUE_BYTES = 1024 * 1024

Writer = asyncio.StreamWriter


def head(status: str = "200 OK", *headers: bytes, length: int | None = None) -> bytes:
    lines = [b"HTTP/1.1 " + status.encode("latin-1"), *headers]
    if length is not None:
        lines.append(b"Content-Length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


class HostileUpstream(TcpServer):
    """The server, on a loop of its own in a thread; `injected` and `poisoned_dropped` tell a test when the
    extra response was sent and when the client dropped the connection that carried it."""

    def __init__(self) -> None:
        super().__init__()
        self._gzip_bomb = gzip.compress(b"a" * BOMB_BYTES, 9)
        self._brotli_bomb = brotli.compress(b"a" * BOMB_BYTES, quality=5)
        self.injected = threading.Event()
        self.poisoned_dropped = threading.Event()
        self.cases: dict[str, Callable[[Writer], Awaitable[bool]]] = {
            "gzip-bomb": self._gzip,
            "brotli-bomb": self._brotli,
            "endless": self._endless,
            "slow-body": self._slow_body,
            "short-length": self._short_length,
            "long-length": self._long_length,
            "many-headers": self._many_headers,
            "huge-header": self._huge_header,
            "redirect-loop": self._redirect_loop,
            "garbage-status": self._garbage_status,
            "inject": self._inject,
            "latin1-404": self._latin1_404,
            "latin1-content-type": self._latin1_content_type,
        }

    async def handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        """Answer requests on one connection until a case ends it or the client goes."""
        poisoned = False
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                name = request.split(b" ", 2)[1].decode("latin-1").removeprefix("/case/")
                poisoned = poisoned or name == "inject"
                if not await self._answer(name, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            if poisoned:
                self.poisoned_dropped.set()
        finally:
            writer.close()

    async def _answer(self, name: str, writer: Writer) -> bool:
        """Send the case's answer; False when the connection is to be closed after it."""
        if name.startswith("echo-"):
            token = name.removeprefix("echo-").encode()
            writer.write(head("200 OK", b"Content-Type: text/plain", length=len(token)) + token)
            await writer.drain()
            return True
        return await self.cases[name](writer)

    async def _gzip(self, writer: Writer) -> bool:
        return await _bomb(writer, b"gzip", self._gzip_bomb)

    async def _brotli(self, writer: Writer) -> bool:
        return await _bomb(writer, b"br", self._brotli_bomb)

    async def _endless(self, writer: Writer) -> bool:
        writer.write(head("200 OK", b"Content-Type: text/plain", b"Transfer-Encoding: chunked"))
        chunk = b"a" * 65536
        while not writer.is_closing():  # until the client hangs up (drain then raises)
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        return False

    async def _slow_body(self, writer: Writer) -> bool:
        writer.write(head("200 OK", b"Content-Type: text/plain", length=100))
        for _ in range(100):
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(SLOW_BYTE_EVERY_S)  # the upstream's pace, not a wait of the test
        return True

    async def _short_length(self, writer: Writer) -> bool:
        writer.write(head("200 OK", b"Content-Type: text/plain", length=100) + b"only ten b")
        await writer.drain()
        return False

    async def _long_length(self, writer: Writer) -> bool:
        writer.write(head("200 OK", b"Content-Type: text/plain", length=5) + b"12345" + b" and then some more bytes")
        await writer.drain()
        return True

    async def _many_headers(self, writer: Writer) -> bool:
        headers = [b"X-Filler-%d: %d" % (i, i) for i in range(HEADER_COUNT)]
        writer.write(head("200 OK", *headers, length=2) + b"ok")
        await writer.drain()
        return False

    async def _huge_header(self, writer: Writer) -> bool:
        writer.write(head("200 OK", b"X-Huge: " + b"a" * HEADER_VALUE_BYTES, length=2) + b"ok")
        await writer.drain()
        return False

    async def _redirect_loop(self, writer: Writer) -> bool:
        writer.write(head("302 Found", b"Location: /case/redirect-loop", length=0))
        await writer.drain()
        return True

    async def _garbage_status(self, writer: Writer) -> bool:
        writer.write(b"SPAM SPAM SPAM\r\nEGGS\r\n\r\n")
        await writer.drain()
        return False

    async def _inject(self, writer: Writer) -> bool:
        writer.write(head("200 OK", b"Content-Type: text/plain", length=5) + b"first")
        await writer.drain()
        await asyncio.sleep(INJECT_AFTER_S)  # the upstream's own misbehaviour, not a wait of the test
        injected = INJECTED_BODY
        writer.write(head("200 OK", b"Content-Type: text/plain", length=len(injected)) + injected)
        await writer.drain()
        self.injected.set()
        return True

    async def _latin1_404(self, writer: Writer) -> bool:
        body = b"not found"
        writer.write(head("404 N\xe3o encontrado", b"Content-Type: text/plain", length=len(body)) + body)
        await writer.drain()
        return True

    async def _latin1_content_type(self, writer: Writer) -> bool:
        body = b"caf\xe9"
        content_type = b"Content-Type: text/plain; charset=iso-8859-1; note=d\xe9j\xe0"
        writer.write(head("200 OK", content_type, length=len(body)) + body)
        await writer.drain()
        return True


async def _bomb(writer: Writer, encoding: bytes, payload: bytes) -> bool:
    """A few KB on the wire that expand to BOMB_BYTES."""
    writer.write(head("200 OK", b"Content-Type: text/plain", b"Content-Encoding: " + encoding, length=len(payload)))
    writer.write(payload)
    await writer.drain()
    return True
