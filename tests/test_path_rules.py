"""Path patterns read with git's rules wherever keel reads one (permission rules, `ls`, the search
fallback's .gitignore handling, `glob` filters), and read deny rules that hold for everything
that would show a file's content: grep (ripgrep and the fallback), knowledge_search and `@file`
mentions. Each test here is an attack that got through before keel read patterns with pathspec
and asked the gate about content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.agent.loop import Agent
from keel.agent.mentions import attach
from keel.globs import escape, gitignore, glob_matcher, ignored
from keel.llm.messages import ToolUse
from keel.llm.providers.scripted import ScriptedProvider
from keel.permissions.gate import Allow, Deny, PermissionGate, PermissionReply
from keel.permissions.rules import Effect, parse_rule, path_matches, settings_rules, suggest
from keel.tools.base import ToolContext, ToolError, ToolOutput
from keel.tools.builtin import glob, grep, ls


async def run(t: object, ctx: ToolContext, **args: object) -> ToolOutput:
    assert hasattr(t, "run")
    return await t.run(ctx, args)  # type: ignore[no-any-return]


def gate(project: Path, rules: list[tuple[str, Effect]], mode: Any = "default") -> PermissionGate:
    parsed = [parse_rule(text, effect, "test") for text, effect in rules]
    return PermissionGate(mode, project, project, parsed)


def agent_with(project: Path, rules: list[tuple[str, Effect]]) -> Agent:
    """An agent whose tools' context is wired to a gate with `rules`, as every front end's is."""
    return Agent(
        provider=ScriptedProvider([]),
        model="scripted",
        cwd=project,
        system="s",
        gate=gate(project, rules),
    )


def call(name: str, **args: Any) -> ToolUse:
    return ToolUse(f"id-{name}", name, args)


@pytest.fixture(params=[pytest.param("ripgrep", marks=pytest.mark.needs("rg")), "python"])
def search_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "ripgrep":
        monkeypatch.delenv("KEEL_NO_RIPGREP", raising=False)
    else:
        monkeypatch.setenv("KEEL_NO_RIPGREP", "1")
    return str(request.param)


# -- permission rules --------------------------------------------------------------------------


async def test_a_character_class_in_a_read_deny_rule_holds(project: Path) -> None:
    for name in ("Secret.env", "secret.env", "xecret.env"):
        (project / name).write_text("TOKEN=1\n", encoding="utf-8")
    g = gate(project, [("Read(./[Ss]ecret.env)", "deny")], "bypass")
    denied = Deny("denied by rule read(./[Ss]ecret.env) (test)", "rule")
    assert await g.authorize(call("read", path="Secret.env"), read_only=True) == denied
    assert await g.authorize(call("read", path="secret.env"), read_only=True) == denied
    assert await g.authorize(call("read", path="xecret.env"), read_only=True) == Allow(
        "mode:bypass"
    )


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("./[Ss]ecret.env", "Secret.env", True),
        ("./[Ss]ecret.env", "xecret.env", False),
        ("./[!a]b.key", "cb.key", True),  # a negated class
        ("./[!a]b.key", "ab.key", False),
        ("./[a-c]?.pem", "bx.pem", True),
        ("./\\#notes", "#notes", True),  # escapes: `#` and `!` as characters
        ("./\\!urgent", "!urgent", True),
        ("./trailing\\ ", "trailing ", True),  # an escaped trailing space is kept…
        ("./trailing\\ ", "trailing", False),
        ("./spaced   ", "spaced", True),  # …unescaped ones are dropped, as git drops them
        ("**/id_rsa", "a/b/id_rsa", True),
        ("./a/**/z.key", "a/z.key", True),
        ("./a/**/z.key", "a/b/c/z.key", True),
        ("./a/**/z.key", "b/a/z.key", False),
        ("./keys/", "keys/id", True),  # a directory pattern covers what is in it
        ("./vault/", "vault", False),  # `vault` is a file here: `/` is for directories only
        ("*.p?m", "certs/x.pem", True),
    ],
)
def test_path_patterns_follow_git(project: Path, pattern: str, path: str, expected: bool) -> None:
    for folder in ("keys", "a/b/c", "certs"):
        (project / folder).mkdir(parents=True, exist_ok=True)
    (project / "vault").write_text("x", encoding="utf-8")
    rule = parse_rule(f"Read({pattern})", "deny", "test")
    assert path_matches(rule.pattern or "", project / path, project) is expected


@pytest.mark.parametrize("effect", ["deny", "ask"])
def test_a_deny_or_ask_pattern_that_cannot_be_applied_fails_closed(
    project: Path, effect: Effect
) -> None:
    source = "/p/.keel/settings.json"
    rules, warnings = settings_rules(
        [("Read(./[z-a].env)", source), ("Read(!public.txt)", source)], effect
    )
    assert [str(r) for r in rules] == ["read(./[z-a].env)", "read(!public.txt)"]
    assert len(warnings) == 2
    assert warnings[0].startswith(
        f"{source}: {effect} rule 'Read(./[z-a].env)': not a valid gitignore pattern ("
    )
    assert warnings[0].endswith("; it covers every path of read until it is fixed")
    assert warnings[1] == (
        f"{source}: {effect} rule 'Read(!public.txt)': a rule's pattern cannot be negated with "
        "'!' (write \\! for a '!'); it covers every path of read until it is fixed"
    )
    g = PermissionGate("bypass", project, project, rules[:1])
    for tool in ("read", "grep", "glob", "ls"):
        assert g._first(effect, tool, {"path": "app.py"}) is rules[0], tool
    assert g._first(effect, "edit", {"path": "app.py"}) is None  # only its own tool (family)


async def test_an_unreadable_deny_pattern_denies_every_read(project: Path) -> None:
    rules, _ = settings_rules([("Read(./[z-a].env)", "/p/.keel/settings.json")], "deny")
    g = PermissionGate("bypass", project, project, rules)
    for tool, path in (("read", "app.py"), ("grep", "."), ("ls", "src")):
        decision = await g.authorize(call(tool, path=path), read_only=True)
        assert isinstance(decision, Deny), tool
    assert g.content_denied(project / "README.md") is rules[0]


def test_an_allow_pattern_that_cannot_be_applied_is_skipped(project: Path) -> None:
    rules, warnings = settings_rules([("Edit(./[z-a]/**)", "/p/.keel/settings.json")], "allow")
    assert rules == []
    assert len(warnings) == 1
    assert warnings[0].startswith("/p/.keel/settings.json: allow rule 'Edit(./[z-a]/**)': ")
    assert warnings[0].endswith("; skipped")
    # Parsed elsewhere (a flag, a command's allowed-tools), such a rule allows nothing.
    rule = parse_rule("Edit(./[z-a]/**)", "allow", "--allowed-tools")
    g = PermissionGate("default", project, project, [rule])
    assert g._allowed_by("edit", {"path": "app.py"}) is None


def test_an_always_allow_answer_saves_the_folder_as_written(tmp_path: Path) -> None:
    """A folder name with pattern characters must not turn into a class in the saved rule."""
    folder = tmp_path / "[x] notes"
    folder.mkdir()
    (tmp_path / "x notes").mkdir()
    rule = suggest("read", {"path": str(folder / "a.md")}, tmp_path)
    assert rule == f"read(//{escape(str(folder).lstrip('/'))}/**)"
    pattern = parse_rule(rule, "allow").pattern or ""
    assert path_matches(pattern, folder / "a.md", tmp_path)
    assert not path_matches(pattern, tmp_path / "x notes" / "a.md", tmp_path)


# -- .gitignore with git's rules: ls and the search fallback -----------------------------------

#: Lines of GitHub's VisualStudio.gitignore.
VISUAL_STUDIO = """\
## Ignore Visual Studio temporary files, build results, and
## files generated by popular Visual Studio add-ons.
*.user
[Dd]ebug/
[Rr]elease/
[Ww][Ii][Nn]32/
[Bb]in/
[Oo]bj/
[Ll]og/
# Visual Studio cache files
*.[Cc]ache
# but keep track of directories ending in .cache
!?*.[Cc]ache/
**/[Pp]ackages/*
!**/[Pp]ackages/build/
\\#*#
spaced\\ 
trail   
"""  # noqa: W291 (trailing spaces are what is tested)


@pytest.fixture
def studio(project: Path) -> Path:
    (project / ".git").mkdir()
    (project / ".gitignore").write_text(VISUAL_STUDIO, encoding="utf-8")
    for rel in (
        "Bin/App.dll",
        "obj/Debug/App.cs",
        "Win32/setup.txt",
        "src/App.cs",
        "src/bin/tool.cs",
        "keep.Cache/data.txt",
        "packages/foo.txt",
        "packages/build/b.props",
        "App.csproj.user",
        "thumbs.cache",
        "#autosave#",
        "spaced ",
        "trail",
    ):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("MARK here\n", encoding="utf-8")
    return project


def test_gitignore_lines_are_read_as_git_reads_them() -> None:
    spec = gitignore(VISUAL_STUDIO.splitlines())
    assert ignored(spec, "Bin", True) is True
    assert ignored(spec, "bin", False) is None  # a file: `[Bb]in/` is for directories
    assert ignored(spec, "keep.Cache", True) is False  # re-included by `!?*.[Cc]ache/`
    assert ignored(spec, "packages/build", True) is False
    assert ignored(spec, "spaced ", False) is True
    assert ignored(spec, "trail", False) is True


async def test_ls_hides_what_a_visual_studio_gitignore_ignores(studio: Path) -> None:
    ctx = ToolContext(cwd=studio, root=studio)
    out = await run(ls, ctx)
    assert out.content == (
        f"{studio}/\n"
        "  keep.Cache/\n"
        "  packages/\n"
        "  src/\n"
        "  .gitignore  347 B\n"
        "  app.py  40 B\n"
        "  README.md  7 B\n"
        "  util.py  6 B\n"
        "[9 hidden by .gitignore or as VCS data: .git/, Bin/, obj/, Win32/, #autosave#, "
        "App.csproj.user, spaced , thumbs.cache, trail; all=true shows them]"
    )
    out = await run(ls, ctx, path="packages")
    assert out.content == (
        f"{studio}/packages/\n  build/\n"
        "[1 hidden by .gitignore or as VCS data: foo.txt; all=true shows them]"
    )
    out = await run(ls, ctx, path="src")
    assert out.content == (
        f"{studio}/src/\n  App.cs  10 B\n"
        "[1 hidden by .gitignore or as VCS data: bin/; all=true shows them]"
    )


async def test_the_search_walk_skips_what_a_visual_studio_gitignore_ignores(
    search_mode: str, studio: Path
) -> None:
    ctx = ToolContext(cwd=studio, root=studio)
    expected = ["keep.Cache/data.txt", "packages/build/b.props", "src/App.cs"]
    out = await run(glob, ctx, pattern="**")
    assert out.content == "\n".join(sorted([*expected, "README.md", "app.py", "util.py"]))
    out = await run(grep, ctx, pattern="MARK", files_only=True)
    assert sorted(str(out.content).splitlines()) == expected


async def test_glob_filters_read_classes_and_alternation_as_ripgrep(
    search_mode: str, project: Path
) -> None:
    (project / "docs").mkdir()
    (project / "docs" / "guide.md").write_text("x\n", encoding="utf-8")
    (project / "x.py").mkdir()  # a folder named like a file: a glob matches files
    (project / "x.py" / "inner.md").write_text("x\n", encoding="utf-8")
    ctx = ToolContext(cwd=project, root=project)
    out = await run(glob, ctx, pattern="[au]*.py")
    assert out.content == "app.py\nutil.py"
    out = await run(glob, ctx, pattern="*.{md,py}")
    assert out.content == "README.md\napp.py\ndocs/guide.md\nutil.py\nx.py/inner.md"
    out = await run(glob, ctx, pattern="{docs,x.py}/*.md")
    assert out.content == "docs/guide.md\nx.py/inner.md"
    out = await run(grep, ctx, pattern="x", glob="*.{md,py}", files_only=True)
    assert sorted(str(out.content).splitlines()) == ["docs/guide.md", "x.py/inner.md"]
    out = await run(glob, ctx, pattern="*.py")
    assert out.content == "app.py\nutil.py"
    with pytest.raises(ToolError, match=r"invalid glob '\{a,b': a '\{' is never closed"):
        await run(glob, ctx, pattern="{a,b")


def test_glob_matcher_is_ripgreps_glob() -> None:
    assert glob_matcher("src/**")("src/a/b.py")
    assert not glob_matcher("src/**")("lib/src/a.py")
    assert not glob_matcher("src")("src/a.py")  # a directory's name takes in no file
    assert glob_matcher("!*.py")("a.md")
    assert not glob_matcher("!*.py")("a.py")
    assert glob_matcher("#*")("#x")  # a glob has no comments
    assert glob_matcher("a{,.bak}")("a")
    assert glob_matcher("a{,.bak}")("a.bak")


# -- read deny rules hold for content ----------------------------------------------------------


@pytest.fixture
def secrets(project: Path) -> Path:
    (project / ".git").mkdir()
    (project / "secret.env").write_text("TOKEN=hunter2\n", encoding="utf-8")
    (project / "keys").mkdir()
    (project / "keys" / "id").write_text("TOKEN=private-key\n", encoding="utf-8")
    (project / "config.py").write_text("TOKEN = os.environ['TOKEN']\n", encoding="utf-8")
    return project


DENY_SECRETS: list[tuple[str, Effect]] = [("Read(./secret.env)", "deny"), ("Read(keys/)", "deny")]
SKIPPED = (
    "[2 files not searched: a read deny rule keeps their content from you (keys/id, secret.env)]"
)


async def test_grep_leaves_out_files_a_read_deny_rule_covers(
    search_mode: str, secrets: Path
) -> None:
    ctx = agent_with(secrets, DENY_SECRETS).ctx
    out = await run(grep, ctx, pattern="TOKEN")
    assert out.content == "config.py:1:TOKEN = os.environ['TOKEN']\n" + SKIPPED
    out = await run(grep, ctx, pattern="TOKEN", files_only=True)
    assert out.content == "config.py\n" + SKIPPED
    out = await run(grep, ctx, pattern="hunter2|private")
    assert out.content == "No matches for 'hunter2|private'.\n" + SKIPPED
    # The count is the same whether or not the files would have matched: it says nothing of
    # what they hold.
    out = await run(grep, ctx, pattern="zzz-no-such-text")
    assert out.content == "No matches for 'zzz-no-such-text'.\n" + SKIPPED
    out = await run(grep, ctx, pattern="TOKEN", glob="*.env")
    assert out.content == (
        "No matches for 'TOKEN'.\n[1 file not searched: a read deny rule keeps its content "
        "from you (secret.env)]"
    )
    # Without a read deny rule nothing is left out and nothing is said.
    out = await run(grep, agent_with(secrets, []).ctx, pattern="hunter2")
    assert out.content == "secret.env:1:TOKEN=hunter2"


async def test_grep_of_a_denied_file_or_folder_is_refused_by_the_gate(secrets: Path) -> None:
    g = gate(secrets, DENY_SECRETS, "bypass")
    for path in ("secret.env", "keys", "keys/id"):
        decision = await g.authorize(call("grep", pattern="TOKEN", path=path), read_only=True)
        assert isinstance(decision, Deny), path


async def test_a_mentioned_file_a_read_deny_rule_covers_is_not_attached(secrets: Path) -> None:
    agent = agent_with(secrets, DENY_SECRETS)
    sent, attachments = attach(
        "compare @secret.env with @config.py and @keys", secrets, refuse=agent.import_refusal
    )
    assert "hunter2" not in sent
    assert "private-key" not in sent
    assert [(a.path, a.refused) for a in attachments] == [
        ("secret.env", "denied by rule read(./secret.env) (test)"),
        ("config.py", ""),
        ("keys", "denied by rule read(keys/) (test)"),
    ]
    assert sent.endswith(
        '<attached-file path="secret.env">\n(not attached: denied by rule read(./secret.env) '
        '(test))\n</attached-file>\n\n<attached-file path="config.py">\n'
        "TOKEN = os.environ['TOKEN']\n</attached-file>\n\n"
        '<attached-file path="keys">\n(not attached: denied by rule read(keys/) (test))\n'
        "</attached-file>"
    )
    assert not attachments[0].complete  # not counted as read for read-before-write


def test_the_agents_tools_and_mentions_ask_the_gate(secrets: Path) -> None:
    agent = agent_with(secrets, DENY_SECRETS)
    assert agent.ctx.content_denied is not None
    assert agent.ctx.content_denied(secrets / "secret.env") == (
        "denied by rule read(./secret.env) (test)"
    )
    assert agent.ctx.content_denied(secrets / "config.py") is None
    # A rule added later (a command's disallowed-tools) counts at once.
    assert isinstance(agent.gate, PermissionGate)
    agent.gate.rules.append(parse_rule("Read(config.py)", "deny", "cmd"))
    assert agent.ctx.content_denied(secrets / "config.py") == "denied by rule read(config.py) (cmd)"


async def test_knowledge_search_never_returns_a_denied_files_sections(secrets: Path) -> None:
    from keel.knowledge.index import has_fts5, index_path, update
    from keel.knowledge.tool import UNTRUSTED, knowledge_tool

    if not has_fts5():
        pytest.skip("this Python's sqlite3 has no FTS5")
    (secrets / "docs").mkdir()
    (secrets / "docs" / "deploy.md").write_text("# Deploy\n\nRotate the token.\n", "utf-8")
    (secrets / "docs" / "vault.md").write_text("# Vault\n\nThe token is hunter2.\n", "utf-8")
    db = index_path(secrets)
    update(secrets, db)
    tool = knowledge_tool(db, secrets)
    ctx = agent_with(secrets, [("Read(./docs/vault.md)", "deny")]).ctx
    out = await tool.run(ctx, {"query": "token", "top_k": 5})
    assert out.content == (
        'Knowledge search for "token" (lexical ranking): 1 result(s).\n'
        "[1 indexed file left out: a read deny rule keeps its content from you (docs/vault.md)]\n"
        f"{UNTRUSTED}\n"
        "<knowledge-results>\n"
        '<chunk cite="docs/deploy.md#deploy" lines="1-3" heading="Deploy">\n'
        "# Deploy\n\nRotate the token.\n"
        "</chunk>\n"
        "</knowledge-results>"
    )
    out = await tool.run(agent_with(secrets, []).ctx, {"query": "token", "top_k": 5})
    assert "hunter2" in str(out.content)  # the index has it: the rule is what keeps it out


async def test_only_deny_rules_withhold_content(secrets: Path) -> None:
    """Only deny rules withhold content: an ask rule asks before `read` of the file itself."""

    async def yes(_: object) -> PermissionReply:
        return PermissionReply(True)

    g = gate(secrets, [("Read(./secret.env)", "ask")])
    g.asker = yes
    assert g.content_denied(secrets / "secret.env") is None
    assert await g.authorize(call("read", path="secret.env"), read_only=True) == Allow(
        "user:once", notable=True
    )
