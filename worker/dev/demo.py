"""A small upstream API so that the example definitions work offline (`make run`)."""

from __future__ import annotations

import asyncio
import random

from aiohttp import web

from worker.dev import authserver

TICKETS = {
    "TICKET-123": {"id": "TICKET-123", "status": "open", "priority": "high", "title": "Checkout fails on Safari"},
    "TICKET-124": {"id": "TICKET-124", "status": "closed", "priority": "low", "title": "Typo on pricing page"},
}


async def ticket(request: web.Request) -> web.Response:
    found = TICKETS.get(request.match_info["ticket_id"])
    if found is None:
        return web.json_response({"error": "no such ticket"}, status=404)
    return web.json_response({**found, "history": [{"at": "2026-11-20T09:12:00Z", "change": "opened"}]})


async def search_tickets(request: web.Request) -> web.Response:
    status = request.query.get("status")
    return web.json_response([t for t in TICKETS.values() if status in (None, t["status"])])


async def create_ticket(request: web.Request) -> web.Response:
    data = await request.json()
    ticket_id = f"TICKET-{random.randint(200, 999)}"
    return web.json_response({"id": ticket_id, "status": "open", **data}, status=201)


async def weather(request: web.Request) -> web.Response:
    await asyncio.sleep(0.05)  # like a real API
    city = request.query.get("city", "Paris")
    return web.json_response({"city": city, "temperature_c": 14.5, "conditions": "light rain"})


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/tickets/{ticket_id}", ticket)
    app.router.add_get("/tickets", search_tickets)
    app.router.add_post("/tickets", create_ticket)
    app.router.add_get("/weather", weather)
    authserver.AuthServer().routes(app)  # an authorization server and a profile API that acts for its users
    return app


def serve(host: str, port: int) -> None:
    web.run_app(make_app(), host=host, port=port, print=None, handle_signals=True)
