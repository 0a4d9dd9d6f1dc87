"""An upstream of list endpoints (GitHub-style Link, Slack-style cursor, offset/limit), a 500-item body and
cacheable items, for the answers tests (structured output, truncation, pagination, caching)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

ISSUES = 70
USERS = 75
ITEMS = 35
MANY = 500


@dataclass
class ListState:
    """What the upstream was asked: requests by path."""

    hits: Counter[str] = field(default_factory=Counter)
    # Where the offsite listing's next link points (another host the worker must not follow).
    offsite_next: str = "http://127.0.0.2:9/offsite/issues?page=2"


async def _issues(request: web.Request) -> web.Response:
    per_page = int(request.query.get("per_page", "10"))
    page = int(request.query.get("page", "1"))
    start = (page - 1) * per_page
    issues = [{"number": n, "title": f"Issue {n}"} for n in range(start + 1, min(start + per_page, ISSUES) + 1)]
    headers = {}
    if start + per_page < ISSUES:
        base = f"{request.scheme}://{request.host}{request.path}"
        headers["Link"] = f'<{base}?per_page={per_page}&page={page + 1}>; rel="next", <{base}?page=7>; rel="last"'
    return web.json_response(issues, headers=headers)


async def _users(request: web.Request) -> web.Response:
    limit = int(request.query.get("limit", "10"))
    start = int(request.query.get("cursor", "c0")[1:])
    members = [{"id": f"U{n:03d}", "name": f"user {n}"} for n in range(start, min(start + limit, USERS))]
    following = f"c{start + limit}" if start + limit < USERS else ""
    return web.json_response({"ok": True, "members": members, "response_metadata": {"next_cursor": following}})


async def _items(request: web.Request) -> web.Response:
    offset, limit = int(request.query.get("offset", "0")), int(request.query.get("limit", "10"))
    return web.json_response({"items": [{"n": n} for n in range(offset, min(offset + limit, ITEMS))]})


async def _many(request: web.Request) -> web.Response:
    data = [{"id": n, "name": f"item {n}", "tags": ["a", "b"]} for n in range(MANY)]
    return web.json_response({"data": data, "total": MANY})


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _item(cache_control: str | None, body: dict[str, object] | None = None) -> Handler:
    """An item (named for the caller's X-User-Token), with this Cache-Control, or a fixed body."""

    async def item(request: web.Request) -> web.Response:
        headers = {"Cache-Control": cache_control} if cache_control else {}
        user = request.headers.get("X-User-Token", "").split("-")[0]  # the name before "-token", not the secret
        value = body or {"id": int(request.query.get("id", "1")), "name": f"item for {user or 'anyone'}"}
        return web.json_response(value, headers=headers)

    return item


def list_upstream(state: ListState) -> web.Application:
    @web.middleware
    async def count(request: web.Request, handler: object) -> web.StreamResponse:
        state.hits[request.path] += 1
        return await handler(request)  # type: ignore[operator, no-any-return]

    async def offsite(request: web.Request) -> web.Response:
        return web.json_response([{"number": 1}], headers={"Link": f'<{state.offsite_next}>; rel="next"'})

    async def created(request: web.Request) -> web.Response:
        return web.json_response({"id": 7, "name": "created"})

    app = web.Application(middlewares=[count])
    app.router.add_get("/repos/acme/app/issues", _issues)
    app.router.add_get("/users.list", _users)
    app.router.add_get("/items", _items)
    app.router.add_get("/many", _many)
    app.router.add_get("/offsite/issues", offsite)
    app.router.add_get("/item", _item(None))
    app.router.add_get("/item-brief", _item("public, max-age=1"))
    app.router.add_get("/item-nostore", _item("no-store"))
    app.router.add_get("/item-private", _item("private, max-age=600"))
    app.router.add_get("/item-wrong", _item(None, {"id": "seven", "name": "not an id"}))
    app.router.add_post("/item", created)
    return app
