"""A library `Agent` is as safe by default as `keel -p`: the settings' rules for its cwd, mode
`default`, the bash sandbox when it works, and nobody to ask (what would ask is denied, with a
hint). Only an explicit `gate=Permissions.allow_all()` runs everything unasked.

The attack: a scripted model whose bash call touches a file outside the project. Before this
change the library ran it unsandboxed and unasked, and the file appeared."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from keel import Agent
from keel.agent.events import Event, ToolFinished
from keel.llm.events import Notice
from keel.permissions import AllowAll, Permissions
from keel.permissions.gate import PermissionGate, PermissionReply, PermissionRequest
from keel.permissions.sandbox import Probe
from keel.testing import ScriptedProvider, reply
from keel.tools.builtin import builtin_tools


def _touch_outside(outside: Path) -> ScriptedProvider:
    return ScriptedProvider([reply("", ("bash", {"command": f"touch {outside}"})), reply("done")])


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    project = tmp_path / "project"
    project.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return project, elsewhere


async def _run(agent: Agent, prompt: str = "go") -> list[Event]:
    events: list[Event] = []
    try:
        await agent.run(prompt, events.append)
    finally:
        await agent.aclose()
    return events


def _results(events: list[Event]) -> list[tuple[str, bool, str]]:
    return [
        (e.call.name, e.result.is_error, e.result.text)
        for e in events
        if isinstance(e, ToolFinished)
    ]


@pytest.mark.needs("sandbox")
async def test_library_bash_outside_the_project_is_sandboxed(tmp_path: Path) -> None:
    project, _ = _dirs(tmp_path)
    # Outside the private /tmp of the sandbox, so the directory is there inside too.
    elsewhere = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="keel-attack-"))
    try:
        target = elsewhere / "pwned"
        agent = Agent(
            provider=_touch_outside(target), model="scripted", tools=builtin_tools(), cwd=project
        )
        events = await _run(agent)
        assert not target.exists()
    finally:
        shutil.rmtree(elsewhere)
    [(name, is_error, text)] = _results(events)
    assert (name, is_error) == ("bash", True)  # touch failed: a failed call
    assert text == f"touch: cannot touch '{target}': Read-only file system\n[exit code 1]"
    assert isinstance(agent.gate, PermissionGate)
    assert (agent.gate.mode, agent.gate.sandboxed, agent.gate.asker) == ("default", True, None)
    assert agent.ctx.sandbox is agent.gate.sandbox is not None
    assert not any(isinstance(e, Notice) for e in events)  # sandboxed: nothing to warn about


async def test_library_without_a_sandbox_denies_bash_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No sandbox here (as on a machine without bubblewrap): the call would ask, nobody can be
    asked, so it is denied and the model is told how the caller can allow it; the agent says at
    its first prompt that bash runs unsandboxed and why."""
    import keel.permissions.setup as setup

    monkeypatch.setattr(setup, "probe", lambda: Probe(False, "bubblewrap (bwrap) is not installed"))
    project, elsewhere = _dirs(tmp_path)
    target = elsewhere / "pwned"
    agent = Agent(
        provider=_touch_outside(target), model="scripted", tools=builtin_tools(), cwd=project
    )
    events = await _run(agent)
    assert not target.exists()
    [(name, is_error, text)] = _results(events)
    assert (name, is_error) == ("bash", True)
    assert text.startswith("permission needed, but this Agent has nobody to ask")
    assert "Permissions.ask(" in text
    assert "Permissions.allow_all()" in text
    notices = [e for e in events if isinstance(e, Notice)]
    assert [n.level for n in notices] == ["warning"]
    assert notices[0].text.startswith("no sandbox: bubblewrap (bwrap) is not installed")
    assert "commands will need permission" in notices[0].text
    # Said once per agent, not at every prompt.
    agent2 = Agent(
        provider=ScriptedProvider([reply("a"), reply("b")]), model="scripted", cwd=project
    )
    first: list[Event] = []
    second: list[Event] = []
    await agent2.run("one", first.append)
    await agent2.run("two", second.append)
    await agent2.aclose()
    assert sum(isinstance(e, Notice) for e in first) == 1
    assert not any(isinstance(e, Notice) for e in second)


async def test_library_write_asks_and_is_denied(tmp_path: Path) -> None:
    project, _ = _dirs(tmp_path)
    provider = ScriptedProvider(
        [reply("", ("write", {"path": "app.py", "content": "x = 1\n"})), reply("done")]
    )
    agent = Agent(provider=provider, model="scripted", tools=builtin_tools(), cwd=project)
    events = await _run(agent)
    assert not (project / "app.py").exists()
    [(name, is_error, text)] = _results(events)
    assert (name, is_error) == ("write", True)
    assert "(needed to change app.py)" in text


