"""The web page's browser, as the tests drive it: Debian's chromium through playwright (one per
module), tabs that record what they requested and every script error, and the page's URL with
the token in its fragment. Shared by tests/test_web.py and tests/test_handover.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.browser_helpers import WAIT, browser_fixture
from tests.server_helpers import MODEL, TOKEN, Served


@dataclass
class Tab:
    """One browser tab on the page, with what it requested and what went wrong in it."""

    page: Any
    requests: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def loc(self, selector: str, **options: Any) -> Any:
        return self.page.locator(selector, **options)

    def prompt(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def result(self, text: str) -> None:
        from playwright.sync_api import expect

        expect(self.loc("#transcript .line.result").last).to_contain_text(text)


@pytest.fixture(name="tabs")
def tabs_fixture(browser: Any) -> Iterator[Any]:
    contexts: list[Any] = []
    opened: list[Tab] = []

    def open_tab(url: str, *, width: int = 1200, height: int = 800, context: Any = None) -> Tab:
        if context is None:
            context = browser.new_context(viewport={"width": width, "height": height})
            contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(WAIT)
        tab = Tab(page)
        page.on("request", lambda r: tab.requests.append(r))
        page.on("pageerror", lambda e: tab.problems.append(str(e)))
        page.on("console", lambda m: tab.problems.append(m.text) if m.type == "error" else None)
        page.goto(url)
        opened.append(tab)
        return tab

    yield open_tab
    for context in contexts:
        context.close()
    for tab in opened:
        # No script error, no CSP violation (chromium logs those as console errors).
        assert [p for p in tab.problems if "Failed to load resource" not in p] == []


def session_url(served: Served, sid: str = "") -> str:
    return f"{served.url}/#token={TOKEN}" + (f"&session={sid}" if sid else "")


def new_session(served: Served, **body: Any) -> str:
    with served.client() as c:
        r = c.post("/v1/sessions", json={"model": MODEL, **body})
        assert r.status_code == 201, r.text
        sid: str = r.json()["id"]
        return sid


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


__all__ = ["WAIT", "Tab", "browser_fixture", "expect", "new_session", "session_url", "tabs_fixture"]
