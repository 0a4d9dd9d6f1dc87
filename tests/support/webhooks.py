"""A local webhook receiver for the callback tests: verifies each delivery with the `standardwebhooks`
package's own verifier and answers as its route is told to (accept, fail with 503, hold the request open)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

Mode = Literal["accept", "fail", "hold_first"]


@dataclass
class Delivery:
    """One request the receiver got, and how it was answered (None: never answered, the client went away)."""

    path: str
    headers: dict[str, str]
    body: bytes
    verified: list[bool]
    at: float
    status: int | None = None


@dataclass
class Receiver:
    """Routes `/hook/<name>`; `modes[name]` says how each answers (accept by default)."""

    secrets: list[str]
    port: int
    modes: dict[str, Mode] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/hook/{name}"

    def to(self, name: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.path == f"/hook/{name}"]

    def accepted(self, name: str) -> list[Delivery]:
        return [d for d in self.to(name) if d.status is not None and 200 <= d.status < 300]

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        verified = [_verifies(secret, body, headers) for secret in self.secrets]
        delivery = Delivery(request.path, headers, body, verified, time.time())
        with self._lock:
            self.deliveries.append(delivery)
            first = len([d for d in self.deliveries if d.path == request.path]) == 1
        mode = self.modes.get(request.match_info["name"], "accept")
        if mode == "hold_first" and first:
            await asyncio.Event().wait()  # until the sender goes away (the handler is cancelled)
        status = 503 if mode == "fail" else (200 if all(verified) else 400)
        delivery.status = status
        return web.json_response({"ok": status == 200}, status=status)


def _verifies(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


class ReceiverServer:
    """The receiver on 127.0.0.1:`port` in a thread of its own; stopped and started again on the same port."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> ReceiverServer:
        app = web.Application()
        app.router.add_post("/hook/{name}", self.receiver.handle)
        self._loop = asyncio.new_event_loop()
        self._ready.clear()
        self._thread = threading.Thread(target=self._serve, args=(app,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the webhook receiver did not start")
        return self

    def _serve(self, app: web.Application) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.receiver.port, reuse_address=True)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def stop(self) -> None:
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None