async def test_from_model_is_gated_too(tmp_path: Path) -> None:
    project, _ = _dirs(tmp_path)
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {"tool_calls": [{"name": "write", "input": {"path": "a.py", "content": "1"}}]},
                    {"text": "done"},
                ]
            }
        ),
        encoding="utf-8",
    )
    agent = Agent.from_model(f"scripted:{script}", cwd=project)
    assert isinstance(agent.gate, PermissionGate)
    events = await _run(agent)
    assert not (project / "a.py").exists()
    assert [(n, e) for n, e, _ in _results(events)] == [("write", True)]


async def test_settings_rules_of_the_cwd_apply(tmp_path: Path) -> None:
    """The project's own settings tighten (a deny rule) and the user's allow rules apply."""
    project, _ = _dirs(tmp_path)
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["read(secret.txt)"]}}), encoding="utf-8"
    )
    (project / "secret.txt").write_text("s3cret", encoding="utf-8")
    provider = ScriptedProvider([reply("", ("read", {"path": "secret.txt"})), reply("done")])
    agent = Agent(provider=provider, model="scripted", tools=builtin_tools(), cwd=project)
    events = await _run(agent)
    [(name, is_error, text)] = _results(events)
    assert (name, is_error) == ("read", True)
    assert "s3cret" not in text
    assert "denied by rule read(secret.txt)" in text


async def test_allow_all_is_an_explicit_decision(tmp_path: Path) -> None:
    project, _ = _dirs(tmp_path)
    provider = ScriptedProvider(
        [reply("", ("write", {"path": "app.py", "content": "x = 1\n"})), reply("done")]
    )
    gate = Permissions.allow_all()
    assert isinstance(gate, AllowAll)
    agent = Agent(
        provider=provider, model="scripted", tools=builtin_tools(), cwd=project, gate=gate
    )
    events = await _run(agent)
    assert (project / "app.py").read_text(encoding="utf-8") == "x = 1\n"
    assert [(n, e) for n, e, _ in _results(events)] == [("write", False)]
    assert agent.ctx.sandbox is None
    assert not any(isinstance(e, Notice) for e in events)  # the caller decided; nothing to say
    # The old spelling keeps working.
    assert isinstance(
        Agent(provider=provider, model="m", cwd=project, gate=AllowAll()).gate, AllowAll
    )


async def test_ask_routes_questions_to_the_asker(tmp_path: Path) -> None:
    project, _ = _dirs(tmp_path)
    asked: list[PermissionRequest] = []

    async def asker(request: PermissionRequest) -> PermissionReply:
        asked.append(request)
        return PermissionReply(allow=True)

    provider = ScriptedProvider(
        [reply("", ("write", {"path": "app.py", "content": "x = 1\n"})), reply("done")]
    )
    gate = Permissions.ask(asker, cwd=project)
    assert isinstance(gate, PermissionGate)
    assert gate.asker is asker
    agent = Agent(
        provider=provider, model="scripted", tools=builtin_tools(), cwd=project, gate=gate
    )
    events = await _run(agent)
    assert [(r.call.name, r.reason) for r in asked] == [("write", "change app.py")]
    assert [(n, e) for n, e, _ in _results(events)] == [("write", False)]
    assert (project / "app.py").exists()


def test_from_settings_builds_what_keel_p_builds(tmp_path: Path) -> None:
    """The same gate as `keel -p` for this cwd: rules with their sources, mode, root."""
    project, _ = _dirs(tmp_path)
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["bash(rm *)"], "defaultMode": "plan"}}),
        encoding="utf-8",
    )
    gate = Permissions.from_settings(project)
    assert isinstance(gate, PermissionGate)
    assert (gate.mode, gate.root, gate.cwd, gate.asker) == ("plan", project, project, None)
    assert [(str(r), r.effect) for r in gate.rules] == [("bash(rm *)", "deny")]
    assert gate.sandboxed == (gate.sandbox is not None)


# -- every front end says when bash runs unsandboxed, and how to fix it -----------------------------

INSTALL = (
    "install it with `sudo apt install bubblewrap` (Debian, Ubuntu), `sudo dnf install "
    "bubblewrap` (Fedora) or `sudo pacman -S bubblewrap` (Arch)"
)


