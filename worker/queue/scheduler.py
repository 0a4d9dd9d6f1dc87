"""The fair take: tenants share each queue by weight, fleet-wide, with deficit round robin in Redis.

Every queue has one list per tenant; the default tenant's lists are the queue's own (kombu's, with their
priority lists), so stock Celery producers and a raw `LPUSH toolcalls` are unchanged. A ring of the tenants
with work is kept in step with the lists by the scripts that push and take:

    <queue>, <queue>\\x06\\x16<pri>         the default tenant's lists (kombu's keys: priorities keep their order)
    <queue>\\x06\\x16@<tenant>              a named tenant's list (the queue's sub-list, like a priority's)
    toolworker:tenants:ring:<queue>       ZSET of the tenants with work, in turn order (default always in it)
    toolworker:tenants:deficit:<queue>    HASH tenant -> calls it may still take in its turn
    toolworker:tenants:turn:<queue>       the tenant whose turn it is
    toolworker:tenants:seq:<queue>        the turn counter (ring scores)
    toolworker:tenants:limits             HASH tenant -> "weight max_in_flight max_queued" (0: none), written
                                          from the definitions (worker/definitions/redis_store.py)
    toolworker:tenants:in_flight          HASH tenant -> calls taken and not yet acknowledged (fleet-wide)
    toolworker:tenants:queued             HASH tenant -> calls waiting, as counted at enqueue

The take (TAKE, one EVAL) serves the tenant at the head of the ring: at the start of its turn it is given
`weight x QUANTUM_CALLS` calls; it takes the oldest message while it has calls left (a batch counts its
calls, from the CALLS_HEADER), then goes to the back of the ring, carrying what it overdrew into its next
turn. A tenant whose list a take empties leaves the ring at once (and one found empty at its turn); one at
its max_in_flight is passed over (its calls wait). While no named tenant has work, the take only looks at
the default tenant's lists (three commands when they are empty). Its reply says whether anything is left.
The message is moved into the holder's in-flight list in the same script (take and record stay one step).
One EVAL may take several messages (up to TAKE_AT_ONCE, and about one quantum of calls), each exactly as a
take of its own would: a worker fed one call per message then meets its calls in bursts, as it meets a
batch message's, and shares the round trips that follow (the results' publication, the acknowledgements).
When every tenant with work owes calls, the first of them is served anyway: the take never idles with work.

Waiting: an idle worker blocks on the default list with `BLMOVE q q RIGHT RIGHT`, which takes nothing and
returns once the list is not empty; a push to a named tenant's list into an empty default list adds a
wake-up item (WAKE) there, which takes drop. So an idle fleet answers a tenant's call at once.

The in-flight count goes down where a taken message leaves its in-flight list: the acknowledgement
(`settle`: RELEASE with the LREM, one script) and a hand-back (`requeued`: lease recovery, kombu's restore). The scripts
build the tenants' keys from their names rather than taking them as KEYS: one server or Sentinel, as the
broker already requires (Redis Cluster is no Celery broker).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from worker.constants import CALLS_HEADER, DEFAULT_TENANT, OVER_QUOTA_HEADER, TENANT_LIMITS_KEY

SEP = "\x06\x16"  # kombu's separator between a queue and its sub-lists
TENANT_MARK = SEP + "@"
RING_PREFIX = "toolworker:tenants:ring:"
DEFICIT_PREFIX = "toolworker:tenants:deficit:"
TURN_PREFIX = "toolworker:tenants:turn:"
SEQ_PREFIX = "toolworker:tenants:seq:"
IN_FLIGHT_KEY = "toolworker:tenants:in_flight"
QUEUED_KEY = "toolworker:tenants:queued"
# An enqueue's once-key, kept longer than the resilient client retries a command (about a minute).
ENQUEUE_ONCE_PREFIX = "toolworker:enqueued:"
ENQUEUE_ONCE_TTL_S = 300
# A tenant's share of one turn, per unit of weight: the client's largest batch, so that every turn takes
# at least one message.
QUANTUM_CALLS = 100
WAKE = "toolworker:wake"
# The most messages one take brings (the broker's channel asks for as many as its consumer may still hold, up
# to this): messages taken together reach the event loop together, so their results are published, and their
# acknowledgements sent, in shared round trips.
TAKE_AT_ONCE = 16
# kombu's Redis transport keeps priorities 3, 6 and 9 of a queue in lists of their own (its default steps).
PRIORITY_SUFFIXES = ("", SEP + "3", SEP + "6", SEP + "9")
_CALLS_RE = re.compile(rb'"' + re.escape(CALLS_HEADER.encode()) + rb'": (\d+)')

_COMMON = """
local DEFAULT, TENANT_MARK, WAKE = '$DEFAULT', '$TENANT_MARK', '$WAKE'
local LIMITS, IN_FLIGHT, QUEUED = '$LIMITS', '$IN_FLIGHT', '$QUEUED'
local RING, SEQ = '$RING', '$SEQ'

