"""ToolClient: the synchronous client, the asyncio client run on a background loop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from worker.client.async_client import AsyncToolClient
from worker.client.handles import CallHandle
from worker.client.messages import CallSpec, checked_tenant
from worker.constants import CLIENT_SLACK_S, CODE_CALL_TIMEOUT_S, DEFAULT_CALL_TIMEOUT_S, DEFAULT_QUEUE, DEFAULT_TENANT
from worker.envelope import ToolResult
from worker.http.egress import EgressPolicy, check_callback
from worker.loop import LoopThread
from worker.settings import get_settings
from worker.shards import Shards

T = TypeVar("T")
# The synchronous client's last resort, should the loop itself not answer (the async code bounds every wait).
_SYNC_GUARD_S = 5.0


class ToolClient:
    """The synchronous client: the asyncio client on a background loop."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        shards: str | None = None,
        queue: str = DEFAULT_QUEUE,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        checked_tenant(tenant)
        if shards is not None:
            Shards.parse(shards)  # raised here, not on the loop
        self._loop = LoopThread("toolclient-loop")
        self._async = self._run(_make_async(redis_url, shards, queue, tenant), 30)

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> ToolResult:
        call = self._async.acall(
            tool, arguments, headers=headers, timeout=timeout, tenant=tenant, user=user, callback_url=callback_url
        )
        return self._run(call, timeout)

    def run_code(
        self, code: str, *, timeout: float = CODE_CALL_TIMEOUT_S, tenant: str | None = None, user: str | None = None
    ) -> ToolResult:
        """Run a program (code mode): see `AsyncToolClient.arun_code`."""
        return self._run(self._async.arun_code(code, timeout=timeout, tenant=tenant, user=user), timeout)

    def submit(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> CallHandle:
        # Returns at once, so that calls submitted in a row leave together in batch messages.
        if callback_url is not None:  # raised here, as the asynchronous client raises it from submit_many
            check_callback(EgressPolicy.parse(get_settings().callback_allow), callback_url)
        call_id = str(uuid.uuid4())
        spec = (tool, arguments or {}, headers or {})
        submit = self._async.submit_many(
            [spec], timeout=timeout, call_ids=[call_id], tenant=tenant, user=user, callback_url=callback_url
        )
        sent = asyncio.run_coroutine_threadsafe(submit, self._loop.loop)
        return CallHandle(self._async, self._run, call_id, sent)

    def call_many(
        self,
        calls: Iterable[CallSpec],
        *,
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        tenant: str | None = None,
        user: str | None = None,
        callback_url: str | None = None,
    ) -> list[ToolResult]:
        many = self._async.acall_many(list(calls), timeout=timeout, tenant=tenant, user=user, callback_url=callback_url)
        return self._run(many, timeout)

    def tools(self, tags: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return self._run(self._async.tools(tags), DEFAULT_CALL_TIMEOUT_S)

    def schema(self, names: Sequence[str]) -> dict[str, Any]:
        return self._run(self._async.schema(names), DEFAULT_CALL_TIMEOUT_S)

    def search(self, question: str, top_k: int = 5) -> list[dict[str, Any]]:
        return self._run(self._async.search(question, top_k), DEFAULT_CALL_TIMEOUT_S)

    def close(self) -> None:
        self._loop.stop(self._async.aclose())

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return self._loop.run(coro, timeout + CLIENT_SLACK_S + _SYNC_GUARD_S)


async def _make_async(redis_url: str | None, shards: str | None, queue: str, tenant: str) -> AsyncToolClient:
    return AsyncToolClient(redis_url, shards=shards, queue=queue, tenant=tenant)
