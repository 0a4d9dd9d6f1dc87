"""What the calls of one worker process share: the tools, the HTTP pools, the breakers, Redis."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from worker import errors
from worker.call.arguments import ArgumentSchema
from worker.call.auth import TokenCache
from worker.call.circuit import Breakers
from worker.call.delegated import UserTokens
from worker.call.fairness import FairTurns
from worker.call.vault import Keyring
from worker.constants import TOOL_ALIASES
from worker.definitions.mcp_tools import unlisted_tool
from worker.definitions.model import Tool, ToolSet, Upstream
from worker.http.egress import EgressPolicy
from worker.http.transport import HttpTransport, PoolSpec

if TYPE_CHECKING:  # the MCP client (and the SDK under it, 32 MB) is loaded by the first MCP call
    from worker.call.mcp_authorization import McpAuthorization
    from worker.mcp_client.sessions import Sessions

# Calls to one upstream under way at once (rendered, sent or being answered), per pooled connection:
# enough that a connection coming free finds its next request ready.
TURNS_PER_CONNECTION = 2


class Runtime:
    """Built once per worker process, with everything it depends on passed in."""

    def __init__(
        self,
        toolset: ToolSet,
        environ: Mapping[str, str],
        transport: HttpTransport | None = None,
        policy: EgressPolicy | None = None,
        redis: aioredis.Redis | None = None,
        users: UserTokens | None = None,
        mcp: Sessions | None = None,
        queue: aioredis.Redis | None = None,
    ) -> None:
        self.toolset = toolset
        self.environ = environ
        self.policy = policy or EgressPolicy.parse("")
        self.transport = transport or HttpTransport(self.policy)
        # Shared state between workers (rate limits); None where no Redis is at hand (unit tests).
        self.redis = redis
        # The Redis the calls are taken from and answered on (the gateway listens there to a call's events).
        self.queue = queue or redis
        self.breakers = Breakers()
        self.tokens = TokenCache(redis)
        # End users' tokens (the vault); without keys, tools that act for a user are refused (78).
        self.users = users or UserTokens(redis, Keyring([]), None, 0)
        self._mcp = mcp
        # Told which upstream's server said its tools changed, on a session this process holds.
        self.on_tools_changed: Callable[[str], None] | None = None
        self._schemas: dict[str, ArgumentSchema] = {}
        self._turns: dict[str, FairTurns] = {}

    @property
    def mcp(self) -> Sessions:
        """One session per MCP server, reused by every call of this process (made by the first MCP call)."""
        if self._mcp is None:
            from worker.mcp_client.sessions import Sessions

            self._mcp = Sessions()
            self._mcp.on_tools_changed = self.on_tools_changed
        return self._mcp

    @cached_property
    def mcp_authorization(self) -> McpAuthorization:
        """MCP servers' authorization servers, found as the MCP specification's client finds them."""
        from worker.call.mcp_authorization import McpAuthorization

        links = self.users.links
        return McpAuthorization(
            self.redis, self.policy, self.transport, self.users.keyring, links.public_url if links else None
        )

    def _tool(self, name: str) -> Tool | None:
        """The tool of a name: the catalog's, else one of an MCP upstream not listed yet."""
        tool = self.toolset.tools.get(TOOL_ALIASES.get(name, name))
        return tool if tool is not None or not self.toolset.unlisted else unlisted_tool(self.toolset, name)

    def resolve(self, name: str) -> tuple[Tool, Upstream]:
        tool = self._tool(name)
        if tool is None:
            if name in self.toolset.unusable:
                raise errors.ToolMisconfigured(
                    f"The tool {name!r} cannot be used because its definition is broken. Tell the operator."
                )
            raise errors.UnknownTool(name, "Use one of the tools you were given.")
        return tool, self.toolset.upstreams[tool.upstream]

    def upstream_of(self, name: str) -> str | None:
        """The upstream of a tool; None when the name (the model's) resolves to no tool."""
        tool = self._tool(name)
        return tool.upstream if tool is not None else None

    def swap(self, toolset: ToolSet) -> None:
        """Serve a new set of tools from the next call on (calls in flight keep theirs); pools whose
        upstream settings changed are retired."""
        self.toolset, self._schemas, self._turns = toolset, {}, {}
        self.transport.retire(pool_spec(upstream) for upstream in toolset.upstreams.values())

    def turns(self, upstream: Upstream) -> FairTurns:
        """The turns of the calls to one upstream, shared by tenant weight (see `admission.Turn`)."""
        turns = self._turns.get(upstream.name)
        if turns is None:
            count = TURNS_PER_CONNECTION * upstream.max_concurrency
            turns = self._turns[upstream.name] = FairTurns(count, self.tenant_weight)
        return turns

    def tenant_weight(self, tenant: str) -> int:
        return self.toolset.tenant(tenant).weight

    def arguments_schema(self, tool: Tool) -> ArgumentSchema:
        schema = self._schemas.get(tool.name)
        if schema is None:
            schema = self._schemas[tool.name] = ArgumentSchema(tool.input_schema)
        return schema

    async def close(self) -> None:
        if self._mcp is not None:
            await self._mcp.close()
        await self.transport.close()


def pool_spec(upstream: Upstream) -> PoolSpec:
    """The connection pool an upstream's calls share."""
    return PoolSpec(upstream.name, upstream.verify_tls, upstream.max_concurrency, upstream.timeout_s)
