"""Permission rules in Claude Code's syntax and files work unchanged through keel, and fail
closed: `.claude/settings*.json` and `~/.claude/settings.json` are read, tool names in either
spelling, Claude Code's path anchors, `Edit` covering every writer, ask rules, and a rule keel
cannot read is an error, never skipped silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel.config.settings import load_settings
from keel.errors import UserError
from keel.llm.messages import ToolUse
from keel.permissions.gate import Allow, Deny, PermissionGate
from keel.permissions.rules import Rule, parse_rule, path_matches, settings_rules
from tests.test_cli import keel, write_script
from tests.test_permissions import HEADLESS, results_by_tool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Bash(npm run test:*)", Rule("bash", "npm run test:*", "deny")),
        ("Bash", Rule("bash", None, "deny")),
        ("Read(./.env)", Rule("read", "./.env", "deny")),
        ("WebFetch(domain:example.org)", Rule("web_fetch", "domain:example.org", "deny")),
        ("MultiEdit(src/**)", Rule("multi_edit", "src/**", "deny")),
        ("KillBash", Rule("bash_kill", None, "deny")),
        ("TodoWrite", Rule("todo_write", None, "deny")),
        ("mcp__github", Rule("mcp__github", None, "deny")),
        ("mcp__github__*", Rule("mcp__github", None, "deny")),
        ("mcp__github__create_issue", Rule("mcp__github__create_issue", None, "deny")),
        ("web_fetch", Rule("web_fetch", None, "deny")),
    ],
)
def test_rules_in_either_spelling(text: str, expected: Rule) -> None:
    assert parse_rule(text, "deny") == expected


def test_a_claude_tool_keel_lacks_is_named_not_dropped() -> None:
    rules, warnings = settings_rules([("NotebookEdit", "/p/.claude/settings.json")], "deny")
    assert [r.tool for r in rules] == ["NotebookEdit"]
    assert warnings == [
        "/p/.claude/settings.json: deny rule 'NotebookEdit' names Claude Code's NotebookEdit, "
        "which keel does not have; it matches nothing"
    ]


def test_an_unreadable_deny_rule_stops_an_unreadable_allow_rule_is_skipped() -> None:
    with pytest.raises(
        UserError, match=r"/p/\.claude/settings\.json: 'Bash\(' is not a permission rule"
    ):
        settings_rules([("Bash(", "/p/.claude/settings.json")], "deny")
    with pytest.raises(UserError):
        settings_rules([("Read(", "/p/.claude/settings.json")], "ask")
    rules, warnings = settings_rules([("Edit(", "/p/.keel/settings.local.json")], "allow")
    assert rules == []
    assert warnings == ["/p/.keel/settings.local.json: 'Edit(' is not a permission rule; skipped"]


@pytest.mark.parametrize(
    ("pattern", "path", "anchor", "expected"),
    [
        ("./.env", "P/.env", None, True),
        ("./.env", "P/sub/.env", None, False),  # anchored at the project root
        (".env", "P/sub/.env", None, True),  # no slash: any depth, as in .gitignore
        ("*.env", "P/a/b/prod.env", None, True),
        ("src/**", "P/src/a/b.py", None, True),
        ("./src/**", "P/src/a/b.py", None, True),
        ("./src/**", "P/lib/src/b.py", None, False),
        ("src", "P/src/deep/file", None, True),  # a matched directory covers its contents
        ("secrets/", "P/secrets/key", None, True),
        ("secrets/", "P/secrets", None, True),
        ("/src/**", "P/src/x.py", "P", True),  # Claude Code: relative to the settings' project
        ("/src/**", "P/src/x.py", None, False),  # keel's files: absolute
        ("//P/src/**", "P/src/x.py", None, True),  # Claude Code's absolute form
        ("~/notes/*", "H/notes/a.md", None, True),
        ("~/notes/*", "P/notes/a.md", None, False),
    ],
)
def test_path_anchors(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pattern: str,
    path: str,
    anchor: str | None,
    expected: bool,
) -> None:
    project, home = tmp_path / "P", tmp_path / "H"
    (project / "secrets").mkdir(parents=True)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))

    def real(text: str) -> Path:
        return tmp_path / text if text[0] in "PH" else Path(text)

    pattern = pattern.replace("//P", "/" + str(project))
    assert path_matches(pattern, real(path), project, real(anchor) if anchor else None) is expected


def _gate(
    project: Path, rules: list[tuple[str, str]], mode: Any = "default", **kw: Any
) -> PermissionGate:
    parsed = [parse_rule(text, effect, "test") for text, effect in rules]  # type: ignore[arg-type]
    return PermissionGate(mode, project, project, parsed, **kw)


def call(name: str, **args: Any) -> ToolUse:
    return ToolUse(f"id-{name}", name, args)


async def test_edit_rules_cover_every_writer(project: Path) -> None:
    g = _gate(project, [("Edit(./src/**)", "allow")], "default")
    for tool in ("write", "edit", "multi_edit"):
        decision = await g.authorize(call(tool, path="src/a.py"), read_only=False)
        assert decision == Allow("rule:edit(./src/**)", notable=True), tool
    decision = await g.authorize(call("write", path="app.py"), read_only=False)
    assert isinstance(decision, Deny)


async def test_a_denied_writer_denies_every_writer_and_read_covers_readers(project: Path) -> None:
    g = _gate(project, [("Write(.env)", "deny"), ("Read(secrets/**)", "deny")], "bypass")
    for tool in ("write", "edit", "multi_edit"):
        decision = await g.authorize(call(tool, path=".env"), read_only=False)
        assert decision == Deny("denied by rule write(.env) (test)", "rule"), tool
    for tool in ("read", "grep", "glob", "ls"):
        decision = await g.authorize(call(tool, path="secrets/key"), read_only=True)
        assert decision == Deny("denied by rule read(secrets/**) (test)", "rule"), tool
    # An allow rule of `write` covers only `write`.
    g = _gate(project, [("Write(src/**)", "allow")])
    assert isinstance(await g.authorize(call("edit", path="src/a.py"), read_only=False), Deny)


@pytest.mark.parametrize("mode", ["default", "accept-edits", "bypass"])
async def test_ask_rules_ask_in_every_mode_even_sandboxed(project: Path, mode: Any) -> None:
    g = _gate(project, [("Bash(git push:*)", "ask"), ("Bash", "allow")], mode, sandboxed=True)
    decision = await g.authorize(call("bash", command="git push origin main"), read_only=False)
    assert decision == Deny(
        f"{HEADLESS} (needed to bash matches the ask rule bash(git push:*) (test))", "headless"
    )
    decision = await g.authorize(call("bash", command="git status && git push"), read_only=False)
    assert isinstance(decision, Deny)
    allowed = await g.authorize(call("bash", command="git status"), read_only=False)
    assert isinstance(allowed, Allow)
    assert not g.would_allow("bash", {"command": "git push"})


# -- end to end: Claude Code's files through `keel -p` -------------------------------------------


SNOOP: list[dict[str, object]] = [
    {
        "tool_calls": [
            {"name": "read", "input": {"path": ".env"}},
            {"name": "write", "input": {"path": "src/new.py", "content": "x = 1\n"}},
            {"name": "bash", "input": {"command": "git push origin main"}},
        ]
    },
    {"text": "done"},
]


def claude_settings(where: Path, data: dict[str, object], name: str = "settings.json") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_project_claude_rules_guard_a_run(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """A Claude Code project's shared deny and ask rules apply at once (they only tighten), in
    bypass mode too; its allow rules wait for approval."""
    (project / ".env").write_text("SECRET=1\n", encoding="utf-8")
    (project / "src").mkdir()
    shared = claude_settings(
        project / ".claude",
        {
            "permissions": {
                "deny": ["Read(./.env)", "Edit(./src/**)"],
                "ask": ["Bash(git push:*)"],
                "allow": ["Bash"],
                "defaultMode": "acceptEdits",
            },
            "env": {"FOO": "1"},
            "apiKeyHelper": "/bin/echo key",
        },
    )
    script = write_script(tmp_path / "s.json", SNOOP)
    out = keel("-p", "go", "--model", f"scripted:{script}", "--mode", "bypass", cwd=project)
    assert out.returncode == 0, out.stderr
    results = results_by_tool(isolated_env)
    assert results == {
        "read": f"denied by rule read(./.env) ({shared})",
        "write": f"denied by rule edit(./src/**) ({shared})",
        "bash": f"{HEADLESS} (needed to bash matches the ask rule bash(git push:*) ({shared}))",
    }
    assert not (project / "src" / "new.py").exists()
    assert (
        f"keel: warning: {shared}: Claude Code settings keel does not use: apiKeyHelper, env "
        "(docs/extensions.md lists what is supported)" in out.stderr
    )
    assert (
        f"keel: warning: {shared}: not applied until you approve them: permissions.allow, "
        "permissions.defaultMode" in out.stderr
    )
    doctor = keel("doctor", cwd=project)
    assert f"  deny Read(./.env)  ({shared})" in doctor.stdout
    assert f"  ask Bash(git push:*)  ({shared})" in doctor.stdout


def test_personal_claude_files_allow(project: Path, tmp_path: Path, isolated_env: Path) -> None:
    """`~/.claude/settings.json` is the user's: its allow rules apply. A project's
    `.claude/settings.local.json` came with the project (keel did not write it): what only
    tightens applies (the `default` mode), its allow rules wait for approval."""
    home = isolated_env / "user-home"
    claude_settings(home / ".claude", {"permissions": {"allow": ["Edit(./src/**)"]}})
    claude_settings(
        project / ".claude",
        {"permissions": {"allow": ["Read"], "ask": [], "defaultMode": "default"}},
        "settings.local.json",
    )
    (project / "src").mkdir()
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "write", "input": {"path": "src/new.py", "content": "x\n"}}]},
            {"text": "done"},
        ],
    )
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    assert results_by_tool(isolated_env)["write"] == "Created src/new.py (1 lines)."
    s = load_settings(project)
    assert s.default_mode == "default"
    assert [r for r, _ in s.allow] == ["Edit(./src/**)"]
    local = project / ".claude" / "settings.local.json"
    assert [(p.path, [e.value for e in p.entries]) for p in s.pending] == [(local, [["Read"]])]


def test_an_unreadable_deny_rule_is_a_one_line_error(project: Path, tmp_path: Path) -> None:
    shared = claude_settings(project / ".claude", {"permissions": {"deny": ["Bash(rm *"]}})
    script = write_script(tmp_path / "s.json", [{"text": "never"}])
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        f"keel: error: {shared}: 'Bash(rm *' is not a permission rule (hint: rules look like "
        '"Bash(git commit *)", "Edit(./src/**)", "WebFetch(domain:python.org)" or "Read")'
    )
    assert "Traceback" not in out.stderr


def test_additional_directories(project: Path, tmp_path: Path, isolated_env: Path) -> None:
    """Yours widen where files may be written; a project's waits for approval."""
    extra = tmp_path / "shared-notes"
    extra.mkdir()
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "tool_calls": [
                    {"name": "write", "input": {"path": str(extra / "n.md"), "content": "x\n"}}
                ]
            },
            {"text": "done"},
        ],
    )
    shared = claude_settings(
        project / ".claude", {"permissions": {"additionalDirectories": [str(extra)]}}
    )
    out = keel("-p", "go", "--model", f"scripted:{script}", "--mode", "bypass", cwd=project)
    assert out.returncode == 0, out.stderr
    assert "is outside the project root" in results_by_tool(isolated_env)["write"]
    assert (
        f"{shared}: not applied until you approve them: permissions.additionalDirectories"
        in out.stderr
    )
    claude_settings(
        isolated_env / "user-home" / ".claude",
        {"permissions": {"additionalDirectories": [str(extra)]}},
    )
    out = keel("-p", "go", "--model", f"scripted:{script}", "--mode", "bypass", cwd=project)
    assert out.returncode == 0, out.stderr
    assert results_by_tool(isolated_env)["write"] == f"Created {extra / 'n.md'} (1 lines)."
    assert (extra / "n.md").read_text(encoding="utf-8") == "x\n"


