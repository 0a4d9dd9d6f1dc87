"""The agent gateway: MCP, XAgent ToolServer and REST front ends in front of the queue (docs/guides/gateway.md).

    catalog.py     the tools offered: what the workers serve, optionally a tagged subset, followed per version
    calls.py       a call through the queue (AsyncToolClient), claimed by callId so a resend is not run twice
    headers.py     which of the agent's request headers travel with its calls
    withdraw.py    taking a call that has not started off its queue (cancellation)
    health.py      can the fleet take calls (a worker answers a ping)
    mcp.py         the MCP server (the `mcp` SDK): tools/list, tools/call, list changes
    discovery.py   discovery mode's meta-tools, for catalogs too large to list
    toolserver.py  XAgent ToolServer-compatible routes
    rest.py        the native REST API; openapi_document.py its OpenAPI document; bodies.py request bodies
    security.py    who calls (bearer tokens), Origin, body caps; app.py the HTTP application; stdio.py `toolworker mcp`
    identity.py    principals, their grants and tenants, the access file
    oauth.py       OAuth 2.1 access tokens (JWT) checked as a resource server; Protected Resource Metadata
    audit.py       one record per call taken, in a capped Redis stream and the logs (`toolworker audit`)
    metrics.py     the gateway's Prometheus metrics

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
