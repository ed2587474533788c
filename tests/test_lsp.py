"""Language-server diagnostics after edits (keel.lsp, docs/lsp.md), through the real loop: real
pyright and typescript-language-server (from tests/lsp/node, `npm ci --prefix tests/lsp/node`)
on real type errors, and a small fake server (tests/lsp/fake_server.py) for the slow, crashing
and leftover-process cases."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import Event, ToolFinished
from keel.app import Options, open_agent
from keel.llm.events import Notice
from keel.lsp.manager import LspManager
from keel.lsp.servers import load_specs
from tests.helpers import user_settings_file
from tests.test_cli import keel, write_script

HERE = Path(__file__).resolve().parent
NODE_BIN = HERE / "lsp" / "node" / "node_modules" / ".bin"
FAKE = HERE / "lsp" / "fake_server.py"
INSTALL = "npm ci --prefix tests/lsp/node"


@pytest.fixture(autouse=True)
def lsp_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEEL_LSP", raising=False)  # conftest turns it off for other tests


def node_server(name: str) -> str:
    path = NODE_BIN / name
    if not path.exists():
        pytest.skip(f"needs {name} from npm: {INSTALL}")
    return str(path)


def fake_entry(**extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(FAKE)],
        "extensionToLanguage": {".fake": "fake"},
        **extra,
    }


def user_settings(data: dict[str, Any]) -> None:
    path = user_settings_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def step(text: str, *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"text": text, "tool_calls": [{"name": n, "input": i} for n, i in calls]}


async def run_script(project: Path, tmp_path: Path, turns: list[dict[str, Any]]) -> Any:
    """Run `turns` through a real agent (settings, tools and servers as a run gets them):
    (the text of each tool result in order, the notices, the agent, closed)."""
    script = write_script(tmp_path / "script.json", [*turns, {"text": "done"}])
    notices: list[str] = []

    def notice(event: Event) -> None:
        # The "no sandbox" line of a machine without bubblewrap is not about diagnostics.
        if isinstance(event, Notice) and not event.text.startswith("no sandbox: "):
            notices.append(event.text)

    agent = await open_agent(
        Options(cwd=project, model=f"scripted:{script}", mode="bypass", no_session=True), notice
    )
    events: list[Event] = []
    try:
        result = await agent.run("go", events.append)
    finally:
        await agent.aclose()
    assert result.stop_reason == "end_turn"
    texts = [e.result.text for e in events if isinstance(e, ToolFinished)]
    return texts, notices, agent


# -- real servers ---------------------------------------------------------------------------------


@pytest.mark.needs("node")
async def test_pyright_type_error_and_broken_importer_in_edit_results(
    tmp_path: Path,
) -> None:
    """An edit that introduces a type error returns pyright's own message; a change that breaks
    a file importing the edited one names that file's new error; the `diagnostics` tool reads
    a file and every open one."""
    user_settings(
        {
            "lsp": {
                "timeout": 60,
                "servers": {
                    "pyright": {
                        "command": node_server("pyright-langserver"),
                        "startupTimeout": 60000,
                    }
                },
            }
        }
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    (project / "lib.py").write_text(
        "def add(a: int, b: int) -> int:\n    return a + b\n", encoding="utf-8"
    )
    (project / "main.py").write_text("from lib import add\n\nprint(add(1, 2))\n", "utf-8")
    texts, notices, agent = await run_script(
        project,
        tmp_path,
        [
            step("reading", ("read", {"path": "lib.py"})),
            step(
                "typing",
                ("edit", {"path": "lib.py", "old_string": "    return", "new_string": "    x: str = 1\n    return"}),
            ),
            step(
                "renaming",
                (
                    "multi_edit",
                    {
                        "path": "lib.py",
                        "edits": [
                            {"old_string": "    x: str = 1\n", "new_string": ""},
                            {"old_string": "def add(", "new_string": "def plus("},
                        ],
                    },
                ),
            ),
            step("checking", ("diagnostics", {"path": "main.py"})),
            step("all", ("diagnostics", {})),
        ],
    )  # fmt: skip
    assert notices == []
    assert texts[1:] == [
        "Edited lib.py: 1 replacement.\n\n"
        '<diagnostics server="pyright">\n'
        'lib.py:2:14: Type "Literal[1]" is not assignable to declared type "str"\n'
        # pyright indents the message's second line with two no-break spaces
        '\xa0\xa0"Literal[1]" is not assignable to "str" [Pyright reportAssignmentType]\n'
        "</diagnostics>",
        "Edited lib.py: 2 edits, 2 replacements.\n\n"
        '<diagnostics server="pyright">\n'
        "new errors in files that import lib.py:\n"
        'main.py:1:17: "add" is unknown import symbol [Pyright reportAttributeAccessIssue]\n'
        "</diagnostics>",
        'main.py:1:17: error: "add" is unknown import symbol [Pyright reportAttributeAccessIssue]',
        'main.py:1:17: error: "add" is unknown import symbol [Pyright reportAttributeAccessIssue]',
    ]
    assert agent.ctx.lsp is not None
    assert agent.ctx.lsp.running() == []  # closed with the agent


@pytest.mark.needs("node")
async def test_typescript_type_error_in_write_and_edit_results(tmp_path: Path) -> None:
    """typescript-language-server's messages for a new file and for an edit to it; an edit
    that fixes them returns the plain result."""
    server = node_server("typescript-language-server")
    user_settings(
        {
            "lsp": {
                "timeout": 60,
                "servers": {"typescript": {"command": server, "startupTimeout": 60000}},
            }
        }
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "tsconfig.json").write_text('{"compilerOptions": {"strict": true}}', "utf-8")
    texts, notices, _ = await run_script(
        project,
        tmp_path,
        [
            step(
                "writing",
                ("write", {"path": "a.ts", "content": 'export const n: number = "one";\n'}),
            ),
            step(
                "fixing",
                ("edit", {"path": "a.ts", "old_string": '"one"', "new_string": "1"}),
            ),
            step(
                "breaking",
                (
                    "edit",
                    {
                        "path": "a.ts",
                        "old_string": "= 1;",
                        "new_string": "= 1;\nexport function f(s: string): number { return s; }",
                    },
                ),
            ),
        ],
    )
    assert notices == []
    assert texts == [
        "Created a.ts (1 lines).\n\n"
        '<diagnostics server="typescript">\n'
        "a.ts:1:14: Type 'string' is not assignable to type 'number'. [typescript 2322]\n"
        "</diagnostics>",
        "Edited a.ts: 1 replacement.",
        "Edited a.ts: 1 replacement.\n\n"
        '<diagnostics server="typescript">\n'
        "a.ts:2:40: Type 'string' is not assignable to type 'number'. [typescript 2322]\n"
        "</diagnostics>",
    ]


# -- the fake server: timeouts, crashes, shutdown, approval ---------------------------------------


async def test_slow_server_results_come_with_the_next_tool_result(tmp_path: Path) -> None:
    """A server slower than `lsp.timeout` does not hold the edit: its result says the check goes
    on, and the errors that arrive later come with the next tool result as a note."""
    user_settings({"lsp": {"timeout": 0.3, "servers": {"fake": fake_entry()}}})
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("hello\n", encoding="utf-8")
    texts, _, _ = await run_script(
        project,
        tmp_path,
        [
            step("writing", ("write", {"path": "a.fake", "content": "SLOW\nERR bad thing\n"})),
            step("waiting", ("bash", {"command": "sleep 2.5; echo waited"})),
            step("reading", ("read", {"path": "notes.txt"})),
        ],
    )
    assert texts == [
        "Created a.fake (2 lines).\n\n(fake is still checking a.fake; its errors will come with "
        "a later result)",
        "waited\n[exit code 0]\n\n"
        '<diagnostics server="fake">\n'
        "(these arrived after the result of the last change to a.fake)\n"
        "a.fake:2:1: bad thing [fake E1]\n"
        "</diagnostics>",
        "     1\thello",
    ]


async def test_crashed_server_restarts_then_stays_off(tmp_path: Path) -> None:
    """A server that dies is restarted for the next change, up to `maxRestarts` times; then it
    stays off for the session and the result says so, once per change, without failing it."""
    warnings: list[str] = []
    specs = load_specs([("test", {"fake": fake_entry(maxRestarts=1)})], warnings=warnings)
    assert warnings == []
    manager = LspManager(specs, project_root=tmp_path, timeout=10)
    path = tmp_path / "a.fake"
    try:
        first = await manager.after_write(path, "ERR one\n")
        ((_, _, pid1),) = manager.running()
        crashed = await manager.after_write(path, "CRASH\n")
        again = await manager.after_write(path, "ERR two\n")
        ((_, _, pid2),) = manager.running()
        crashed2 = await manager.after_write(path, "CRASH\n")
        off = await manager.after_write(path, "ERR three\n")
        silent = await manager.after_write(path, "ERR four\n")
    finally:
        await manager.aclose()
    assert first == '<diagnostics server="fake">\na.fake:1:1: one [fake E1]\n</diagnostics>'
    assert crashed == "(no diagnostics for a.fake: fake exited (exit code 3))"
    assert again == '<diagnostics server="fake">\na.fake:1:1: two [fake E1]\n</diagnostics>'
    assert pid2 != pid1
    assert crashed2 == "(no diagnostics for a.fake: fake exited (exit code 3))"
    assert off == (
        "(no diagnostics for a.fake: fake exited (exit code 3); restarted 1 time(s), it stays "
        "off for this session)"
    )
    assert silent == ""  # said once


async def test_server_that_cannot_start_is_named_once(tmp_path: Path) -> None:
    entry = {"command": sys.executable, "args": ["-c", "import sys; sys.exit(4)"],
             "extensions": [".fake"]}  # fmt: skip
    specs = load_specs([("test", {"fake": entry})], warnings=[])
    manager = LspManager(specs, project_root=tmp_path, timeout=10)
    try:
        first = await manager.after_write(tmp_path / "a.fake", "x\n")
        second = await manager.after_write(tmp_path / "a.fake", "y\n")
    finally:
        await manager.aclose()
    assert first == ("(no diagnostics for a.fake: fake could not start: fake exited (exit code 4))")
    assert second == ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "State:\tZ" not in status.read_text(encoding="utf-8")


def test_keel_p_leaves_no_server_process_behind(tmp_path: Path) -> None:
    """`keel -p` ends its language servers with the session: the server and the child it
    started are gone when keel exits."""
    pids = tmp_path / "pids"
    entry = fake_entry(env={"FAKE_LSP_PIDS": str(pids)})
    user_settings({"lsp": {"timeout": 10, "servers": {"fake": entry}}})
    project = tmp_path / "project"
    project.mkdir()
    script = write_script(
        tmp_path / "s.json",
        [step("writing", ("write", {"path": "a.fake", "content": "ERR oops\n"})), {"text": "ok"}],
    )
    env = {**os.environ}
    env.pop("KEEL_LSP", None)
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "go", "--model", f"scripted:{script}",
         "--mode", "bypass", "--output-format", "stream-json"],
        cwd=project, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "a.fake:1:1: oops [fake E1]" in out.stdout
    (line,) = pids.read_text(encoding="utf-8").splitlines()
    server, child = (int(p) for p in line.split())
    deadline = time.monotonic() + 5
    while (_alive(server) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server)
    assert not _alive(child)


async def test_project_server_runs_only_once_approved(tmp_path: Path) -> None:
    """A language server entry in the project's settings runs a command: until the user
    approves the file's entry (`keel trust approve`), it does not start, and keel says so."""
    pids = tmp_path / "pids"
    project = tmp_path / "project"
    (project / ".keel").mkdir(parents=True)
    (project / ".git").mkdir()
    entry = fake_entry(env={"FAKE_LSP_PIDS": str(pids)})
    settings = {"lsp": {"timeout": 10, "servers": {"fake": entry}}}
    (project / ".keel" / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    turns = [step("writing", ("write", {"path": "a.fake", "content": "ERR oops\n"}))]
    texts, notices, agent = await run_script(project, tmp_path, turns)
    assert texts == ["Created a.fake (1 lines)."]
    assert not pids.exists()
    assert agent.ctx.lsp is None or agent.ctx.lsp.spec_for(project / "a.fake") is None
    (waiting,) = [n for n in notices if "lsp.servers.fake" in n]
    assert waiting.startswith(f"{project / '.keel' / 'settings.json'}: not applied until you ")
    listed = keel("trust", "list", cwd=project)
    assert "    lsp.servers.fake = " in listed.stdout, listed.stdout
    assert "runs this language server on your machine when a matching file changes" in listed.stdout
    approved = keel("trust", "approve", "settings", cwd=project)
    assert approved.returncode == 0, approved.stderr
    (project / "a.fake").unlink()
    texts, notices, _ = await run_script(project, tmp_path, turns)
    assert texts == [
        'Created a.fake (1 lines).\n\n<diagnostics server="fake">\na.fake:1:1: oops [fake E1]\n'
        "</diagnostics>"
    ]
    assert pids.exists()


async def test_no_server_here_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no language server can run (none installed, none configured), edits return what
    they always did and no `diagnostics` tool is offered."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("x = 1\n", encoding="utf-8")
    texts, notices, agent = await run_script(
        project,
        tmp_path,
        [
            step("reading", ("read", {"path": "a.py"})),
            step("typing", ("edit", {"path": "a.py", "old_string": "x = 1", "new_string": "x: str = 1"})),
        ],
    )  # fmt: skip
    assert texts == ["     1\tx = 1", "Edited a.py: 1 replacement."]
    assert not [n for n in notices if "lsp" in n]
    assert agent.ctx.lsp is None
    assert agent.registry.get("diagnostics") is None


async def test_lsp_setting_false_and_keel_lsp_0_turn_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    turns = [step("writing", ("write", {"path": "a.fake", "content": "ERR oops\n"}))]
    user_settings({"lsp": {"enabled": False, "servers": {"fake": fake_entry()}}})
    texts, _, agent = await run_script(project, tmp_path, turns)
    assert (texts, agent.ctx.lsp) == (["Created a.fake (1 lines)."], None)
    user_settings({"lsp": {"servers": {"fake": fake_entry()}}})
    monkeypatch.setenv("KEEL_LSP", "0")
    (project / "a.fake").unlink()
    texts, _, agent = await run_script(project, tmp_path, turns)
    assert (texts, agent.ctx.lsp) == (["Created a.fake (1 lines)."], None)


def test_bad_server_entries_are_named_and_skipped() -> None:
    warnings: list[str] = []
    specs = load_specs(
        [
            (
                "settings.json",
                {
                    "a": {"command": "x"},
                    "b": {"command": "x", "extensionToLanguage": {"py": "python"}},
                    "c": {"command": "x", "extensions": [".c2"], "transport": "socket"},
                    "pyright": {"disabled": True},
                    "d": {"command": "x", "extensions": [".d"], "colour": "red"},
                },
            )
        ],
        warnings=warnings,
    )
    assert warnings == [
        "settings.json: lsp server 'a': it names no file extensions (extensionToLanguage); skipped",
        "settings.json: lsp server 'b': extensionToLanguage must map extensions to language ids, "
        'like {".py": "python"}; skipped',
        "settings.json: lsp server 'c': transport 'socket' is not supported (only stdio); skipped",
        "settings.json: lsp server 'd': unknown key 'colour' skipped",
    ]
    assert [s.name for s in specs] == [
        "d",
        "basedpyright",
        "typescript",
        "gopls",
        "rust-analyzer",
        "clangd",
    ]


def test_plugin_lsp_servers_are_read_with_their_variables(tmp_path: Path) -> None:
    """A plugin's `.lsp.json` (Claude Code's format) becomes `plugin:<plugin>:<server>`, with
    `${CLAUDE_PLUGIN_ROOT}` filled in and the plugin's variables in its environment."""
    from keel.lsp.servers import ServerSpec

    root = tmp_path / "plug"
    entries = {
        "go": {
            "command": "${CLAUDE_PLUGIN_ROOT}/bin/gopls",
            "args": ["serve"],
            "extensionToLanguage": {".go": "go"},
        }
    }
    warnings: list[str] = []
    filled = {
        "go": {
            **entries["go"],
            "command": f"{root}/bin/gopls",
            "env": {"CLAUDE_PLUGIN_ROOT": str(root), "CLAUDE_PLUGIN_DATA": "/d"},
        }
    }
    specs = load_specs([], plugins=[("p", root / ".lsp.json", filled)], warnings=warnings)
    off = load_specs(
        [("settings.json", {"plugin:p:go": {"disabled": True}})],
        plugins=[("p", root / ".lsp.json", filled)],
        warnings=warnings,
    )
    assert warnings == []
    assert [s.name for s in off] == [s.name for s in specs[1:]]  # turned off by settings
    assert specs[0] == ServerSpec(
        "plugin:p:go",
        f"{root}/bin/gopls",
        ("serve",),
        ((".go", "go"),),
        (),
        env=(("CLAUDE_PLUGIN_DATA", "/d"), ("CLAUDE_PLUGIN_ROOT", str(root))),
        source=f"plugin p ({root / '.lsp.json'})",
    )


async def test_diagnostics_tool_runs_in_plan_mode(tmp_path: Path) -> None:
    """`diagnostics` is read-only: plan mode lets it run."""
    user_settings({"lsp": {"timeout": 10, "servers": {"fake": fake_entry()}}})
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.fake").write_text("ERR one\nWARN two\n", encoding="utf-8")
    script = write_script(
        tmp_path / "s.json",
        [step("checking", ("diagnostics", {"path": "a.fake"})), {"text": "done"}],
    )
    agent = await open_agent(
        Options(cwd=project, model=f"scripted:{script}", mode="plan", no_session=True)
    )
    events: list[Event] = []
    try:
        await agent.run("go", events.append)
    finally:
        await agent.aclose()
    (finished,) = [e for e in events if isinstance(e, ToolFinished)]
    assert finished.result.text == (
        "a.fake:1:1: error: one [fake E1]\na.fake:2:1: warning: two [fake E1]"
    )
    assert not finished.result.is_error


async def test_timeout_never_holds_the_loop_longer_than_asked(tmp_path: Path) -> None:
    specs = load_specs([("test", {"fake": fake_entry()})], warnings=[])
    manager = LspManager(specs, project_root=tmp_path, timeout=0.4)
    try:
        await manager.after_write(tmp_path / "warm.fake", "")  # started: the wait is the check
        start = time.monotonic()
        block = await manager.after_write(tmp_path / "a.fake", "SLOW\nERR late\n")
        waited = time.monotonic() - start
        assert block == (
            "(fake is still checking a.fake; its errors will come with a later result)"
        )
        assert waited < 1.2
        assert manager.take_late() == ""
        await asyncio.sleep(1.6)
        assert manager.take_late() == (
            '<diagnostics server="fake">\n'
            "(these arrived after the result of the last change to a.fake)\n"
            "a.fake:2:1: late [fake E1]\n"
            "</diagnostics>"
        )
        assert manager.take_late() == ""
    finally:
        await manager.aclose()


async def test_pull_diagnostics_and_the_servers_configuration(tmp_path: Path) -> None:
    """A server that offers pull diagnostics (`diagnosticProvider`) is asked with
    `textDocument/diagnostic`; its `workspace/configuration` request is answered from the
    entry's `settings`, by section."""
    entry = fake_entry(env={"FAKE_LSP_PULL": "1"}, settings={"fake": {"level": "strict"}})
    specs = load_specs([("test", {"fake": entry})], warnings=[])
    manager = LspManager(specs, project_root=tmp_path, timeout=10)
    try:
        first = await manager.after_write(tmp_path / "a.fake", "x\nERR pulled\n")
        second = await manager.after_write(tmp_path / "a.fake", "fine\n")
        listed = [(p.name, [d.message for d in ds]) for p, ds in manager.open_files()]
    finally:
        await manager.aclose()
    assert first == (
        '<diagnostics server="fake">\n'
        'a.fake:1:1: level is "strict"\n'
        "a.fake:2:1: pulled [fake E1]\n"
        "</diagnostics>"
    )
    assert second == '<diagnostics server="fake">\na.fake:1:1: level is "strict"\n</diagnostics>'
    assert listed == [("a.fake", ['level is "strict"'])]  # what `diagnostics` lists


async def test_configured_server_that_is_not_installed_is_named(tmp_path: Path) -> None:
    user_settings({"lsp": {"servers": {"mine": {"command": "no-such-lsp", "extensions": [".q"]}}}})
    project = tmp_path / "project"
    project.mkdir()
    _, notices, _ = await run_script(project, tmp_path, [])
    assert [n for n in notices if "lsp" in n] == [
        f"{user_settings_file()}: lsp server 'mine' not used: no-such-lsp is not installed here "
        "(not on PATH)"
    ]


async def test_resume_keeps_the_diagnostics_tool_as_the_session_had_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session started where a server could run offered `diagnostics`; resumed where none
    can (here `KEEL_LSP=0`), it still offers the same tools, so the resume is not refused as a
    changed configuration, and the tool says no server runs."""
    from keel.app import resume_agent

    user_settings({"lsp": {"servers": {"fake": fake_entry()}}})
    project = tmp_path / "project"
    project.mkdir()
    script = write_script(
        tmp_path / "s.json",
        [step("checking", ("diagnostics", {})), {"text": "done"}, {"text": "again"}],
    )
    options = Options(cwd=project, model=f"scripted:{script}", mode="bypass")
    agent = await open_agent(options)
    try:
        await agent.run("go")
        assert agent.session is not None
        path = agent.session.path
        tools = [t.name for t in agent.tool_specs]
    finally:
        await agent.aclose()
    assert "diagnostics" in tools
    monkeypatch.setenv("KEEL_LSP", "0")
    notices: list[str] = []
    opened = await resume_agent(
        path, options, lambda e: notices.append(e.text) if isinstance(e, Notice) else None
    )
    try:
        assert [t.name for t in opened.agent.tool_specs] == tools
        assert not [n for n in notices if "changed configuration" in n], notices
        assert opened.agent.ctx.lsp is None
    finally:
        await opened.agent.aclose()


def test_doctor_lists_the_language_servers(tmp_path: Path) -> None:
    user_settings({"lsp": {"servers": {"fake": fake_entry(), "pyright": {"disabled": True}}}})
    project = tmp_path / "project"
    project.mkdir()
    out = keel("doctor", cwd=project).stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("language servers: "))
    lines = out[start : start + 7]
    assert lines[1] == f"  fake: ready (.fake; {user_settings_file()})"
    assert [line.split(":")[0] for line in lines[2:]] == [
        "  basedpyright",
        "  typescript",
        "  gopls",
        "  rust-analyzer",
        "  clangd",
    ]
    assert out[start + 7] == "Codex and OpenCode files: none"


@pytest.mark.parametrize(
    ("target", "line", "imports"),
    [
        ("pkg/lib.py", "from pkg.lib import add", True),
        ("pkg/lib.py", "from pkg import lib, other", True),
        ("pkg/lib.py", "from .lib import add", True),
        ("pkg/lib.py", "from . import lib", True),
        ("pkg/lib.py", "import pkg.lib as l", True),
        ("lib.py", "from lib import add", True),
        ("pkg/lib.py", "from other.lib2 import add", False),
        ("pkg/lib.py", "from mcp.client import lib_helper", False),
        ("pkg/__init__.py", "from pkg import thing", True),
        ("src/util.ts", "import { f } from './util';", True),
        ("src/util.ts", "import { f } from '../src/util.js';", True),
        ("src/util.ts", "import { f } from './utility';", False),
        ("src/util.ts", "const s = './util';", False),
        ("src/index.ts", "export * from './src';", True),
        ("inc/util.h", '#include "inc/util.h"', True),
        ("src/util.rs", "mod util;", True),
        ("src/util.rs", "use crate::util::f;", True),
        ("cmd/store/store.go", '\t"example.com/app/store"', True),
    ],
)
def test_import_lines_name_the_changed_module(target: str, line: str, imports: bool) -> None:
    from keel.lsp.manager import import_pattern

    assert bool(import_pattern(Path("/p") / target).search(line)) is imports


async def test_a_failing_check_never_fails_the_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong while checking, the change stays made: the result names the error
    instead of becoming one."""
    import keel.lsp.manager as manager_module

    def broken(*_: object) -> list[Path]:
        raise RuntimeError("boom")

    monkeypatch.setattr(manager_module, "find_importers", broken)
    user_settings({"lsp": {"timeout": 10, "servers": {"fake": fake_entry()}}})
    project = tmp_path / "project"
    project.mkdir()
    texts, _, _ = await run_script(
        project, tmp_path, [step("writing", ("write", {"path": "a.fake", "content": "ERR x\n"}))]
    )
    assert texts == ["Created a.fake (1 lines).\n\n(no diagnostics for a.fake: RuntimeError: boom)"]
    assert (project / "a.fake").read_text(encoding="utf-8") == "ERR x\n"


def _install_lsp_plugin(tmp_path: Path) -> Path:
    """A marketplace with one plugin whose `.lsp.json` names the fake server through
    `${CLAUDE_PLUGIN_ROOT}`, installed (`keel plugin install`) for a new git project."""
    import shutil

    market = tmp_path / "market"
    plugin = market / "lspplug"
    (market / ".claude-plugin").mkdir(parents=True)
    (plugin / ".claude-plugin").mkdir(parents=True)
    catalogue = {"name": "m", "plugins": [{"name": "lspplug", "source": "./lspplug"}]}
    (market / ".claude-plugin" / "marketplace.json").write_text(json.dumps(catalogue), "utf-8")
    manifest = {"name": "lspplug", "version": "1.0.0"}
    (plugin / ".claude-plugin" / "plugin.json").write_text(json.dumps(manifest), "utf-8")
    shutil.copy(FAKE, plugin / "fake_server.py")
    servers = {
        "fake": {
            "command": sys.executable,
            "args": ["${CLAUDE_PLUGIN_ROOT}/fake_server.py"],
            "extensionToLanguage": {".fake": "fake"},
        }
    }
    (plugin / ".lsp.json").write_text(json.dumps(servers), encoding="utf-8")
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    for args in (("plugin", "marketplace", "add", str(market)), ("plugin", "install", "lspplug@m")):
        out = keel(*args, cwd=project)
        assert out.returncode == 0, out.stderr
    return project


@pytest.mark.needs("git")
async def test_an_installed_plugins_lsp_server_reports_after_edits(tmp_path: Path) -> None:
    """A plugin's `.lsp.json` (Claude Code's format, `${CLAUDE_PLUGIN_ROOT}` in its args), once
    the plugin is installed and on: its server reports after an edit, named
    `plugin:<plugin>:<server>`."""
    project = _install_lsp_plugin(tmp_path)
    texts, notices, _ = await run_script(
        project, tmp_path, [step("writing", ("write", {"path": "a.fake", "content": "ERR x\n"}))]
    )
    assert texts == [
        'Created a.fake (1 lines).\n\n<diagnostics server="plugin:lspplug:fake">\n'
        "a.fake:1:1: x [fake E1]\n</diagnostics>"
    ]
    assert not [n for n in notices if "lsp" in n.lower()], notices
