"""A real headless browser for the console's tests: Debian's chromium (installed by `make browser`),
driven by Playwright for Python (whose own browser download is not used)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.waiting import wait_until
from worker.dev.embedded import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A chromium of its own (Playwright gives it a fresh temporary profile), for the module's tests."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page in a context of its own: no cookie from another test."""
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()


def screenshot_dir() -> Path:
    """Where the tests save screenshots for a reviewer: inside the venv, outside git."""
    directory = Path(__file__).resolve().parents[2] / ".venv" / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class AsgiThread:
    """An ASGI app on uvicorn, in a thread of this process, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AsgiThread:
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn to listen")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
