"""Paginated tools: every page's request, and the pages read one after another into one answer.

    answer ─▶ page 1 (the handler: turn, attempts) ─▶ items, next ─▶ page 2 ─▶ … ─▶ merged items (JSON array)

Each page is the same call with the tool's pagination `param` set to the continuation value (a `Link`
`rel="next"` URL, a cursor read from the body, an offset), so a model that passes the envelope's
`next_cursor` back as that argument continues where the call stopped. Pages are read while the call has
time, while the merged items fit the output budget and up to `max_pages`; a next link to another host
is not followed (the pages read are returned, with a note saying so).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import jmespath
from yarl import URL

from worker import errors
from worker.call.job import Answer, Job
from worker.call.rendering import render
from worker.definitions.model import Pagination, Tool, Upstream
from worker.http.transport import PreparedRequest, Response

# A page is not asked for with less time than this left before the call's deadline.
MIN_PAGE_TIME_S = 0.5
_LINK = re.compile(r"<([^>]*)>\s*((?:;\s*[^;,]*)*)")
_REL_NEXT = re.compile(r"""rel\s*=\s*"?([^";]*)"?""")

PageAnswer = Callable[[Job], Awaitable[Answer]]


def first_request(
    tool: Tool,
    upstream: Upstream,
    arguments: Mapping[str, Any],
    call_headers: Mapping[str, str],
    environ: Mapping[str, str],
) -> PreparedRequest:
    """The tool's request for these arguments; for a paginated tool, the page its continuation argument
    names (a next URL on the upstream's origin, a cursor or an offset as query parameters)."""
    pagination = tool.pagination
    if pagination is None:
        return render(tool, upstream, arguments, call_headers, environ)
    value = arguments.get(pagination.param)
    rest = {name: v for name, v in arguments.items() if name != pagination.param}
    request = render(tool, upstream, rest, call_headers, environ)
    if isinstance(value, str) and _is_url(value):
        return replace(request, url=_same_path(_same_origin(value, request.url), request.url))
    params = _page_params(pagination, value)
    return replace(request, url=_with_query(request.url, params)) if params else request


def _page_params(pagination: Pagination, value: Any) -> dict[str, str]:
    params = {}
    if pagination.style == "offset":
        params[pagination.param] = str(_offset(value))
        if pagination.limit_param is not None and pagination.limit is not None:
            params[pagination.limit_param] = str(pagination.limit)
    elif value is not None and value != "":
        params[pagination.param] = str(value)
    return params


def _offset(value: Any) -> int:
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError):
        raise errors.InvalidArguments("The offset to continue from must be a whole number.") from None


def _with_query(url: str, params: Mapping[str, str]) -> str:
    """The URL with these query parameters set (replacing any of the same names)."""
    parsed = URL(url, encoded=True)
    kept = [(k, v) for k, v in parsed.query.items() if k not in params]
    query = urlencode([*kept, *params.items()])
    return str(parsed.with_query(None)) + "?" + query


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def _same_origin(target: str, rendered: str) -> str:
    """A next link is followed only on the upstream's own origin (like a redirect)."""
    try:
        same = URL(target, encoded=True).origin() == URL(rendered, encoded=True).origin()
    except ValueError:
        raise errors.MalformedURL("The next page's URL is malformed.") from None
    if not same:
        raise errors.EgressBlocked("Blocked by the egress policy: the next page's link points to another host.")
    return target


def _same_path(target: str, rendered: str) -> str:
    """A next URL (which a model may pass back) reaches the tool's own path only, not the rest of its host."""
    if URL(target, encoded=True).path != URL(rendered, encoded=True).path:
        raise errors.InvalidArguments("The next page's URL must be on this tool's own path.")
    return target


@dataclass
class _Pages:
    """The pages read so far."""

    items: list[Any]
    count: int = 0
    attempts: int = 0


