"""Turns shared fairly by tenant inside one worker process: a weighted round-robin semaphore.

The calls of a process wait for their turn at an upstream's connections (`admission.Turn`). With a plain
semaphore they are served in order of arrival, so a batch message of one tenant (a hundred calls at once)
would take every turn ahead of another tenant's single call. Here each tenant waits in a line of its own;
a freed turn goes to the tenant at the head of a ring of the tenants with waiters, which keeps it for
`weight` turns in a row and then goes to the back. A lone tenant gets every turn; with nobody waiting a
turn is taken at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class FairTurns:
    def __init__(self, turns: int, weight_of: Callable[[str], int]) -> None:
        self._free = turns
        self._weight_of = weight_of
        self._lines: dict[str, deque[asyncio.Future[None]]] = {}
        self._ring: deque[str] = deque()  # the tenants with a line, the one being served first
        self._left: dict[str, int] = {}  # turns still due to the ring's head in its round

    def locked(self) -> bool:
        """Whether a call would wait (no turn free, or others already waiting)."""
        return self._free <= 0 or bool(self._ring)

    async def acquire(self, tenant: str) -> None:
        if not self.locked():
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        line = self._lines.get(tenant)
        if line is None:
            line = self._lines[tenant] = deque()
            self._ring.append(tenant)
        line.append(waiter)
        try:
            await waiter
        except BaseException:  # cancelled or timed out
            if waiter.done() and not waiter.cancelled():
                self.release()  # given a turn just as it gave up: pass it on
            raise

    def release(self) -> None:
        self._free += 1
        self._hand_over()

    def _hand_over(self) -> None:
        while self._free > 0 and self._ring:
            tenant = self._ring[0]
            line = self._lines[tenant]
            waiter = line.popleft()
            if not line:
                self._leave(tenant)
            if waiter.done():  # gave up waiting
                continue
            waiter.set_result(None)
            self._free -= 1
            if line:
                self._charge(tenant)

    def _charge(self, tenant: str) -> None:
        left = self._left.get(tenant, self._weight_of(tenant)) - 1
        if left > 0:
            self._left[tenant] = left
        else:  # its round is over: to the back of the ring
            self._left.pop(tenant, None)
            self._ring.rotate(-1)

    def _leave(self, tenant: str) -> None:
        del self._lines[tenant]
        self._ring.popleft()
        self._left.pop(tenant, None)