local known = {}
local function limits(t)
  if not known[t] then
    local own = redis.call('HMGET', LIMITS, t, DEFAULT)
    local raw = own[1] or own[2] or '1 0 0'
    local w, f, q = string.match(raw, '^(%d+) (%d+) (%d+)$')
    known[t] = {tonumber(w) or 1, tonumber(f) or 0, tonumber(q) or 0}
  end
  return known[t][1], known[t][2], known[t][3]
end

local function header_calls(item)
  return tonumber(string.match(item, '"$CALLS_PATTERN": (%d+)'))
end
"""

# KEYS: the queues, in the order to serve them. ARGV[1]: how many messages to take at most; ARGV[2]: the
# holder's in-flight list prefix; ARGV[3...]: the suffixes of the default tenant's lists, in priority order.
# Returns nil, or {source, message, more, source2, message2, ...}: the messages of the first queue that had
# any, in the order taken, each one take as if alone (so tenants' turns and limits hold per message), until
# the count or QUANTUM calls are taken. A take with no named tenant in a queue's ring and nothing in its
# default lists costs three commands; a named tenant whose list a take empties leaves the ring at once (not
# at its next turn).
TAKE = (
    _COMMON
    + """
local DEFICIT, TURN, QUANTUM, OVER = '$DEFICIT', '$TURN', $QUANTUM, '$OVER'
local count, prefix, suffixes = tonumber(ARGV[1]), ARGV[2], {}
for i = 3, #ARGV do suffixes[#suffixes + 1] = ARGV[i] end

