"""What every console page shares: the paths of the nav, the templates and the security headers every answer
carries, and `Room`, the base of each group of pages (rendering with the session's nav, recording an action
in the audit trail)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from starlette.responses import HTMLResponse

from worker.gateway.calls import Calls
from worker.gateway.console.gate import CONSOLE_PATH
from worker.gateway.console.sessions import CSRF_FIELD, Session
from worker.gateway.identity.audit import action

LOGIN = CONSOLE_PATH + "/login"
FLEET = CONSOLE_PATH + "/fleet"
APPROVALS = CONSOLE_PATH + "/approvals"
CONNECTIONS = CONSOLE_PATH + "/connections"
UPSTREAMS = CONSOLE_PATH + "/upstreams"
LINKS = (
    ("Fleet", FLEET),
    ("Catalog", "/console/catalog"),
    ("Upstreams", UPSTREAMS),
    ("Dead letters", "/console/dead-letters"),
    ("Audit", "/console/audit"),
)
HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; "
    "form-action 'self'",
}
_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("links", LINKS)
    return HTMLResponse(_templates.get_template(name).render(**context), status_code=status, headers=HEADERS)


def refusal(status: int, message: str, session: Session | None = None) -> HTMLResponse:
    return render("message.html", status, title="Refused", message=message, session=session, csrf_field=CSRF_FIELD)


class Room:
    """A group of pages: the gateway's calls (and its audit trail), and the nav's links."""

    def __init__(self, calls: Calls, links: Sequence[tuple[str, str]]) -> None:
        self.calls = calls
        self.links = tuple(links)

    def _view(self, name: str, session: Session, status: int = 200, **context: Any) -> HTMLResponse:
        return render(name, status, session=session, csrf_field=CSRF_FIELD, links=self.links, **context)

    def _audit(self, session: Session, name: str, target: str = "", detail: str = "") -> None:
        if self.calls.audit is not None:
            who = session.principal
            self.calls.audit.record(action(who.name, who.tenant, name, target, detail))
