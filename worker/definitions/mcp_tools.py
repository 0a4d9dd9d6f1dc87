"""An MCP upstream's tools (docs/guides/mcp-upstreams.md): its listing as stored, what changed between two
listings (digests, the audit's records, pinning), and the catalog's tools made from it. Pure functions: the
listing is read from the server by worker/mcp_client/ and kept in Redis by definitions/listings.py.

    server's tools/list ─▶ merged (digests; with `pin`, changes withheld) ─▶ Listing ─▶ tools(): catalog names
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from worker.constants import KIND_MCP, MAX_TOOL_DESCRIPTION_CHARS, MAX_TOOL_SCHEMA_BYTES, TOOL_NAME_MAX_CHARS
from worker.definitions.model import TASK_MODES, Problem, RequestTemplate, Source, Tool, ToolSet, Upstream

JSON = Any
# What of a server's tool definition is kept (and digested): the rest (icons, _meta) is not served.
KEPT_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations", "execution")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def digest(definition: Mapping[str, JSON]) -> str:
    """The digest of a tool's definition: sha256 of its canonical JSON, first 16 hex digits."""
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def kept(definition: Mapping[str, JSON]) -> dict[str, JSON]:
    """A server's tool definition with only the fields served."""
    return {key: definition[key] for key in KEPT_FIELDS if definition.get(key) is not None}


@dataclass(frozen=True, slots=True)
class Change:
    """A tool that changed after the first listing: `old`/`new` digests (None: new, or removed), and what."""

    upstream: str
    tool: str
    old: str | None
    new: str | None
    fields: tuple[str, ...]
    withheld: bool

    def record(self) -> dict[str, str]:
        """The audit trail's fields for this change."""
        what = ",".join(self.fields) or ("added" if self.old is None else "removed")
        held = "withheld until accepted" if self.withheld else "served"
        return {
            "kind": "mcp_tool_changed",
            "upstream": self.upstream,
            "tool": self.tool,
            "oldDigest": self.old or "",
            "newDigest": self.new or "",
            "changed": what,
            "state": held,
        }


