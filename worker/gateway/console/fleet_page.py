"""The fleet page: the workers, what waits and runs per queue and tenant (the table `toolworker queue` prints),
and the chart of the last minutes (chart.py), which fleet.js fetches again every REFRESH_S seconds from
`/console/fleet/chart` (a fragment of the page, same origin, same session)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from worker.gateway.calls import Calls
from worker.gateway.console import chart
from worker.gateway.console.fleet import Workers, tenant_rows
from worker.gateway.console.sessions import Session
from worker.gateway.console.views import FLEET, HEADERS, Room
from worker.shards import Shard
from worker.watch import Watch

CHART = FLEET + "/chart"
SCRIPT = "/console/assets/fleet.js"
REFRESH_S = 2
_SCRIPT_TEXT = (Path(__file__).parent / "assets" / "fleet.js").read_text()


class FleetPages(Room):
    def __init__(self, calls: Calls, links: Sequence[tuple[str, str]], shards: list[tuple[Shard, redis.Redis]]) -> None:
        super().__init__(calls, links)
        self.workers = Workers([shard.url for shard, _ in shards])
        self.watch = Watch([client for _, client in shards])
        self._shards = shards

    async def fleet(self, request: Request, session: Session) -> Response:
        rows, problems = await tenant_rows(self._shards)
        workers = await self.workers.seen()
        sharded = self._shards[0][0].name != ""
        context: dict[str, Any] = {"rows": rows, "problems": problems, "sharded": sharded, "workers": workers}
        figures = await self._figures()
        return self._view("fleet.html", session, nav="Fleet", chart=figures, chart_url=CHART, script=SCRIPT, **context)

    async def chart(self, request: Request, session: Session) -> Response:
        return HTMLResponse(await self._figures(), headers=HEADERS)

    async def script(self, request: Request) -> Response:
        return Response(_SCRIPT_TEXT, media_type="text/javascript", headers=HEADERS)

    async def _figures(self) -> Markup:
        series = await asyncio.to_thread(self.watch.series)
        end = time.time()
        start = end - self.watch.window_s
        if not series:
            return Markup('<p class="note" id="no-series">No calls and nothing waiting in the last minutes.</p>')
        return chart.legend() + Markup("").join(chart.figure(s, start, end) for s in series)
