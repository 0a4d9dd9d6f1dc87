"""Result publication (worker/results.py) on fakeredis: once per callId, and after the script cache is lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.constants import DONE_KEY_PREFIX, REDACTED, RESULT_KEY_PREFIX
from worker.envelope import ToolResult
from worker.protocol import envelope_from_meta, redacted_repr
from worker.queue.publisher import Publisher

STREAM = "toolworker:replies:test"


@pytest.fixture
async def publisher() -> AsyncIterator[Publisher]:
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    yield Publisher(client, ttl_s=60, stream_maxlen=1000)
    await client.aclose()


def result(call_id: str, text: str = "ok") -> ToolResult:
    return ToolResult(call_id=call_id, tool="t", exit_code=0, status_code=200, result=text)


async def stream_call_ids(publisher: Publisher) -> list[str]:
    entries = await publisher.client.xrange(STREAM)
    return [json.loads(fields[b"envelope"])["callId"] for _, fields in entries]


async def test_each_call_is_published_once(publisher: Publisher) -> None:
    assert await publisher.publish([(result("a"), STREAM), (result("b"), STREAM)]) == [True, True]
    assert await publisher.publish([(result("a", "second run"), STREAM)]) == [False]
    assert await stream_call_ids(publisher) == ["a", "b"]
    stored = await publisher.client.get(RESULT_KEY_PREFIX + "a")
    assert stored is not None
    assert envelope_from_meta(stored)["result"] == "ok"  # the first result stays
    assert await publisher.already_done(["a", "b", "c"]) == {"a", "b"}


async def test_publishes_after_the_script_cache_is_flushed(publisher: Publisher) -> None:
    assert await publisher.publish([(result("a"), None)]) == [True]
    await publisher.client.script_flush()
    assert await publisher.publish([(result("b"), STREAM), (result("a"), STREAM)]) == [True, False]
    assert await stream_call_ids(publisher) == ["b"]
    assert await publisher.client.exists(DONE_KEY_PREFIX + "b") == 1


async def test_results_of_one_tick_share_a_flush(publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []
    publish = publisher.publish

    async def counting(results: list[tuple[ToolResult, str | None]]) -> list[bool]:
        batches.append(len(results))
        return await publish(results)

    monkeypatch.setattr(publisher, "publish", counting)
    outcomes = await asyncio.gather(*(publisher.publish_one(result(f"c{i}"), STREAM) for i in range(5)))
    assert outcomes == [True] * 5
    assert batches == [5]
    assert await stream_call_ids(publisher) == [f"c{i}" for i in range(5)]


def _full_repr(message: Any) -> str:
    """redacted_repr's text before the cap, encoding everything."""
    if isinstance(message, list):
        return "[" + ", ".join(_full_repr(item) for item in message) + "]"
    if isinstance(message, dict) and isinstance(message.get("headers"), dict):
        message = {**message, "headers": dict.fromkeys(message["headers"], REDACTED)}
    return json.dumps(message, ensure_ascii=False, default=str)


_calls = st.lists(
    st.fixed_dictionaries(
        {"callId": st.text(max_size=80), "arguments": st.dictionaries(st.text(max_size=5), st.text(max_size=300))},
        optional={"headers": st.dictionaries(st.text(max_size=8), st.text(max_size=20))},
    ),
    max_size=40,
)


@given(st.one_of(_calls.map(lambda calls: [calls]), st.lists(st.lists(st.text(max_size=40), max_size=60), max_size=6)))
def test_argsrepr_is_the_capped_repr_without_encoding_what_is_cut(args: list[Any]) -> None:
    """Task events show a batch's first calls; the repr stops encoding once past the cap."""
    full = _full_repr(args)
    expected = full if len(full) <= 1024 else full[:1021] + "..."
    assert redacted_repr(args) == expected
