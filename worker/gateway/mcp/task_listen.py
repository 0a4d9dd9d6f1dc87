"""Push for tasks (2026-07-28): a `subscriptions/listen` whose filter names `taskIds` (the tasks extension's
key) gets `notifications/tasks`, the task as `tasks/get` gives it, on each change of those tasks, read from
Redis every poll interval; any other filter is the SDK's own handler."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

import mcp_types as types
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, ServerEvent, event_matches, event_to_notification
from pydantic import BaseModel
from starlette.requests import Request

from worker.gateway.calls import Calls
from worker.gateway.identity.principals import LOCAL, Principal, principal_of
from worker.gateway.mcp.task_store import TaskStore
from worker.gateway.mcp.task_views import detailed, view_of

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    Context = ServerRequestContext[Any, Any]

# A listen stream's bound on list-changed events waiting to be sent, and on the tasks it watches.
LISTEN_BACKLOG = 1024
MAX_LISTENED_TASKS = 100


class Notification(BaseModel):
    method: str
    params: dict[str, Any]


async def send(ctx: Context, notification: BaseModel) -> None:
    """A notification on the request's own stream (the SDK types only the core vocabulary; it sends any model)."""
    core = cast(types.ServerNotification, notification)  # typed as the core vocabulary, sent as any model
    await ctx.session.send_notification(core, related_request_id=ctx.request_id)


def principal(ctx: Context) -> Principal:
    return principal_of(ctx.request.scope) if isinstance(ctx.request, Request) else LOCAL


class TaskWatch:
    """The tasks a listen stream names, watched in Redis for the principal that asked."""

    def __init__(self, calls: Calls, store: TaskStore, poll_ms: int) -> None:
        self.calls = calls
        self.store = store
        self.poll_ms = poll_ms

    async def listen(
        self, ctx: Context, requested: types.SubscriptionFilter, task_ids: list[str], bus: SubscriptionBus
    ) -> types.SubscriptionsListenResult:
        """A listen stream whose filter names `taskIds`: `notifications/tasks` (the task as `tasks/get` gives it)
        whenever one of them changes, beside the list-changed events the filter also asks for. It ends once
        every named task has ended, unless it listens for those too. Another principal's task is never told of.
        """
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        honored = types.SubscriptionFilter.model_validate(
            {**requested.model_dump(by_alias=True, exclude_none=True), "taskIds": task_ids}
        )
        events: asyncio.Queue[ServerEvent] = asyncio.Queue(maxsize=LISTEN_BACKLOG)
        uris = frozenset(honored.resource_subscriptions or ())

        def deliver(event: ServerEvent) -> None:
            if event_matches(honored, uris, event) and not events.full():
                events.put_nowait(event)

        unsubscribe = bus.subscribe(deliver)
        try:
            acknowledged = types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=meta)
            await send(ctx, types.SubscriptionsAcknowledgedNotification(params=acknowledged))
            keep_open = any(
                (requested.tools_list_changed, requested.prompts_list_changed, requested.resources_list_changed, uris)
            )
            await self._watch(ctx, task_ids, events, meta, keep_open)
        finally:
            unsubscribe()
        return types.SubscriptionsListenResult(_meta=meta)

    async def _watch(
        self,
        ctx: Context,
        task_ids: list[str],
        events: asyncio.Queue[ServerEvent],
        meta: dict[str, Any],
        keep_open: bool,
    ) -> None:
        who, told = principal(ctx).name, dict[str, Any]()
        watched: list[str] = list(dict.fromkeys(task_ids))
        while watched or keep_open:
            for task_id in list(watched):
                record = await self.store.get(task_id, who)
                view = None if record is None else await view_of(self.calls, record)
                if view is None or view.terminal:
                    watched.remove(task_id)
                if view is None:
                    continue
                shown = detailed(view)
                now = {key: value for key, value in shown.items() if key != "lastUpdatedAt"}
                if told.get(task_id) != now:
                    told[task_id] = now
                    await send(ctx, Notification(method="notifications/tasks", params={**shown, "_meta": meta}))
            try:
                event = await asyncio.wait_for(events.get(), self.poll_ms / 1000)
            except TimeoutError:
                continue
            await send(ctx, event_to_notification(event, meta))


class TaskListen:
    """`subscriptions/listen`: the SDK's handler, unless the filter names `taskIds` (the tasks extension's key,
    which the SDK's handler does not know): then TaskWatch.listen."""

    def __init__(self, bus: SubscriptionBus, watch: TaskWatch | None) -> None:
        self._bus = bus
        self._sdk = ListenHandler(bus)
        self._watch = watch

    async def __call__(self, ctx: Context, params: types.SubscriptionsListenRequestParams) -> Any:
        task_ids = (params.notifications.model_extra or {}).get("taskIds")
        if self._watch is None or not task_ids:
            return await self._sdk(ctx, params)
        if not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids):
            raise MCPError(code=types.INVALID_PARAMS, message="taskIds must be a list of task ids")
        return await self._watch.listen(ctx, params.notifications, task_ids[:MAX_LISTENED_TASKS], self._bus)
