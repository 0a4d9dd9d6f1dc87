"""The console's routes: a table of pages (GET, never a change) and actions (POST, CSRF-checked).

GET  /console/login                    the sign-in form (one field: a gateway static token)
POST /console/login                    sign in: a session cookie, then the fleet page
POST /console/logout                   sign out: the session ends on the server
GET  /console, /console/fleet          workers; per queue and tenant: waiting, queued, in flight, oldest ages;
                                       the chart of the last minutes (fleet_page.py)
GET  /console/fleet/chart              the chart alone, which the page's script fetches again every 2 s
GET  /console/assets/fleet.js          that script (no session needed: it holds nothing)
GET  /console/catalog?q=               the tools the principal may call, or those matching q
GET  /console/catalog/{name}           a tool's schema and a form to try it
POST /console/catalog/{name}/try       run a call through the gateway's call path; its envelope
GET  /console/dead-letters             one row per item, with its reason
GET  /console/dead-letters/{id}        one item, redacted
POST /console/dead-letters/{id}/purge  remove exactly that item
POST /console/dead-letters/{id}/replay enqueue its calls again (answered once)
GET  /console/audit?principal=&tool=&exit_code=   the audit trail, newest first
GET  /console/upstreams                each upstream: kind, protocol, tools, last refresh and error; withheld tools
POST /console/upstreams/{name}/accept  serve what `pin` withheld (the form's `tool`, or all of them)

The dead-letter pages are letters.py's, the fleet's fleet_page.py's, the upstreams' upstream_page.py's; what
every page shares is views.py's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from worker.constants import AUDIT_STREAM_KEY
from worker.definitions import catalog
from worker.errors import TenantQueueFull, UnknownTool
from worker.gateway.calls import Calls, CallSpec
from worker.gateway.console.fleet_page import CHART, SCRIPT, FleetPages
from worker.gateway.console.gate import CONSOLE_PATH, Gate, csrf_of
from worker.gateway.console.letters import LetterPages
from worker.gateway.console.sessions import COOKIE, CSRF_FIELD, LOGIN_COOKIE, Session, new_secret
from worker.gateway.console.sources import Decision, Extensions, NotWaiting
from worker.gateway.console.upstream_page import Accept, UpstreamPages
from worker.gateway.console.views import APPROVALS, CONNECTIONS, FLEET, LINKS, LOGIN, UPSTREAMS, Room, refusal, render
from worker.gateway.health import FleetUnavailable
from worker.queue.dead_letter_store import DeadLetters
from worker.shards import Shard

T = TypeVar("T")

# The audit page shows at most this many records, of the newest AUDIT_SCAN it reads.
AUDIT_ROWS = 200
AUDIT_SCAN = 10_000
SEARCH_TOP_K = 50
DECISIONS: dict[str, Decision] = {"approve": "approve", "deny": "deny"}

Page = Callable[[Request, Session], Awaitable[Response]]
Act = Callable[[Request, Session, FormData], Awaitable[Response]]


class Console(Room):
    """The console's routes, composed from its rooms; signing in and out, the catalog, audit and approvals."""

    def __init__(
        self,
        calls: Calls,
        gate: Gate,
        shards: list[tuple[Shard, redis.Redis]],
        redis_async: aioredis.Redis,
        call_timeout_s: float,
        extensions: Extensions | None = None,
        accept: Accept | None = None,
    ) -> None:
        """`shards`: a synchronous client on each shard, the home one first (the figures `toolworker queue`
        reads); `redis_async`: the home shard's; `accept`: serves what an MCP upstream's `pin` withheld."""
        self.extensions = extensions or Extensions()
        extra = [("Approvals", APPROVALS)] if self.extensions.approvals else []
        extra += [("Connections", CONNECTIONS)] if self.extensions.connections else []
        super().__init__(calls, (*LINKS, *extra))
        self.gate = gate
        self._redis = redis_async
        self.call_timeout_s = call_timeout_s
        self.fleet = FleetPages(calls, self.links, shards)
        self.letters = LetterPages(calls, self.links, DeadLetters(redis_async))
        self.upstreams = UpstreamPages(calls, self.links, redis_async, accept or _nothing_accepted)

    def routes(self) -> list[Route]:
        pages: dict[str, Page] = {
            CONSOLE_PATH: self.home,
            CONSOLE_PATH + "/": self.home,
            FLEET: self.fleet.fleet,
            CHART: self.fleet.chart,
            "/console/catalog": self.catalog,
            "/console/catalog/{name}": self.tool,
            "/console/dead-letters": self.letters.letters,
            "/console/dead-letters/{item}": self.letters.letter,
            "/console/audit": self.audit,
            UPSTREAMS: self.upstreams.upstreams,
        }
        actions: dict[str, Act] = {
            "/console/logout": self.logout,
            "/console/catalog/{name}/try": self.try_call,
            "/console/dead-letters/{item}/purge": self.letters.purge,
            "/console/dead-letters/{item}/replay": self.letters.replay,
            UPSTREAMS + "/{name}/accept": self.upstreams.accept,
        }
        if self.extensions.approvals is not None:
            pages[APPROVALS] = self.approvals
            actions[APPROVALS + "/{call_id}"] = self.decide
        if self.extensions.connections is not None:
            pages[CONNECTIONS] = self.connections
        return [
            Route(LOGIN, self.login_form, methods=["GET"]),
            Route(LOGIN, self.login, methods=["POST"]),
            Route(SCRIPT, self.fleet.script, methods=["GET"]),
            *(Route(path, self._page(view), methods=["GET"]) for path, view in pages.items()),
            *(Route(path, self._action(act), methods=["POST"]) for path, act in actions.items()),
        ]

    # --- the gate, once for every page and action -----------------------------------------------------

    def _page(self, view: Page) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            session = await self.gate.session(request)
            if session is None:
                return RedirectResponse(LOGIN, 303)
            if not session.principal.grant.may("operate"):
                return refusal(403, "This principal may not operate the console.")
            return await view(request, session)

        return handle

    def _action(self, act: Act) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if not self.gate.same_origin(request):
                return refusal(403, "This form was not sent from the console's own origin.")
            session = await self.gate.session(request)
            if session is None or not session.principal.grant.may("operate"):
                return refusal(403, "Sign in first: this session has ended or may not operate the console.")
            form = await request.form()
            if not session.csrf_matches(csrf_of(form)):
                return refusal(403, "The form's CSRF token is missing or stale: reload the page.", session)
            return await act(request, session, form)

        return handle

    # --- signing in and out ---------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        token = request.cookies.get(LOGIN_COOKIE) or new_secret()
        response = render(
            "login.html", session=None, csrf=token, csrf_field=CSRF_FIELD, error="", tokenless=self.gate.tokenless
        )
        if request.cookies.get(LOGIN_COOKIE) != token:
            self._set_cookie(request, response, LOGIN_COOKIE, token, LOGIN, max_age=3600)
        return response

    async def login(self, request: Request) -> Response:
        if not self.gate.same_origin(request):
            return refusal(403, "This form was not sent from the console's own origin.")
        form = await request.form()
        if not self.gate.login_token_matches(request, form):
            return refusal(403, "The sign-in form's CSRF token is missing or stale: reload the page.")
        given = form.get("token")
        principal = self.gate.principal(given if isinstance(given, str) else "")
        if principal is None:
            error = "That token is not valid."
            context = {"csrf": csrf_of(form), "csrf_field": CSRF_FIELD, "error": error, "tokenless": False}
            return render("login.html", 401, session=None, **context)
        if not principal.grant.may("operate"):
            return refusal(403, "This token's principal may not operate the console (it needs the operate grant).")
        session_id, session = await self.gate.sessions.open(principal)
        self._audit(session, "console.sign_in")
        response = RedirectResponse(FLEET, 303)
        self._set_cookie(request, response, COOKIE, session_id, CONSOLE_PATH)
        response.delete_cookie(LOGIN_COOKIE, path=LOGIN)
        return response

    async def logout(self, request: Request, session: Session, form: FormData) -> Response:
        await self.gate.sessions.close(request.cookies.get(COOKIE, ""))
        self._audit(session, "console.sign_out")
        response = RedirectResponse(LOGIN, 303)
        response.delete_cookie(COOKIE, path=CONSOLE_PATH)
        return response

    def _set_cookie(
        self, request: Request, response: Response, name: str, value: str, path: str, max_age: int | None = None
    ) -> None:
        secure = self.gate.secure_cookie(request)
        response.set_cookie(name, value, max_age=max_age, path=path, httponly=True, samesite="strict", secure=secure)

    # --- pages ----------------------------------------------------------------------------------------

    async def home(self, request: Request, session: Session) -> Response:
        return RedirectResponse(FLEET, 303)

    async def catalog(self, request: Request, session: Session) -> Response:
        toolset = self.calls.visible(session.principal).toolset
        query = request.query_params.get("q", "").strip()
        if query:
            rows = [row for row in catalog.search(toolset, query, SEARCH_TOP_K) if _positive(row["score"])]
        else:
            rows = catalog.list_tools(toolset)
        return self._view("catalog.html", session, rows=rows, query=query, nav="Catalog")

    async def tool(self, request: Request, session: Session) -> Response:
        found = self.calls.visible(session.principal).tool(request.path_params["name"])
        if found is None:
            return self._view("message.html", session, 404, title="Not found", message="No such tool.")
        definition = catalog.definition(found)
        return self._view("tool.html", session, tool=definition, properties=_properties(definition), nav="Catalog")

    async def audit(self, request: Request, session: Session) -> Response:
        wanted = {k: request.query_params.get(k, "").strip() for k in ("principal", "tool", "exit_code")}
        records, scanned = await self._audit_records(wanted)
        return self._view("audit.html", session, records=records, wanted=wanted, scanned=scanned, nav="Audit")

    async def _audit_records(self, wanted: Mapping[str, str]) -> tuple[list[dict[str, str]], int]:
        """The newest records that match, of the newest AUDIT_SCAN."""
        found: list[dict[str, str]] = []
        scanned, end = 0, "+"
        while len(found) < AUDIT_ROWS and scanned < AUDIT_SCAN:
            entries: Any = await self._redis.xrevrange(AUDIT_STREAM_KEY, max=end, min="-", count=1000) or []
            for entry_id, raw in entries:
                record = {"id": _text(entry_id), **{_text(k): _text(v) for k, v in raw.items()}}
                if _matches(record, wanted) and len(found) < AUDIT_ROWS:
                    found.append(record)
            scanned += len(entries)
            if len(entries) < 1000:
                break
            end = "(" + _text(entries[-1][0])
        return found, scanned

    # --- actions --------------------------------------------------------------------------------------

    async def try_call(self, request: Request, session: Session, form: FormData) -> Response:
        name = request.path_params["name"]
        raw = form.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else None
        except ValueError as exc:
            arguments, problem = None, f"The arguments are not JSON: {exc}"
        else:
            problem = "The arguments must be a JSON object."
        if not isinstance(arguments, dict):
            return self._view("message.html", session, 400, title="Bad arguments", message=problem)
        spec = CallSpec(name, arguments, timeout_s=self.call_timeout_s, principal=session.principal)
        try:
            submitted = await self.calls.submit(spec)
            envelope = await self.calls.answer(submitted, self.call_timeout_s + 5)
        except UnknownTool:
            return self._view("message.html", session, 404, title="Not found", message="No such tool.")
        except FleetUnavailable as exc:
            return self._view("message.html", session, 503, title="Unavailable", message=str(exc))
        except TenantQueueFull as exc:
            return self._view("message.html", session, 429, title="Queue full", message=exc.message)
        if envelope is None:
            self.calls.hold(submitted)  # its audit record says pending; GET /v1/calls/{id} finds it
        shown = json.dumps(envelope.to_dict(), indent=2, ensure_ascii=False) if envelope else ""
        context = {"tool": name, "call_id": submitted.call_id, "envelope": envelope, "shown": shown}
        return self._view("answer.html", session, nav="Catalog", **context)

    async def approvals(self, request: Request, session: Session) -> Response:
        source = _routed(self.extensions.approvals)
        waiting = await source.waiting()
        done = {k: request.query_params.get(k, "") for k in ("approve", "deny")}
        may = session.principal.grant.may("approve")
        return self._view("approvals.html", session, waiting=waiting, done=done, may=may, nav="Approvals")

    async def decide(self, request: Request, session: Session, form: FormData) -> Response:
        source = _routed(self.extensions.approvals)
        call_id, asked, reason = request.path_params["call_id"], form.get("decision"), form.get("reason")
        reason = reason.strip() if isinstance(reason, str) else ""
        decision = DECISIONS.get(asked if isinstance(asked, str) else "")
        if not session.principal.grant.may("approve"):
            return refusal(403, "This principal may not decide parked calls (it needs the approve grant).", session)
        if decision is None:
            return self._view("message.html", session, 400, title="Bad decision", message="Approve or Deny.")
        if decision == "deny" and not reason:
            return self._view("message.html", session, 400, title="A reason, please", message="Say why it is denied.")
        try:
            await source.decide(call_id, decision, reason, session.principal)
        except NotWaiting as exc:
            return self._view("message.html", session, 409, title="Not waiting", message=str(exc))
        self._audit(session, f"approval.{decision}", call_id, reason)
        return RedirectResponse(f"{APPROVALS}?{decision}={call_id}", 303)

    async def connections(self, request: Request, session: Session) -> Response:
        source = _routed(self.extensions.connections)
        user = request.query_params.get("user", "").strip()
        rows = await source.connections(user or None)
        return self._view("connections.html", session, rows=rows, user=user, nav="Connections")


def _properties(definition: Mapping[str, Any]) -> list[dict[str, str]]:
    """The schema's top-level properties: name, type, whether required, description."""
    schema = definition.get("inputSchema") or {}
    required = set(schema.get("required") or ())
    properties = schema.get("properties") or {}
    return [
        {
            "name": str(name),
            "type": str(spec.get("type", "")) if isinstance(spec, dict) else "",
            "required": "yes" if name in required else "",
            "description": str(spec.get("description", "")) if isinstance(spec, dict) else "",
        }
        for name, spec in properties.items()
    ]


def _matches(record: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    tool = record.get("tool") or record.get("action", "")
    pairs = (("principal", record.get("principal", "")), ("tool", tool), ("exit_code", record.get("exitCode", "")))
    return all(not wanted[key] or wanted[key] == value for key, value in pairs)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _positive(score: object) -> bool:
    return isinstance(score, int | float) and score > 0


async def _nothing_accepted(upstream: str, tool: str | None) -> Any:
    raise KeyError(f"this console cannot accept the tools of {upstream!r}")


def _routed(extension: T | None) -> T:
    """A console extension whose pages are routed only when it is there."""
    assert extension is not None
    return extension
