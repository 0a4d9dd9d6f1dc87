"""Per-session headers (the `mcp_headers` of the seed): which headers of the agent's own request travel
with its calls.

A header is forwarded only when the tool's upstream lists it in `overridable_headers`; the worker checks
the same list again. `Authorization` is the gateway's own credential and never leaves the gateway, even
for an upstream that would accept one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from worker.definitions.model import Upstream

NEVER_FORWARDED = frozenset({"authorization", "host", "content-length", "content-type", "transfer-encoding"})


def forwarded(headers: Iterable[tuple[str, str]] | Mapping[str, str], upstream: Upstream) -> dict[str, str]:
    """The headers (lower-case names) this upstream takes from the client's request."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    accepted = upstream.overridable_headers
    return {
        name.lower(): value for name, value in pairs if name.lower() in accepted and name.lower() not in NEVER_FORWARDED
    }
