"""The agent gateway: MCP, REST and XAgent ToolServer front ends, and a console, in front of the queue
(docs/guides/gateway.md). One room per surface, over what they share; app.py composes them.

    mcp/           the MCP surface: the SDK server, tasks, asking, discovery mode, stdio
    rest/          the REST surface under /v1: routes as a table, their types, the generated OpenAPI document
    console/       the operators' console: server-rendered HTML pages behind a session of their own
    toolserver.py  XAgent ToolServer-compatible routes
    identity/      who calls: principals and tokens, OAuth, end users' tokens, the audit trail

What every surface shares:

    calls.py       a call through the queue (AsyncToolClient), claimed by callId so a resend is not run twice
    claims.py      the claims on callIds in Redis; withdraw.py taking a call not yet started off its queue
    catalog.py     the tools offered: what the workers serve, optionally a tagged subset, followed per version
    decisions.py   deciding on calls parked for approval
    headers.py     which of the agent's request headers travel with its calls
    health.py      can the fleet take calls (a worker answers a ping); metrics.py the Prometheus metrics
    app.py         the HTTP application that composes the surfaces

The gateway never sends a request to an upstream: every call is a queued call, answered by a worker.
"""

from __future__ import annotations


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("toolworker")
    except PackageNotFoundError:
        return "0"
