"""Deny rules and the bash constructs that evaluate code held in a variable: a builtin, operator
or expansion that takes a variable name or an array subscript from a value and evaluates it.
With x='a[$(rm victim)]', `[[ -v $x ]]`, `${!x}`, `unset -v "$x"`, `wait -n -p "$x"`,
`RANDOM=$x` or `${s:x}` run `rm victim`; with x='$(rm victim)', `a=([$x]=1)` does (bash expands
that subscript twice).

Each attack is first run by real bash to show that it deletes the victim; then, with a deny rule
`bash(rm *)`, the gate must refuse it in every mode, naming the construct, also through `keel -p`
and `keel serve-tools`. The literal forms, which evaluate nothing, still run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from keel.permissions.gate import Allow, Deny, Mode
from keel.permissions.shell import opaque_reasons
from keel.remote.client import Peer, connect
from tests import nats_fixture
from tests.test_cli import keel, write_script
from tests.test_deny_bypass import bash_results, decide, gate, refusal
from tests.test_remote_tools import ServeTools

nats_server, nats_url = nats_fixture.nats_server, nats_fixture.nats_url

CODE = "a[$(rm victim)]"  # bash runs `rm victim` when it evaluates this as a variable name
SET = f"x='{CODE}'; "


def name(shown: str) -> str:
    return f"bash evaluates a variable name that is not literal ({shown})"


def twice(shown: str) -> str:
    return f"bash expands an array subscript twice ({shown})"


def code(what: str) -> str:
    return f"bash evaluates a variable that may hold a command ({what})"


SUBSCRIPT = code("array subscript in a variable name can run a command")

# (command, why keel refuses it, files the attack needs besides the victim)
ATTACKS: list[tuple[str, str, dict[str, str]]] = [
    # A variable name taken from a value: refused whatever the value.
    (SET + "[[ -v $x ]]", name("[[ -v $x ]]"), {}),
    (SET + '[[ -v "$x" ]]', name("[[ -v $x ]]"), {}),
    (SET + '[[ ! -v "$x" ]]', name("[[ -v $x ]]"), {}),
    (SET + 'test -v "$x"', name("test -v $x"), {}),
    (SET + '[ -v "$x" ]', name("[ -v $x ]"), {}),
    (SET + "echo ${!x}", name("${!x}"), {}),
    (SET + 'echo "${!x:-none}"', name("${!x:-none}"), {}),
    (SET + "echo $(( ${!x} + 1 ))", name("${!x}"), {}),
    (f"set -- '{CODE}'; echo ${{!1}}", name("${!1}"), {}),
    (f"set -- '{CODE}'; echo ${{!@}}", name("${!@}"), {}),
    (SET + 'sleep 0 & wait -n -p "$x"', name("wait -n -p $x"), {}),
    (SET + 'sleep 0 & wait -p "$x" $!', name("wait -p $x $!"), {}),
    ("a=(1); " + SET + 'unset -v "$x"', name("unset -v $x"), {}),
    ("a=(1); " + SET + 'unset "$x"', name("unset $x"), {}),
    # A compound assignment expands its subscripts twice: `$(…)` in the value runs.
    ("x='$(rm victim)'; a=([$x]=1)", twice("a=([$x]=1)"), {}),
    ("x='$(rm victim)'; a=([\"$x\"]=1 2)", twice("a=([$x]=1 2)"), {}),
    ("x='$(rm victim)'; declare -a a=([$x]=1)", twice("a=([$x]=1)"), {}),
    ("x='$(rm victim)'; a+=([$x]=1)", twice("a+=([$x]=1)"), {}),
    ("a=(['$(rm victim)']=1)", twice("a=(['$(rm victim)']=1)"), {}),
    # Arithmetic on a value, refused when the line holds code as data.
    (SET + "s=abc; echo ${s:x}", code("arithmetic on variables (${s:x})"), {}),
    (SET + "s=abc; echo ${s:0:$x}", code("arithmetic on variables (${s:0:$x})"), {}),
    (SET + "set -- a b; echo ${@:$x}", code("arithmetic on variables (${@:$x})"), {}),
    (SET + "a=(1); echo ${#a[x]}", code("arithmetic on variables (${#a[x]})"), {}),
    (SET + "RANDOM=$x", code("arithmetic on variables (RANDOM=$x)"), {}),
    (SET + "OPTIND=$x; getopts a o -a", code("arithmetic on variables (OPTIND=$x)"), {}),
    (SET + 'declare SRANDOM="$x"', code("arithmetic on variables (SRANDOM=$x)"), {}),
    (SET + 'printf -v RANDOM %s "$x"', code("arithmetic on variables (printf RANDOM)"), {}),
    (SET + 'for OPTIND in "$x"; do :; done', code("arithmetic on variables (for OPTIND)"), {}),
    (f"read RANDOM <<< '{CODE}'", code("arithmetic on variables (read RANDOM)"), {}),
    (SET + "i=$x; exec {a[i]}>/dev/null", code("arithmetic on variables ({a[i]})"), {}),
    # A literal name whose subscript reads a variable.
    ("a=(1); " + SET + "unset 'a[x]'", SUBSCRIPT, {}),
    (SET + "test -v 'a[x]'", SUBSCRIPT, {}),
    (SET + "[[ -v a[x] ]]", SUBSCRIPT, {}),
    (SET + "read 'a[x]' <<< 1", SUBSCRIPT, {}),
    (SET + "printf -v 'a[x]' 1", SUBSCRIPT, {}),
    (SET + "sleep 0 & wait -p 'a[x]' $!", SUBSCRIPT, {}),
    # A word that is not literal where an option naming a variable may stand.
    (
        f"x='-v{CODE}'; printf \"$x\" 1",
        code("a word that is not literal may name a variable (printf $x 1)"),
        {},
    ),
    (
        f"x='-p{CODE}'; sleep 0 & wait \"$x\" $!",
        code("a word that is not literal may name a variable (wait $x $!)"),
        {},
    ),
    (
        SET + 'o=-v; [ "$o" "$x" ]',
        code("a word that is not literal may name a variable ([ $o $x ])"),
        {},
    ),
    # Code built at run time, which the line does not show as `$(`: still code as data.
    ("d='$'; x=\"a[${d}(rm victim)]\"; echo $((x))", code("arithmetic on variables ($((x)))"), {}),
    ('x="a[${u:-$}(rm victim)]"; echo $((x))', code("arithmetic on variables ($((x)))"), {}),
    (
        "x=${u:-'a[$(rm victim)]'}; echo $((x))",
        code("arithmetic on variables ($((x)))"),
        {},
    ),
    (
        'x="a[${BASH_COMMAND:5:1}(rm victim)]"; echo $((x))',
        code("arithmetic on variables ($((x)))"),
        {},
    ),
    (
        "n=$'\\n'; q=${n@Q}; x=\"a[${q:0:1}(rm victim)]\"; echo $((x))",
        code("arithmetic on variables ($((x)))"),
        {},
    ),
    (
        "e='\\x24'; x=\"a[${e@E}(rm victim)]\"; echo $((x))",
        code("arithmetic on variables ($((x)))"),
        {},
    ),
    # A file name, and a line read by `select`, can hold the code too.
    ("for f in a*; do : $((f)); done", code("arithmetic on variables ($((f)))"), {CODE: ""}),
    (
        "select v in a; do : $((REPLY)); break; done < f",
        code("arithmetic on variables ($((REPLY)))"),
        {"f": CODE + "\n"},
    ),
]
IDS = [repr(c)[:60] for c, _, _ in ATTACKS]

# The code held in the environment keel runs with, not in the line.
ENVIRONMENT = {"X": CODE, "Y": "$(rm victim)"}
ENV_ATTACKS: list[tuple[str, str]] = [
    ("[[ -v $X ]]", name("[[ -v $X ]]")),
    ('test -v "$X"', name("test -v $X")),
    ('[ -v "$X" ]', name("[ -v $X ]")),
    ("echo ${!X}", name("${!X}")),
    ('a=(1); unset -v "$X"', name("unset -v $X")),
    ('sleep 0 & wait -n -p "$X"', name("wait -n -p $X")),
    ("a=([$Y]=1)", twice("a=([$Y]=1)")),
]

# Bash runs the code in these; the deny rule itself sees it (keel follows the word list).
FOLLOWED = ["compgen -W '$(rm victim)' z", "x=1; compgen -W '$x $(rm victim)' z"]

# Literal names and the forms that evaluate nothing: bash keeps the victim, keel runs them.
SAFE = [
    SET + "[[ -v x ]]",
    SET + "[[ -v HOME ]] && test -v PATH && [ -v x ]",
    SET + "unset -v y; unset x",
    SET + 'unset -f "$x"',
    "a=([k]=1); declare -A m=([k]=1)",
    SET + "a=(1); a=([${#a[@]}]=2 [$#]=3)",
    SET + "echo ${!x*} ${!BASH@} ${!a[@]} ${!a[*]} ${!#}",
    SET + "echo ${#x} ${x:0:1} ${x: -1} ${x:-d} ${x:+y}",
    SET + 'printf "%s\\n" "$x"; printf -- "$x"; printf -v y %s "$x"',
    SET + '[ "$x" = y ]; [ -n "$x" ]; [ "$x" ]; [ "$x" -eq 1 ]; test "$x" != -v',
    SET + 'shift "$x"; printf "%d" "$x"; exit "$x"',
    SET + "wait; wait $!; wait -n",
    SET + "echo ${x@Q} ${x@U}",
    SET + 'for f in *.txt; do wc -l "$f"; done',
    "for ((i = 0; i < 3; i++)); do echo $((i + 1)) ${a[i]}; done",
    "[[ $# -gt 0 ]] && echo $((x * 2))",
]


def with_victim(tmp_path: Path, files: dict[str, str]) -> None:
    (tmp_path / "victim").write_text("keep me\n", encoding="utf-8")
    for file, text in files.items():
        (tmp_path / file).write_text(text, encoding="utf-8")


def run_bash(tmp_path: Path, command: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        ["bash", "-c", command],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )


# -- the attacks are real ----------------------------------------------------------------------


@pytest.mark.parametrize(("command", "why", "files"), ATTACKS, ids=IDS)
def test_each_attack_really_deletes_the_victim_in_bash(
    tmp_path: Path, command: str, why: str, files: dict[str, str]
) -> None:
    with_victim(tmp_path, files)
    run_bash(tmp_path, command)
    assert not (tmp_path / "victim").exists(), command


@pytest.mark.parametrize(("command", "why"), ENV_ATTACKS, ids=[c for c, _ in ENV_ATTACKS])
def test_code_held_in_the_environment_really_deletes_the_victim(
    tmp_path: Path, command: str, why: str
) -> None:
    with_victim(tmp_path, {})
    run_bash(tmp_path, command, ENVIRONMENT)
    assert not (tmp_path / "victim").exists(), command


@pytest.mark.parametrize("command", FOLLOWED)
def test_the_followed_lines_really_delete_the_victim(tmp_path: Path, command: str) -> None:
    with_victim(tmp_path, {})
    run_bash(tmp_path, command)
    assert not (tmp_path / "victim").exists(), command


@pytest.mark.parametrize("command", SAFE, ids=[repr(c)[:60] for c in SAFE])
def test_the_literal_forms_evaluate_nothing_in_bash(tmp_path: Path, command: str) -> None:
    with_victim(tmp_path, {"a.txt": "a\n"})
    run_bash(tmp_path, command, ENVIRONMENT)
    assert (tmp_path / "victim").exists(), command


# -- the gate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
@pytest.mark.parametrize("mode", ["default", "accept-edits", "plan", "bypass"])
@pytest.mark.parametrize(("command", "why", "files"), ATTACKS, ids=IDS)
async def test_a_deny_rule_for_bash_refuses_them(
    project: Path, command: str, why: str, files: dict[str, str], mode: Mode, sandboxed: bool
) -> None:
    g = gate(project, mode, ["deny:bash(rm *)"], sandboxed=sandboxed)
    assert await decide(g, command) == refusal(why)
    assert g.would_allow("bash", {"command": command}) is False


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
@pytest.mark.parametrize("mode", ["default", "bypass"])
@pytest.mark.parametrize(("command", "why"), ENV_ATTACKS, ids=[c for c, _ in ENV_ATTACKS])
async def test_a_deny_rule_refuses_them_with_the_code_in_the_environment(
    project: Path, command: str, why: str, mode: Mode, sandboxed: bool
) -> None:
    g = gate(project, mode, ["deny:bash(rm *)"], sandboxed=sandboxed)
    assert await decide(g, command) == refusal(why)


@pytest.mark.parametrize("command", FOLLOWED)
async def test_the_deny_rule_reads_the_word_list_compgen_expands(
    project: Path, command: str
) -> None:
    g = gate(project, "bypass", ["deny:bash(rm *)"], sandboxed=True)
    assert await decide(g, command) == Deny("denied by rule bash(rm *) (test)", "rule")


@pytest.mark.parametrize(("command", "why", "files"), ATTACKS, ids=IDS)
async def test_without_a_deny_rule_for_bash_bypass_still_runs_them(
    project: Path, command: str, why: str, files: dict[str, str]
) -> None:
    g = gate(project, "bypass", ["deny:read(secrets/**)", "bash(git *)"], sandboxed=False)
    assert await decide(g, command) == Allow("mode:bypass")


@pytest.mark.parametrize("command", SAFE, ids=[repr(c)[:60] for c in SAFE])
async def test_the_literal_forms_still_run_with_a_deny_rule(project: Path, command: str) -> None:
    assert opaque_reasons(command) == ()
    sandboxed = gate(project, "default", ["deny:bash(rm *)"], sandboxed=True)
    assert await decide(sandboxed, command) == Allow("sandbox")
    bypass = gate(project, "bypass", ["deny:bash(rm *)"], sandboxed=False)
    assert await decide(bypass, command) == Allow("mode:bypass")


# -- end to end: `keel -p` with a scripted model, real bash, real files -----------------------

E2E = [
    ("x='a[$(rm victim1)]'; [[ -v $x ]]", name("[[ -v $x ]]")),
    ("x='a[$(rm victim2)]'; echo ${!x}", name("${!x}")),
    ("a=(1); x='a[$(rm victim3)]'; unset -v \"$x\"", name("unset -v $x")),
    ("x='a[$(rm victim4)]'; sleep 0 & wait -n -p \"$x\"", name("wait -n -p $x")),
    ("x='$(rm victim5)'; a=([$x]=1)", twice("a=([$x]=1)")),
    ('test -v "$X"', name("test -v $X")),  # X='a[$(rm victim6)]' in keel's environment
]
VICTIMS = [f"victim{n}" for n in range(1, len(E2E) + 1)]


def run_keel_p(
    project: Path, tmp_path: Path, *extra: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    for victim in VICTIMS:
        (project / victim).write_text("keep me\n", encoding="utf-8")
    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [{"name": "bash", "input": {"command": c}}]} for c, _ in E2E
    ]
    turns.append({"text": "done"})
    script = write_script(tmp_path / "attack.json", turns)
    env = {**env, "X": "a[$(rm victim6)]"}
    return keel(
        "-p", "clean up", "--model", f"scripted:{script}", "--mode", "bypass", *extra,
        cwd=project, env=env,
    )  # fmt: skip


def victims_left(project: Path) -> list[str]:
    return sorted(p.name for p in project.iterdir() if p.name.startswith("victim"))


@pytest.mark.parametrize(
    "sandboxed",
    [
        pytest.param(True, marks=pytest.mark.needs("sandbox"), id="sandboxed"),
        pytest.param(False, id="unsandboxed"),
    ],
)
def test_keel_p_refuses_them_and_the_victims_survive(
    project: Path, tmp_path: Path, isolated_env: Path, sandboxed: bool
) -> None:
    env = {} if sandboxed else {"KEEL_NO_SANDBOX": "1"}
    out = run_keel_p(project, tmp_path, "--disallowed-tools", "bash(rm *)", env=env)
    assert out.returncode == 0, out.stderr
    rule = "deny rule bash(rm *) (--disallowed-tools)"
    assert bash_results(isolated_env) == [refusal(why, rule).reason for _, why in E2E]
    assert victims_left(project) == VICTIMS


def test_keel_p_without_the_deny_rule_runs_them(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """The control: the same run with no deny rule deletes every victim."""
    out = run_keel_p(project, tmp_path, env={"KEEL_NO_SANDBOX": "1"})
    assert out.returncode == 0, out.stderr
    assert len(bash_results(isolated_env)) == len(E2E)
    assert victims_left(project) == []


# -- end to end: `keel serve-tools` over NATS -----------------------------------------------------


@pytest.mark.needs("nats-server")
async def test_serve_tools_refuses_them_and_the_victim_survives(
    nats_url: str, tmp_path: Path
) -> None:
    """The serving project's deny rule refuses the line a remote caller sends; the same call to
    a project without the rule deletes its victim (the control)."""
    guarded, open_ = tmp_path / "guarded", tmp_path / "open"
    for root in (guarded, open_):
        root.mkdir()
        (root / "victim").write_text("keep me\n", encoding="utf-8")
    (guarded / ".keel").mkdir()
    shared = guarded / ".keel" / "settings.json"
    shared.write_text(json.dumps({"permissions": {"deny": ["bash(rm *)"]}}), encoding="utf-8")
    servers = [
        ServeTools(nats_url, root, tmp_path / f"home-{who}", who, "--tools", "bash", allow=["bash"])
        for root, who in ((guarded, "guarded"), (open_, "open"))
    ]
    command = SET + '[[ -v "$x" ]]'
    nc = await connect(nats_url)
    try:
        args = {"command": command, "sandbox": False}
        refused = await Peer(nc, "guarded", timeout=10).call("bash", args)
        ran = await Peer(nc, "open", timeout=10).call("bash", args)
    finally:
        await nc.close()
        for server in servers:
            server.stop()
    why = refusal(name("[[ -v $x ]]"), f"deny rule bash(rm *) ({shared})").reason
    assert (refused.is_error, refused.content) == (True, f"refused by the serving agent: {why}")
    assert (guarded / "victim").exists()
    # It ran (the test itself is false: exit 1, a failed call) and took the victim with it.
    assert (ran.is_error, ran.content) == (True, "[exit code 1]")
    assert not (open_ / "victim").exists()