def test_a_read_deny_rule_keeps_an_import_out_of_the_prompt(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """A project CLAUDE.md that imports `@.env` does not bring the secret into the prompt
    when a deny rule forbids reading it (the attack: the rule guards the read tool, the import
    would go around it)."""
    from keel.agent.loop import Agent
    from keel.llm.providers.scripted import ScriptedProvider

    (project / ".env").write_text("SECRET=hunter2\n", encoding="utf-8")
    (project / "CLAUDE.md").write_text("Project notes.\n\n@.env\n", encoding="utf-8")
    shared = claude_settings(project / ".claude", {"permissions": {"deny": ["Read(./.env)"]}})
    rules, _ = settings_rules([("Read(./.env)", str(shared))], "deny")
    agent = Agent(
        provider=ScriptedProvider([]),
        model="scripted",
        cwd=project,
        gate=PermissionGate("default", project, project, rules),
    )
    assert "Project notes." in agent.context
    assert "hunter2" not in agent.prompt_text
    # Without the rule, the import is followed (Claude Code's behaviour).
    open_agent = Agent(
        provider=ScriptedProvider([]),
        model="scripted",
        cwd=project,
        gate=PermissionGate("default", project, project, []),
    )
    assert "SECRET=hunter2" in open_agent.context
    # Through keel -p the refusal is named on stderr.
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    assert (
        f"{project / 'CLAUDE.md'}: import @.env not followed: denied by rule read(./.env) "
        f"({shared})" in out.stderr
    )


async def test_reading_outside_the_project_asks(project: Path, tmp_path: Path) -> None:
    """As in Claude Code: a README that tells the model to read `~/.ssh/id_rsa` does not get it
    read unasked. Inside the project (and the additional directories) reads run at once."""
    secret_dir = tmp_path / "home" / ".ssh"
    secret_dir.mkdir(parents=True)
    secret = secret_dir / "id_rsa"
    secret.write_text("KEY\n", encoding="utf-8")
    g = _gate(project, [])
    for tool in ("read", "grep", "glob", "ls"):
        decision = await g.authorize(call(tool, path=str(secret)), read_only=True)
        assert decision == Deny(
            f"{HEADLESS} (needed to read {secret}, outside the project)", "headless"
        )
    relative = await g.authorize(call("read", path="../home/.ssh/id_rsa"), read_only=True)
    assert isinstance(relative, Deny)
    assert await g.authorize(call("read", path="app.py"), read_only=True) == Allow("read-only")
    assert await g.authorize(call("grep", pattern="x"), read_only=True) == Allow("read-only")
    # An allow rule for the directory, the additional directories and bypass let it through.
    ruled = _gate(project, [(f"Read(/{secret_dir}/**)", "allow")])
    assert isinstance(await ruled.authorize(call("read", path=str(secret)), read_only=True), Allow)
    extra = PermissionGate("default", project, project, [], extra_roots=(secret_dir,))
    assert await extra.authorize(call("read", path=str(secret)), read_only=True) == Allow(
        "read-only"
    )
    bypass = _gate(project, [], "bypass")
    assert isinstance(await bypass.authorize(call("read", path=str(secret)), read_only=True), Allow)
    # "Always allow" offers the file's directory, not every read.
    asked: list[Any] = []

    async def asker(request: Any) -> Any:
        from keel.permissions.gate import PermissionReply

        asked.append(request)
        return PermissionReply(allow=True)

    interactive = _gate(project, [], asker=asker)
    await interactive.authorize(call("read", path=str(secret)), read_only=True)
    assert asked[0].suggestion == f"read(/{secret_dir}/**)"
