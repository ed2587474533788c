"""The bash analysis behind `bash(...)` permission rules: normalisation, the bypasses an allow
rule must refuse and a deny rule must catch, pattern matching, the safe list, suggestions.

Cases marked "bash 5.2" were checked against bash itself while writing the parser."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from keel.permissions import shell
from keel.permissions.shell import (
    CommandAnalysis,
    analyze,
    is_read_only,
    match_prefix,
    opaque_reasons,
    rule_allows,
    rule_denies,
    suggest_rule,
    suggest_rules,
    unreadable_arguments,
)

SUB = "command substitution $(…)"
VARIABLE_SUBSCRIPT = "array subscript in a variable name can run a command"
BACKQUOTE = "command substitution `…`"


def case(command: str, *commands: str, approval: tuple[str, ...] = (), error: str | None = None):
    return pytest.param(command, CommandAnalysis(commands, approval, error), id=repr(command)[:60])


# -- normalisation -----------------------------------------------------------------------------

NORMALISATION = [
    case(
        'FOO=1 git   commit -m "a b" 2>&1',
        "git commit -m 'a b'",
        approval=("sets environment variable FOO",),
    ),
    case("CI=1 NODE_ENV=test npm test", "npm test"),
    case("lower=1 npm test", "npm test"),
    case("""git commit -m "it's" """, """git commit -m 'it'"'"'s'"""),
    case('echo a\\ b "a b" a" "b \'a b\'', "echo 'a b' 'a b' 'a b' 'a b'"),
    case("echo 'a  b'   c", "echo 'a  b' c"),
    case("echo '' \"\"", "echo '' ''"),
    case("ls '*.py' *.py ~/x ~\"/a b\"", "ls '*.py' *.py ~/x ~'/a b'"),
    case('echo $HOME "${HOME}/x" "$x"y "$x".txt', "echo $HOME ${HOME}/x ${x}y $x.txt"),
    case('printf "%s\\n" x', "printf '%s\\n' x"),
    case("echo 'a\nb'", "echo 'a\nb'"),
    case("\\rm x", "rm x"),
    case("r''m x", "rm x"),
    case('"r"m x', "rm x"),
    case("$'\\x72\\u006d' $'\\162m' $\"rm\" r$'m'", "rm rm rm rm"),
    case("rm x\\\n  -rf", "rm x -rf"),
    case("r\\\nm x", "rm x"),
    case("echo a#b", "echo a#b"),
    case("git status # ; rm x", "git status"),
    case("git status;#rm x", "git status"),
    case("echo $# $? $$ ${#a[@]}", "echo $# $? $$ ${#a[@]}"),
    case('declare -a arr=(1 "a b")', "declare -a arr=(1 'a b')"),
    case(""),
    case("# only a comment"),
    case("x=1"),
    case("X=1", approval=("sets environment variable X",)),
]


@pytest.mark.parametrize(("command", "expected"), NORMALISATION)
def test_normalisation(command: str, expected: CommandAnalysis) -> None:
    assert analyze(command) == expected


# -- structure: every simple command is found ----------------------------------------------------

STRUCTURE = [
    case("git status; rm -rf /", "git status", "rm -rf /"),
    case("a && b || c | d |& e & f", "a", "b", "c", "d", "e", "f"),
    case("a\nb\n\nc", "a", "b", "c"),
    case("(a; (b)) && { c; }", "a", "b", "c"),
    case("if a; then b; elif c; then d; else e; fi", "a", "b", "c", "d", "e"),
    case("while a; do b; done; until c; do d; done", "a", "b", "c", "d"),
    case("for f in *; do rm $f; done", "rm $f"),
    case("for f in $(ls); do rm $f; done", "ls", "rm $f", approval=(SUB,)),
    case("select x in a b; do rm $x; done", "rm $x"),
    case("case $1 in (a) b;; c|d) e;& *) f;;& esac", "b", "e", "f"),
    case("case x in\n  a) rm y ;;\nesac", "rm y"),
    case("f() { rm x; }; f", "rm x", "f"),
    case("function g { rm y; }", "rm y"),
    case("f() (rm x)", "rm x"),
    case("! rm x", "rm x"),
    case("time -p rm x", "rm x"),
    case("coproc rm x", "rm x"),
    case("coproc NAME { rm x; }", "rm x"),
    case("[[ -f x && $y == z ]] && rm x", "rm x"),
    case("[[ a < b ]]"),
    case("((1 + 2)) && rm x", "rm x"),
    case("((a) | b)", "a", "b"),
    case(
        "$((echo a); echo b)",
        "echo a",
        "echo b",
        "$((echo a); echo b)",
        approval=(SUB, "command name is not literal ($((echo a); echo b))"),
    ),
    case("a=(1 $(rm x)) b=2", "rm x", approval=(SUB,)),
]


@pytest.mark.parametrize(("command", "expected"), STRUCTURE)
def test_structure(command: str, expected: CommandAnalysis) -> None:
    assert analyze(command) == expected


# -- substitutions, here-documents, redirections -----------------------------------------------

EXPANSIONS = [
    case("$(rm x)", "rm x", "$(rm x)", approval=(SUB, "command name is not literal ($(rm x))")),
    case("`rm x`", "rm x", "`rm x`", approval=(BACKQUOTE, "command name is not literal (`rm x`)")),
    case("git status $(rm x)", "rm x", "git status $(rm x)", approval=(SUB,)),
    case('echo "$(rm x)"', "rm x", "echo $(rm x)", approval=(SUB,)),
    case("echo '$(rm x)' '`rm y`'", "echo '$(rm x)' '`rm y`'"),
    case("echo ${x:-$(rm y)}", "rm y", "echo ${x:-$(rm y)}", approval=(SUB,)),
    # The substitution's output is evaluated as arithmetic too.
    case(
        "echo $(( $(rm y) + 1 ))",
        "rm y",
        "echo $(( $(rm y) + 1 ))",
        approval=(SUB, "arithmetic on variables ($(( $(rm y) + 1 )))"),
    ),
    case("x=$(rm y)", "rm y", approval=(SUB,)),
    case(
        "echo `echo \\`rm z\\``",
        "rm z",
        "echo `rm z`",
        "echo `echo \\`rm z\\``",
        approval=(BACKQUOTE,),
    ),
    case("echo $( (rm x) )", "rm x", "echo $( (rm x) )", approval=(SUB,)),
    case(
        "cat <(rm x) >(tee y)",
        "rm x",
        "tee y",
        "cat <(rm x) >(tee y)",
        approval=("process substitution <(…)", "process substitution >(…)"),
    ),
    # bash 5.2: a plain `{` does not nest inside `${…}`, so `rm y` runs.
    case("echo ${x:-{} ; rm y ; x=}", "echo ${x:-{}", "rm y"),
    case("echo \"${x:-'}'}\"; rm z", "echo ${x:-'}'}", "rm z"),
]

HEREDOCS = [
    case("cat <<EOF\nrm -rf /\nEOF", "cat"),
    case("cat <<'EOF'\n$(rm x)\nEOF\necho after", "cat", "echo after"),
    case("cat <<EOF\n$(rm x) `rm y`\nEOF", "cat", "rm x", "rm y", approval=(SUB, BACKQUOTE)),
    case("cat <<-EOF\n\tbody\n\tEOF\nrm x", "cat", "rm x"),
    case("cat <<EOF; rm x\nbody\nEOF", "cat", "rm x"),
    case("x=$(cat <<EOF\nrm no\nEOF\n); echo $x", "cat", "echo $x", approval=(SUB,)),
    # bash 5.2 joins `EO\` + `F` in an unquoted here-document and ends it there.
    case("cat <<EOF\nEO\\\nF\nrm x\nEOF", "cat", "rm x", "EOF"),
    case("cat <<'EOF'\nEO\\\nF\nrm x\nEOF", "cat"),
    # bash 5.2: where an assignment may stand, `x[ <<EOF ]` is one word, not a here-document.
    case(
        "x[ <<EOF ]\nrm y\nEOF ]",
        "x[ <<EOF ]",
        "rm y",
        "EOF ]",
        approval=("command name is not literal (x[ <<EOF ])",),
    ),
    case(
        "bash <<EOF\nrm -rf /\nEOF",
        "bash",
        "rm -rf /",
        approval=("bash reads commands from standard input",),
    ),
    case("sh <<< 'rm x'", "sh", "rm x", approval=("sh reads commands from standard input",)),
    case('cat <<< "$(rm x)"', "rm x", "cat", approval=(SUB,)),
]

REDIRECTIONS = [
    case(
        "git status > /etc/passwd",
        "git status",
        approval=("output redirected to a file (/etc/passwd)",),
    ),
    case("echo x >>log", "echo x", approval=("output redirected to a file (log)",)),
    case(
        "echo x >|f &>g &>>h",
        "echo x",
        approval=(
            "output redirected to a file (f)",
            "output redirected to a file (g)",
            "output redirected to a file (h)",
        ),
    ),
    case("echo x 2>err", "echo x", approval=("output redirected to a file (err)",)),
    case("echo x <>f", "echo x", approval=("output redirected to a file (f)",)),
    case("echo x >&file", "echo x", approval=("output redirected to a file (file)",)),
    case("echo x > $f", "echo x", approval=("output redirected to a file ($f)",)),
    case(
        "echo x >/dev/null/../../etc/x",
        "echo x",
        approval=("output redirected to a file (/dev/null/../../etc/x)",),
    ),
    case("git status 2>&1", "git status"),
    case("git status >/dev/null 2>&1", "git status"),
    case("git status &>/dev/null 1>&2 >&2 2>&- 2>/dev/stderr", "git status"),
    case("cat < in.txt <&3 0<&-", "cat"),
    case("exec 3</dev/tcp/host/80", "exec", approval=("network connection (/dev/tcp/host/80)",)),
    case("{ rm x; } > out", "rm x", approval=("output redirected to a file (out)",)),
]


@pytest.mark.parametrize(("command", "expected"), EXPANSIONS + HEREDOCS + REDIRECTIONS)
def test_substitutions_heredocs_and_redirections(command: str, expected: CommandAnalysis) -> None:
    assert analyze(command) == expected


# -- commands inside commands ------------------------------------------------------------------

NESTED = [
    case('bash -c "rm x"', "bash -c 'rm x'", "rm x"),
    case("sh -c 'git status; rm x'", "sh -c 'git status; rm x'", "git status", "rm x"),
    case("bash -lc 'rm x' arg0", "bash -lc 'rm x' arg0", "rm x"),
    case("/bin/bash -o pipefail -c 'rm x'", "/bin/bash -o pipefail -c 'rm x'", "rm x"),
    case("bash script.sh arg", "bash script.sh arg"),
    case(
        'bash -c "$CMD"', "bash -c $CMD", approval=("command string is not literal (bash -c $CMD)",)
    ),
    case(
        "bash -c 'echo \"unterminated'",
        "bash -c 'echo \"unterminated'",
        error="bash -c: unterminated double quote",
    ),
    case("eval rm x", "eval rm x", "rm x", approval=("eval",)),
    case("eval $CMD", "eval $CMD", approval=("eval", "command string is not literal (eval $CMD)")),
    case("trap 'rm x' EXIT", "trap 'rm x' EXIT", "rm x"),
    case("watch -n 5 rm x", "watch -n 5 rm x", "rm x"),
    case("su -c 'rm x' root", "su -c 'rm x' root", "rm x"),
    case("alias g='rm -rf'; g x", "alias 'g=rm -rf'", "rm -rf", "g x"),
    case("timeout 1 rm x", "timeout 1 rm x", "rm x"),
    case("timeout -s KILL --foreground 5 rm x", "timeout -s KILL --foreground 5 rm x", "rm x"),
    case(
        "timeout --foo 5 rm x",
        "timeout --foo 5 rm x",
        "rm x",
        approval=("cannot tell what timeout runs (unknown option --foo)",),
    ),
    case("nice -n 5 nohup rm x &", "nice -n 5 nohup rm x", "nohup rm x", "rm x"),
    case(
        "nice -10 ionice -c3 stdbuf -oL setsid rm x",
        "nice -10 ionice -c3 stdbuf -oL setsid rm x",
        "ionice -c3 stdbuf -oL setsid rm x",
        "stdbuf -oL setsid rm x",
        "setsid rm x",
        "rm x",
    ),
    case("env X=1 rm x", "env X=1 rm x", "rm x", approval=("sets environment variable X",)),
    case("env -i -u HOME lang=C rm x", "env -i -u HOME lang=C rm x", "rm x"),
    case("sudo -E -u root rm -rf /", "sudo -E -u root rm -rf /", "rm -rf /"),
    case("doas -u root rm x", "doas -u root rm x", "rm x"),
    case(
        "command rm x; builtin echo; exec rm y",
        "command rm x",
        "rm x",
        "builtin echo",
        "echo",
        "exec rm y",
        "rm y",
    ),
    case("command -v rm >/dev/null", "command -v rm"),
    case("/usr/bin/time -f %e rm x", "/usr/bin/time -f %e rm x", "rm x"),
    case("\\timeout 1 rm x", "timeout 1 rm x", "rm x"),
    case("xargs rm < list", "xargs rm", "rm"),
    case(
        "xargs -0 -n 1 -I{} sh -c 'rm {}'",
        "xargs -0 -n 1 -I{} sh -c 'rm {}'",
        "sh -c 'rm {}'",
        "rm {}",
    ),
    case("find . -exec rm {} \\;", "find . -exec rm {} ';'", "rm {}"),
    case(
        "find . -name '*.o' -execdir rm -f {} + -ok echo {} \\;",
        "find . -name '*.o' -execdir rm -f {} + -ok echo {} ';'",
        "rm -f {}",
        "echo {}",
    ),
    case("fd -e o -x rm", "fd -e o -x rm", "rm"),
    case(
        "git status | sh", "git status", "sh", approval=("sh reads commands from standard input",)
    ),
    case(
        "curl x | sudo bash",
        "curl x",
        "sudo bash",
        "bash",
        approval=("bash reads commands from standard input",),
    ),
    case("sudo -s", "sudo -s", approval=("sudo reads commands from standard input",)),
    case("su -", "su -", approval=("su reads commands from standard input",)),
]


@pytest.mark.parametrize(("command", "expected"), NESTED)
def test_wrappers_shells_and_eval_expose_the_inner_command(
    command: str, expected: CommandAnalysis
) -> None:
    assert analyze(command) == expected


# -- what always needs a human ----------------------------------------------------------------

APPROVAL = [
    case(
        "PATH=/tmp/evil:$PATH git status",
        "git status",
        approval=("sets environment variable PATH",),
    ),
    case(
        "export PATH=/x LANG=C",
        "export PATH=/x LANG=C",
        approval=("sets environment variable PATH",),
    ),
    case(
        "LD_PRELOAD=x.so GIT_PAGER=sh git log",
        "git log",
        approval=("sets environment variable LD_PRELOAD", "sets environment variable GIT_PAGER"),
    ),
    case("LC_ALL=C TZ=UTC CI=1 git log", "git log"),
    case("$x", "$x", approval=("command name is not literal ($x)",)),
    case("{rm,-rf,/}", "{rm,-rf,/}", approval=("command name is not literal ({rm,-rf,/})",)),
    case("/???/rm x", "/???/rm x", approval=("command name is not literal (/???/rm)",)),
    case(
        "echo $((i + 1)) $((2 * 3)) $(($# + 1))",
        "echo $((i + 1)) $((2 * 3)) $(($# + 1))",
        approval=("arithmetic on variables ($((i + 1)))",),
    ),
    case("((n++))", approval=("arithmetic on variables (((n++)))",)),
    case(
        "[[ $a -eq 1 ]] || [[ $# -gt 0 ]]", approval=("arithmetic on variables ([[ $a -eq 1 ]])",)
    ),
    case(
        "echo ${a[i]} ${a[1]} ${a[@]}",
        "echo ${a[i]} ${a[1]} ${a[@]}",
        approval=("arithmetic on variables (${a[i]})",),
    ),
    case("let i++", "let i++", approval=("arithmetic on variables (let i++)",)),
    case("local -i n=1", "local -i n=1", approval=("arithmetic on variables (local -i)",)),
    case(
        "unset 'a[$(rm x)]'",
        "unset 'a[$(rm x)]'",
        approval=("array subscript in a variable name can run a command",),
    ),
    case(
        "printf -v 'a[$x]' y; printf '[%s]' \"$x\"",
        "printf -v 'a[$x]' y",
        "printf '[%s]' $x",
        approval=("array subscript in a variable name can run a command",),
    ),
    case("echo ${x@P}", "echo ${x@P}", approval=("prompt expansion ${…@P}",)),
    case(
        "echo ${s:i:2} ${#a[i]} ${s:0:2} ${s:-x}",
        "echo ${s:i:2} ${#a[i]} ${s:0:2} ${s:-x}",
        approval=("arithmetic on variables (${s:i:2})", "arithmetic on variables (${#a[i]})"),
    ),
    case("a=([k]=1 [0]=2)", approval=("arithmetic on variables (a=([k]=1 [0]=2))",)),
    case("a=([$x]=1)", approval=("bash expands an array subscript twice (a=([$x]=1))",)),
    case(
        "RANDOM=$x OPTIND=1",
        approval=(
            "sets environment variable RANDOM",
            "arithmetic on variables (RANDOM=$x)",
            "sets environment variable OPTIND",
        ),
    ),
    case(
        "exec {a[i]}>/dev/null {fd}<f",
        "exec",
        approval=("arithmetic on variables ({a[i]})",),
    ),
    case("unset 'a[i]'", "unset 'a[i]'", approval=(VARIABLE_SUBSCRIPT,)),
    case("[[ -v a[i] ]]", approval=(VARIABLE_SUBSCRIPT,)),
    case('[[ -v HOME ]] && unset -v x && test -v "$x"', "unset -v x", "test -v $x"),
    case(
        "env -S 'rm x'",
        "env -S 'rm x'",
        "'rm x'",
        approval=("cannot tell what env runs (unknown option -S)",),
    ),
]


@pytest.mark.parametrize(("command", "expected"), APPROVAL)
def test_constructs_that_need_approval(command: str, expected: CommandAnalysis) -> None:
    assert analyze(command) == expected


PARSE_ERRORS = [
    case('echo "unterminated', error="unterminated double quote"),
    case("echo 'unterminated", error="unterminated single quote"),
    case("echo `unterminated", error="unterminated backquote"),
    case("echo $(rm x", "rm x", error="unterminated $("),
    case("echo ${x", error="unterminated ${"),
    case("(rm x", "rm x", error="unterminated subshell '('"),
    case("rm x)", "rm x", error="unexpected ')'"),
    case("echo (x)", error="unexpected '('"),
    case(";; rm x", error="unexpected ';;'"),
    case("cat <<EOF\nno end", "cat", error="here-document not terminated by EOF"),
    case("cat <<EOF", "cat", error="here-document without a body (EOF)"),
    case("cat <<$x\nbody\n$x", error="here-document delimiter with an expansion"),
    case("case x in", error="unterminated 'case'"),
    case("[[ -f x", error="unterminated '[['"),
    case("echo >", error="missing target after '>'"),
    case("a=(1", error="unterminated array '('"),
    case("$(" * 60 + ")" * 60, error="nested too deeply"),
]


@pytest.mark.parametrize(("command", "expected"), PARSE_ERRORS)
def test_parse_errors(command: str, expected: CommandAnalysis) -> None:
    assert analyze(command) == expected


# -- rules: bypass attempts ---------------------------------------------------------------------

# Generous allow rules: even with the wrappers and shells allowed, what they run is checked too.
ALLOW = (
    "git status*",
    "echo*",
    "cat*",
    "true",
    "timeout *",
    "env *",
    "xargs *",
    "find *",
    "bash -c *",
    "sh -c *",
    "sudo *",
    "nice *",
    "nohup *",
    "eval *",
    "trap *",
    "watch *",
)
DENY = ("rm*",)

BYPASSES = [
    ("git status; rm -rf /", "rm -rf /"),
    ("git status && rm -rf ~", "rm -rf ~"),
    ("git status || rm x", "rm x"),
    ("git status & rm x", "rm x"),
    ("git status\nrm x", "rm x"),
    ("git status \\\n; rm x", "rm x"),
    ("git status | rm x", "rm x"),
    ("$(rm x)", "rm x"),
    ("`rm x`", "rm x"),
    ("git status $(rm x)", "rm x"),
    ('echo "$(rm x)"', "rm x"),
    ("echo ${x:-`rm x`}", "rm x"),
    ("cat <(rm x)", "rm x"),
    ('bash -c "rm x"', "rm x"),
    ("sh -c 'git status; rm x'", "rm x"),
    ("bash -c \"bash -c 'rm x'\"", "rm x"),
    ("eval rm x", "rm x"),
    ("eval 'git status; rm x'", "rm x"),
    ("(rm x)", "rm x"),
    ("{ rm x; }", "rm x"),
    ("timeout 1 rm x", "rm x"),
    ("env X=1 rm x", "rm x"),
    ("sudo -u root rm -rf /", "rm -rf /"),
    ("nice -n 5 nohup rm x &", "rm x"),
    ("xargs rm < list", "rm"),
    ("find . -exec rm {} \\;", "rm {}"),
    ("FOO=bar rm x", "rm x"),
    ("\\rm x", "rm x"),
    ("r''m x", "rm x"),
    ('"r"m x', "rm x"),
    ("$'\\x72m' x", "rm x"),
    ("r\\\nm x", "rm x"),
    ("/bin/rm x", "/bin/rm x"),
    ("./rm x", "./rm x"),
    ("{rm,-rf,x}", "{rm,-rf,x}"),
    ("r{m,} x", "r{m,} x"),
    ("for f in *; do rm $f; done", "rm $f"),
    ("if true; then rm x; fi", "rm x"),
    ("case a in a) rm x;; esac", "rm x"),
    ("f() { rm x; }", "rm x"),
    ("trap 'rm x' EXIT", "rm x"),
    ("watch rm x", "rm x"),
    ("alias ls='rm -rf'", "rm -rf"),
    ("env -S 'rm x'", "'rm x'"),
    ("cat <<EOF\n$(rm x)\nEOF", "rm x"),
    ("bash <<EOF\nrm -rf /\nEOF", "rm -rf /"),
    ("cat <<EOF\nEO\\\nF\nrm x\nEOF", "rm x"),
    ("x[ <<EOF ]\nrm y\nEOF ]", "rm y"),
    ("echo ${x:-{} ; rm y ; x=}", "rm y"),
    # Lines that do not parse: any run of words in them counts.
    ('echo "unterminated; rm -rf /', "rm -rf /"),
    ("git status; rm x; echo 'unterminated", "rm x"),
    ("nohup " * 60 + "rm x", "rm x"),
]


@pytest.mark.parametrize(("command", "denied"), BYPASSES, ids=[repr(c)[:60] for c, _ in BYPASSES])
def test_bypass_attempts_are_refused_by_allow_rules_and_caught_by_deny_rules(
    command: str, denied: str
) -> None:
    assert rule_allows(ALLOW, command) is False
    assert rule_denies(DENY, command) == denied


REFUSED_WITHOUT_RM = [
    "git status > /etc/passwd",
    "git status 2> err.txt",
    "git status &> out",
    "git status | sh",
    "echo rm x | bash",
    "git status $(true)",
    "PATH=/tmp/evil git status",
    "GIT_DIR=/tmp/x git status",
    "git status; ls",
    "git statu",
    "$CMD status",
    "echo $((x))",
    "",
    "x=1",
    "# git status",
]


@pytest.mark.parametrize("command", REFUSED_WITHOUT_RM)
def test_allow_rules_refuse(command: str) -> None:
    assert rule_allows(ALLOW, command) is False
    assert rule_denies(DENY, command) is None


ALLOWED = [
    "git status",
    "git status --short",
    "git  status   -s",
    "\"git\" 'status'",
    "git status 2>&1",
    "git status >/dev/null 2>&1",
    "git status &>/dev/null",
    "git status < /dev/null",
    "git status #; rm x",
    "git status \\\n  --short",
    "git status && git status -s || true",
    "git status | cat",
    "(git status)",
    "{ git status; }",
    "if git status; then echo ok; fi",
    "CI=1 git status",
    "echo '$(rm x)' '`rm x`'",
    "cat <<'EOF'\nrm -rf /\nEOF",
    "cat <<EOF\nrm -rf /\nEOF",
    "timeout 5 git status",
    "env lang=C git status",
    "sh -c 'git status'",
    "find . -name x -exec cat {} +",
    "xargs cat < list",
]


@pytest.mark.parametrize("command", ALLOWED)
def test_allow_rules_allow(command: str) -> None:
    assert rule_allows(ALLOW, command) is True
    assert rule_denies(DENY, command) is None


def test_deny_rules_report_the_first_matching_command_in_order() -> None:
    line = "git push --force; git reset --hard && rm -rf build"
    assert rule_denies(["git reset*", "rm *"], line) == "git reset --hard"
    assert rule_denies(["rm *", "git reset*"], line) == "git reset --hard"
    assert rule_denies(["git push *"], line) == "git push --force"
    assert rule_denies(["git pull *"], line) is None
    assert rule_denies([], line) is None


def test_every_command_must_match_some_allow_rule() -> None:
    line = "git add . && git commit -m 'msg'"
    assert rule_allows(["git add *", "git commit *"], line) is True
    assert rule_allows(["git add *"], line) is False
    assert rule_allows(["git commit *"], line) is False
    assert rule_allows([], line) is False
    # Allowing a wrapper allows nothing it runs.
    assert rule_allows(["timeout *"], "timeout 60 pytest") is False
    assert rule_allows(["timeout *", "pytest *"], "timeout 60 pytest") is True


# -- matching --------------------------------------------------------------------------------

MATCHING = [
    ("git commit*", "git commit", True),
    ("git commit*", "git commit -m x", True),
    ("git commit*", "git commit-tree x", True),
    ("git commit *", "git commit", True),
    ("git commit *", "git commit -m x", True),
    ("git commit *", "git commit-tree x", False),
    ("git commit:*", "git commit", True),
    ("git commit:*", "git commit --amend", True),
    ("git commit:*", "git commitx", False),
    ("npm run test:*", "npm run test -- --watch", True),
    ("npm run test:*", "npm run test-e2e", False),
    ("git commit", "git commit", True),
    ("git commit", "git commit -m x", False),
    ("  git   commit  *", "git commit -a", True),
    ("*", "anything at all", True),
    ("git * --dry-run", "git push origin --dry-run", True),
    ("git * --dry-run", "git push --dry-run origin", False),
    ("rm*", "git rm x", False),
    ("ls*", "lsof", True),
    ("ls *", "lsof", False),
    ("echo a.b", "echo aXb", False),
    ("echo (x)", "echo (x)", True),
    ("git commit -m *", "git commit -m 'a\nb'", True),
    ("git commit -m 'a b'", "git commit -m 'a b'", True),
]


@pytest.mark.parametrize(("pattern", "command", "expected"), MATCHING)
def test_match_prefix(pattern: str, command: str, expected: bool) -> None:
    assert match_prefix(pattern, command) is expected


def test_patterns_match_the_normalised_command() -> None:
    assert rule_allows(["git commit -m 'a b'"], 'git commit -m "a b"') is True
    assert rule_allows(["git commit -m 'a b'"], "git commit -m a\\ b") is True
    assert rule_allows(["git commit -m 'a b'"], "git commit -m a b") is False


# -- safe list ---------------------------------------------------------------------------------

READ_ONLY = [
    "pwd",
    "whoami",
    "date",
    "date +%Y-%m-%d",
    "date -u -Iseconds",
    "ls -la",
    "ls *.py",
    "cat a b",
    "head -n 5 f",
    "tail -f log",
    "wc -l *.py",
    "which python3",
    "echo $HOME",
    "du -sh .",
    "df -h",
    "grep -rn 'foo bar' src",
    "rg -n foo",
    "git status",
    "git status --short",
    "git --no-pager log --oneline -5",
    "git diff HEAD~1 -- src",
    "git show HEAD:x",
    "git branch",
    "git branch -a -v --sort=-committerdate",
    "git branch --show-current",
    "python3 --version",
    "node --version",
    "go version",
    "git log | head -5",
    "cat f | grep x | wc -l",
    "ls 2>/dev/null",
    "git status 2>&1 | head",
    "ls # a comment",
    "cat < f",
    "grep x <<< 'y'",
]
NOT_READ_ONLY = [
    "pwd -P",
    "date -s 2020-01-01",
    "ls; pwd",
    "ls && pwd",
    "ls\npwd",
    "ls &",
    "(ls)",
    "{ ls; }",
    "ls > out",
    "ls $(pwd)",
    "ls `pwd`",
    "git push",
    "git branch -D x",
    "git branch new",
    "git diff --output=x",
    "git -c core.pager=sh log",
    "git log $X",
    "git diff *",
    "rg --pre sh x",
    "rg --pre=sh x",
    "FOO=1 ls",
    "x=1 ls",
    "timeout 1 ls",
    "sudo ls",
    "bash -c ls",
    "find .",
    "python3 -c 1",
    "cat <<EOF\nx\nEOF",
    "./ls",
    "/bin/ls",
    "",
    'echo "unterminated',
    "git status | sh",
    "ls | xargs rm",
    "if true; then ls; fi",
]


@pytest.mark.parametrize("command", READ_ONLY)
def test_read_only(command: str) -> None:
    assert is_read_only(command) is True


@pytest.mark.parametrize("command", NOT_READ_ONLY)
def test_not_read_only(command: str) -> None:
    assert is_read_only(command) is False


# -- suggestions -------------------------------------------------------------------------------

SUGGESTIONS = [
    ("git commit -m x", "bash(git commit *)"),
    ("git status", "bash(git status *)"),
    ("git", "bash(git)"),
    ("git -C repo status", "bash(git -C repo status)"),
    ("npm test", "bash(npm test *)"),
    ("npm run build -- --watch", "bash(npm run build *)"),
    ("npm run", "bash(npm run)"),
    ("pnpm dlx create-x app", "bash(pnpm dlx create-x *)"),
    ("uv run pytest -x", "bash(uv run pytest *)"),
    ("uv run --with x y", "bash(uv run --with x y)"),
    ("npx jest --watch", "bash(npx jest *)"),
    ("cargo test --all", "bash(cargo test *)"),
    ("make", "bash(make)"),
    ("make test", "bash(make test *)"),
    ("docker ps -a", "bash(docker ps *)"),
    ("docker run -it ubuntu", "bash(docker run -it ubuntu)"),
    ("kubectl get pods", "bash(kubectl get *)"),
    ("python -m pytest -q", "bash(python -m pytest *)"),
    ("python3 app.py --port 1", "bash(python3 app.py *)"),
    ("python -c 'print(1)'", "bash(python -c 'print(1)')"),
    ("python", "bash(python)"),
    ("pytest tests/x.py -q", "bash(pytest *)"),
    ("ls -la", "bash(ls *)"),
    ("./gradlew build", "bash(./gradlew *)"),
    ("FOO=1 rm x 2>&1", "bash(rm *)"),
    ("ls *.py", "bash(ls *)"),
    ("python 'a*b.py'", ""),
    ("", ""),
    ("x=1", ""),
]


@pytest.mark.parametrize(("command", "rule"), SUGGESTIONS)
def test_suggest_rule(command: str, rule: str) -> None:
    assert suggest_rule(command) == rule


def test_suggest_rules_covers_every_command_once() -> None:
    assert suggest_rules("timeout 60 pytest") == ("bash(timeout *)", "bash(pytest *)")
    assert suggest_rules("git add . && git commit -m x; git add y") == (
        "bash(git add *)",
        "bash(git commit *)",
    )
    assert suggest_rules("") == ()
    line = "cd src && npm run build"
    assert rule_allows([r[5:-1] for r in suggest_rules(line)], line) is True


# -- robustness and boundaries -----------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "$(" * 500 + ")" * 500,
        "(" * 3000 + ")" * 3000,
        "${a:-" * 500 + "}" * 500,
        '"$(' * 300 + ')"' * 300,
        "nohup " * 3000 + "x",
        "eval " * 500 + "x",
        "bash -c '" + "bash -c " * 100 + "x'",
        "{a,b}" * 2000,
        "[[ " * 1000,
        "$((" * 500 + "))" * 500,
    ],
    ids=lambda c: repr(c[:20]),
)
def test_pathological_input_is_bounded(command: str) -> None:
    analysis = analyze(command)  # must not raise (RecursionError included)
    assert rule_allows(["*"], command) is (
        not analysis.needs_approval and not analysis.parse_error and bool(analysis.commands)
    )


def test_long_lines_stay_fast() -> None:
    words = " ".join(f"w{i}" for i in range(20000))
    assert analyze(f"echo {words}").commands == (f"echo {words}",)
    assert len(analyze("a | " * 5000 + "b").commands) == 5001


def test_imports_only_the_standard_library_and_keel_frozen() -> None:
    tree = ast.parse(Path(shell.__file__).read_text(encoding="utf-8"))
    modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    keel = {m for m in modules if m.split(".")[0] == "keel"}
    others = {m.split(".")[0] for m in modules} - {"keel", "__future__"}
    assert keel == {"keel.frozen"}
    assert others <= sys.stdlib_module_names


# -- opaque to deny rules ----------------------------------------------------------------------

NOT_LITERAL = "the program name is not literal"
STDIN = "reads its commands from standard input"
NOT_SHOWN = "takes the program from words the line does not show"

OPAQUE = [
    ("$(echo rm) x", (f"{NOT_LITERAL} ($(echo rm))",)),
    ('"$(echo rm)" x', (f"{NOT_LITERAL} ($(echo rm))",)),
    ("${x:-rm} y", (f"{NOT_LITERAL} (${{x:-rm}})",)),
    (
        "${!x} y",
        ("bash evaluates a variable name that is not literal (${!x})", f"{NOT_LITERAL} (${{!x}})"),
    ),
    ("$(<f) x", (f"{NOT_LITERAL} ($(<f))",)),
    ('set -- rm x; "$@"', (f"{NOT_LITERAL} ($@)",)),
    ("{ $c x; } && ! $d", (f"{NOT_LITERAL} ($c)", f"{NOT_LITERAL} ($d)")),
    ("if true; then $c x; fi", (f"{NOT_LITERAL} ($c)",)),
    ("time $c x", (f"{NOT_LITERAL} ($c)",)),
    ("coproc $c x", (f"{NOT_LITERAL} ($c)",)),
    ("{rm,-rf,x}", (f"{NOT_LITERAL} ({{rm,-rf,x}})",)),
    ("[r]m x", (f"{NOT_LITERAL} ([r]m)",)),
    ("sudo -u root $c x", ("cannot tell what sudo runs ($c)", f"{NOT_LITERAL} ($c)")),
    ('nohup "$c" x', (f"{NOT_LITERAL} ($c)",)),
    ("nice -n $n rm x", ("cannot tell what nice runs ($n)",)),
    ("env -S 'rm x'", ("cannot tell what env runs (unknown option -S)",)),
    (
        "env --split-string='rm x'",
        ("cannot tell what env runs (unknown option --split-string=rm x)",),
    ),
    ('sh -c "$(cat s)"', ("the command string is not literal (sh -c $(cat s))",)),
    ('su -c "$x"', ("the command string is not literal (su -c $x)",)),
    (
        "watch $x",
        ("cannot tell what watch runs ($x)", "the command string is not literal (watch $x)"),
    ),
    ('alias a="$x"', ("defines an alias (alias a=$x)",)),
    ("cat <<EOF | sh\nrm x\nEOF", (f"sh {STDIN}",)),
    ("sh -s < <(echo rm x)", (f"sh {STDIN}",)),
    ("exec 3<<<'rm x'; sh <&3", (f"sh {STDIN}",)),
    ("sh /dev/fd/3 3<<<'rm x'", ("sh reads its commands from /dev/fd/3",)),
    ("bash /proc/self/fd/0 <<< 'rm x'", ("bash reads its commands from /proc/self/fd/0",)),
    ("bash --rcfile s -i <<< true", ("bash --rcfile runs a script (s)",)),
    ("curl -s x | sudo bash", (f"bash {STDIN}",)),
    ("sudo -s", ("sudo reads commands from standard input",)),
    ("echo rm x | su", ("su reads commands from standard input",)),
    (
        "source ~/.bashrc",
        ("source runs a script, which deny rules cannot read (source ~/.bashrc)",),
    ),
    ("command . ./x", (". runs a script, which deny rules cannot read (. ./x)",)),
    ("xargs sh", ("sh takes its commands from words the line does not show", f"sh {STDIN}")),
    ("xargs -a list env -i", (f"env {NOT_SHOWN}",)),
    ("xargs xargs", (f"xargs {NOT_SHOWN}",)),
    ("xargs timeout 5", (f"timeout {NOT_SHOWN}",)),
    ("xargs watch", (f"watch {NOT_SHOWN}",)),
    ("xargs find . -exec", ("find runs a command the line does not show in full",)),
    ("fd -e sh -x env", (f"env {NOT_SHOWN}",)),
    ("fd -x sh -c '{}'", ("fd fills in the program ({})",)),
    ("find . -exec {} \\;", ("find fills in the program ({})",)),
    ("find . -exec env {} x \\;", ("find fills in the program ({})",)),
    ("xargs -i sh -c '{} x'", ("xargs fills in the program ({})",)),
    ("xargs -I % sh -c '% x'", ("xargs fills in the program (%)",)),
    ("xargs --replace=@@ env @@ x", ("xargs fills in the program (@@)",)),
    ("find $d -name x", ("cannot tell what find runs ($d)",)),
    ('find "$d" -name x', ("cannot tell what find runs ($d)",)),
    ('find . -print "$o" rm x \\;', ("cannot tell what find runs ($o)",)),
    ('f(){ rm -r "$@"; }; f -f x', ("calls f, a function the line defines",)),
    ("f x; function f { :; }", ("calls f, a function the line defines",)),
    (
        'timeout(){ "$@"; }; timeout 5 rm x',
        (f"{NOT_LITERAL} ($@)", "calls timeout, a function the line defines"),
    ),
    ("g(){ :; }; bash -c 'g x'", ("calls g, a function the line defines",)),
    ("command_not_found_handle(){ :; }; nosuch", ("defines command_not_found_handle",)),
    ("alias r=rm", ("defines an alias (alias r=rm)",)),
    ("BASH_ALIASES[r]=rm", ("sets BASH_ALIASES, which decides which program runs",)),
    ("enable -f ./x.so rm", ("enable -f changes which program a name runs",)),
    ("export PATH=.:$PATH", ("sets PATH, which decides which program runs",)),
    ("env PATH=. ls", ("sets PATH, which decides which program runs",)),
    ("BASH_ENV=s bash -c true", ("sets BASH_ENV, which decides which program runs",)),
    ("LD_PRELOAD=./x.so ls", ("sets LD_PRELOAD, which decides which program runs",)),
    ("read PATH < f", ("read sets PATH, which decides which program runs",)),
    ("printf -v PATH %s .", ("printf sets PATH, which decides which program runs",)),
    ("for PATH in .; do ls; done", ("for sets PATH, which decides which program runs",)),
    ("declare -n p=PATH; p=.", ("declares a name reference (declare -n)",)),
    ("echo 'rm x' | tee s.sh; bash ./s.sh", ("runs the script ./s.sh, a file the line writes",)),
    ("cat > run <<'EOF'\nrm x\nEOF\nchmod +x run; ./run", ("runs ./run, a file the line writes",)),
    ("install -m 755 /bin/rm bin/r; bin/r x", ("runs bin/r, a file the line writes",)),
    ("ln -s /bin/rm ~/.local/bin/zap; zap x", ("runs zap, a file the line writes",)),
    ("dd if=/bin/rm of=r; ./r x", ("runs ./r, a file the line writes",)),
    ('cp /bin/rm "$d"; ./tool x', ("runs ./tool, a file the line writes",)),
    ("$D/tool x", (f"{NOT_LITERAL} ($D/tool)",)),
    ('"$D/"* x', (f"{NOT_LITERAL} ($D/*)",)),
    ('"$D/$n" x', (f"{NOT_LITERAL} ($D/$n)",)),
    (
        "x='a[$(rm y)]'; echo $((x))",
        ("bash evaluates a variable that may hold a command (arithmetic on variables ($((x))))",),
    ),
    (
        "x=$'a[\\x24(rm y)]'; (( x ))",
        ("bash evaluates a variable that may hold a command (arithmetic on variables ((( x ))))",),
    ),
    (
        "read x < f; [[ $x -eq 1 ]]",
        (
            "bash evaluates a variable that may hold a command "
            "(arithmetic on variables ([[ $x -eq 1 ]]))",
        ),
    ),
    (
        "x=$(cat f); echo ${a[x]}",
        ("bash evaluates a variable that may hold a command (arithmetic on variables (${a[x]}))",),
    ),
    ("chroot / rm x", ("chroot runs a program that keel does not follow",)),
    ("busybox rm x", ("busybox runs a program that keel does not follow",)),
    ("flock /tmp/l rm x", ("flock runs a program that keel does not follow",)),
    ("parallel rm ::: x", ("parallel runs a program that keel does not follow",)),
    ("ssh localhost rm x", ("ssh runs a program that keel does not follow",)),
    ("su -s /bin/rm -c x", ("su -s picks the program that runs",)),
    ("sudo 'BASH_FUNC_ls%%=() { :; }' ls", ("sudo sets BASH_FUNC_ls%%",)),
    ("echo 'rm x' | sponge s; sh s", ("runs the script s, a file the line writes",)),
    ("mapfile -t -C 'rm x' -c 1 a <<< y", ("mapfile -C runs a command for each line",)),
    ("readarray -tC rm a < f", ("readarray -C runs a command for each line",)),
    ("compgen -C 'rm x' z", ("compgen -C/-F runs a command or a function",)),
    ("compgen -F f z", ("compgen -C/-F runs a command or a function",)),
    ("hash $o /bin/rm ls", ("cannot tell what hash does ($o /bin/rm ls)",)),
    ("alias $a", ("defines an alias (alias $a)",)),
    ("export $x", ("cannot tell what export sets ($x)",)),
    ('declare "$o" p=PATH', ("cannot tell what declare sets ($o)",)),
    ("read $v < f", ("cannot tell which variable read sets ($v)",)),
    ('read -a "$n" < f', ("cannot tell which variable read sets ($n)",)),
    ('echo "unterminated', ("keel cannot parse the line (unterminated double quote)",)),
    ("git status\necho 'x", ("keel cannot parse the line (unterminated single quote)",)),
]

NOT_OPAQUE = [
    "rm x",
    "$'\\x72m' x",
    "r''m x",
    "/bin/rm x",
    "command rm x",
    "env -i lang=C rm x",
    "eval 'rm x'",
    "eval rm x",
    "bash -c 'rm x'",
    "bash <<'EOF'\nrm x\nEOF",
    "bash <<EOF\nrm x\nEOF",
    "sh <<< 'rm x'",
    "bash -i <<< 'rm x'",
    "sh script.sh",
    "./configure && make > build.log",
    "go build -o app . && ./app",
    "echo x > out.txt; cat out.txt",
    "xargs rm < list",
    "xargs -0 wc -l",
    "xargs",
    "xargs -I{} mv {} {}.bak",
    "find . -name '*.o' -delete",
    "find . -exec rm {} +",
    'find "./$d" -name "$n" -type f',
    "fd -x rm",
    "f(){ rm x; }",
    "for ((i = 0; i < 3; i++)); do echo $((i + 1)); done",
    "[[ $# -gt 0 ]] && echo $((x * 2))",
    "echo '$(rm x)'",
    "x=$(date); echo $x",
    "export -n FOO",
    'export FOO="$bar"',
    'local x="$1"',
    'read -r -p "$prompt" line',
    "mapfile -t lines < f",
    "compgen -c",
    "hash -r",
    "declare -i n=1",
    "command -v $x",
    "PATH_SUFFIX=1 make",
    '"$HOME/.local/bin/tool" --help',
    '"$VIRTUAL_ENV"/bin/pytest -q',
]


@pytest.mark.parametrize(("command", "reasons"), OPAQUE, ids=[repr(c)[:60] for c, _ in OPAQUE])
def test_opaque_reasons(command: str, reasons: tuple[str, ...]) -> None:
    assert opaque_reasons(command) == reasons


@pytest.mark.parametrize("command", NOT_OPAQUE, ids=[repr(c)[:60] for c in NOT_OPAQUE])
def test_lines_that_name_their_programs_are_not_opaque(command: str) -> None:
    assert opaque_reasons(command) == ()


@pytest.mark.parametrize(
    "command", ALLOWED + READ_ONLY + [c for c, _ in SUGGESTIONS], ids=lambda c: repr(c)[:60]
)
def test_whatever_an_allow_rule_or_the_safe_list_passes_is_not_opaque(command: str) -> None:
    assert opaque_reasons(command) == ()


def test_opaque_reasons_leave_the_analysis_as_it_was() -> None:
    """The analysis allow rules and the safe list read is the same with or without them."""
    assert analyze("echo rm x | xargs env") == CommandAnalysis(
        ("echo rm x", "xargs env", "env"), (), None
    )
    assert analyze("source x") == CommandAnalysis(("source x",), (), None)
    assert analyze("hash -p /bin/rm ls") == CommandAnalysis(("hash -p /bin/rm ls",), (), None)


UNREADABLE = [
    ("git push *", "s=push; git $s origin", "git $s origin"),
    ("git push *", "echo push | xargs git", "git"),
    ("git push *", 'git "$@"', "git $@"),
    ("git push *", "git pu* origin", "git pu* origin"),
    ("git push *", 'git commit -m "$msg"', None),
    ("git push *", 'git -C "$d" push', None),  # `git push *` never matches `git -C d push`
    ("git push*", "git $x", "git $x"),
    ("rm -rf /", "rm -rf $d", "rm -rf $d"),
    ("rm -rf /", "rm -r $d", None),
    ("rm *", "echo $x", None),
    ("rm *", "rm $x", "rm $x"),
    ("npm run deploy:*", "npm run $t", "npm run $t"),
    ("npm run deploy:*", "npm test $x", None),
    ("git * --force", "git $x", "git $x"),
    ("*", "ls $x", "ls $x"),
    ("docker", "docker $x", "docker $x"),
    ("docker", "docker ps $x", None),
]


@pytest.mark.parametrize(("pattern", "command", "found"), UNREADABLE)
def test_unreadable_arguments(pattern: str, command: str, found: str | None) -> None:
    assert unreadable_arguments(pattern, command) == found


@pytest.mark.parametrize(
    "line",
    [
        "hash -p /bin/rm ls; ls x",
        "mapfile -C 'rm x' -c 1 arr < f",
        "compgen -C 'rm x' y",
        "read PATH; ls",
        "for PATH in .; do ls; done",
        "declare -n p=PATH; p=.; ls",
        "export $v; ls",
        "alias $a; ls",
    ],
)
def test_allow_rules_do_not_pass_lines_that_change_what_a_name_runs(line: str) -> None:
    """Found while making deny rules fail closed: these ran unasked with allow rules for each
    program; they now need approval like any line whose programs cannot be known."""
    patterns = [
        "hash *",
        "ls *",
        "ls",
        "mapfile *",
        "compgen *",
        "read *",
        "declare *",
        "export *",
        "alias *",
    ]
    assert not shell.rule_allows(patterns, line)
    assert not shell.is_read_only(line)
