"""Per-session headers (the `mcp_headers` of the seed): which headers of the agent's own request travel
with its calls.

A header is forwarded only when the tool's upstream lists it in `overridable_headers`, or names it as the
call header that carries an end user's own credential (`auth.per_call_header`); the worker checks the
same again. `Authorization` is the gateway's own credential and never leaves the gateway, even
for an upstream that would accept one.
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.definitions.model import Upstream

NEVER_FORWARDED = frozenset({"authorization", "host", "content-length", "content-type", "transfer-encoding"})


def forwarded(headers: Mapping[str, str], upstream: Upstream) -> dict[str, str]:
    """The headers (lower-case names) this upstream takes from the client's request; `headers` is looked
    up by lower-case name (a request's case-insensitive headers, or a dict with lower-case keys)."""
    names = set(upstream.overridable_headers)
    if upstream.auth is not None and upstream.auth.per_call_header:
        names.add(upstream.auth.per_call_header)
    found = {name: headers.get(name) for name in names - NEVER_FORWARDED}
    return {name: value for name, value in found.items() if value is not None}
