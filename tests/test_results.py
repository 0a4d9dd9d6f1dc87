"""Result publication (worker/results.py) on fakeredis: once per callId, and after the script cache is lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from worker.constants import REDACTED, RESULT_KEY_PREFIX
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
    assert await publisher.already_done(["a", "b", "c"]) == {"a", "b"}


async def test_results_of_one_tick_share_a_flush(publisher: Publisher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Results finished in the same loop tick go to Redis in one round trip."""
    batches: list[int] = []
    outcomes_of = publisher._outcomes

    async def counting(results: list[tuple[ToolResult, str | None]]) -> list[Any]:
        batches.append(len(results))
        return await outcomes_of(results)

    monkeypatch.setattr(publisher, "_outcomes", counting)
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


async def test_text_that_is_not_unicode_is_published_valid(publisher: Publisher) -> None:
    """Header bytes that were not UTF-8 (carried as surrogates) are published read as Latin-1, other
    unpaired surrogates as U+FFFD: the envelope is valid UTF-8 and says what the upstream sent."""
    bad = ToolResult(
        call_id="u1",
        tool="t",
        status_code=404,
        content_type="text/plain; charset=\udcff",
        result="half \ud800 pair",
        error={"type": "http_error", "message": "HTTP 404 N\udce3o encontrado"},
        exit_code=22,
    )
    assert await publisher.publish_one(bad, STREAM) is True
    entries = await publisher.client.xrange(STREAM)
    envelope = json.loads(entries[0][1][b"envelope"].decode("utf-8"))  # strict: valid UTF-8
    assert envelope["contentType"] == "text/plain; charset=ÿ"
    assert envelope["error"]["message"] == "HTTP 404 Não encontrado"
    assert envelope["result"] == "half \ufffd pair"
    assert envelope["exitCode"] == 22
    stored = await publisher.client.get(RESULT_KEY_PREFIX + "u1")
    assert stored is not None and envelope_from_meta(stored) == envelope


async def test_an_envelope_that_cannot_be_encoded_is_published_as_an_internal_error(publisher: Publisher) -> None:
    """A field JSON cannot carry makes the call's envelope an internal error (70), never no envelope."""
    broken = ToolResult(call_id="b1", tool="t", headers={"X-Raw": b"bytes"})  # type: ignore[dict-item]
    with capture_logs() as logs:
        assert await publisher.publish([(broken, STREAM), (result("b2"), STREAM)]) == [True, True]
    envelopes = [json.loads(fields[b"envelope"]) for _, fields in await publisher.client.xrange(STREAM)]
    assert [(e["callId"], e["exitCode"]) for e in envelopes] == [("b1", 70), ("b2", 0)]
    assert envelopes[0]["error"]["type"] == "internal_error"
    assert [entry["event"] for entry in logs] == ["result.unencodable"]


async def test_one_failed_publication_fails_only_its_own_call(publisher: Publisher) -> None:
    """A reply stream key that holds no stream fails that call's publication alone; the others of the
    same round trip are published and their callers told so."""
    await publisher.client.set("not-a-stream", "x")
    outcomes = await asyncio.gather(
        publisher.publish_one(result("p1"), STREAM),
        publisher.publish_one(result("p2"), "not-a-stream"),
        publisher.publish_one(result("p3"), STREAM),
        return_exceptions=True,
    )
    assert outcomes[0] is True and outcomes[2] is True
    assert isinstance(outcomes[1], redis.exceptions.ResponseError)
    assert await stream_call_ids(publisher) == ["p1", "p3"]
