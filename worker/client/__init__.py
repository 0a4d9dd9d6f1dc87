"""The client: enqueue tool calls and wait for their envelopes, synchronously or on asyncio.

sync_client.py   ToolClient: the asynchronous client run on a background loop
handles.py       CallHandle: a call the synchronous client submitted, waited for when asked
async_client.py  AsyncToolClient: submit, call, await results, read the catalog
messages.py      a call as a message: its checks and its fields
outbox.py        one flush per loop tick and shard, batch messages per queue and tenant
replies.py       the reply stream read on every shard a call went to; the calls awaited
stored.py        the result store, read once within a bound or polled
routing.py       one Link per shard (its connections), the shard of a tenant and of a call
"""

from worker.client.async_client import AsyncToolClient
from worker.client.handles import CallHandle
from worker.client.messages import CallSpec, checked_tenant
from worker.client.sync_client import ToolClient
from worker.protocol import task_messages

__all__ = [
    "AsyncToolClient",
    "CallHandle",
    "CallSpec",
    "ToolClient",
    "checked_tenant",
    "task_messages",
]
