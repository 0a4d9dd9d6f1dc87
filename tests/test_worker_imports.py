"""A worker whose definitions name no MCP upstream does not load the MCP SDK (about 32 MB of resident memory
per process): its MCP client is made by the first MCP call, and the handler of the servers' "tools changed"
notifications is in place for the sessions that call opens. Run in a fresh interpreter, as a worker starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import asyncio, sys
from pathlib import Path
import fakeredis
import worker.queue.bridge, worker.queue.tasks  # what a worker process loads
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.definitions.file_store import load
from worker.protocol import ToolCall
from worker.upstreams.background import upstream_work

def loaded():
    return sorted(name for name in sys.modules if name.split(".")[0] in ("mcp", "mcp_types", "httpx2"))

async def main(definitions):
    runtime = Runtime(load([Path(definitions)], environ={}), {}, redis=fakeredis.aioredis.FakeRedis())
    work = [asyncio.ensure_future(w) for w in upstream_work(runtime, lambda: runtime.toolset, print, 0.01, 100)]
    envelope = await run_call(ToolCall(tool="closed_get", arguments={}, call_id="c1"), runtime)
    await asyncio.sleep(0.05)  # the background work has looked at the definitions
    assert envelope.exit_code == 7, envelope.to_dict()  # an HTTP call, sent (to a closed port)
    assert loaded() == [], loaded()
    sessions = runtime.mcp  # what the first MCP call does
    assert "mcp" in sys.modules and sessions.on_tools_changed is runtime.on_tools_changed is not None
    for task in work:
        task.cancel()
    await runtime.close()

asyncio.run(main(sys.argv[1]))
"""

DEFINITIONS = """
upstreams:
  closed:
    base_url: "http://127.0.0.1:{port}"
    timeout_seconds: 2
tools:
  - name: closed_get
    upstream: closed
    description: A GET to a port nobody listens on.
    request: {{method: GET, path: /}}
    input_schema: {{type: object, properties: {{}}}}
"""


@pytest.mark.integration
def test_a_worker_of_http_tools_does_not_load_the_mcp_sdk(tmp_path: Path) -> None:
    from worker.dev.embedded import free_port

    definitions = tmp_path / "tools.yaml"
    definitions.write_text(DEFINITIONS.format(port=free_port()), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(definitions)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
