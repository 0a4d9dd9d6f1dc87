"""The fair take's scripts against fakeredis (Lua): the order tenants are served in, their limits, and the
bookkeeping that acknowledgement and recovery rely on; and the fair turns inside a worker."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.call.fairness import FairTurns
from worker.constants import CALLS_HEADER, DEFAULT_QUEUE, OVER_QUOTA_HEADER, TENANT_LIMITS_KEY
from worker.queue import scheduler

SUFFIXES = ["", "\x06\x163", "\x06\x166", "\x06\x169"]  # kombu's default priority steps
PREFIX = "toolworker:inflight:test:"


def _message(name: str, calls: int = 1) -> str:
    return json.dumps({"body": "[]", "headers": {"id": name, CALLS_HEADER: calls}, "properties": {}})


def _push(r: fakeredis.FakeRedis, tenant: str, name: str, calls: int = 1) -> bool:
    with r.pipeline(transaction=False) as pipe:
        scheduler.enqueue(pipe, DEFAULT_QUEUE, tenant, [_message(name, calls)], calls)
        (reply,) = pipe.execute()
    return scheduler.refused_limit(reply) is None


def _take(r: fakeredis.FakeRedis) -> tuple[str, dict] | None:
    reply = r.execute_command(*scheduler.take_command([DEFAULT_QUEUE], PREFIX, SUFFIXES))
    if reply is None:
        return None
    return scheduler.source_of(reply[0].decode())[1], json.loads(reply[1])


def _limits(r: fakeredis.FakeRedis, **table: str) -> None:
    r.hset(TENANT_LIMITS_KEY, mapping=table)


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def test_weights_share_each_round_by_calls(r: fakeredis.FakeRedis) -> None:
    """Weights 1:3, both with work: each round gives 100 calls to one and 300 to the other, alternately."""
    _limits(r, a="1 0 0", b="3 0 0")
    for i in range(800):
        _push(r, "a", f"a{i}")
        _push(r, "b", f"b{i}")
    order = [_take(r) for _ in range(800)]
    assert all(item is not None for item in order)
    tenants = [item[0] for item in order if item is not None]
    assert Counter(tenants) == {"a": 200, "b": 600}
    assert tenants[:100] == ["a"] * 100 and tenants[100:400] == ["b"] * 300  # a joined the ring first


def test_a_batch_counts_its_calls(r: fakeredis.FakeRedis) -> None:
    """A tenant sending batches of 100 calls gets one batch a round against another's 100 single calls."""
    for i in range(3):
        _push(r, "bulk", f"batch{i}", calls=100)
    for i in range(200):
        _push(r, "live", f"one{i}")
    tenants = [item[0] for item in (_take(r) for _ in range(202)) if item is not None]
    assert tenants[:1] == ["bulk"] and tenants[1:101] == ["live"] * 100 and tenants[101] == "bulk"


def test_the_default_tenant_keeps_priorities_and_takes_its_turn(r: fakeredis.FakeRedis) -> None:
    """Stock producers' messages (the queue's own lists) go by priority, and share the queue with tenants."""
    r.lpush(DEFAULT_QUEUE + "\x06\x166", _message("low"))
    r.lpush(DEFAULT_QUEUE, _message("high"))
    _push(r, "acme", "acme1")
    taken = [_take(r) for _ in range(4)]
    names = [(item[0], item[1]["headers"]["id"]) for item in taken if item is not None]
    assert names == [("default", "high"), ("default", "low"), ("acme", "acme1")]
    assert taken[3] is None


def test_a_tenant_at_max_in_flight_waits_and_others_go_on(r: fakeredis.FakeRedis) -> None:
    """At its max_in_flight a tenant is passed over (its calls wait); released calls let it go on."""
    _limits(r, capped="1 2 0")
    for i in range(4):
        _push(r, "capped", f"c{i}")
    _push(r, "other", "o1")
    first = [_take(r) for _ in range(4)]
    assert [item[0] for item in first if item is not None] == ["capped", "capped", "other"]
    assert first[3] is None
    assert int(r.hget(scheduler.IN_FLIGHT_KEY, "capped")) == 2
    inflight = PREFIX + scheduler.tenant_list(DEFAULT_QUEUE, "capped")
    item = r.lindex(inflight, -1)
    with r.pipeline(transaction=False) as pipe:
        pipe.lrem(inflight, 1, item)
        scheduler.release(pipe, scheduler.tenant_list(DEFAULT_QUEUE, "capped"), item)
        pipe.execute()
    after = _take(r)
    assert after is not None and after[0] == "capped"