def _without_bwrap(tmp_path: Path) -> dict[str, str]:
    """A PATH with the programs a run needs but no bubblewrap (as on a machine without it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "sh", "git", "env"):
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    return {"PATH": str(bin_dir)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap is Linux's sandbox")
def test_doctor_and_keel_p_say_how_to_install_bubblewrap(tmp_path: Path) -> None:
    from tests.test_cli import keel, write_script

    project, _ = _dirs(tmp_path)
    env = _without_bwrap(tmp_path)
    out = keel("doctor", cwd=project, env=env)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("sandbox:"))
    assert lines[at : at + 2] == [
        f"sandbox: NOT AVAILABLE: bubblewrap (bwrap) is not installed; {INSTALL}",
        "  without it, every bash command asks for permission (headless runs deny them)",
    ]
    script = write_script(tmp_path / "s.json", [{"text": "hello"}])
    out = keel("-p", "hi", "--model", f"scripted:{script}", cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        f"keel: warning: no sandbox: bubblewrap (bwrap) is not installed; {INSTALL}; commands "
        "will need permission"
    ]
    out = keel(
        "-p", "hi", "--model", f"scripted:{script}", "--mode", "bypass", cwd=project, env=env
    )
    assert out.stderr.splitlines() == [
        f"keel: warning: no sandbox: bubblewrap (bwrap) is not installed; {INSTALL}; in bypass "
        "mode bash commands run unsandboxed and unasked"
    ]


def test_a_sandbox_turned_off_in_settings_is_said_at_start(tmp_path: Path) -> None:
    from keel.config.settings import user_config_dir
    from tests.test_cli import keel, write_script

    project, _ = _dirs(tmp_path)
    user = user_config_dir()
    user.mkdir(parents=True, exist_ok=True)
    (user / "settings.json").write_text(json.dumps({"sandbox": {"enabled": False}}), "utf-8")
    script = write_script(tmp_path / "s.json", [{"text": "hello"}])
    out = keel("-p", "hi", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "keel: warning: no sandbox: the sandbox is turned off in your settings "
        "(sandbox.enabled: false; remove it to turn it back on); commands will need permission"
    ]
    out = keel("doctor", cwd=project)
    assert (
        "sandbox: turned off in settings (sandbox.enabled: false); every bash command asks for "
        "permission (headless runs deny them)"
    ) in out.stdout.splitlines()


def test_platforms_without_a_sandbox_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from keel.permissions import sandbox

    monkeypatch.delenv("KEEL_NO_SANDBOX", raising=False)
    monkeypatch.setattr(sys, "platform", "win32")
    sandbox.probe.cache_clear()
    try:
        result = sandbox.probe()
    finally:
        sandbox.probe.cache_clear()
    assert result == Probe(
        False,
        "keel has no sandbox on this system (win32); it sandboxes bash with bubblewrap on Linux "
        "and Seatbelt on macOS",
    )


@pytest.mark.needs("sandbox", "git")
async def test_a_worktree_subagent_runs_bash_in_a_sandbox_of_its_own(tmp_path: Path) -> None:
    """The gate a worktree subagent gets is copied for the worktree (another root) and still
    says "sandboxed"; its bash must then run in a sandbox of that worktree, not unsandboxed:
    before, the copy carried no sandbox and a `touch` outside ran unasked."""
    from keel.agent.subagents import enable_subagents, load_agent_types
    from keel.testing.routing import RoutedProvider
    from tests.test_subagents import git, task

    project, _ = _dirs(tmp_path)
    (project / "a.py").write_text("x = 1\n", encoding="utf-8")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "init")
    elsewhere = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="keel-attack-"))
    target = elsewhere / "pwned"
    provider = RoutedProvider(
        {
            "PARENT": [reply("", task("CHILD: go", isolation="worktree")), reply("ok")],
            "CHILD": [
                reply("", ("bash", {"command": f"touch {target}; touch inside.txt; ls"})),
                reply("done"),
            ],
        }
    )
    agent = Agent(provider=provider, model="scripted", tools=builtin_tools(), cwd=project)
    enable_subagents(agent, load_agent_types(project, user_dir=None, home=project / "no-home"))
    try:
        await _run(agent, "PARENT")
        assert not target.exists()
    finally:
        shutil.rmtree(elsewhere)
    bash_results = [
        m.tool_results[0].text for m in provider.of("CHILD")[-1].messages if m.tool_results
    ]
    assert bash_results == [
        f"touch: cannot touch '{target}': Read-only file system\na.py\ninside.txt\n[exit code 0]"
    ]


async def test_an_agent_is_an_async_context_manager_that_closes_itself(project: Path) -> None:
    """`async with Agent(...) as agent:` closes the agent however the block ends (the README's
    snippet used to end with aiohttp's "Unclosed client session" warnings)."""
    from keel import Agent
    from keel.testing import ScriptedProvider, reply

    closed: list[str] = []

    class Provider(ScriptedProvider):
        async def aclose(self) -> None:
            closed.append("provider")

    async with Agent(provider=Provider([reply("hi")]), model="scripted", cwd=project) as agent:
        assert (await agent.run("hello")).text == "hi"
        assert closed == []
    assert closed == ["provider"]
    with pytest.raises(RuntimeError, match="boom"):
        async with Agent(provider=Provider([]), model="scripted", cwd=project):
            raise RuntimeError("boom")
    assert closed == ["provider", "provider"]
