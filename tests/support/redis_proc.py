"""A `redis-server` that a test may kill -9, pause and start again on the same port from its append-only file.

Every write is fsynced before it is answered (`appendfsync always`), so what a client saw answered survives
a kill: a call lost or answered twice after a restart is the worker's doing, not the server's.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import redis

from tests.support.waiting import wait_until
from worker.dev.embedded import free_port


class RedisProcess:
    """`redis-server` on 127.0.0.1:port, AOF with `appendfsync always`, its data in `directory`."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> RedisProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"]
        with (self.directory / "server.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=1.0)
        try:
            wait_until(lambda: self._answers(client), timeout_s, f"redis-server on port {self.port}")
        finally:
            client.close()
        return self

    def _answers(self, client: redis.Redis) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited; see {self.directory / 'server.log'}")
        try:
            return bool(client.ping())
        except redis.ConnectionError:  # refused, or still loading its append-only file
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed beyond what was fsynced."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()  # a paused server would not act on SIGTERM
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
