"""The dead-letter pages: the newest items with their reasons, one item redacted, and the two actions on it
(purge it; replay its calls, answered once), each in the audit trail."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from worker.gateway.calls import Calls
from worker.gateway.console.sessions import Session
from worker.gateway.console.views import Room
from worker.queue.dead_letter_store import DeadLetterError, DeadLetters, NoSuchItem

# The dead-letter page lists the newest this many (the list keeps up to 10,000; the CLI prints them all).
DEAD_LETTER_ROWS = 500


class LetterPages(Room):
    def __init__(self, calls: Calls, links: Sequence[tuple[str, str]], dead_letters: DeadLetters) -> None:
        super().__init__(calls, links)
        self.dead_letters = dead_letters

    async def letters(self, request: Request, session: Session) -> Response:
        items = await self.dead_letters.items()
        done = {k: request.query_params.get(k, "") for k in ("purged", "replayed")}
        context: dict[str, Any] = {"items": items[:DEAD_LETTER_ROWS], "total": len(items), "done": done}
        return self._view("dead_letters.html", session, nav="Dead letters", **context)

    async def letter(self, request: Request, session: Session) -> Response:
        try:
            item = await self.dead_letters.get(request.path_params["item"])
        except NoSuchItem as exc:
            return self._view("message.html", session, 404, title="Not found", message=str(exc))
        shown = json.dumps(item.shown(), indent=2, ensure_ascii=False, default=str)
        return self._view("dead_letter.html", session, item=item, shown=shown, nav="Dead letters")

    async def purge(self, request: Request, session: Session, form: FormData) -> Response:
        item = request.path_params["item"]
        try:
            await self.dead_letters.purge(item)
        except NoSuchItem as exc:
            return self._view("message.html", session, 404, title="Not found", message=str(exc))
        self._audit(session, "dead_letter.purge", item)
        return RedirectResponse(f"/console/dead-letters?purged={item}", 303)

    async def replay(self, request: Request, session: Session, form: FormData) -> Response:
        item = request.path_params["item"]
        try:
            await self.dead_letters.replay(item, self._enqueue)
        except NoSuchItem as exc:
            return self._view("message.html", session, 404, title="Not found", message=str(exc))
        except DeadLetterError as exc:
            return self._view("message.html", session, 409, title="Not replayed", message=str(exc))
        self._audit(session, "dead_letter.replay", item)
        return RedirectResponse(f"/console/dead-letters?replayed={item}", 303)

    async def _enqueue(
        self, tool: str, arguments: dict[str, Any], call_id: str, tenant: str, principal: str | None, timeout_s: float
    ) -> None:
        calls: list[tuple[str, dict[str, Any], dict[str, str]]] = [(tool, arguments, {})]
        await self.calls.client.submit_many(
            calls, timeout=timeout_s, call_ids=[call_id], tenant=tenant, principal=principal
        )