def test_max_queued_refuses_at_enqueue_and_marks_raw_excess(r: fakeredis.FakeRedis) -> None:
    """The enqueue script refuses calls past max_queued; a message pushed past it by hand is marked when taken."""
    _limits(r, small="1 0 3")
    assert [_push(r, "small", f"s{i}") for i in range(4)] == [True, True, True, False]
    r.lpush(scheduler.tenant_list(DEFAULT_QUEUE, "small"), _message("raw"))  # a raw producer, counted by hand
    r.hincrby(scheduler.QUEUED_KEY, "small", 1)
    marks = [item[1]["headers"].get(OVER_QUOTA_HEADER) for item in (_take(r) for _ in range(4)) if item is not None]
    assert marks == [3, None, None, None]  # 4 waiting against a limit of 3: one refused


def test_a_tenant_push_wakes_an_idle_worker_and_the_take_drops_the_wake_up(r: fakeredis.FakeRedis) -> None:
    """A push to a tenant's list adds a wake-up to the empty default list; takes never deliver it."""
    _push(r, "acme", "a1")
    assert r.lrange(DEFAULT_QUEUE, 0, -1) == [scheduler.WAKE.encode()]
    taken = _take(r)
    assert taken is not None and taken[0] == "acme"
    assert _take(r) is None and r.llen(DEFAULT_QUEUE) == 0


def test_requeued_messages_rejoin_their_tenant(r: fakeredis.FakeRedis) -> None:
    """A message handed back (a dead holder's) is waiting again, counted, its tenant back in the ring."""
    _push(r, "acme", "a1", calls=5)
    _take(r)
    source = scheduler.tenant_list(DEFAULT_QUEUE, "acme")
    raw = r.rpop(PREFIX + source)
    assert int(r.hget(scheduler.IN_FLIGHT_KEY, "acme")) == 5 and int(r.hget(scheduler.QUEUED_KEY, "acme")) == 0
    with r.pipeline(transaction=True) as pipe:
        pipe.rpush(source, raw)
        scheduler.requeued(pipe, source, raw)
        pipe.execute()
    assert int(r.hget(scheduler.IN_FLIGHT_KEY, "acme")) == 0 and int(r.hget(scheduler.QUEUED_KEY, "acme")) == 5
    again = _take(r)
    assert again is not None and again[1]["headers"]["id"] == "a1"


backlogs = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.tuples(st.integers(1, 4), st.lists(st.integers(1, 100), min_size=1, max_size=12)),
    min_size=2,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(backlogs=backlogs, late=st.sampled_from(["a", "b", "c", "d"]), late_after=st.integers(0, 20))
def test_every_call_is_taken_and_nobody_waits_more_than_a_round(
    backlogs: dict[str, tuple[int, list[int]]], late: str, late_after: int
) -> None:
    """Whatever the weights and batch sizes, every message is taken once, and while a tenant has work no
    more than one round of the others' calls (weight x 100 + what one batch overdraws) is taken between its
    takes."""
    r = fakeredis.FakeRedis()
    _limits(r, **{name: f"{weight} 0 0" for name, (weight, _) in backlogs.items()})
    waiting: Counter[str] = Counter()
    for name, (_, sizes) in backlogs.items():
        for i, size in enumerate(sizes):
            _push(r, name, f"{name}{i}", size)
            waiting[name] += 1
    expected = sorted(f"{name}{i}" for name, (_, sizes) in backlogs.items() for i in range(len(sizes)))
    taken: list[tuple[str, str, int, set[str]]] = []  # tenant, message, calls, the tenants with work then
    while True:
        if len(taken) == late_after:  # a tenant whose work comes while the others' is under way
            _push(r, late, "late", 1)
            waiting[late] += 1
            expected = sorted([*expected, "late"])
        with_work = {name for name, count in waiting.items() if count}
        if (item := _take(r)) is None:
            break
        waiting[item[0]] -= 1
        taken.append((item[0], item[1]["headers"]["id"], item[1]["headers"][CALLS_HEADER], with_work))
    assert sorted(name for _, name, _, _ in taken) == expected
    weights = {late: 1} | {name: weight for name, (weight, _) in backlogs.items()}  # late: maybe a new tenant
    for tenant in waiting:
        round_calls = sum(w * scheduler.QUANTUM_CALLS + 99 for name, w in weights.items() if name != tenant)
        since = 0
        for who, _, calls, with_work in taken:
            since = 0 if who == tenant or tenant not in with_work else since + calls
            assert since <= round_calls


