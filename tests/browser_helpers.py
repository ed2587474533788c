"""The browser the page tests drive: Debian's chromium through playwright, one per test module.
Import the fixture as `from tests.browser_helpers import browser_fixture` (`# noqa: F401`);
tests take it as `browser`. It skips, with the reason, where playwright or chromium is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

#: How long an `expect` waits (ms): a busy two-core machine runs the page tests in parallel.
WAIT = 15_000


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (skips the test, with the reason, where it cannot start)."""
    pytest.importorskip("playwright.sync_api", reason="needs the playwright package (keel[dev])")
    from playwright.sync_api import Error, expect, sync_playwright

    expect.set_options(timeout=WAIT)
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        except Error as err:
            pytest.skip(f"chromium cannot start here: {str(err).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture(name="browser", scope="module")
def browser_fixture() -> Iterator[Any]:
    with chromium() as b:
        yield b