@dataclass(frozen=True, slots=True)
class Listing:
    """What a refresh last read of an MCP upstream, as stored in Redis."""

    upstream: str
    # The server's name -> its definition (KEPT_FIELDS), as served; `pending` holds what `pin` withholds.
    tools: Mapping[str, Mapping[str, JSON]] = field(default_factory=dict)
    pending: Mapping[str, Mapping[str, JSON]] = field(default_factory=dict)
    protocol: str | None = None
    listed_at: float | None = None  # the last refresh that read the tools; None: never listed
    tried_at: float | None = None
    error: str | None = None  # why the last refresh failed (the tools listed before keep being served)

    @property
    def available(self) -> bool:
        return self.error is None and self.listed_at is not None

    def to_json(self) -> str:
        return json.dumps(
            {
                "upstream": self.upstream,
                "tools": self.tools,
                "pending": self.pending,
                "protocol": self.protocol,
                "listedAt": self.listed_at,
                "triedAt": self.tried_at,
                "error": self.error,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Listing:
        data = json.loads(text)
        return cls(
            upstream=data["upstream"],
            tools=data.get("tools") or {},
            pending=data.get("pending") or {},
            protocol=data.get("protocol"),
            listed_at=data.get("listedAt"),
            tried_at=data.get("triedAt"),
            error=data.get("error"),
        )

    def summary(self) -> dict[str, JSON]:
        """What `toolworker upstreams` and the REST listing show of it."""
        return {
            "tools": len(self.tools),
            "pending": sorted(self.pending),
            "protocol": self.protocol,
            "listedAt": self.listed_at,
            "triedAt": self.tried_at,
            "available": self.available,
            "error": self.error,
        }


def merged(
    previous: Listing | None, upstream: str, listed: Mapping[str, Mapping[str, JSON]], pin: bool
) -> tuple[dict[str, Mapping[str, JSON]], dict[str, Mapping[str, JSON]], list[Change]]:
    """The tools served and withheld after a refresh that listed `listed`, and the changes to audit. The first
    listing is served as it is; after it, a changed or new tool is audited and, with `pin`, withheld (the
    version served before keeps serving)."""
    if previous is None or previous.listed_at is None:
        return dict(listed), {}, []
    served: dict[str, Mapping[str, JSON]] = {}
    pending: dict[str, Mapping[str, JSON]] = {}
    changes: list[Change] = []
    for name, definition in listed.items():
        old = previous.tools.get(name)
        if old is not None and digest(old) == digest(definition):
            served[name] = old
            continue
        if previous.pending.get(name) != definition:  # a change already withheld is recorded once
            changes.append(_change(upstream, name, old, definition, pin))
        if pin:
            pending[name] = definition
            if old is not None:
                served[name] = old
        else:
            served[name] = definition
    for name, old in previous.tools.items():
        if name not in listed:
            changes.append(_change(upstream, name, old, None, False))
    return served, pending, changes


def _change(
    upstream: str, name: str, old: Mapping[str, JSON] | None, new: Mapping[str, JSON] | None, pin: bool
) -> Change:
    fields: tuple[str, ...] = ()
    if old is not None and new is not None:
        fields = tuple(key for key in KEPT_FIELDS if old.get(key) != new.get(key))
    old_digest = None if old is None else digest(old)
    new_digest = None if new is None else digest(new)
    return Change(upstream, name, old_digest, new_digest, fields, pin and new is not None)


def accepted(listing: Listing, tool: str | None = None) -> Listing:
    """The listing with its withheld tools (or the one named, by the server's name) served."""
    names = list(listing.pending) if tool is None else [tool]
    missing = [name for name in names if name not in listing.pending]
    if missing:
        raise KeyError(f"no tool of {listing.upstream!r} waits to be accepted under the name {missing[0]!r}")
    tools = {**listing.tools, **{name: listing.pending[name] for name in names}}
    pending = {name: d for name, d in listing.pending.items() if name not in names}
    return replace(listing, tools=tools, pending=pending)


# --- the catalog's tools -------------------------------------------------------------------------


def catalog_name(upstream: Upstream, server_name: str) -> str:
    """`prefix` + the server's name (default prefix `<upstream>_`), characters outside [A-Za-z0-9_-] as `_`,
    at most 64 characters."""
    assert upstream.mcp is not None
    prefix = f"{upstream.name}_" if upstream.mcp.prefix is None else upstream.mcp.prefix
    return _NOT_NAME.sub("_", prefix + server_name)[:TOOL_NAME_MAX_CHARS]


def selected(upstream: Upstream, server_name: str) -> bool:
    """Whether `include`/`exclude` (globs on the server's names) let a tool through."""
    assert upstream.mcp is not None
    included = any(fnmatch.fnmatchcase(server_name, glob) for glob in upstream.mcp.include)
    return included and not any(fnmatch.fnmatchcase(server_name, glob) for glob in upstream.mcp.exclude)


def with_listings(toolset: ToolSet, listings: Mapping[str, Listing]) -> ToolSet:
    """The toolset with every MCP upstream's listed tools added (a new ToolSet; the given one is unchanged).
    An upstream never listed adds none and says why in `notices`; a name taken already is refused (a problem),
    naming both sources."""
    out = ToolSet(dict(toolset.upstreams), dict(toolset.tools), list(toolset.problems), dict(toolset.unusable))
    out.tenants, out.notices = dict(toolset.tenants), list(toolset.notices)
    unlisted: list[str] = []
    for name, upstream in toolset.upstreams.items():
        if upstream.mcp is None:
            continue
        listing = listings.get(name)
        if listing is None or listing.listed_at is None:
            why = listing.error if listing is not None and listing.error else "it has not been listed yet"
            sent = f"calls to {catalog_name(upstream, '')}* are sent to it as they are named until it is listed"
            out.notices.append(Problem(upstream.source, f"MCP upstream {name!r} has no tools: {why}; {sent}"))
            unlisted.append(name)
            continue
        for server_name, definition in sorted(listing.tools.items()):
            if selected(upstream, server_name):
                _add(out, upstream, server_name, definition)
    out.unlisted = tuple(unlisted)
    return out


def unlisted_tool(toolset: ToolSet, name: str) -> Tool | None:
    """The tool a call of `name` reaches on an MCP upstream never listed (one that wants a user's token even
    to list its tools): its prefix + the server's name, sent as that name; the longest prefix wins. None when
    no such upstream's prefix (nor include/exclude) matches."""
    found: tuple[int, Upstream] | None = None
    for upstream_name in toolset.unlisted:
        upstream = toolset.upstreams.get(upstream_name)
        if upstream is None or upstream.mcp is None:
            continue
        prefix = catalog_name(upstream, "")
        fits = name.startswith(prefix) and len(name) > len(prefix) and selected(upstream, name[len(prefix) :])
        if fits and (found is None or len(prefix) > found[0]):
            found = (len(prefix), upstream)
    if found is None:
        return None
    size, upstream = found
    source = Source(f"<mcp {upstream.name}: not listed yet>")
    return tool_of(upstream, name[size:], {"name": name[size:]}, source)


def _add(out: ToolSet, upstream: Upstream, server_name: str, definition: Mapping[str, JSON]) -> None:
    source = Source(f"<mcp {upstream.name}: {server_name}>")
    try:
        tool = tool_of(upstream, server_name, definition, source)
    except ValueError as exc:
        out.problems.append(Problem(source, str(exc)))
        return
    existing = out.tools.get(tool.name)
    if existing is not None:
        message = f"tool name {tool.name!r} is taken (by {existing.source}); refused"
        out.problems.append(Problem(source, message))
        return
    out.tools[tool.name] = tool


def tool_of(upstream: Upstream, server_name: str, definition: Mapping[str, JSON], source: Source) -> Tool:
    """The catalog's tool for one of the server's tools; ValueError when its text is over the size caps."""
    description = str(definition.get("description") or "")
    if len(description) > MAX_TOOL_DESCRIPTION_CHARS:
        raise ValueError(
            f"description of {len(description)} characters (at most {MAX_TOOL_DESCRIPTION_CHARS}); refused"
        )
    schema = definition.get("inputSchema") or {"type": "object", "properties": {}}
    output = definition.get("outputSchema")
    size = len(json.dumps([schema, output]).encode())
    if size > MAX_TOOL_SCHEMA_BYTES or not isinstance(schema, Mapping):
        raise ValueError(f"schemas of {size} bytes (at most {MAX_TOOL_SCHEMA_BYTES}, an object); refused")
    task = (definition.get("execution") or {}).get("taskSupport")
    return Tool(
        name=catalog_name(upstream, server_name),
        upstream=upstream.name,
        request=RequestTemplate(method="POST"),
        description=description,
        tags=(upstream.name,),
        source=source,
        kind=KIND_MCP,
        task=task if task in TASK_MODES else None,
        schema=dict(schema),
        output=dict(output) if isinstance(output, Mapping) else None,
        remote_name=server_name,
        title=definition.get("title"),
        annotations=definition.get("annotations"),
    )
