"""Effect classes (issue 12): a call that is not safe to repeat is never re-run blindly.

The seeds' contract lets a crash repeat the calls in flight. For a `git push`, a deploy or a
payment that is not acceptable: such a call gets a durable `tool_started` record before it runs,
and a resume that finds it without a result asks (interactive) or stops with `unknown_outcome`
(exit 7) and names `keel resume ID --rerun CALL` / `--skip CALL`. Everything else is re-run as
before. Attacks: a SIGKILL while `git push` runs, then a plain `keel resume`.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from keel.agent.loop import Agent
from keel.agent.tool_runner import SKIPPED_UNKNOWN
from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result, user
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import Reply
from keel.mcp.client import RemoteTool
from keel.mcp.tools import McpTool
from keel.permissions import AllowAll
from keel.permissions.gate import PermissionGate, PermissionReply, PermissionRequest
from keel.session.fold import fold
from keel.session.journal import Journal, read_records
from keel.session.records import (
    FORMAT,
    AssistantRecord,
    Fingerprint,
    Meta,
    ProcessRecord,
    Record,
    TerminalRecord,
    ToolResultRecord,
    ToolStartedRecord,
    UserRecord,
)
from keel.session.store import SessionLog
from keel.tools.base import ToolContext, tool
from keel.tools.builtin import builtin_tools
from keel.tools.effects import DEFAULT_UNSAFE_TO_REPEAT, command_repeat_risk, repeat_risk
from tests.test_cli import keel, session_files, write_script
from tests.test_resume_safety import crash_keel

CALL = "toolu_scripted_000001"
UNSANDBOXED = {"KEEL_NO_SANDBOX": "1"}
MODE = ("--mode", "bypass")


def fake_git(project: Path) -> dict[str, str]:
    """A `git` on PATH that logs each push and takes 4 s (long enough to be killed in)."""
    bin_dir = project.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    git = bin_dir / "git"
    git.write_text(
        f'#!/bin/sh\necho "$*" >> {project.parent / "pushes"}\nsleep 4\necho pushed\n',
        encoding="utf-8",
    )
    git.chmod(git.stat().st_mode | stat.S_IXUSR)
    return {**UNSANDBOXED, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def pushes(project: Path) -> list[str]:
    log = project.parent / "pushes"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def killed_mid_push(project: Path, tmp_path: Path, home: Path) -> tuple[Path, dict[str, str]]:
    env = fake_git(project)
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "git push origin main"}}]},
            {"text": "Pushed."},
        ],
    )
    out = crash_keel(
        "-p", "ship it", "--model", f"scripted:{script}", *MODE, cwd=project,
        crash="spawn:1:0.5", env=env,
    )  # fmt: skip
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert pushes(project) == ["push origin main"]
    (path,) = session_files(home)
    return path, env


def test_a_push_cut_off_by_a_crash_is_not_run_again_headless(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    path, env = killed_mid_push(project, tmp_path, isolated_env)
    payloads = [r.payload for r in read_records(path).records]
    # The start is journaled before the command runs (before its process record).
    assert [p.type for p in payloads] == ["meta", "user", "assistant", "tool_started", "process"]
    started = payloads[3]
    assert started == ToolStartedRecord(
        CALL,
        "bash",
        "`git push origin main` matches the unsafe_to_repeat commands",
        "git push origin main",
        "builtin",
    )
    sid = path.stem
    out = crash_keel("resume", sid, *MODE, cwd=project, env=env)
    assert out.returncode == 7, out.stderr
    assert out.stdout == ""
    assert (
        f"keel: warning: outcome unknown: call {CALL} (bash: git push origin main) was running "
        "when keel stopped and is not safe to repeat (`git push origin main` matches the "
        f"unsafe_to_repeat commands). Run it again: keel resume {sid} --rerun {CALL}; or go on "
        f"without it: keel resume {sid} --skip {CALL}\n"
    ) in out.stderr
    assert pushes(project) == ["push origin main"]  # not pushed twice
    last = read_records(path).records[-1].payload
    assert isinstance(last, TerminalRecord)
    assert last.reason == "unknown_outcome"
    again = crash_keel("resume", sid, *MODE, cwd=project, env=env)  # still undecided: same stop
    assert again.returncode == 7
    assert pushes(project) == ["push origin main"]

    bogus = keel("resume", sid, "--skip", "toolu_nope", *MODE, cwd=project, env=env)
    assert (bogus.returncode, bogus.stderr.splitlines()[-1] + "\n") == (
        2,
        f"keel: error: --skip toolu_nope: not a call of session {sid} whose outcome is unknown "
        f"(those are: {CALL}) (hint: the message of the run that stopped names the call ids)\n",
    )
    skipped = keel("resume", sid, "--skip", CALL, *MODE, cwd=project, env=env)
    assert (skipped.returncode, skipped.stdout) == (0, "Pushed.\n"), skipped.stderr
    assert pushes(project) == ["push origin main"]
    results = [
        r.payload for r in read_records(path).records if isinstance(r.payload, ToolResultRecord)
    ]
    assert [(r.result.tool_use_id, r.result.text, r.result.is_error) for r in results] == [
        (CALL, SKIPPED_UNKNOWN, True)
    ]


def test_rerun_runs_the_cut_off_call_again(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    path, env = killed_mid_push(project, tmp_path, isolated_env)
    out = keel("resume", path.stem, "--rerun", CALL, *MODE, cwd=project, env=env)
    assert (out.returncode, out.stdout) == (0, "Pushed.\n"), out.stderr
    assert pushes(project) == ["push origin main", "push origin main"]
    results = [
        r.payload for r in read_records(path).records if isinstance(r.payload, ToolResultRecord)
    ]
    assert [r.result.text for r in results] == ["pushed\n[exit code 0]"]
    started = [
        r.payload for r in read_records(path).records if isinstance(r.payload, ToolStartedRecord)
    ]
    assert len(started) == 2  # the re-run was journaled as started too


def test_a_repeatable_call_cut_off_by_a_crash_is_re_run_as_before(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "echo x >> ran; sleep 4"}}]},
            {"text": "Done."},
        ],
    )
    out = crash_keel(
        "-p", "go", "--model", f"scripted:{script}", *MODE, cwd=project, crash="spawn:1:0.5",
        env=UNSANDBOXED,
    )  # fmt: skip
    assert out.returncode == -signal.SIGKILL
    (path,) = session_files(isolated_env)
    assert not any(isinstance(r.payload, ToolStartedRecord) for r in read_records(path).records)
    out = crash_keel("resume", path.stem, *MODE, cwd=project, env=UNSANDBOXED)
    assert (out.returncode, out.stdout) == (0, "Done.\n"), out.stderr
    assert (project / "ran").read_text(encoding="utf-8") == "x\nx\n"


# -- interactive: asked through the gate's asker ------------------------------------------------

DEPLOYS: list[str] = []


@tool(repeat_safe=False)
async def deploy(ctx: ToolContext, target: str) -> str:
    """Deploy to a target.

    Args:
        target: where to.
    """
    DEPLOYS.append(target)
    return f"deployed {target}"


async def resume_with_asker(tmp_path: Path, allow: bool) -> tuple[list[PermissionRequest], Path]:
    """A session whose `deploy` call started and never answered, resumed with someone to ask."""
    DEPLOYS.clear()
    fp = Fingerprint("scripted", "scripted", "", "", 10)
    log = SessionLog.create(
        cwd=tmp_path, model="scripted", fingerprint=fp, directory=tmp_path / "s"
    )
    log.user(user("ship"))
    call = ToolUse("d1", "deploy", {"target": "prod"})
    log.assistant(Message("assistant", (call,)), Usage(1, 1), 0.0, "tool_use", 1)
    log.tool_started("d1", "deploy", "deploy is declared not safe to repeat", '{"target": "prod"}')
    log.close()
    journal, loaded = Journal.open(log.path)
    state = fold(loaded.records)
    assert [r.tool_use_id for r in state.unknown_outcome] == ["d1"]
    asked: list[PermissionRequest] = []

    async def asker(request: PermissionRequest) -> PermissionReply:
        asked.append(request)
        return PermissionReply(allow)

    gate = PermissionGate("bypass", tmp_path, tmp_path, asker=asker)
    provider = ScriptedProvider([Reply(Message("assistant", (Text("ok"),)), Usage(1, 1))])
    agent = Agent(
        provider=provider, model="scripted", cwd=tmp_path, system="s", tools=[deploy], gate=gate
    )
    agent.restore(state)
    agent.session = SessionLog(journal, state.meta.id)
    result = await agent.resume()
    await agent.aclose()
    assert result.stop_reason == "end_turn"
    return asked, log.path


@pytest.mark.parametrize("allow", [True, False], ids=["rerun", "skip"])
async def test_interactive_resume_asks_before_repeating(allow: bool, tmp_path: Path) -> None:
    asked, path = await resume_with_asker(tmp_path, allow)
    assert [(r.call.id, r.reason) for r in asked] == [
        (
            "d1",
            "run again a call whose outcome is unknown (keel stopped while it ran; deploy is "
            'declared not safe to repeat): {"target": "prod"}',
        )
    ]
    assert (["prod"] if allow else []) == DEPLOYS
    results = [
        r.payload for r in read_records(path).records if isinstance(r.payload, ToolResultRecord)
    ]
    expected = "deployed prod" if allow else SKIPPED_UNKNOWN
    assert [r.result.text for r in results] == [expected]


async def test_an_unrepeatable_call_is_journaled_as_started_before_it_runs(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    log = SessionLog.create(cwd=tmp_path, model="scripted", directory=tmp_path / "s")

    @tool(repeat_safe=False)
    async def pay(ctx: ToolContext, amount: int) -> str:
        """Pay.

        Args:
            amount: how much.
        """
        seen.append([r.payload.type for r in read_records(log.path).records])
        return "paid"

    @tool
    async def look(ctx: ToolContext) -> str:
        """Look."""
        seen.append([r.payload.type for r in read_records(log.path).records])
        return "seen"

    provider = ScriptedProvider(
        [
            Reply(
                Message(
                    "assistant", (ToolUse("p1", "pay", {"amount": 5}), ToolUse("l1", "look", {}))
                ),
                Usage(1, 1),
            ),
            Reply(Message("assistant", (Text("done"),)), Usage(1, 1)),
        ]
    )
    agent = Agent(
        provider=provider,
        model="scripted",
        cwd=tmp_path,
        system="s",
        tools=[pay, look],
        session=log,
        gate=AllowAll(),
    )
    assert (await agent.run("go")).stop_reason == "end_turn"
    await agent.aclose()
    assert seen == [
        ["meta", "user", "assistant", "tool_started"],
        ["meta", "user", "assistant", "tool_started", "tool_result"],
    ]
    started = [
        (r.payload, r.v)
        for r in read_records(log.path).records
        if isinstance(r.payload, ToolStartedRecord)
    ]
    assert started == [
        (
            ToolStartedRecord(
                "p1", "pay", "pay is declared not safe to repeat", '{"amount": 5}', "local"
            ),
            FORMAT,
        )
    ]
    line = log.path.read_bytes().split(b"\n")[3]
    assert line.startswith(b'{"v":2,')
    assert b'"type":"tool_started"' in line


# -- what counts as unsafe to repeat --------------------------------------------------------------


def ctx(tmp_path: Path, patterns: tuple[str, ...] = DEFAULT_UNSAFE_TO_REPEAT) -> ToolContext:
    return ToolContext(cwd=tmp_path, root=tmp_path, unsafe_to_repeat=patterns)


@pytest.mark.parametrize(
    ("command", "hit"),
    [
        ("git push origin main", "git push origin main"),
        ("git push", "git push"),
        ("cd repo && git push --force", "git push --force"),
        ("make && npm publish --access public", "npm publish --access public"),
        ("kubectl apply -f deploy.yaml", "kubectl apply -f deploy.yaml"),
        ("terraform apply -auto-approve", "terraform apply -auto-approve"),
        ("docker push registry/app:1", "docker push registry/app:1"),
        ("gh release create v1.0", "gh release create v1.0"),
        ("(git push origin HEAD)", "git push origin HEAD"),
        ("git status", None),
        ("echo git push", None),
        ("git pushd", None),
        ("npm test", None),
    ],
)
def test_bash_commands_matching_the_patterns_are_unsafe_to_repeat(
    command: str, hit: str | None, tmp_path: Path
) -> None:
    expected = None if hit is None else f"`{hit}` matches the unsafe_to_repeat commands"
    assert command_repeat_risk(ctx(tmp_path), {"command": command}) == expected
    (bash,) = [t for t in builtin_tools() if t.name == "bash"]
    assert repeat_risk(bash, ctx(tmp_path), {"command": command}) == expected


def test_the_pattern_list_is_the_contexts(tmp_path: Path) -> None:
    c = ctx(tmp_path, (*DEFAULT_UNSAFE_TO_REPEAT, "./deploy.sh *", "stripe charges create *"))
    assert command_repeat_risk(c, {"command": "./deploy.sh prod"}) == (
        "`./deploy.sh prod` matches the unsafe_to_repeat commands"
    )
    assert command_repeat_risk(ctx(tmp_path), {"command": "./deploy.sh prod"}) is None


def test_other_builtin_tools_stay_repeatable(tmp_path: Path) -> None:
    risky = {
        t.name: repeat_risk(t, ctx(tmp_path), {"command": "git push"} if t.name == "bash" else {})
        for t in builtin_tools()
    }
    assert {name for name, why in risky.items() if why} == {"bash"}


@pytest.mark.parametrize(
    ("hints", "safe"),
    [
        ({}, False),  # the spec's default: not idempotent, so asked about after a crash
        ({"destructive_hint": False}, False),  # harmless, but a second call may still add twice
        ({"destructive_hint": True}, False),
        ({"idempotent_hint": False}, False),
        ({"destructive_hint": True, "idempotent_hint": True}, True),  # deleting twice is fine
        ({"destructive_hint": False, "idempotent_hint": True}, True),
        ({"read_only_hint": True, "destructive_hint": True}, True),  # read-only wins
    ],
)
def test_mcp_annotations_map_to_the_effect_class(
    hints: dict[str, Any], safe: bool, tmp_path: Path
) -> None:
    remote = RemoteTool("charge", "Charge a card.", {"type": "object"}, **hints)
    t = McpTool.create(None, "pay", remote, "mcp__pay__charge")  # type: ignore[arg-type]
    assert t.repeat_safe is safe
    assert repeat_risk(t, ctx(tmp_path), {}) == (
        None if safe else "mcp__pay__charge is declared not safe to repeat"
    )


def test_fold_knows_which_unanswered_calls_have_an_unknown_outcome() -> None:
    calls = Message(
        "assistant",
        (ToolUse("a", "bash", {"command": "x"}), ToolUse("b", "bash", {"command": "y"})),
    )
    payloads = [
        Meta("s", "/p", "m"),
        UserRecord(user("go")),
        AssistantRecord(calls, Usage(), 0.0, "tool_use", 1),
        ToolStartedRecord("a", "bash", "r", "x"),
        ProcessRecord("a", 100, 5, "b"),
        ToolResultRecord(tool_result("a", "ok")),
        ToolStartedRecord("b", "bash", "r", "y"),
    ]
    state = fold([Record(i, "t", p) for i, p in enumerate(payloads, start=1)])  # type: ignore[arg-type]
    assert state.unknown_outcome == [ToolStartedRecord("b", "bash", "r", "y")]
    assert state.pending is not None
    assert [c.id for c in state.pending.unanswered] == ["b"]


def test_settings_add_commands_not_safe_to_repeat(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """`unsafe_to_repeat` in the user's and the project's settings adds patterns (never removes
    the defaults); a wrongly typed value is reported and skipped."""
    user_dir = isolated_env / "config"
    user_dir.mkdir(parents=True, exist_ok=True)
    (user_dir / "settings.json").write_text('{"unsafe_to_repeat": ["./deploy.sh *"]}', "utf-8")
    (project / ".keel").mkdir()
    (project / ".keel" / "settings.json").write_text(
        '{"unsafe_to_repeat": ["make release *"]}', "utf-8"
    )
    (project / ".keel" / "settings.local.json").write_text(
        '{"unsafe_to_repeat": "git push *"}', "utf-8"
    )
    commands = ["./deploy.sh prod", "make release v2", "git push", "echo fine"]
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": c}} for c in commands]},
            {"text": "Done."},
        ],
    )
    out = keel(
        "-p", "go", "--model", f"scripted:{script}", *MODE, cwd=project, env=UNSANDBOXED
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        f"{project / '.keel' / 'settings.local.json'}: unsafe_to_repeat must be a list of "
        "strings; ignored"
    ) in out.stderr
    (path,) = session_files(isolated_env)
    started = [
        r.payload.summary
        for r in read_records(path).records
        if isinstance(r.payload, ToolStartedRecord)
    ]
    assert started == ["./deploy.sh prod", "make release v2", "git push"]