local function default_lists(q)
  local keys = {}
  for _, suffix in ipairs(suffixes) do keys[#keys + 1] = q .. suffix end
  return keys
end

local function oldest(keys, looked)
  -- one look at every priority
  if #keys > 1 and not looked and redis.call('EXISTS', unpack(keys)) == 0 then return nil end
  for _, src in ipairs(keys) do
    local item = redis.call('LINDEX', src, -1)
    while item == WAKE do
      redis.call('RPOP', src)
      item = redis.call('LINDEX', src, -1)
    end
    if item then return src, item end
  end
  return nil
end

local turns = {}  -- queue -> the tenant whose turn it is (false: none), read once
local function turn_of(q)
  if turns[q] == nil then turns[q] = redis.call('GET', TURN .. q) or false end
  return turns[q]
end

local function end_turn(q, t)
  if turn_of(q) == t then
    redis.call('DEL', TURN .. q)
    turns[q] = false
  end
end

local function rotate(q, ring, t)
  redis.call('ZADD', ring, redis.call('INCR', SEQ .. q), t)
  end_turn(q, t)
end

local members = {}  -- queue -> how many tenants its ring holds, as this script left it

local function leave(q, ring, t, deficit)
  if t == DEFAULT then return rotate(q, ring, t) end
  redis.call('ZREM', ring, t)
  members[q] = members[q] - 1
  if deficit then redis.call('HDEL', DEFICIT .. q, t) end
  end_turn(q, t)
end

local function over_quota(item, mq)
  local ok, message = pcall(cjson.decode, item)
  if not ok or type(message) ~= 'table' or type(message.headers) ~= 'table' then return item end
  message.headers[OVER] = mq
  return cjson.encode(message)
end

local function move(src, item, t, mq, named)
  local counted = header_calls(item) or (named and 1 or 0)
  local queued = 0
  if counted > 0 then  -- (a positive count only: Redis 7.0 refuses the -0 that Lua makes of a zero)
    queued = redis.call('HINCRBY', QUEUED, t, -counted) + counted
    if queued < counted then redis.call('HSET', QUEUED, t, 0) end  -- never below zero
  elseif mq > 0 then
    queued = tonumber(redis.call('HGET', QUEUED, t)) or 0
  end
  if mq > 0 and queued > mq then
    redis.call('RPOP', src)
    item = over_quota(item, mq)
    redis.call('LPUSH', prefix .. src, item)
  else
    redis.call('LMOVE', src, prefix .. src, 'RIGHT', 'LEFT')
  end
  return item
end

local function turn(q, ring, t, force, looked)  -- looked: the default tenant alone, its lists not empty
  local w, f, mq = limits(t)
  local named = t ~= DEFAULT
  local keys = named and {q .. TENANT_MARK .. t} or default_lists(q)
  local src, item = oldest(keys, looked)
  if not src then return 'empty' end
  local n = header_calls(item) or 1
  if f > 0 then
    local used = tonumber(redis.call('HGET', IN_FLIGHT, t)) or 0
    if used > 0 and used + n > f then return 'capped' end
  end
  if looked then  -- the default tenant alone: no turns to keep
    item = move(src, item, t, mq, false)
    redis.call('HINCRBY', IN_FLIGHT, t, n)
    return 'taken', src, item
  end
  local stored = redis.call('HGET', DEFICIT .. q, t)
  local left = tonumber(stored) or 0
  if turn_of(q) ~= t then left = math.min(left, 0) + w * QUANTUM end  -- a new turn
  if left <= 0 and not force then
    redis.call('HSET', DEFICIT .. q, t, left)
    return 'owing'
  end
  item = move(src, item, t, mq, named)
  redis.call('HINCRBY', IN_FLIGHT, t, n)
  left = left - n
  local more = named and redis.call('LLEN', src) > 0
  if named and not more then
    leave(q, ring, t, stored)
  else
    redis.call('HSET', DEFICIT .. q, t, left)
    if left <= 0 then
      rotate(q, ring, t)
    elseif turn_of(q) ~= t then
      redis.call('SET', TURN .. q, t)
      turns[q] = t
    end
  end
  if named and (more or members[q] > 1) and redis.call('LLEN', q) == 0 then
    redis.call('LPUSH', q, WAKE)  -- more named work: wake an idle worker
  end
  return 'taken', src, item
end

local function serve(q)  -- the next message of q, or nil (and true when q's lists are all empty)
  local ring = RING .. q
  if not members[q] then  -- once a script: its takes keep members[q] as they change the ring
    redis.call('ZADD', ring, 'NX', 0, DEFAULT)
    members[q] = redis.call('ZCARD', ring)
  end
  local size = members[q]
  if size == 1 then  -- no named tenant has work: the default tenant's lists alone, if they hold any
    if redis.call('EXISTS', unpack(default_lists(q))) == 0 then return nil, true end
    local outcome, src, item = turn(q, ring, DEFAULT, true, true)
    if outcome == 'taken' then return {src, item} end
    return nil
  end
  local owing = nil
  for _ = 1, size do
    local t = redis.call('ZRANGE', ring, 0, 0)[1]
    local outcome, src, item = turn(q, ring, t, false, false)
    if outcome == 'taken' then return {src, item} end
    if outcome == 'empty' then
      leave(q, ring, t, true)
    else
      if outcome == 'owing' and not owing then owing = t end
      rotate(q, ring, t)
    end
  end
  if owing then
    local outcome, src, item = turn(q, ring, owing, true, false)
    if outcome == 'taken' then return {src, item} end
  end
  return nil
end

-- The third element: 0 when the only queue served has nothing left to take (the next poll waits at once).
for _, q in ipairs(KEYS) do
  local taken, calls, emptied = {}, 0, false
  while #taken < 2 * count and calls < QUANTUM do
    local one, empty = serve(q)
    if not one then
      emptied = empty
      break
    end
    taken[#taken + 1], taken[#taken + 2] = one[1], one[2]
    calls = calls + (header_calls(one[2]) or 1)
  end
  if #taken > 0 then
    local more = #KEYS > 1 or members[q] > 1 or (not emptied and redis.call('EXISTS', unpack(default_lists(q))) > 0)
    table.insert(taken, 3, more and 1 or 0)
    return taken
  end
end
return nil
"""
)

# KEYS[1]: the tenant's list; KEYS[2], when given: the enqueue's once-key (an enqueue sent again after a lost
# reply finds it and pushes nothing). ARGV: queue, tenant, calls, messages... Returns {1, max_queued} when
# pushed (or pushed before), {0, max_queued} when the tenant's waiting calls would go over its max_queued
# (nothing pushed).
ENQUEUE = (
    _COMMON
    + """
local q, t, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local _, _, mq = limits(t)
if mq > 0 and (tonumber(redis.call('HGET', QUEUED, t)) or 0) + n > mq then return {0, mq} end
if KEYS[2] and not redis.call('SET', KEYS[2], '1', 'NX', 'EX', $ONCE_TTL) then return {1, mq} end
for i = 4, #ARGV, 500 do redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 499, #ARGV))) end
redis.call('HINCRBY', QUEUED, t, n)
if t ~= DEFAULT then
  local ring = RING .. q
  if not redis.call('ZSCORE', ring, t) then redis.call('ZADD', ring, redis.call('INCR', SEQ .. q), t) end
  if redis.call('LLEN', q) == 0 then redis.call('LPUSH', q, WAKE) end
end
return {1, mq}
"""
)

# ARGV: queue, tenant, calls[, the message]; KEYS[1], with the message: the in-flight list it leaves. A
# tenant's calls answered (or handed back): the message leaves the in-flight list, the in-flight count goes
# down and, for a named tenant with calls waiting (it may have been at its max_in_flight), an idle worker
# is woken. One step: an acknowledgement is one command on the wire.
RELEASE = (
    _COMMON
    + """
local q, t = ARGV[1], ARGV[2]
local calls = tonumber(ARGV[3])
if KEYS[1] then redis.call('LREM', KEYS[1], 1, ARGV[4]) end
if calls ~= 0 then redis.call('HINCRBY', IN_FLIGHT, t, 0 - calls) end
if t ~= DEFAULT and redis.call('LLEN', q .. TENANT_MARK .. t) > 0 and redis.call('LLEN', q) == 0 then
  redis.call('LPUSH', q, WAKE)
end
"""
)


def _script(text: str) -> str:
    names = {
        "$DEFAULT": DEFAULT_TENANT,
        "$TENANT_MARK": TENANT_MARK,
        "$WAKE": WAKE,
        "$LIMITS": TENANT_LIMITS_KEY,
        "$IN_FLIGHT": IN_FLIGHT_KEY,
        "$QUEUED": QUEUED_KEY,
        "$RING": RING_PREFIX,
        "$SEQ": SEQ_PREFIX,
        "$DEFICIT": DEFICIT_PREFIX,
        "$TURN": TURN_PREFIX,
        "$QUANTUM": str(QUANTUM_CALLS),
        "$OVER": OVER_QUOTA_HEADER,
        "$CALLS_PATTERN": CALLS_HEADER.replace("-", "%-"),
        "$ONCE_TTL": str(ENQUEUE_ONCE_TTL_S),
    }
    for name, value in names.items():
        text = text.replace(name, value)
    return text


TAKE, ENQUEUE, RELEASE = _script(TAKE), _script(ENQUEUE), _script(RELEASE)


def tenant_list(queue: str, tenant: str) -> str:
    """The list a tenant's calls to `queue` wait in (the queue's own for the default tenant)."""
    return queue if tenant == DEFAULT_TENANT else queue + TENANT_MARK + tenant


def source_of(key: str) -> tuple[str, str]:
    """The queue and tenant of one of a queue's lists (a priority's list is the default tenant's)."""
    queue, _, rest = key.partition(SEP)
    return (queue, rest[1:]) if rest.startswith("@") else (queue, DEFAULT_TENANT)


def calls_in(item: bytes) -> int:
    """The calls a message carries, as the take counts them."""
    match = _CALLS_RE.search(item)
    return int(match.group(1)) if match else 1


def _queued_calls(item: bytes, named: bool) -> int:
    """What the message added to its tenant's queued count (a stock producer's message: nothing)."""
    match = _CALLS_RE.search(item)
    return int(match.group(1)) if match else int(named)


def take_command(queues: Sequence[str], inflight_prefix: str, suffixes: Sequence[str], count: int = 1) -> list[Any]:
    """The EVAL of the fair take of up to `count` messages over `queues` (the default tenant's lists: the
    queue + each suffix)."""
    return ["EVAL", TAKE, len(queues), *queues, count, inflight_prefix, *suffixes]


def taken_messages(reply: Sequence[Any]) -> list[tuple[bytes, bytes]]:
    """Each (source, message) a take's reply holds, in the order taken."""
    return [(reply[0], reply[1]), *zip(reply[3::2], reply[4::2], strict=True)]


def release(pipe: Any, source: str, item: bytes) -> None:
    """In a pipeline that removed the message from its in-flight list: its calls are no longer in flight."""
    queue, tenant = source_of(source)
    if tenant == DEFAULT_TENANT:
        pipe.hincrby(IN_FLIGHT_KEY, tenant, -calls_in(item))
    else:
        pipe.eval(RELEASE, 0, queue, tenant, calls_in(item))


def settle(pipe: Any, inflight: str, source: str, item: bytes) -> None:
    """A settlement's one command: the message out of the in-flight list `inflight`, its calls released."""
    queue, tenant = source_of(source)
    pipe.eval(RELEASE, 1, inflight, queue, tenant, calls_in(item), item)


def requeued(pipe: Any, source: str, item: bytes, in_flight: bool = True) -> None:
    """In the pipeline that pushes a taken message back onto `source` (a dead holder's, a restored one):
    the tenant has work again, its calls wait instead of running (`in_flight`: not released already)."""
    queue, tenant = source_of(source)
    named = tenant != DEFAULT_TENANT
    calls = calls_in(item) if in_flight else 0
    if named:
        pipe.zadd(RING_PREFIX + queue, {tenant: 0}, nx=True)  # at the front: these calls waited already
        pipe.eval(RELEASE, 0, queue, tenant, calls)  # and an idle worker is woken for them
    elif calls:
        pipe.hincrby(IN_FLIGHT_KEY, tenant, -calls)
    queued = _queued_calls(item, named)
    if queued:
        pipe.hincrby(QUEUED_KEY, tenant, queued)


def enqueue(pipe: Any, queue: str, tenant: str, messages: Sequence[str], calls: int, once: str | None = None) -> None:
    """Add the push of one tenant's messages to `pipe`; its reply tells whether they were refused. With
    `once` (an id unique to this push), the push is made at most once however often the pipeline is sent:
    a client that retries across a failover would otherwise push again what the promoted replica has."""
    keys = [tenant_list(queue, tenant)] + ([ENQUEUE_ONCE_PREFIX + once] if once else [])
    pipe.eval(ENQUEUE, len(keys), *keys, queue, tenant, calls, *messages)


def refused_limit(reply: Any) -> int | None:
    """The max_queued that refused an ENQUEUE, None when it was pushed."""
    pushed, limit = reply
    return None if int(pushed) else int(limit)


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's limits as the scripts read them (0: none)."""

    weight: int = 1
    max_in_flight: int = 0
    max_queued: int = 0

    def encoded(self) -> str:
        return f"{self.weight} {self.max_in_flight} {self.max_queued}"

    @classmethod
    def decoded(cls, raw: bytes | str) -> TenantLimits:
        text = raw.decode() if isinstance(raw, bytes) else raw
        weight, max_in_flight, max_queued = (int(part) for part in text.split())
        return cls(weight, max_in_flight, max_queued)


def limits_of(table: Mapping[Any, Any], tenant: str) -> TenantLimits:
    """A tenant's limits from the limits hash as read: its own, else the default tenant's."""
    for name in (tenant, DEFAULT_TENANT):
        raw = table.get(name) if name in table else table.get(name.encode())
        if raw is not None:
            return TenantLimits.decoded(raw)
    return TenantLimits()


@dataclass(frozen=True)
class TenantRow:
    """What `toolworker queue` and the metrics show of one tenant on one queue."""

    queue: str
    tenant: str
    waiting: int  # messages in the tenant's lists
    queued: int  # calls waiting, as counted at enqueue (the tenant's, over every queue)
    in_flight: int  # calls taken and not yet acknowledged (the tenant's, over every queue)


def in_flight(client: redis.Redis) -> dict[str, int]:
    """Calls taken and not yet acknowledged, per tenant (fleet-wide)."""
    return _counts(client, IN_FLIGHT_KEY)


def listed_tenants(client: redis.Redis) -> set[str]:
    """The tenants the definitions name (their limits are in Redis)."""
    names: Any = client.hkeys(TENANT_LIMITS_KEY)
    return {name.decode() for name in names}


def _counts(client: redis.Redis, key: str) -> dict[str, int]:
    table: Any = client.hgetall(key)
    return {name.decode(): int(count) for name, count in table.items()}


def snapshot(client: redis.Redis, queues: Iterable[str], suffixes: Sequence[str]) -> list[TenantRow]:
    """Waiting and in-flight per queue and tenant: the default tenant, the ring's and the listed ones."""
    flying, queued, listed = in_flight(client), _counts(client, QUEUED_KEY), listed_tenants(client)
    rows = []
    for queue in queues:
        ring: Any = client.zrange(RING_PREFIX + queue, 0, -1)
        tenants = sorted({name.decode() for name in ring} | listed | {DEFAULT_TENANT})
        with client.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                for key in _lists(queue, tenant, suffixes):
                    pipe.llen(key)
            lengths = iter(pipe.execute())
        for tenant in tenants:
            waiting = sum(next(lengths) for _ in _lists(queue, tenant, suffixes))
            rows.append(TenantRow(queue, tenant, waiting, queued.get(tenant, 0), flying.get(tenant, 0)))
    return rows


def _lists(queue: str, tenant: str, suffixes: Sequence[str]) -> list[str]:
    return [queue + s for s in suffixes] if tenant == DEFAULT_TENANT else [tenant_list(queue, tenant)]
