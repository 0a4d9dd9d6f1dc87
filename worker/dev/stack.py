"""`make run` / `toolworker dev`: the whole local stack in the foreground; Ctrl-C stops it."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from worker.dev.embedded import EmbeddedRedis, free_port
from worker.settings import get_settings

DEV_REDIS_PORT = 6390
DEMO_PORT = 8765
DEMO_MCP_PORT = 8766
GATEWAY_PORT = 8780


def run_dev_stack(flower_port: int = 5555) -> int:
    env = dict(os.environ)
    server = None
    if "TOOLWORKER_REDIS_URL" not in env:
        port = DEV_REDIS_PORT if _port_free(DEV_REDIS_PORT) else free_port()
        server = EmbeddedRedis(Path(".dev") / "redis", port=port, persistent=True).start()
        env["TOOLWORKER_REDIS_URL"] = server.url
    demo_port = DEMO_PORT if _port_free(DEMO_PORT) else free_port()
    env.setdefault("TOOLWORKER_DEMO_URL", f"http://127.0.0.1:{demo_port}")
    demo_mcp_port = DEMO_MCP_PORT if _port_free(DEMO_MCP_PORT) else free_port()
    env.setdefault("TOOLWORKER_DEMO_MCP_URL", f"http://127.0.0.1:{demo_mcp_port}/mcp")
    env.setdefault("TOOLWORKER_LOG_FORMAT", "console")
    gateway_port = GATEWAY_PORT if _port_free(GATEWAY_PORT) else free_port()
    env.setdefault("TOOLWORKER_GATEWAY_PUBLIC_URL", f"http://127.0.0.1:{gateway_port}")
    env.setdefault("TOOLWORKER_VAULT_KEYS", _dev_vault_key(Path(".dev") / "vault.key"))
    processes = _start_processes(env, demo_port, flower_port, gateway_port)
    signal.signal(signal.SIGTERM, _interrupt)  # stopped by a supervisor: clean up like Ctrl-C
    _print_banner(env, flower_port, gateway_port)
    try:
        return _supervise(processes)
    finally:
        _stop(processes)
        if server is not None:
            server.stop()


def _start_processes(
    env: dict[str, str], demo_port: int, flower_port: int, gateway_port: int
) -> dict[str, subprocess.Popen[bytes]]:
    python = sys.executable
    demo = f"from worker.dev.demo import serve; serve('127.0.0.1', {demo_port})"
    demo_mcp_port = int(env["TOOLWORKER_DEMO_MCP_URL"].rsplit(":", 1)[1].split("/")[0])
    demo_mcp = f"from worker.dev.demo_mcp import serve; serve('127.0.0.1', {demo_mcp_port})"
    flower = ["-m", "celery", "-A", "worker.app", "flower", f"--port={flower_port}", "--address=127.0.0.1"]
    commands = {
        "demo": [python, "-c", demo],
        "demo_mcp": [python, "-c", demo_mcp],
        "worker": [python, "-m", "worker", "worker", "-n", "dev@%h"],
        "flower": [python, *flower],
        "gateway": [python, "-m", "worker", "gateway", "--host", "127.0.0.1", "--port", str(gateway_port)],
    }
    # A process group of their own: Ctrl-C reaches us once, and we stop them in order.
    return {name: subprocess.Popen(argv, env=env, start_new_session=True) for name, argv in commands.items()}


def _print_banner(env: dict[str, str], flower_port: int, gateway_port: int) -> None:
    from worker.gateway.mcp.stdio import desktop_config

    settings = get_settings()
    redis_url = env["TOOLWORKER_REDIS_URL"]
    gateway = f"http://127.0.0.1:{gateway_port}"
    config = desktop_config(redis_url, settings.definitions)
    print(
        f"\ntoolworker dev stack: Redis {redis_url}, demo upstream {env['TOOLWORKER_DEMO_URL']}, "
        f"Flower http://127.0.0.1:{flower_port}, definitions {settings.definitions}\n"
        f"Agent gateway {gateway}: MCP (Streamable HTTP) at {gateway}/mcp, ToolServer at {gateway}/toolserver, "
        f"REST at {gateway}/v1 (no tokens: loopback only)\n"
        "Try, in another shell:\n"
        f"  TOOLWORKER_REDIS_URL={redis_url} .venv/bin/toolworker call ticket_lookup --arg ticket_id=TICKET-123\n"
        f'  curl -s {gateway}/v1/calls -d \'{{"tool": "ticket_lookup", "arguments": {{"ticket_id": "TICKET-123"}}}}\'\n'
        "Acting for a user (docs/guides/acting-for-users.md): the first call answers 67 with a link to open;\n"
        f'  curl -s {gateway}/v1/calls -d \'{{"tool": "my_profile"}}\'   then open the link, Allow, call again\n'
        f"An MCP client over HTTP: point it at {gateway}/mcp. A desktop MCP client (stdio) runs `toolworker mcp`;\n"
        f"add this to its configuration (e.g. claude_desktop_config.json):\n{config}\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )


def _dev_vault_key(path: Path) -> str:
    """The dev stack's vault key, made once and kept beside its Redis data (so connections survive a restart)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("dev:" + base64.b64encode(os.urandom(32)).decode())
        path.chmod(0o600)
    return path.read_text().strip()


def _supervise(processes: dict[str, subprocess.Popen[bytes]]) -> int:
    try:
        while True:
            for name, process in processes.items():
                if process.poll() is not None:
                    print(f"toolworker dev: {name} exited with {process.returncode}; stopping", file=sys.stderr)
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping...", file=sys.stderr)
        return 0


def _stop(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for process in processes.values():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
