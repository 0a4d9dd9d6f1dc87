"""The client's reply stream: one per client, read on every shard a call went to (a Redis stream survives
a reconnect, where pub/sub would drop what was sent meanwhile); each envelope read answers the future its
call is awaited on, and a call not answered in time is read from the result store once."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisError

from worker.client.routing import READ_BLOCK_MS, Link, Routing, one_line
from worker.client.stored import StoredResults
from worker.constants import CLIENT_SLACK_S, DEFAULT_CALL_TIMEOUT_S
from worker.envelope import ToolResult

_READ_COUNT = 1000
# Envelopes read are trimmed off the reply stream once this many are there (one command for many calls).
_TRIM_EVERY = 64


class Replies:
    """The calls awaited by this client, answered from its reply stream or, late, from the result store."""

    def __init__(self, routing: Routing) -> None:
        self.stream = f"toolworker:replies:{uuid.uuid4().hex}"
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.stored = StoredResults(routing)
        self._routing = routing
        self._closing = False

    def expect(self, call_ids: Iterable[str], link: Link) -> None:
        """Calls about to leave through `link`: their envelopes are awaited, and its reply stream read."""
        self._ensure_reader(link)
        loop = asyncio.get_running_loop()
        expected = list(call_ids)
        for call_id in expected:
            self.waiting[call_id] = loop.create_future()
        self._routing.sent(expected, link)

    def forget(self, call_ids: Iterable[str]) -> None:
        forgotten = list(call_ids)
        for call_id in forgotten:
            self.waiting.pop(call_id, None)
        self._routing.forget(forgotten)

    async def result(self, call_id: str, timeout: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """The envelope of a call; raises TimeoutError when it does not come in time (RedisLost when Redis
        does not answer either). A call submitted by another client is looked for on every shard."""
        future = self.waiting.get(call_id)
        if future is None:  # not submitted by this client: read the stored result
            return await self.stored.poll(call_id, timeout)
        try:
            envelope = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            stored = await self.stored.one(call_id, CLIENT_SLACK_S)
            if stored is None:
                raise TimeoutError(f"no result for call {call_id} within {timeout:g} s") from None
            envelope = stored
        finally:  # answered or given up on: a long-lived client keeps no entry behind
            self.forget([call_id])
        return ToolResult.from_dict(envelope)

    async def collect(self, call_ids: list[str], tools: list[str], wait_s: float, timeout: float) -> list[ToolResult]:
        """The envelopes of calls submitted here, in order, waited for together (one timer, no task each).
        A call still unanswered after `wait_s` is read from the result store, else ends with 28."""
        futures = [self.waiting[call_id] for call_id in call_ids]
        try:
            pending = [future for future in futures if not future.done()]
            if pending:
                await asyncio.wait(pending, timeout=wait_s)
            late = [call_id for call_id, future in zip(call_ids, futures, strict=True) if not future.done()]
            stored = await self.stored.many(late, CLIENT_SLACK_S, "while waiting for results") if late else []
            stored_by_id = dict(zip(late, stored, strict=True))
            results = []
            for call_id, tool, future in zip(call_ids, tools, futures, strict=True):
                envelope = future.result() if future.done() else stored_by_id[call_id]
                results.append(
                    ToolResult.from_dict(envelope) if envelope is not None else _unanswered(call_id, tool, timeout)
                )
            return results
        finally:  # also when the caller is cancelled: a long-lived client keeps no entry behind
            self.forget(call_ids)

    async def close(self) -> None:
        # A blocked XREAD does not honour cancellation promptly: drop its connection instead.
        self._closing = True
        links = self._routing.links.values()
        for link in links:
            await link.reader_redis.connection_pool.disconnect()
        readers = {link.reader for link in links if link.reader is not None}
        if readers:
            await asyncio.wait(readers, timeout=READ_BLOCK_MS / 1000 + 1)
            for reader in readers:
                reader.cancel()
            # And awaited (a cancelled task ends within a few turns of the loop): one still running when the
            # pools are closed puts its connection back into a closed pool, where its socket stays open.
            await asyncio.wait(readers)

    def _ensure_reader(self, link: Link) -> None:
        """Replies are read from a shard once a call went there (an idle shard is not polled)."""
        if link.reader is None or link.reader.done():
            link.reader = asyncio.get_running_loop().create_task(self._read(link))

    async def _read(self, link: Link) -> None:
        last_id, read_kept = "0-0", 0
        while not self._closing:
            try:
                answer: Any = await link.reader_redis.xread(
                    {self.stream: last_id}, count=_READ_COUNT, block=READ_BLOCK_MS
                )
            except RedisError as exc:
                link.read_error = one_line(exc)
                if not self._closing:
                    await asyncio.sleep(0.5)  # Redis is away: try again without spinning
                continue
            link.read_error = None
            for _stream, entries in answer or []:
                for entry_id, fields in entries:
                    last_id, read_kept = entry_id, read_kept + 1
                    self._deliver(json.loads(fields[b"envelope"]))
            if read_kept >= _TRIM_EVERY:  # what was read leaves the stream, a few dozen at a time
                await link.reader_redis.xtrim(self.stream, minid=last_id, approximate=False)
                read_kept = 0

    def _deliver(self, envelope: dict[str, Any]) -> None:
        future = self.waiting.get(str(envelope.get("callId")))
        if future is not None and not future.done():
            future.set_result(envelope)


def _unanswered(call_id: str, tool: str, timeout: float) -> ToolResult:
    return ToolResult(
        call_id=call_id,
        tool=tool,
        exit_code=28,
        error={"type": "timeout", "message": f"The tool did not answer within {timeout:g} seconds."},
    )
