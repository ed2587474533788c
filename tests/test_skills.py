"""Skills and custom slash commands on real folders: discovery and precedence, frontmatter
problems, the index section, the `skill` tool, argument expansion and `` !`cmd` `` runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keel.skills import (
    Command,
    CommandSet,
    Expansion,
    Skill,
    SkillSet,
    load_commands,
    load_extensions,
    load_skills,
    skill_tool,
)
from keel.skills.skills import search_dirs, split_arguments, substitute
from keel.tools.base import ToolContext, ToolError, ToolOutput


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    return tmp_path / "config"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    return root


@pytest.fixture
def cwd(repo: Path) -> Path:
    """Two levels below the repository root."""
    path = repo / "pkg" / "sub"
    path.mkdir(parents=True)
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def skill_file(skills_dir: Path, folder: str, frontmatter: str, body: str = "Do it.") -> Path:
    return write(skills_dir / folder / "SKILL.md", f"---\n{frontmatter}\n---\n\n{body}\n")


def skill(name: str, description: str, body: str, path: Path) -> Skill:
    return Skill(name=name, description=description, body=body, path=path)


# -- discovery ---------------------------------------------------------------------------------


def test_search_dirs_run_from_user_dirs_to_the_project_root_down_to_cwd(
    home: Path, user_dir: Path, repo: Path, cwd: Path
) -> None:
    assert search_dirs(cwd, user_dir=user_dir, home=home, kind="skills") == [
        home / ".codex/skills",
        home / ".config/opencode/skill",
        home / ".config/opencode/skills",
        home / ".claude/skills",
        user_dir / "skills",
        *(
            d / rel
            for d in (repo, repo / "pkg", cwd)
            for rel in (".codex/skills", ".opencode/skill", ".opencode/skills", ".claude/skills",
                        ".keel/skills")
        ),
    ]  # fmt: skip
    # Without a git repository the project is cwd alone; a directory reached twice (the home
    # directory as the project) keeps its later place.
    assert search_dirs(home, user_dir=None, home=home, kind="commands") == [
        home / ".claude/commands",
        home / ".keel/commands",
    ]


def test_later_skills_override_earlier_ones_by_name(
    tmp_path: Path, home: Path, user_dir: Path, repo: Path, cwd: Path
) -> None:
    a_home = skill_file(home / ".claude/skills", "alpha", "description: alpha from home")
    a_user = skill_file(user_dir / "skills", "alpha", "description: alpha from keel's config")
    b_repo = skill_file(repo / ".claude/skills", "beta", "description: beta from the repo")
    b_pkg = skill_file(repo / "pkg/.keel/skills", "beta", "description: beta from pkg/.keel")
    # The frontmatter name wins over the folder name.
    g_cwd = skill_file(cwd / ".claude/skills", "folder", "name: gamma\ndescription: gamma")
    # Above the repository root: not part of the project.
    skill_file(tmp_path / ".claude/skills", "outside", "description: never seen")
    write(repo / ".claude/skills/no-skill-md/README.md", "not a skill\n")

    skills = load_skills(cwd, user_dir=user_dir, home=home)

    assert skills.skills == {
        "alpha": skill("alpha", "alpha from keel's config", "Do it.", a_user),
        "beta": skill("beta", "beta from pkg/.keel", "Do it.", b_pkg),
        "gamma": skill("gamma", "gamma", "Do it.", g_cwd),
    }
    assert [s.path for s in skills.shadowed] == [a_home, b_repo]
    assert skills.warnings == []


def test_a_symlinked_skill_folder_is_followed(tmp_path: Path, home: Path, cwd: Path) -> None:
    target = skill_file(tmp_path / "shared", "linked", "description: shared skill").parent
    (cwd / ".claude/skills").mkdir(parents=True)
    (cwd / ".claude/skills/linked").symlink_to(target, target_is_directory=True)
    skills = load_skills(cwd, user_dir=None, home=home)
    assert list(skills.skills) == ["linked"]
    assert skills.skills["linked"].directory == cwd / ".claude/skills/linked"


def test_unusable_skills_are_skipped_with_a_warning_naming_file_and_line(
    home: Path, repo: Path
) -> None:
    d = repo / ".claude/skills"
    no_description = skill_file(d, "a-no-description", "name: a-no-description")
    bad_name = skill_file(d, "b-bad-name", "description: fine\nname: Bad_Name")
    bad_folder = skill_file(d, "c_folder", "description: fine")
    long_name = skill_file(d, "d-long", f"name: {'x' * 65}\ndescription: fine")
    bad_yaml = skill_file(d, "e-yaml", "description: Broken\n  nested: value")
    not_closed = write(d / "f-open/SKILL.md", "---\ndescription: never closed\nbody\n")
    bad_flag = skill_file(d, "g-flag", "description: fine\n\ndisable-model-invocation: sometimes")
    list_description = skill_file(d, "h-list", "description:\n  - one\n  - two")
    not_mapping = skill_file(d, "i-list", "- description: x")
    write(d / "j-binary/SKILL.md", "").write_bytes(b"---\n\xff\xfe\n---\n")
    # Read leniently, line 2 would do; line 3 still would not, so the file is reported as it is.
    still_bad = skill_file(d, "k-yaml", "description: Use when: x\n  nested: value")
    good = skill_file(d, "z-good", "description: the one that works")

    skills = load_skills(repo, user_dir=None, home=home)

    # Names outside the Agent Skills charset load, as in Claude Code; a name that cannot be
    # typed as a command is called by its folder's name, with a warning.
    assert list(skills.skills) == ["Bad_Name", "c_folder", "d-long", "z-good"]
    assert skills.skills["z-good"].path == good
    assert [skills.skills[n].path for n in ("Bad_Name", "c_folder", "d-long")] == [
        bad_name,
        bad_folder,
        long_name,
    ]
    assert skills.warnings == [
        f"{no_description}: no description in the frontmatter (it tells the model when to use "
        "the skill); skipped",
        f"{long_name}:2: skill name '{'x' * 65}' cannot be typed as a command (spaces, `/`, or "
        "over 64 characters); it is offered as /d-long",
        f"{bad_yaml}:3: the frontmatter is not valid YAML: mapping values are not allowed here; "
        "skipped",
        f"{not_closed}:1: the frontmatter has no closing --- line; skipped",
        f"{bad_flag}:4: `disable-model-invocation` must be true or false, got 'sometimes'; skipped",
        f"{list_description}:2: `description` must be text; skipped",
        f"{not_mapping}:2: the frontmatter must be `key: value` lines; skipped",
        f"{d / 'j-binary/SKILL.md'}: not UTF-8 text; skipped",
        f"{still_bad}:2: the frontmatter is not valid YAML: mapping values are not allowed here; "
        "skipped",
    ]


def test_values_claude_code_accepts_but_yaml_rejects_are_read_as_text(
    home: Path, repo: Path
) -> None:
    path = skill_file(
        repo / ".claude/skills",
        "review",
        "description: Review a PR. Use when: the user asks for a review\n"
        "argument-hint: [pr-number] [priority]\n"
        "allowed-tools: Bash(gh pr view:*), Bash(git commit -m 'a, b'), Read\n"
        "user-invocable: 'false'",
    )
    skills = load_skills(repo, user_dir=None, home=home)
    assert skills.skills == {
        "review": Skill(
            name="review",
            description="Review a PR. Use when: the user asks for a review",
            body="Do it.",
            path=path,
            user_invocable=False,
            allowed_tools=("Bash(gh pr view:*)", "Bash(git commit -m 'a, b')", "Read"),
            argument_hint="[pr-number] [priority]",
        )
    }
    assert skills.warnings == [
        f"{path}:2: `description` is not valid YAML; read as plain text (quote the value)",
        f"{path}:3: `argument-hint` is not valid YAML; read as plain text (quote the value)",
        f"{path}:4: `allowed-tools` of a skill is not honoured by keel: the tools review needs "
        "ask as usual",
    ]


@pytest.mark.parametrize(
    ("frontmatter", "expected"),
    [
        ("allowed-tools: Read Grep Glob", ("Read", "Grep", "Glob")),
        ("allowed-tools: [Read, 'Bash(npm test)']", ("Read", "Bash(npm test)")),
        ("argument-hint: [message]", ()),
    ],
)
def test_allowed_tools_forms(
    home: Path, repo: Path, frontmatter: str, expected: tuple[str]
) -> None:
    skill_file(repo / ".claude/skills", "s", f"description: d\n{frontmatter}")
    loaded = load_skills(repo, user_dir=None, home=home).skills["s"]
    assert loaded.allowed_tools == expected
    assert loaded.argument_hint == ("[message]" if "argument-hint" in frontmatter else "")


# -- the index and the tool --------------------------------------------------------------------


def test_index_section_lists_model_invocable_skills_sorted(home: Path, repo: Path) -> None:
    d = repo / ".claude/skills"
    skill_file(d, "zeta", "description: Last by name.")
    skill_file(d, "alpha", "description: >\n  Folded over\n  two lines.")
    skill_file(d, "long", f"description: {'word ' * 60}")
    skill_file(d, "secret", "description: Only for people.\ndisable-model-invocation: true")
    skill_file(d, "quiet", "description: Not on the menu.\nuser-invocable: false")
    skills = load_skills(repo, user_dir=None, home=home)
    clipped = ("word " * 50)[:249].rstrip() + "…"
    assert skills.index_section() == (
        "<skills>\n"
        "Skills are instructions for particular tasks, kept in folders with any files they need. "
        "When a task matches a skill's description, call the skill tool with its name before you "
        "start, then follow the instructions it returns.\n"
        "- alpha: Folded over two lines.\n"
        f"- long: {clipped}\n"
        "- quiet: Not on the menu.\n"
        "- zeta: Last by name.\n"
        "</skills>"
    )
    assert [s.name for s in skills.user_invocable()] == ["alpha", "long", "secret", "zeta"]
    assert SkillSet().index_section() == ""
    only_hidden = SkillSet([skills.skills["secret"]])
    assert only_hidden.index_section() == ""


async def test_skill_tool_returns_the_body_under_its_base_directory(home: Path, repo: Path) -> None:
    d = repo / ".claude/skills"
    path = skill_file(
        d,
        "pdf",
        "description: Fill PDF forms.",
        "# PDF forms\n\nRun `scripts/fill.py` on $ARGUMENTS.\nSee reference.md.",
    )
    skill_file(d, "deploy", "description: Deploy.\ndisable-model-invocation: true")
    skills = load_skills(repo, user_dir=None, home=home)
    tool = skill_tool(skills)
    ctx = ToolContext(cwd=repo, root=repo)

    assert (tool.name, tool.read_only) == ("skill", True)
    assert tool.input_schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The skill's name, as listed."},
            "arguments": {
                "type": "string",
                "description": "What the task says the skill should work on, if anything "
                "(fills the skill's $ARGUMENTS).",
                "default": "",
            },
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert await tool.run(ctx, {"name": "pdf", "arguments": "form.pdf"}) == ToolOutput(
        f"Base directory for this skill: {path.parent}\n\n"
        "# PDF forms\n\nRun `scripts/fill.py` on form.pdf.\nSee reference.md."
    )
    assert await tool.run(ctx, {"name": "pdf"}) == ToolOutput(
        f"Base directory for this skill: {path.parent}\n\n"
        "# PDF forms\n\nRun `scripts/fill.py` on .\nSee reference.md."
    )
    with pytest.raises(ToolError) as unknown:
        await tool.run(ctx, {"name": "pdfs"})
    assert str(unknown.value) == "unknown skill 'pdfs'; available: pdf"
    with pytest.raises(ToolError) as hidden:
        await tool.run(ctx, {"name": "deploy"})
    assert (
        str(hidden.value) == "skill 'deploy' is only for the user to start; do the task without it"
    )
    with pytest.raises(ToolError) as empty:
        await skill_tool(SkillSet()).run(ctx, {"name": "pdf"})
    assert str(empty.value) == "unknown skill 'pdf'; no skills are available"


def test_user_invocation_respects_the_flags(home: Path, repo: Path) -> None:
    d = repo / ".claude/skills"
    deploy = skill_file(
        d, "deploy", "description: Deploy.\ndisable-model-invocation: true", "Deploy to $1."
    )
    skill_file(d, "background", "description: Conventions.\nuser-invocable: false")
    skills = load_skills(repo, user_dir=None, home=home)

    assert skills.expand("/deploy staging") == Expansion(
        "skill",
        "deploy",
        "staging",
        f"Base directory for this skill: {deploy.parent}\n\nDeploy to staging.\n\n"
        "ARGUMENTS: staging",
        deploy,
    )
    assert skills.expand("/background") is None
    assert skills.expand("/missing x") is None
    assert skills.expand("please /deploy") is None
    assert skills.expand("/usr/bin/env") is None


# -- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ("a b  c", ["a", "b", "c"]),
        ("\"two words\" 'single quoted' x", ["two words", "single quoted", "x"]),
        ('a "" b', ["a", "", "b"]),
        ("C:\\path #7", ["C:\\path", "#7"]),
        ("don't stop", ["don't", "stop"]),  # unbalanced quote: plain whitespace split
        ("", []),
    ],
)
def test_split_arguments(arguments: str, words: list[str]) -> None:
    assert split_arguments(arguments) == words


@pytest.mark.parametrize(
    ("template", "arguments", "expected"),
    [
        ("Fix $ARGUMENTS now", '12 "high prio"', 'Fix 12 "high prio" now'),
        ("[$1] [$2] [$3]", '12 "high prio"', "[12] [high prio] []"),
        ("$9 $1$1", "a b c d e f g h i", "i aa"),
        ("$10 costs $5", "a", "$10 costs "),
        ("$ARGUMENTS", "$1 $ARGUMENTS", "$1 $ARGUMENTS"),  # one pass
        ("$1/$ARGUMENTS", "", "/"),
    ],
)
def test_substitute(template: str, arguments: str, expected: str) -> None:
    assert substitute(template, arguments) == expected


@pytest.mark.parametrize(
    ("body", "prompt", "text"),
    [
        ("Review $ARGUMENTS.", "/s 42 high", "Review 42 high."),
        ("Review $1.", "/s 42 high", "Review 42.\n\nARGUMENTS: 42 high"),
        ("Review.", "/s   42\n  more  ", "Review.\n\nARGUMENTS: 42\n  more"),
        ("Review.", "/s", "Review."),
        ("Review $ARGUMENTS.", "/s", "Review ."),
    ],
)
def test_arguments_are_appended_when_the_body_has_no_placeholder(
    home: Path, repo: Path, body: str, prompt: str, text: str
) -> None:
    path = skill_file(repo / ".claude/skills", "s", "description: d", body)
    expansion = load_skills(repo, user_dir=None, home=home).expand(prompt)
    assert expansion is not None
    assert expansion.text == f"Base directory for this skill: {path.parent}\n\n{text}"


# -- custom commands ---------------------------------------------------------------------------


def test_commands_are_found_namespaced_and_overridden(
    home: Path, user_dir: Path, repo: Path, cwd: Path
) -> None:
    h = write(home / ".claude/commands/frontend/component.md", "Make a component $1.\n")
    u = write(user_dir / "commands/commit.md", "Commit.\n")
    p = write(
        repo / ".claude/commands/commit.md",
        "---\ndescription: Commit the staged changes\nargument-hint: [message]\n"
        "allowed-tools: Bash(git add:*), Bash(git commit:*)\nmodel: claude-haiku-4-5\n---\n"
        "Commit with message $ARGUMENTS.\n",
    )
    deep = write(repo / "pkg/.keel/commands/a/b/c.md", "Deep.\n")
    write(repo / ".claude/commands/notes.txt", "not markdown\n")
    spaced = write(cwd / ".claude/commands/two words.md", "x\n")
    broken = write(cwd / ".claude/commands/broken.md", "---\ndescription: x\n  y: z\n---\nx\n")

    commands = load_commands(cwd, user_dir=user_dir, home=home)

    assert commands.all() == [
        Command(name="a:b:c", body="Deep.", path=deep),
        Command(
            name="commit",
            body="Commit with message $ARGUMENTS.",
            path=p,
            description="Commit the staged changes",
            argument_hint="[message]",
            # A project's command may not pre-approve tools (it came with the repository).
            allowed_tools=(),
            model="claude-haiku-4-5",
        ),
        Command(name="frontend:component", body="Make a component $1.", path=h, user_level=True),
    ]
    assert commands.shadowed == (Command(name="commit", body="Commit.", path=u, user_level=True),)
    assert commands.root == repo
    assert commands.warnings == [
        f"{p}:4: `allowed-tools` of a project's command is not honoured (a file that came with "
        "the repository may not widen permissions); /commit asks as usual. Put it in "
        "~/.claude/commands to pre-approve",
        f"{broken}:3: the frontmatter is not valid YAML: mapping values are not allowed here; "
        "skipped",
        f"{spaced}: a command name cannot contain spaces; skipped",
    ]


def allow_echo(asked: list[str]) -> Callable[[str], bool]:
    def allow(command: str) -> bool:
        asked.append(command)
        return command.startswith(("echo ", "pwd"))

    return allow


async def test_shell_substitutions_run_when_allowed_and_are_refused_otherwise(
    home: Path, repo: Path, cwd: Path
) -> None:
    path = write(
        repo / ".claude/commands/status.md",
        "---\ndescription: Status\n---\n"
        "Branch: !`echo main for $1`\n"
        "Root: !`pwd`\n"
        "Log: !`git log --oneline -3`\n"
        "Look at @src/app.py and the code span `!` here.\n"
        "Task: $ARGUMENTS\n",
    )
    commands = load_commands(cwd, user_dir=None, home=home)
    asked: list[str] = []

    expansion = await commands.expand(
        '/status "PR 7" !`echo injected`',
        allow_shell=allow_echo(asked),
    )

    assert expansion == Expansion(
        "command",
        "status",
        '"PR 7" !`echo injected`',
        "Branch: main for PR 7\n"
        f"Root: {repo}\n"
        "Log: [not run: !`git log --oneline -3` needs permission]\n"
        "Look at @src/app.py and the code span `!` here.\n"
        'Task: "PR 7" !`echo injected`',
        path,
        refused=("git log --oneline -3",),
    )
    # Substitutions typed as arguments are never run, nor even asked about.
    assert asked == ["echo main for PR 7", "pwd", "git log --oneline -3"]


async def test_allow_shell_may_be_async_and_output_is_capped(home: Path, repo: Path) -> None:
    write(
        repo / ".keel/commands/big.md",
        "!`yes | head -c 12000`\n!`echo oops; exit 3`\n!`printf 'no newline'`",
    )
    commands = load_commands(repo, user_dir=None, home=home)

    async def allow(command: str) -> bool:
        return True

    expansion = await commands.expand("/big", allow_shell=allow)
    assert expansion is not None
    assert expansion.text == (
        "y\n" * 5000 + "\n[output cut at 10000 bytes]\noops\n[exit code 3]\nno newline"
    )
    assert (expansion.refused, expansion.timed_out) == ((), ())


async def test_a_substitution_that_runs_too_long_is_stopped(home: Path, repo: Path) -> None:
    write(repo / ".claude/commands/slow.md", "Before !`sleep 5` after")
    commands = load_commands(repo, user_dir=None, home=home)
    expansion = await commands.expand("/slow", allow_shell=lambda c: True, timeout=0.2)
    assert expansion is not None
    assert expansion.text == "Before [timed out: !`sleep 5` did not finish in 0.2 s] after"
    assert expansion.timed_out == ("sleep 5",)


async def test_expand_ignores_prompts_that_name_no_command(home: Path, repo: Path) -> None:
    commands = CommandSet(root=repo)
    assert await commands.expand("/nothing here", allow_shell=lambda c: True) is None
    assert await commands.expand("plain text", allow_shell=lambda c: True) is None


# -- name clashes ------------------------------------------------------------------------------


async def test_builtins_win_over_skills_and_skills_over_commands(home: Path, repo: Path) -> None:
    help_skill = skill_file(repo / ".claude/skills", "help", "description: Project help.")
    hidden_skill = skill_file(
        repo / ".claude/skills",
        "clear",
        "description: Hidden.\ndisable-model-invocation: true",
    )
    deploy_skill = skill_file(repo / ".claude/skills", "deploy", "description: Deploy.")
    deploy_command = write(repo / ".claude/commands/deploy.md", "Deploy (command).\n")
    compact_command = write(repo / ".claude/commands/compact.md", "Compact (command).\n")
    kept = write(repo / ".claude/commands/kept.md", "Kept.\n")

    skills, commands = load_extensions(
        repo, user_dir=None, home=home, builtins=("help", "clear", "compact")
    )

    assert skills.warnings == [
        f"{hidden_skill}: skill clear has the name of a built-in command: /clear runs the "
        "built-in; it is unused",
        f"{help_skill}: skill help has the name of a built-in command: /help runs the built-in; "
        "the model can still use it",
    ]
    assert commands.warnings == [
        f"{compact_command}: command /compact is hidden by the built-in /compact",
        f"{deploy_command}: command /deploy is hidden by the skill in {deploy_skill}",
    ]
    assert list(commands.commands) == ["kept"]
    assert commands.get("kept") == Command(name="kept", body="Kept.", path=kept)
    assert skills.expand("/help") is None
    assert skills.expand("/deploy") is not None
    assert [s.name for s in skills.user_invocable()] == ["deploy"]
    assert "- help: Project help." in skills.index_section()
    ctx = ToolContext(cwd=repo, root=repo)
    output = await skill_tool(skills).run(ctx, {"name": "help"})
    assert output == ToolOutput(f"Base directory for this skill: {help_skill.parent}\n\nDo it.")
