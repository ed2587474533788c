"""Deny rules fail closed: with a deny rule for bash, a line whose programs keel cannot tell
without running it is refused, in every mode, sandboxed or not, and through `keel -p`.

Each attack below is first run by real bash to show it really deletes the file a `bash(rm *)`
rule protects; then the gate must refuse it. Lines with no deny rule for bash keep the decision
they had before (the sandbox or bypass lets them run)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from keel.permissions.gate import Allow, Deny, Mode, PermissionGate
from keel.permissions.rules import parse_rule
from keel.session.journal import read_records
from keel.session.records import AssistantRecord, ToolResultRecord
from tests.test_cli import keel, session_files, write_script

needs_bwrap = pytest.mark.needs("sandbox")

RULE = "deny rule bash(rm *) (test)"
HINT = (
    "write the command plainly (literal program names and arguments: no variables, "
    "substitutions, eval, sourced scripts or pipes into a shell)"
)


def refusal(why: str, rules: str = RULE) -> Deny:
    return Deny(
        f"refused: {why}, so keel cannot tell whether {rules} would match what runs; {HINT}", "rule"
    )


def gate(project: Path, mode: Mode, rules: list[str], *, sandboxed: bool) -> PermissionGate:
    parsed = [
        parse_rule(r.removeprefix("deny:"), "deny" if r.startswith("deny:") else "allow", "test")
        for r in rules
    ]
    return PermissionGate(mode, project, project, parsed, sandboxed=sandboxed)


async def decide(g: PermissionGate, command: str) -> Allow | Deny:
    from keel.llm.messages import ToolUse

    return await g.authorize(ToolUse("id-bash", "bash", {"command": command}), read_only=False)


# (command, why keel refuses it, files the attack needs besides the victim `x`)
ATTACKS: list[tuple[str, str, dict[str, str]]] = [
    ("$(echo rm) x", "the program name is not literal ($(echo rm))", {}),
    ("`echo rm` x", "the program name is not literal (`echo rm`)", {}),
    ("echo 'rm x' | sh", "sh reads its commands from standard input", {}),
    ("echo 'rm x' | bash -s", "bash reads its commands from standard input", {}),
    ("X=rm; $X x", "the program name is not literal ($X)", {}),
    ("a=r; b=m; $a$b x", "the program name is not literal ($a$b)", {}),
    ("rm${IFS}x", "the program name is not literal (rm${IFS}x)", {}),
    (
        ". ./script",
        ". runs a script, which deny rules cannot read (. ./script)",
        {"script": "rm x\n"},
    ),
    (
        "source s.sh",
        "source runs a script, which deny rules cannot read (source s.sh)",
        {"s.sh": "rm x\n"},
    ),
    (
        "builtin . ./script",
        ". runs a script, which deny rules cannot read (. ./script)",
        {"script": "rm x\n"},
    ),
    ('c=rm; eval "$c x"', "the command string is not literal (eval $c' x')", {}),
    ("eval $(echo rm) x", "the command string is not literal (eval $(echo rm) x)", {}),
    ("exec $(echo rm) x", "cannot tell what exec runs ($(echo rm))", {}),
    ("sh < script", "sh reads its commands from standard input", {"script": "rm x\n"}),
    ('bash <<< "$(echo rm) x"', "the command string is not literal (bash <<< $(echo rm)' x')", {}),
    ("bash /dev/stdin <<< 'rm x'", "bash reads its commands from /dev/stdin", {}),
    ("bash <(echo rm x)", "cannot tell what bash runs (<(echo rm x))", {}),
    ("c=rm bash <<EOF\n\\$c x\nEOF", "a shell reads a here-document with expansions", {}),
    ("echo 'rm x' > s.sh; sh s.sh", "runs the script s.sh, a file the line writes", {}),
    ("echo 'rm x' > s && chmod +x s && ./s", "runs ./s, a file the line writes", {}),
    ("cp /bin/rm r; ./r x", "runs ./r, a file the line writes", {}),
    ('d=.; cp /bin/rm "$d/r"; "$d/r" x', "runs $d/r, a file the line writes", {}),
    ("ln -s /bin/rm r && ./r x", "runs ./r, a file the line writes", {}),
    ("v='rm x'; bash -c \"$v\"", "the command string is not literal (bash -c $v)", {}),
    ("bash -c '$0 x' rm", "the program name is not literal ($0)", {}),
    ("echo rm x | xargs env", "env takes the program from words the line does not show", {}),
    ("echo rm x | xargs nice", "nice takes the program from words the line does not show", {}),
    (
        "printf 'rm x' | xargs -0 bash -c",
        "bash takes its commands from words the line does not show",
        {},
    ),
    ("echo rm x | xargs sh -c '\"$@\"' _", "the program name is not literal ($@)", {}),
    ("echo rm | xargs -I{} sh -c '{} x'", "xargs fills in the program ({})", {}),
    ("c=rm; find . -name x -exec $c {} +", "cannot tell what find runs ($c)", {}),
    (
        "find . -name s -exec sh {} \\;",
        "sh runs a script whose name is not literal ({})",
        {"s": "rm x\n"},
    ),
    ("o='-exec rm {} +'; find . -name x $o", "cannot tell what find runs ($o)", {}),
    ('f(){ "$@"; }; f rm x', "the program name is not literal ($@)", {}),
    ("c=rm; command $c x", "cannot tell what command runs ($c)", {}),
    ("c=rm; env $c x", "cannot tell what env runs ($c)", {}),
    ("timeout 5${IFS}rm x", "cannot tell what timeout runs (5${IFS}rm)", {}),
    ('o=--foreground; timeout "$o" 5 rm x', "cannot tell what timeout runs ($o)", {}),
    ("hash -p /bin/rm ls; ls x", "hash -p changes which program a name runs", {}),
    ("BASH_CMDS[ls]=/bin/rm; ls x", "sets BASH_CMDS, which decides which program runs", {}),
    ("ln -s /bin/rm ls; PATH=.:$PATH ls x", "sets PATH, which decides which program runs", {}),
    (
        "x='a[$(rm x)]'; echo $((x))",
        "bash evaluates a variable that may hold a command (arithmetic on variables ($((x))))",
        {},
    ),
    (
        "v='$(rm x)'; echo ${v@P}",
        "bash evaluates a variable that may hold a command (prompt expansion ${…@P})",
        {},
    ),
    ("/???/r[m] x", "the program name is not literal (/???/r[m])", {}),
    ('trap "$(echo rm) x" EXIT', "the command string is not literal (trap $(echo rm)' x')", {}),
    ("strace -o /dev/null rm x", "strace runs a program that keel does not follow", {}),
    ("mapfile -C 'rm x #' -c 1 a <<< y", "mapfile -C runs a command for each line", {}),
    ("compgen -C 'rm x' z", "compgen -C/-F runs a command or a function", {}),
    (
        "x=$(printf 'a[\\x24(rm x)]'); echo $((x))",
        "bash evaluates a variable that may hold a command (arithmetic on variables ($((x))))",
        {},
    ),
    ("v=PATH=.; ln -s /bin/rm ls; export $v; ls x", "cannot tell what export sets ($v)", {}),
    ("env 'BASH_FUNC_ls%%=() { rm \"$@\"; }' bash -c 'ls x'", "env sets BASH_FUNC_ls%%", {}),
    (
        "shopt -s expand_aliases; a=r=rm; alias $a\nr x",
        "defines an alias (alias $a)",
        {},
    ),
]
IDS = [repr(c)[:50] for c, _, _ in ATTACKS]

# Plain spellings of `rm x`: the deny rule itself sees through them.
PLAIN = [
    "rm x",
    "r\\m x",
    '"r"m x',
    "\\rm x",
    "/bin/rm x",
    "$'\\x72m' x",
    "/???/rm x",
    'd=/bin; "$d/rm" x',
    "command rm x",
    "env rm x",
    "nice -n 5 rm x",
    "timeout 5 rm x",
    "echo x | xargs rm",
    "find . -name x -exec rm {} +",
    "bash -c 'rm x'",
    "eval 'rm x'",
    "bash <<'EOF'\nrm x\nEOF",
    "sh <<< 'rm x'",
    "shopt -s expand_aliases\nalias r=rm\nr x",
    'f(){ rm "$@"; }; f x',
]

# Lines that name their programs plainly: a deny rule for bash does not stop them.
UNAFFECTED = [
    "git status",
    "ls -la | grep x | wc -l",
    'echo $HOME "$PWD"',
    'for f in *.py; do wc -l "$f"; done',
    "for ((i = 0; i < 3; i++)); do echo $i; done",
    "cat <<EOF | wc -l\n$HOME\nEOF",
    "bash -c 'echo hi'",
    "sh scripts/test.sh",
    "eval 'echo hi'",
    "find . -name '*.py' -print",
    'find "./$d" -name "$n"',
    "printf '%s\\n' a b | xargs -0 wc -l",
    "timeout 5 make test",
    '"$HOME/.local/bin/tool" --help',
    "make test > log.txt 2>&1",
    "x=$(git rev-parse HEAD); echo $x",
]


@pytest.mark.parametrize(("command", "why", "files"), ATTACKS, ids=IDS)
def test_each_attack_really_deletes_the_file_in_bash(
    tmp_path: Path, command: str, why: str, files: dict[str, str]
) -> None:
    """The attacks are real: bash runs `rm x` for every one of them."""
    if command.startswith("strace") and shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    (tmp_path / "x").write_text("keep me\n", encoding="utf-8")
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, capture_output=True, timeout=30, check=False
    )
    assert not (tmp_path / "x").exists(), command


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
@pytest.mark.parametrize("mode", ["default", "accept-edits", "plan", "bypass"])
@pytest.mark.parametrize(("command", "why", "files"), ATTACKS, ids=IDS)
async def test_a_deny_rule_for_bash_refuses_what_it_cannot_read(
    project: Path, command: str, why: str, files: dict[str, str], mode: Mode, sandboxed: bool
) -> None:
    g = gate(project, mode, ["deny:bash(rm *)"], sandboxed=sandboxed)
    assert await decide(g, command) == refusal(why)
    assert g.would_allow("bash", {"command": command}) is False


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
@pytest.mark.parametrize("mode", ["default", "accept-edits", "bypass"])
@pytest.mark.parametrize(("command", "why", "files"), ATTACKS, ids=IDS)
async def test_without_a_deny_rule_for_bash_the_decision_is_unchanged(
    project: Path, command: str, why: str, files: dict[str, str], mode: Mode, sandboxed: bool
) -> None:
    """Deny rules for other tools and allow rules for bash do not switch the check on."""
    plain = gate(project, mode, [], sandboxed=sandboxed)
    other = gate(
        project,
        mode,
        ["deny:read(secrets/**)", "deny:web_fetch", "bash(git *)"],
        sandboxed=sandboxed,
    )
    expected = await decide(plain, command)
    assert await decide(other, command) == expected
    if mode == "bypass":
        assert expected == Allow("mode:bypass")
    elif sandboxed:
        assert expected == Allow("sandbox")
    else:
        assert isinstance(expected, Deny)
        assert expected.source == "headless"


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
@pytest.mark.parametrize("mode", ["default", "bypass"])
@pytest.mark.parametrize("command", PLAIN, ids=[repr(c)[:50] for c in PLAIN])
async def test_plain_spellings_are_denied_by_the_rule_itself(
    project: Path, command: str, mode: Mode, sandboxed: bool
) -> None:
    g = gate(project, mode, ["deny:bash(rm *)"], sandboxed=sandboxed)
    assert await decide(g, command) == Deny("denied by rule bash(rm *) (test)", "rule")


@pytest.mark.parametrize("command", UNAFFECTED, ids=[repr(c)[:50] for c in UNAFFECTED])
async def test_plain_lines_still_run_with_a_deny_rule(project: Path, command: str) -> None:
    sandboxed = gate(project, "default", ["deny:bash(rm *)"], sandboxed=True)
    assert await decide(sandboxed, command) == Allow("sandbox")
    bypass = gate(project, "bypass", ["deny:bash(rm *)"], sandboxed=False)
    assert await decide(bypass, command) == Allow("mode:bypass")


async def test_the_refusal_names_every_deny_rule_for_bash(project: Path) -> None:
    g = gate(
        project,
        "bypass",
        ["deny:bash(rm *)", "deny:read(.env)", "deny:bash(git push *)"],
        sandboxed=True,
    )
    assert await decide(g, "$(echo rm) x") == refusal(
        "the program name is not literal ($(echo rm))",
        "deny rules bash(rm *) (test), bash(git push *) (test)",
    )


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("s=push; git $s origin", "the words of `git $s origin` are not literal"),
        ("echo push | xargs git", "the words of `git` are not literal"),
        ("git $opt push", "the words of `git $opt push` are not literal"),
        ('git commit -m "$msg"', None),
        ('git log --format="$f"', None),
        ("echo $x | xargs wc -l", None),
    ],
)
async def test_words_a_pattern_looks_at_must_be_literal(
    project: Path, command: str, expected: str | None
) -> None:
    """A deny rule on a subcommand cannot read `git $sub`: refused. Unknown words elsewhere are
    fine (`git commit -m "$msg"` can never be `git push`)."""
    g = gate(project, "bypass", ["deny:bash(git push *)"], sandboxed=True)
    want = (
        Allow("mode:bypass")
        if expected is None
        else refusal(expected, "deny rule bash(git push *) (test)")
    )
    assert await decide(g, command) == want


async def test_a_bare_bash_deny_rule_denies_everything_as_before(project: Path) -> None:
    g = gate(project, "bypass", ["deny:bash"], sandboxed=True)
    assert await decide(g, "$(echo rm) x") == Deny("denied by rule bash (test)", "rule")
    assert await decide(g, "git status") == Deny("denied by rule bash (test)", "rule")


# -- end to end: `keel -p` with a scripted model, real bash, real files -----------------------

E2E = [
    ("$(echo rm) victim1", "the program name is not literal ($(echo rm))"),
    ("echo 'rm victim2' | sh", "sh reads its commands from standard input"),
    ("X=rm; $X victim3", "the program name is not literal ($X)"),
    ("rm${IFS}victim4", "the program name is not literal (rm${IFS}victim4)"),
    (". ./script", ". runs a script, which deny rules cannot read (. ./script)"),
]
VICTIMS = ["victim1", "victim2", "victim3", "victim4", "victim5"]


def bash_results(home: Path) -> list[str]:
    path = max(session_files(home), key=lambda p: p.stat().st_mtime_ns)
    names: dict[str, str] = {}
    results: list[str] = []
    for record in read_records(path).records:
        payload = record.payload
        if isinstance(payload, AssistantRecord):
            names.update((c.id, c.name) for c in payload.message.tool_uses)
        elif isinstance(payload, ToolResultRecord) and names[payload.result.tool_use_id] == "bash":
            results.append(payload.result.text)
    return results


def run_attacks(
    project: Path, tmp_path: Path, *extra: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    for name in VICTIMS:
        (project / name).write_text("keep me\n", encoding="utf-8")
    (project / "script").write_text("rm victim5\n", encoding="utf-8")
    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [{"name": "bash", "input": {"command": c}}]} for c, _ in E2E
    ]
    turns.append({"text": "done"})
    script = write_script(tmp_path / "attack.json", turns)
    return keel(
        "-p", "clean up", "--model", f"scripted:{script}", "--mode", "bypass", *extra,
        cwd=project, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    "sandboxed",
    [pytest.param(True, marks=needs_bwrap, id="sandboxed"), pytest.param(False, id="unsandboxed")],
)
def test_keel_p_refuses_the_attacks_and_the_files_survive(
    project: Path, tmp_path: Path, isolated_env: Path, sandboxed: bool
) -> None:
    env = {} if sandboxed else {"KEEL_NO_SANDBOX": "1"}
    out = run_attacks(project, tmp_path, "--disallowed-tools", "bash(rm *)", env=env)
    assert out.returncode == 0, out.stderr
    rule = "deny rule bash(rm *) (--disallowed-tools)"
    assert bash_results(isolated_env) == [refusal(why, rule).reason for _, why in E2E]
    assert sorted(p.name for p in project.iterdir() if p.name.startswith("victim")) == VICTIMS


@pytest.mark.parametrize(
    "sandboxed",
    [pytest.param(True, marks=needs_bwrap, id="sandboxed"), pytest.param(False, id="unsandboxed")],
)
def test_keel_p_without_the_deny_rule_runs_them(
    project: Path, tmp_path: Path, isolated_env: Path, sandboxed: bool
) -> None:
    """The control: the same run with no deny rule deletes every victim (the attacks work)."""
    env = {} if sandboxed else {"KEEL_NO_SANDBOX": "1"}
    out = run_attacks(project, tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert bash_results(isolated_env) == ["[exit code 0]"] * len(E2E)
    assert [p.name for p in project.iterdir() if p.name.startswith("victim")] == []


def test_deny_rules_from_settings_refuse_too(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """A deny rule in the shared project file (which may only tighten) switches the check on."""
    (project / ".keel").mkdir()
    shared = project / ".keel" / "settings.json"
    shared.write_text(json.dumps({"permissions": {"deny": ["bash(rm *)"]}}), encoding="utf-8")
    out = run_attacks(project, tmp_path, env={"KEEL_NO_SANDBOX": "1"})
    assert out.returncode == 0, out.stderr
    rule = f"deny rule bash(rm *) ({shared})"
    assert bash_results(isolated_env) == [refusal(why, rule).reason for _, why in E2E]
    assert sorted(p.name for p in project.iterdir() if p.name.startswith("victim")) == VICTIMS
