"""Whether and when a call may start: its deadline, its arguments, its turn at the upstream."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC
from typing import Any, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaViolation

from worker import errors, json_text
from worker.call.fairness import FairTurns
from worker.call.runtime import TURNS_PER_CONNECTION
from worker.constants import MAX_ARGUMENTS_BYTES, MAX_ARGUMENTS_DEPTH
from worker.definitions.model import Upstream
from worker.protocol import ToolCall

# A call without a deadline waits this long at most for the shared rate limit.
MAX_RATE_WAIT_S = 300.0
_MAX_REPORTED_ERRORS = 5


def call_deadline(call: ToolCall, received_at: float) -> float:
    """The wall-clock time by which the call must be over (the earlier of deadline and timeout)."""
    limits = []
    if call.deadline is not None:
        at = call.deadline if call.deadline.tzinfo else call.deadline.replace(tzinfo=UTC)
        limits.append(at.timestamp())
    if call.timeout_s is not None:
        limits.append(received_at + call.timeout_s)
    deadline = min(limits, default=float("inf"))
    if deadline <= time.time():
        raise errors.DeadlineExceeded("The call's deadline passed before it could start; it was not sent.")
    return deadline


def validate_arguments(arguments: dict[str, Any], validator: Draft202012Validator) -> dict[str, Any]:
    check_nesting(arguments)  # first: what follows walks the arguments recursively
    size = encoded_size(arguments)
    if size > MAX_ARGUMENTS_BYTES:
        raise errors.InvalidArguments(f"The arguments are too large ({size} bytes; at most {MAX_ARGUMENTS_BYTES}).")
    problems = [_explain(e) for e in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))]
    if problems:
        shown = problems[:_MAX_REPORTED_ERRORS]
        more = f" (and {len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
        raise errors.InvalidArguments("Invalid arguments: " + "; ".join(shown) + more + ".")
    return arguments


def encoded_size(value: Any) -> int:
    """UTF-8 size of a JSON value; text that is not valid Unicode (a lone surrogate) is refused."""
    try:
        return len(json_text.utf8(value))
    except UnicodeEncodeError:
        raise errors.InvalidArguments("The arguments or headers contain text that is not valid Unicode.") from None


def check_nesting(arguments: Any) -> None:
    """Refuse arguments that nest objects and arrays deeper than MAX_ARGUMENTS_DEPTH (the arguments object
    itself is level 1). Walked without recursion, so that no depth can exhaust the stack here."""
    pending: list[tuple[Any, int]] = [(arguments, 1)]
    while pending:
        value, depth = pending.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else None
        if children is None:
            continue
        if depth > MAX_ARGUMENTS_DEPTH:
            raise errors.InvalidArguments(
                f"The arguments nest objects and arrays more than {MAX_ARGUMENTS_DEPTH} levels deep; "
                "send them flatter, as the tool's schema describes them."
            )
        pending.extend((child, depth + 1) for child in children)


def _explain(error: SchemaViolation) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [p for p in cast(list[str], error.validator_value) if p not in error.instance]
        names = ", ".join(f"`{'.'.join(filter(None, [where, p]))}`" for p in missing)
        return f"{names} {'is' if len(missing) == 1 else 'are'} required"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        return f"{error.message}" + (f" in `{where}`" if where else "")
    return f"`{where or 'arguments'}`: {error.message}"


class Turn:
    """A call's place among the calls under way to its upstream: TURNS_PER_CONNECTION x max_concurrency
    of them per worker process. The others wait unprepared, each tenant's in order of arrival, the tenants
    by weighted round robin (`fairness.FairTurns`); a burst of thousands
    would otherwise render and start every request in one go, and hold the loop for a second or more
    while the upstream's answers waited to be read. A call gives its turn back while it sleeps between
    attempts (`pause`).

    Used as `async with turn:` around everything the call does at its upstream."""

    def __init__(self, turns: FairTurns, upstream: Upstream, deadline: float, tenant: str) -> None:
        self._turns, self._upstream, self._deadline, self._tenant = turns, upstream, deadline, tenant
        self._held = self._sent = False  # _sent: an earlier attempt had its turn

    async def __aenter__(self) -> Turn:
        await self.take()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.give_back()

    async def pause(self, sleep_s: float) -> None:
        """Sleep without the turn (another call may use it meanwhile), then take it again."""
        self.give_back()
        await asyncio.sleep(max(0.0, sleep_s))
        await self.take()

    async def take(self) -> None:
        if self._held:
            return
        if self._turns.locked():
            await self._wait()
        else:
            await self._turns.acquire(self._tenant)  # at once
        self._held = self._sent = True

    async def _wait(self) -> None:
        """As long as a free pooled connection was waited for (or, at a rate-limited upstream, a slot)."""
        upstream = self._upstream
        limited = upstream.rate_limit is not None
        # Never negative: a deadline that passed meanwhile leaves no time to wait, not less than none.
        wait_s = max(0.0, min(MAX_RATE_WAIT_S if limited else upstream.timeout_s, self._deadline - time.time()))
        try:
            async with asyncio.timeout(wait_s):
                await self._turns.acquire(self._tenant)
        except TimeoutError:
            error = errors.DeadlineExceeded if limited else errors.TimedOut
            raise error(
                f"The call waited {wait_s:.3g} seconds for its turn at the upstream, which had "
                f"{TURNS_PER_CONNECTION * upstream.max_concurrency} calls under way; "
                f"it was not sent{' again' if self._sent else ''}."
            ) from None

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._turns.release()