async def test_fair_turns_serve_a_lone_call_before_a_batch() -> None:
    """With a batch of one tenant waiting for turns, another tenant's single call gets the next turn."""
    turns = FairTurns(1, lambda tenant: 1)
    await turns.acquire("bulk")
    served: list[str] = []

    async def call(tenant: str) -> None:
        await turns.acquire(tenant)
        served.append(tenant)
        turns.release()

    waiting = [asyncio.create_task(call("bulk")) for _ in range(50)]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(call("live")))
    await asyncio.sleep(0)
    turns.release()
    await asyncio.gather(*waiting)
    assert served.index("live") <= 1


async def test_fair_turns_follow_weights_and_skip_who_gave_up() -> None:
    """Turns go 1:3 by weight while both wait; a waiter that timed out is skipped, its turn passed on."""
    turns = FairTurns(1, {"a": 1, "b": 3}.get)  # type: ignore[arg-type]
    await turns.acquire("x")
    served: list[str] = []

    async def call(tenant: str) -> None:
        await turns.acquire(tenant)
        served.append(tenant)
        turns.release()

    quitter = asyncio.create_task(asyncio.wait_for(turns.acquire("a"), 0.01))
    tasks = [asyncio.create_task(call(t)) for t in ["a"] * 4 + ["b"] * 12]
    with pytest.raises(TimeoutError):
        await quitter
    turns.release()
    await asyncio.gather(*tasks)
    assert served == (["a"] + ["b"] * 3) * 4
    assert not turns.locked()


def _take_many(r: fakeredis.FakeRedis, count: int) -> list[tuple[str, str]]:
    reply = r.execute_command(*scheduler.take_command([DEFAULT_QUEUE], PREFIX, SUFFIXES, count))
    if reply is None:
        return []
    taken = scheduler.taken_messages(reply)
    return [(scheduler.source_of(src.decode())[1], json.loads(item)["headers"]["id"]) for src, item in taken]


def _mixed_backlog(r: fakeredis.FakeRedis) -> None:
    _limits(r, a="1 0 0", b="3 0 0", capped="1 3 0")
    for i in range(150):
        _push(r, "a", f"a{i}")
        _push(r, "b", f"b{i}")
    for i in range(6):
        _push(r, "capped", f"c{i}")
        _push(r, "bulk", f"bulk{i}", calls=40)
    r.lpush(DEFAULT_QUEUE, *[_message(f"stock{i}") for i in range(20)])


@pytest.mark.parametrize("count", [3, 16])
def test_a_take_of_many_takes_what_takes_of_one_would(count: int) -> None:
    """A take of up to `count` messages takes them in the order as many takes of one would: weights, turns,
    max_in_flight and stock producers' lists as before; it stops at a quantum of calls, and says what is left."""
    one, many = fakeredis.FakeRedis(), fakeredis.FakeRedis()
    _mixed_backlog(one)
    _mixed_backlog(many)
    alone = [(item[0], item[1]["headers"]["id"]) for item in iter(lambda: _take(one), None)]
    together: list[tuple[str, str]] = []
    sizes: list[int] = []
    while taken := _take_many(many, count):
        together += taken
        sizes.append(len(taken))
    assert together == alone and len(alone) == 150 * 2 + 3 + 6 + 20  # capped: its max_in_flight, 3
    assert max(sizes) == count and len(sizes) < len(alone)


def test_a_take_of_many_stops_at_a_quantum_of_calls() -> None:
    r = fakeredis.FakeRedis()
    for i in range(6):
        _push(r, "bulk", f"bulk{i}", calls=40)
    assert [name for _, name in _take_many(r, 16)] == ["bulk0", "bulk1", "bulk2"]  # 120 calls: no fourth


def test_a_take_of_many_says_whether_anything_is_left() -> None:
    r = fakeredis.FakeRedis()
    for i in range(5):
        _push(r, "default", f"d{i}")
    first = r.execute_command(*scheduler.take_command([DEFAULT_QUEUE], PREFIX, SUFFIXES, 3))
    assert len(scheduler.taken_messages(first)) == 3 and first[2] == 1
    last = r.execute_command(*scheduler.take_command([DEFAULT_QUEUE], PREFIX, SUFFIXES, 3))
    assert len(scheduler.taken_messages(last)) == 2 and last[2] == 0
