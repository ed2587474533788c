"""Instruction text beyond the top-level files: Claude Code rules (always-on ones in the context
that opens the first user message, path-scoped ones delivered when a matching file is read or edited), nested AGENTS.md /
CLAUDE.md delivered on demand, Codex's AGENTS.override.md and ~/.codex/AGENTS.md, OpenCode's
`instructions`. End-to-end tests run the real `keel -p` against the loopback Anthropic server and
assert the whole request bodies."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.instruction_notes import InstructionNotes
from keel.agent.loop import Agent
from keel.agent.prompt import instruction_files, load_instructions
from keel.agent.rules import read_rule
from keel.llm.events import Notice
from keel.llm.messages import ToolResult, ToolUse
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from keel.tools.builtin import builtin_tools
from tests.helpers import context_of, system_and_context
from tests.test_cli import keel

MODEL = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def server() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as s:
        yield s


def server_env(server: AnthropicServer) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def bodies(server: AnthropicServer) -> list[dict[str, Any]]:
    return [r.json or {} for r in server.model_requests]


def system_text(body: dict[str, Any]) -> str:
    system = body["system"]
    return system if isinstance(system, str) else "".join(b["text"] for b in system)


def without_cache(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_cache(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache(v) for v in value]
    return value


def assert_prefix_stable(all_bodies: list[dict[str, Any]]) -> None:
    """System prompt and tools byte-identical in every request; every earlier message kept."""
    first = all_bodies[0]
    for body in all_bodies[1:]:
        assert without_cache(body["system"]) == without_cache(first["system"])
        assert without_cache(body["tools"]) == without_cache(first["tools"])
    for before, after in itertools.pairwise(all_bodies):
        old, new = without_cache(before["messages"]), without_cache(after["messages"])
        assert new[: len(old) - 1] == old[:-1]


def note(*sections: tuple[Path, str, Path]) -> str:
    """The system note for (file, text, the path that brought it) sections."""
    inner = "\n\n".join(
        f'<instructions source="{f}" for="{target}">\n{text}\n</instructions>'
        for f, text, target in sections
    )
    return f"<system-note>\n{inner}\n</system-note>"


@pytest.fixture
def repo(project: Path) -> Path:
    """A git project with a nested AGENTS.md, always-on and path-scoped rules."""
    (project / ".git").mkdir()
    write(project / "AGENTS.md", "ROOT: run make test")
    write(project / "pkg" / "AGENTS.md", "PKG: this package is generated; edit the templates")
    write(project / "pkg" / "gen.py", "X = 1\n")
    write(project / "pkg" / "deep" / "mod.py", "Y = 2\n")
    write(project / ".claude" / "rules" / "always.md", "ALWAYS: answer in English")
    write(
        project / ".claude" / "rules" / "python" / "style.md",
        '---\npaths:\n  - "pkg/**/*.py"\n---\nPY: type every function',
    )
    write(
        project / ".claude" / "rules" / "docs.md",
        "---\npaths: docs/**/*.{md,rst}\n---\nDOCS: one sentence per line",
    )
    return project


def test_keel_p_delivers_a_nested_agents_md_and_a_path_scoped_rule_once_after_the_read(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    server.add(reply("", ("read", {"path": "README.md"})))  # unrelated: brings nothing
    server.add(reply("", ("read", {"path": "pkg/gen.py"})))
    server.add(reply("", ("read", {"path": "pkg/gen.py"}), ("read", {"path": "pkg/deep/mod.py"})))
    server.add(reply("done"))
    out = keel("-p", "look around", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    sent = bodies(server)
    assert len(sent) == 4
    context, prompt = context_of(sent[0]), system_and_context(sent[0])
    assert "<instructions " not in system_text(sent[0])  # the top-level files are the context's
    assert f'<instructions source="{repo / "AGENTS.md"}">\nROOT: run make test\n' in context
    rule = repo / ".claude" / "rules" / "always.md"
    assert f'<instructions source="{rule}">\nALWAYS: answer in English\n</instructions>' in context
    assert "PKG:" not in prompt
    assert "PY:" not in prompt
    assert "DOCS:" not in prompt
    assert_prefix_stable(sent)
    # After the unrelated read: the tool result alone.
    assert [b["type"] for b in sent[1]["messages"][-1]["content"]] == ["tool_result"]
    # After the read in pkg/: the nested AGENTS.md, then the rule, after the result.
    gen = repo / "pkg" / "gen.py"
    style = repo / ".claude" / "rules" / "python" / "style.md"
    last = sent[2]["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result", "text"]
    assert last[1]["text"] == note(
        (repo / "pkg" / "AGENTS.md", "PKG: this package is generated; edit the templates", gen),
        (style, "PY: type every function", gen),
    )
    # Once per context: the same files again bring nothing new.
    assert [b["type"] for b in sent[3]["messages"][-1]["content"]] == ["tool_result"] * 2
    everything = json.dumps(sent[3])
    assert everything.count("PKG: this package") == 1
    assert everything.count("PY: type every function") == 1


def test_an_edit_below_the_working_directory_brings_its_directory_files(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    """Started in pkg/ (its AGENTS.md is in the context): a write in pkg/deep/ brings
    pkg/deep/CLAUDE.md and its `.claude/CLAUDE.md`, not pkg/AGENTS.md again."""
    pkg = repo / "pkg"
    write(pkg / "deep" / "CLAUDE.md", "DEEP: keep it small")
    write(pkg / "deep" / ".claude" / "CLAUDE.md", "DEEP DOT-CLAUDE")
    server.add(reply("", ("write", {"path": "deep/new.py", "content": "Z = 3\n"})))
    server.add(reply("done"))
    out = keel(
        "-p", "add a file", "--model", MODEL, "--mode", "accept-edits",
        cwd=pkg, env=server_env(server),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    first, second = bodies(server)
    assert "PKG: this package" in context_of(first)
    target = pkg / "deep" / "new.py"
    assert second["messages"][-1]["content"][1]["text"] == note(
        (pkg / "deep" / "CLAUDE.md", "DEEP: keep it small", target),
        (pkg / "deep" / ".claude" / "CLAUDE.md", "DEEP DOT-CLAUDE", target),
        (repo / ".claude" / "rules" / "python" / "style.md", "PY: type every function", target),
    )


def test_a_failed_read_brings_nothing(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    server.add(reply("", ("read", {"path": "pkg/missing.py"})))
    server.add(reply("done"))
    out = keel("-p", "read it", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    last = bodies(server)[1]["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result"]
    assert last[0]["is_error"] is True


# -- AGENTS.override.md and the other tools' user files --------------------------------------------


def test_keel_p_sends_agents_override_md_instead_of_agents_md(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    home = isolated_env / "user-home"
    write(home / ".codex" / "AGENTS.md", "CODEX USER: not sent, the override wins")
    write(home / ".codex" / "AGENTS.override.md", "CODEX USER OVERRIDE")
    write(repo / "AGENTS.override.md", "ROOT OVERRIDE: release freeze, no refactors")
    write(repo / "pkg" / "AGENTS.override.md", "PKG OVERRIDE")
    server.add(reply("", ("read", {"path": "pkg/gen.py"})))
    server.add(reply("done"))
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    first, second = bodies(server)
    context, prompt = context_of(first), system_and_context(first)
    assert "ROOT OVERRIDE: release freeze" in context
    assert "ROOT: run make test" not in prompt
    assert "CODEX USER OVERRIDE" in context
    assert "CODEX USER: not sent" not in prompt
    gen = repo / "pkg" / "gen.py"
    assert second["messages"][-1]["content"][1]["text"] == note(
        (repo / "pkg" / "AGENTS.override.md", "PKG OVERRIDE", gen),
        (repo / ".claude" / "rules" / "python" / "style.md", "PY: type every function", gen),
    )


def test_user_files_of_claude_code_codex_opencode_and_keel_in_order(tmp_path: Path) -> None:
    home, user_dir, root = tmp_path / "home", tmp_path / "config", tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    files = [
        write(home / ".claude" / "CLAUDE.md", "claude"),
        write(home / ".claude" / "rules" / "a.md", "user rule"),
        write(home / ".codex" / "AGENTS.md", "codex"),
        write(home / ".config" / "opencode" / "AGENTS.md", "opencode"),
        write(home / ".config" / "opencode" / "team.md", "opencode instructions"),
        write(user_dir / "AGENTS.md", "keel"),
        write(root / "AGENTS.md", "project"),
        write(root / ".claude" / "rules" / "b.md", "project rule"),
        write(root / "docs" / "guide.md", "guide"),
    ]
    write(home / ".claude" / "rules" / "scoped.md", "---\npaths: ['*.go']\n---\nscoped")
    write(home / ".config" / "opencode" / "opencode.json", '{"instructions": ["team.md"]}')
    write(
        root / "opencode.jsonc",
        '{\n  // shared guidance\n  "instructions": [\n    "docs/*.md", /* all */\n'
        '    "https://example.com/rules.md",\n  ],\n  "model": "x//y",\n}\n',
    )
    assert instruction_files(root, user_dir=user_dir, home=home) == files
    loaded = load_instructions(root, user_dir=user_dir, home=home)
    assert loaded.warnings == (
        f"{root / 'opencode.jsonc'}: instructions https://example.com/rules.md not fetched: "
        "keel reads local files",
    )


def test_opencode_instructions_outside_the_project_are_not_read(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    write(tmp_path / "secret.md", "SECRET")
    write(root / "opencode.json", '{"instructions": ["../secret.md", "/etc/hostname"]}')
    loaded = load_instructions(root, user_dir=None, home=tmp_path / "home")
    assert loaded.files == ()
    assert loaded.warnings == (
        f"{root / 'opencode.json'}: instructions {tmp_path / 'secret.md'} not read: outside the "
        "project",
        f"{root / 'opencode.json'}: instructions /etc/hostname not read: not inside the project",
    )


# -- what a project may not do with a nested file ----------------------------------------------------


def test_a_nested_file_may_not_import_or_link_outside_the_project(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    secret = write(isolated_env / "user-home" / ".ssh" / "id_rsa", "PRIVATE KEY")
    write(repo / "pkg" / "AGENTS.md", "PKG: see @~/.ssh/id_rsa and @../../outside.md")
    write(repo.parent / "outside.md", "OUTSIDE")
    (repo / "lib").mkdir()
    os.symlink(secret, repo / "lib" / "CLAUDE.md")
    write(repo / "lib" / "a.py", "A = 1\n")
    server.add(reply("", ("read", {"path": "pkg/gen.py"}), ("read", {"path": "lib/a.py"})))
    server.add(reply("done"))
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    everything = json.dumps(bodies(server))
    assert "PRIVATE KEY" not in everything
    assert "OUTSIDE" not in everything
    assert "PKG: see @~/.ssh/id_rsa" in everything
    assert f"{repo / 'lib' / 'CLAUDE.md'}: not included: it is a link to {secret}" in out.stderr
    assert "import @~/.ssh/id_rsa not followed: a project file may import only" in out.stderr


# -- rules: the format -------------------------------------------------------------------------------


def test_rule_frontmatter_forms(tmp_path: Path) -> None:
    warnings: list[str] = []
    one = write(tmp_path / "one.md", "---\npaths: src/**/*.{ts,tsx}, lib/*.js\n---\nbody")
    unquoted = write(tmp_path / "unquoted.md", "---\npaths: **/*.go\n---\nGo")
    bad = write(tmp_path / "bad.md", "---\npaths: {a: 1}\n---\nbody")
    broken = write(tmp_path / "broken.md", '---\npaths: ["src\\\\"]\n---\nbody')
    unclosed = write(tmp_path / "unclosed.md", "---\npaths: [\n---\nbody")
    rules = [read_rule(p, warnings) for p in (one, unquoted, bad, broken, unclosed)]
    assert [r.patterns if r else None for r in rules] == [
        ("src/**/*.{ts,tsx}", "lib/*.js"),
        ("**/*.go",),
        None,
        None,
        None,
    ]
    assert warnings == [
        f"{bad}: paths must be a list of globs; rule not used",
        f"{broken}: paths: 'src\\\\': not a valid gitignore pattern (Invalid git pattern: "
        "'src\\\\'); rule not used",
        f"{unclosed}: paths: '[': it matches nothing as a gitignore pattern (a comment, or an "
        "unclosed '['); write \\# or \\[ for the character itself; rule not used",
    ]


# -- once per context ---------------------------------------------------------------------------------


async def test_delivered_again_after_a_compaction(repo: Path, isolated_env: Path) -> None:
    provider = ScriptedProvider(
        [
            reply("", ("read", {"path": "pkg/gen.py"})),
            reply("ok"),
            reply("<summary>read pkg/gen.py</summary>"),
            reply("", ("read", {"path": "pkg/gen.py"})),
            reply("ok"),
        ]
    )
    async with Agent(provider=provider, model="scripted", tools=builtin_tools(), cwd=repo) as agent:
        await agent.run("one")
        await agent.compact()
        await agent.run("two")
    notes = [
        r.messages[-1].blocks[-1].text  # type: ignore[union-attr]
        for r in provider.requests
        if r.messages[-1].tool_results
    ]
    assert len(notes) == 2
    assert notes[0] == notes[1]
    assert "PKG: this package" in notes[0]
    assert "PY: type every function" in notes[0]


# -- the cost per tool call ---------------------------------------------------------------------------


def test_checking_a_call_costs_microseconds(repo: Path, tmp_path: Path) -> None:
    for i in range(50):
        write(repo / ".claude" / "rules" / f"r{i}.md", f"---\npaths: ['src{i}/**/*.py']\n---\nR{i}")
    notes = InstructionNotes(repo, user_dir=tmp_path / "config", home=tmp_path / "home")
    notes.reset("")
    calls = [ToolUse(f"t{i}", "read", {"path": f"pkg/deep/f{i % 20}.py"}) for i in range(2000)]
    results = {c.id: ToolResult(c.id, ()) for c in calls}
    notes.note_for(calls[:1], results)  # loads the rules once
    start = time.perf_counter()
    for call in calls:
        notes.note_for([call], results)
    per_call = (time.perf_counter() - start) / len(calls)
    assert per_call < 0.001, per_call


# -- output styles ---------------------------------------------------------------------------------

PIRATE = "---\nname: Pirate\ndescription: talks like a pirate\n---\nAnswer like a pirate."


def test_keel_p_with_a_project_output_style_replaces_the_work_style(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    from keel.agent.output_styles import IDENTITY
    from keel.agent.prompt import ROLE, SAFETY

    write(repo / ".claude" / "output-styles" / "pirate.md", PIRATE)
    write(repo / ".claude" / "settings.json", '{"outputStyle": "pirate"}')
    server.add(reply("arr"))
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    system = system_text(bodies(server)[0])
    assert system == (
        f"{IDENTITY}\n\n{SAFETY}\n\n"
        "<output-style>\nOutput style: Pirate\n\nAnswer like a pirate.\n</output-style>"
    )
    assert ROLE not in system
    assert "<output-style>" not in context_of(bodies(server)[0])
    assert "unknown key" not in out.stderr
    assert "does not use" not in out.stderr


def test_a_built_in_style_keeps_the_work_style_and_an_unknown_one_is_named(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    from keel.agent.prompt import BASE_PROMPT

    settings = write(repo / ".claude" / "settings.local.json", '{"outputStyle": "Explanatory"}')
    server.add(reply("ok"))
    server.add(reply("ok"))
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    system = system_text(bodies(server)[0])
    assert system.startswith(BASE_PROMPT + "\n\n<output-style>\nOutput style: Explanatory\n\n")
    assert system.endswith("\n</output-style>")
    assert "<output-style>" not in context_of(bodies(server)[0])
    settings.write_text('{"outputStyle": "Terse"}', encoding="utf-8")
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    assert system_text(bodies(server)[1]) == BASE_PROMPT
    assert (
        f"{settings}: outputStyle 'Terse' is no output style (known: Default, Explanatory, "
        "Learning, Proactive, Concise); keel's own prompt is used"
    ) in out.stderr


async def test_output_style_command_changes_the_prompt_from_the_next_fresh_context(
    repo: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.testing import ScriptedProvider as Scripted
    from keel.tui.view import Output
    from tests.tui_helpers import Recorder, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    write(isolated_env / "user-home" / ".claude" / "output-styles" / "pirate.md", PIRATE)
    provider = Scripted([reply("one"), reply("two"), reply("three")], model="claude-sonnet-4-5")
    recorder = Recorder()
    controller = await make_controller(repo, provider)
    controller.attach(recorder)
    controller.submit("first")
    await controller.wait()
    controller.submit("/output-style")
    await controller.wait()
    listing = [e for e in recorder.events if isinstance(e, Output)][-1].text
    assert "- **Default** (this context, next): keel's own prompt" in listing
    assert "- **Pirate**: talks like a pirate · " in listing
    controller.submit("/output-style PIRATE")
    await controller.wait()
    saved = repo / ".keel" / "settings.local.json"
    assert recorder.events[-1] == Notice(
        "output style: Pirate from the next fresh context (/clear); this conversation keeps "
        f"Default (saved in {saved})"
    )
    assert json.loads(saved.read_text(encoding="utf-8")) == {"outputStyle": "Pirate"}
    controller.submit("second")
    await controller.wait()
    controller.submit("/clear")
    await controller.wait()
    controller.submit("third")
    await controller.wait()
    first, second, third = provider.requests
    assert second.system == first.system  # the cached prefix holds
    assert "<output-style>" not in first.system
    assert third.system.endswith("Output style: Pirate\n\nAnswer like a pirate.\n</output-style>")
    await controller.close()


# -- keel trust list ---------------------------------------------------------------------------------


def test_trust_list_gives_rules_styles_and_nested_files_their_verdicts(
    repo: Path, isolated_env: Path
) -> None:
    write(repo / "AGENTS.override.md", "override")
    write(repo / "CLAUDE.md", "shadowed")
    write(repo / "pkg" / "CLAUDE.md", "shadowed too")
    write(repo / ".claude" / "output-styles" / "pirate.md", PIRATE)
    out = keel("trust", "list", cwd=repo)
    assert out.returncode == 0, out.stderr
    gate = "whatever it makes the model do passes the permission gate"
    lines = [line for line in out.stdout.splitlines() if line.startswith("  ")]
    assert lines == [
        f"  .claude/output-styles [output-styles]: prompt text: output styles Pirate (chosen "
        f"with outputStyle or /output-style); {gate}",
        f"  .claude/rules [rules]: prompt text: 1 always-on rule(s) in the context, 2 sent "
        f"when the model reads or edits a file their paths match; {gate}",
        "  AGENTS.md [instructions]: not read: the AGENTS.override.md beside it is",
        f"  AGENTS.override.md [instructions]: prompt text: in the context; {gate}",
        "  CLAUDE.md [instructions]: not read: the AGENTS.override.md beside it is",
        "  pkg/AGENTS.md [instructions]: prompt text: sent when the model reads or edits a file "
        f"in pkg/ (once per context); {gate}",
        "  pkg/CLAUDE.md [instructions]: not read: the AGENTS.md beside it is",
    ]


def test_a_continued_session_does_not_send_a_delivered_file_again(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    server.add(reply("", ("read", {"path": "pkg/gen.py"})))
    server.add(reply("read it"))
    server.add(reply("", ("read", {"path": "pkg/deep/mod.py"})))
    server.add(reply("again"))
    first = keel("-p", "one", "--model", MODEL, cwd=repo, env=server_env(server))
    assert first.returncode == 0, first.stderr
    second = keel("-p", "-c", "two", "--model", MODEL, cwd=repo, env=server_env(server))
    assert second.returncode == 0, second.stderr
    sent = bodies(server)
    assert len(sent) == 4
    assert "PKG: this package" in sent[1]["messages"][-1]["content"][1]["text"]
    # The continued session rebuilt the note from its journal; the next read in pkg/ brings
    # nothing new.
    assert [b["type"] for b in sent[3]["messages"][-1]["content"]] == ["tool_result"]
    assert json.dumps(sent[3]).count("PKG: this package") == 1


def test_doctor_lists_the_path_scoped_rules(repo: Path, isolated_env: Path) -> None:
    out = keel("doctor", cwd=repo)
    rules = repo / ".claude" / "rules"
    assert (
        "rules sent when the model reads or edits a matching file: 2\n"
        f"  {rules / 'docs.md'} (docs/**/*.{{md,rst}})\n"
        f"  {rules / 'python' / 'style.md'} (pkg/**/*.py)\n"
    ) in out.stdout


def test_a_read_deny_rule_keeps_a_nested_file_out(
    server: AnthropicServer, repo: Path, isolated_env: Path
) -> None:
    write(
        repo / ".claude" / "settings.json", '{"permissions": {"deny": ["Read(./pkg/AGENTS.md)"]}}'
    )
    server.add(reply("", ("read", {"path": "pkg/gen.py"})))
    server.add(reply("done"))
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    gen = repo / "pkg" / "gen.py"
    assert bodies(server)[1]["messages"][-1]["content"][1]["text"] == note(
        (repo / ".claude" / "rules" / "python" / "style.md", "PY: type every function", gen),
    )
    assert "PKG: this package" not in json.dumps(bodies(server))
    settings = repo / ".claude" / "settings.json"
    assert (
        f"keel: warning: {repo / 'pkg' / 'AGENTS.md'}: not sent to the model: denied by rule "
        f"read(./pkg/AGENTS.md) ({settings})\n"
    ) in out.stderr


def test_whose_a_file_is_comes_from_the_intake_not_from_where_it_was_found(
    tmp_path: Path,
) -> None:
    """A checkout mounted over the home's parent: `~/.claude/CLAUDE.md` lies inside the project,
    so it came with the project and may not import a file outside it."""
    root = tmp_path / "repo"
    home = root / "home"
    (root / ".git").mkdir(parents=True)
    write(tmp_path / "secret.md", "SECRET")
    user_file = write(home / ".claude" / "CLAUDE.md", f"see @{tmp_path / 'secret.md'}")
    loaded = load_instructions(root, user_dir=tmp_path / "config", home=home)
    assert [f.path for f in loaded.files] == [user_file]
    assert loaded.warnings == (
        f"{user_file}: import @{tmp_path / 'secret.md'} not followed: a project file may import "
        f"only files inside the project ({root}); import it from ~/.claude/CLAUDE.md",
    )
    # Outside the project the same file is the user's and imports what it names.
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / ".git").mkdir(parents=True)
    own = load_instructions(elsewhere, user_dir=tmp_path / "config", home=home)
    assert [f.text for f in own.files] == [f"see @{tmp_path / 'secret.md'}", "SECRET"]


def test_a_sibling_directory_brings_its_files_and_outside_the_project_nothing(
    repo: Path, tmp_path: Path
) -> None:
    write(repo / "web" / "CLAUDE.md", "WEB")
    write(repo / "web" / "app" / "AGENTS.md", "APP")
    write(tmp_path / "outside" / "AGENTS.md", "OUTSIDE")
    notes = InstructionNotes(repo / "pkg", user_dir=tmp_path / "config", home=tmp_path / "home")
    assert [f for f, _ in notes.brought_by(str(repo / "web" / "app" / "x.ts"))] == [
        repo / "web" / "CLAUDE.md",
        repo / "web" / "app" / "AGENTS.md",
    ]
    assert notes.brought_by(str(repo / "pkg" / "gen.md")) == []  # pkg/ is in the system prompt
    assert notes.brought_by(str(tmp_path / "outside" / "x.py")) == []


def test_a_plugins_output_style_is_named_after_the_plugin(
    server: AnthropicServer, repo: Path, isolated_env: Path, tmp_path: Path
) -> None:
    market = tmp_path / "market"
    write(
        market / ".claude-plugin" / "marketplace.json",
        json.dumps(
            {
                "name": "styles-market",
                "owner": {"name": "tests"},
                "plugins": [{"name": "style-kit", "source": "./style-kit"}],
            }
        ),
    )
    write(
        market / "style-kit" / "output-styles" / "terse.md",
        "---\nname: Terse\nkeep-coding-instructions: true\n---\nAnswer in one line.",
    )
    for args in (("marketplace", "add", str(market)), ("install", "style-kit@styles-market")):
        done = keel("plugin", *args, cwd=repo)
        assert done.returncode == 0, done.stderr
    write(repo / ".claude" / "settings.local.json", '{"outputStyle": "style-kit:terse"}')
    server.add(reply("ok"))
    out = keel("-p", "hi", "--model", MODEL, cwd=repo, env=server_env(server))
    assert out.returncode == 0, out.stderr
    assert system_text(bodies(server)[0]).endswith(
        "<output-style>\nOutput style: style-kit:Terse\n\nAnswer in one line.\n</output-style>"
    )


async def test_context_lists_what_was_sent_as_notes(
    repo: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.testing import ScriptedProvider as Scripted
    from keel.tui.view import Output
    from tests.tui_helpers import Recorder, make_controller

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    provider = Scripted(
        [reply("", ("read", {"path": "pkg/gen.py"})), reply("ok")], model="claude-sonnet-4-5"
    )
    recorder = Recorder()
    controller = await make_controller(repo, provider)
    controller.attach(recorder)
    controller.submit("look")
    await controller.wait()
    controller.submit("/context")
    await controller.wait()
    text = [e for e in recorder.events if isinstance(e, Output)][-1].text
    style = repo / ".claude" / "rules" / "python" / "style.md"
    assert text.endswith(
        "**Sent as notes** (files the model read or edited brought them)\n\n"
        f"- `{repo / 'pkg' / 'AGENTS.md'}`\n- `{style}`"
    )
    await controller.close()