async def answer(job: Job, page: PageAnswer, budget_chars: int) -> Answer:
    """The call's answer with the items of its pages merged (or the first page's own, when it is no listing)."""
    pagination = job.tool.pagination
    assert pagination is not None
    pages = _Pages([])
    current, first = job, None
    while True:
        answer = await page(current)
        pages.attempts += answer.attempts
        first = first or answer
        data, items = _listing(answer, pagination)
        if items is None:
            if pages.count == 0:
                return replace(answer, attempts=pages.attempts)
            why = "it failed" if answer.error or not _ok(answer.response) else "it is not a listing"
            return _merged(first, pages, current.arguments.get(pagination.param), f"Page {pages.count + 1}: {why}.")
        pages.items.extend(items)
        pages.count += 1
        assert answer.response is not None
        following = _next(pagination, data, answer.response, current, len(items))
        if following is None:
            return _merged(first, pages, None, None)
        stop = _stop(job, pagination, pages, following, answer, budget_chars)
        if stop is not None:
            note, resumable = stop
            return _merged(first, pages, following if resumable else None, note)
        current = replace(job, arguments={**job.arguments, pagination.param: following})


def _stop(
    job: Job, pagination: Pagination, pages: _Pages, following: str, answer: Answer, budget: int
) -> tuple[str | None, bool] | None:
    """Why no further page is read now, and whether the model may continue from it (None: read it)."""
    if pages.count >= pagination.max_pages:
        return None, True
    if job.deadline - time.time() < MIN_PAGE_TIME_S:
        return "Stopped before the call's deadline; more pages remain.", True
    if len(json.dumps(pages.items, ensure_ascii=False, separators=(",", ":"))) >= budget:
        return "Stopped at the output budget; more pages remain.", True
    if _is_url(following) and answer.request is not None:
        try:
            _same_origin(following, answer.request.url)
        except errors.ToolError:
            host = URL(following, encoded=True).host
            return f"The next page's link points to another host ({host}); it was not followed (egress policy).", False
    return None


def _ok(response: Response | None) -> bool:
    return response is not None and 200 <= response.status < 300


def _listing(answer: Answer, pagination: Pagination) -> tuple[Any, list[Any] | None]:
    """A page's parsed body and its items (None: the page failed, is not JSON, or holds no list there)."""
    response = answer.response
    if answer.error is not None or response is None or not _ok(response) or not response.complete:
        return None, None
    try:
        data = json.loads(response.body)
    except ValueError:
        return None, None
    items = jmespath.search(pagination.items, data)
    return data, items if isinstance(items, list) else None


def _next(pagination: Pagination, data: Any, response: Response, current: Job, count: int) -> str | None:
    """The continuation value of the page after this one; None: this was the last."""
    if pagination.style == "link":
        return next_link(response.link, response.url)
    if pagination.style == "cursor":
        assert pagination.next is not None
        cursor = jmespath.search(pagination.next, data)
        return str(cursor) if cursor not in (None, "", False) else None
    if pagination.limit is None or count < pagination.limit:
        return None  # a short page is the last
    return str(_offset(current.arguments.get(pagination.param)) + pagination.limit)


def next_link(header: str | None, base: str) -> str | None:
    """The `rel="next"` target of a Link header (RFC 8288), made absolute against the page's URL."""
    for target, params in _LINK.findall(header or ""):
        rels = {rel for match in _REL_NEXT.findall(params) for rel in match.split()}
        if "next" in rels:
            return str(URL(base).join(URL(target)))
    return None


def _merged(first: Answer | None, pages: _Pages, next_cursor: Any, note: str | None) -> Answer:
    """One answer for the pages read: their items as a JSON array, the first page's request and head."""
    assert first is not None and first.response is not None
    body = json.dumps(pages.items, ensure_ascii=False, separators=(",", ":")).encode()
    response = replace(first.response, body=body, complete=True, content_type="application/json", charset="utf-8")
    cursor = None if next_cursor is None else str(next_cursor)
    return Answer(
        first.request, response, attempts=pages.attempts, pages=pages.count, next_cursor=cursor, note=note or None
    )
