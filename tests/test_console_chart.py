"""The fleet page's live chart in a real headless chromium, against a real gateway, worker, Redis and upstream:
it appears, it moves under load, and a queue nobody serves shows its oldest call's age growing. Screenshots
go to the pytest temporary directory (`<basetemp>/console-chart0/`)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Page

from tests.conftest import FIXTURES, start_worker, stop_worker, worker_env
from tests.support.browser import browser, page
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import wait_until
from worker.dev.embedded import EmbeddedRedis, free_port

pytestmark = pytest.mark.integration
__all__ = ["browser", "page"]

OPERATOR_TOKEN = "chart-operator-token-7d21"
DEFINITIONS = FIXTURES / "console"


@dataclass
class ChartStack:
    gateway: Gateway
    shots: Path
    env: dict[str, str]

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module")
def stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartStack]:
    """A Redis, a worker (of toolcalls only), an upstream and a gateway whose token may operate."""
    directory = tmp_path_factory.mktemp("console-chart")
    server = EmbeddedRedis(directory / "redis").start()
    upstream = ServerThread(make_upstream(UpstreamState())).start()
    env = worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS)
    worker = start_worker(env, directory / "worker.log")
    gateway = None
    try:
        published = subprocess.run(
            [sys.executable, "-m", "worker", "publish"], env=env, capture_output=True, timeout=60
        )
        assert published.returncode == 0, published.stderr  # console-held becomes a routed queue
        port = free_port()
        genv = gateway_env(server.url, DEFINITIONS, TOOLWORKER_GATEWAY_TOKENS=OPERATOR_TOKEN)
        gateway = start_gateway(genv, directory / "gateway.log", port)
        wait_listening(gateway, ready=True)
        yield ChartStack(gateway, directory, env)
    finally:
        if gateway is not None:
            gateway.stop()
        stop_worker(worker)
        upstream.stop()
        server.stop()


def sign_in(page: Page, stack: ChartStack) -> None:
    page.goto(stack.url + "/console/login")
    page.get_by_label("Token").fill(OPERATOR_TOKEN)
    page.get_by_label("Token").press("Enter")
    assert page.locator("h1").inner_text() == "Fleet"


def call(stack: ChartStack, tool: str, item: str, wait: bool = True) -> None:
    body = {"tool": tool, "arguments": {"item": item}, "wait": wait}
    answer = httpx2.post(
        stack.url + "/v1/calls", json=body, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30
    )
    assert answer.status_code in (200, 202), answer.text


def figure_value(page: Page, queue: str, attribute: str) -> float | None:
    """A series' latest figure, as its <figure> gives it (None: the series is not drawn, or has no value)."""
    found = page.locator(f'figure.series[data-queue="{queue}"][data-tenant="default"]')
    if found.count() == 0:
        return None
    value = found.first.get_attribute(f"data-{attribute}")
    return None if value in (None, "-") else float(value)


class Load:
    """Calls to echo_get from a few threads, each waiting for its answer, until stopped."""

    def __init__(self, stack: ChartStack, threads: int = 4) -> None:
        self._stack = stack
        self._stop = threading.Event()
        self.answered = 0
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, n: int) -> None:
        count = 0
        while not self._stop.is_set():
            call(self._stack, "echo_get", f"load-{n}-{count}")
            count += 1
            self.answered += 1


def test_the_chart_appears_and_moves_under_load(stack: ChartStack, page: Page) -> None:
    """Under a stream of calls the page's chart refreshes by itself (no reload) and its toolcalls series
    shows ok calls per second above zero, with a p50 and p99; the script and the chart come from the page's
    own origin only."""
    origins: set[str] = set()
    page.on("request", lambda request: origins.add(request.url.split("/")[2]))
    sign_in(page, stack)
    assert page.locator("#fleet-chart").count() == 1
    with Load(stack):
        wait_until(lambda: (figure_value(page, "toolcalls", "ok-per-s") or 0) > 0, 60, "ok calls/s on the chart")
        first = page.locator("#fleet-chart").get_attribute("data-refreshed")
        points = page.locator('figure.series[data-queue="toolcalls"] polyline.ok').get_attribute("points")
        wait_until(
            lambda: page.locator('figure.series[data-queue="toolcalls"] polyline.ok').get_attribute("points") != points,
            30,
            "the ok line to move",
        )
        page.screenshot(path=str(stack.shots / "chart-under-load.png"), full_page=True)
    assert page.locator("#fleet-chart").get_attribute("data-refreshed") != first
    assert figure_value(page, "toolcalls", "p50-s") is not None and figure_value(page, "toolcalls", "p99-s") is not None
    assert origins == {stack.url.split("/")[2]}


def test_a_stalled_queue_shows_a_growing_age(stack: ChartStack, page: Page) -> None:
    """Calls to a queue no worker serves wait: the chart's oldest waiting age for that queue grows from one
    refresh to the next, and the table shows the same queue's age."""
    for n in range(3):
        call(stack, "held_echo", f"stalled-{n}", wait=False)
    sign_in(page, stack)
    wait_until(lambda: (figure_value(page, "console-held", "oldest-waiting-s") or 0) > 0, 30, "the held queue drawn")
    first = figure_value(page, "console-held", "oldest-waiting-s") or 0.0
    wait_until(
        lambda: (figure_value(page, "console-held", "oldest-waiting-s") or 0) >= first + 3, 30, "the age to grow by 3 s"
    )
    line = page.locator('figure.series[data-queue="console-held"] polyline.age').get_attribute("points") or ""
    assert len(line.split()) >= 2  # a line of samples, rising
    page.screenshot(path=str(stack.shots / "chart-stalled.png"), full_page=True)
    held = [row for row in page.locator("#tenants tbody tr").all_inner_texts() if row.startswith("console-held")]
    assert any("default" in row for row in held)


def test_top_prints_the_same_figures(stack: ChartStack) -> None:
    """`toolworker top --once`: the held queue's oldest waiting call, and toolcalls' calls answered; its text
    frame names both."""
    call(stack, "held_echo", "top-held", wait=False)
    for n in range(3):
        call(stack, "echo_get", f"top-{n}")
    argv = [sys.executable, "-m", "worker", "top", "--once"]

    def figures() -> dict[str, dict[str, float | None]]:
        shown = subprocess.run([*argv, "--format", "json"], env=stack.env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        return {row["queue"]: row for row in json.loads(shown.stdout) if row["tenant"] == "default"}

    wait_until(lambda: (figures().get("console-held", {}).get("oldest_waiting_s") or 0) > 0, 30, "the held age")
    wait_until(lambda: "toolcalls" in figures(), 30, "toolcalls' calls in top")
    text = subprocess.run(argv, env=stack.env, capture_output=True, text=True, timeout=60).stdout
    assert "console-held" in text and "toolcalls" in text and "WAITING" in text
