"""A real headless browser for the console's tests: Debian's chromium (installed by `make browser`),
driven by Playwright for Python (whose own browser download is not used)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

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
