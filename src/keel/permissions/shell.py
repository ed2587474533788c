"""Shell command lines as `bash(...)` permission rules see them: split, normalised, checked.

This module owns the reading of a command line for permission rules: which simple commands it
would start (also inside chains, pipes, subshells, groups, `if`/`for`/`while`/`case`, command
and process substitutions, `bash -c '…'`, `eval`, `compgen -W '…'`, wrappers such as
`timeout 5 …`, `xargs …`, `find … -exec …`), which constructs no rule may allow, how a rule
pattern matches, the built-in read-only safe list and the rule an "always allow" button offers.
It follows bash's grammar.

It must never run, expand or rewrite a command, touch the file system or the environment, or
import anything from keel but `keel.frozen`. When in doubt it asks: whatever it cannot follow
makes the line need approval (allow rules never pass it), while deny rules still look at every
command it could find; and when a line's programs cannot be known at all, `opaque_reasons` says
why, so that a deny rule can fail closed instead of letting it run.

Normalisation (`CommandAnalysis.commands`)
    Each simple command becomes its words, joined by single spaces, with leading `NAME=value`
    assignments and redirections removed. Quotes are resolved and each word is re-quoted in one
    canonical way: a word that reads the same bare stays bare (`r''m`, `\\rm`, `"rm"`,
    `$'\\x72m'` all become `rm`), a quoted part that needs quoting is single-quoted as
    `shlex.quote` does (`-m "a b"` becomes `-m 'a b'`, `'*'` stays `'*'`, an empty argument is
    `''`), and expansions keep their source text (`$x`, `${x:-y}`, `$(date)`). A backslash-newline
    joins lines; a `#` comment is dropped. Order: the commands of a substitution come before the
    command that uses it; a wrapper (`timeout 5 rm x`) comes before the command it runs (`rm x`).
    Both are listed, so an allow rule must cover both and a deny rule catches either.

Matching (`match_prefix`)
    A pattern is compared with a normalised command (the whole of it). `*` matches any run of
    characters, spaces included, so `git commit*` matches `git commit`, `git commit -m x` and also
    `git commit-tree`. A pattern ending in ` *` or `:*` (Claude Code's `npm run test:*`) matches
    whole words: `git commit *` and `git commit:*` match `git commit` and `git commit -m x`, not
    `git commit-tree`. A pattern without `*` must equal the command. Runs of whitespace in a
    pattern count as one space; write patterns in the normalised form (`-m 'a b'`). A literal `*`
    cannot be expressed. `rule_allows` needs every command to match some pattern; `rule_denies`
    also tries each command with its program's directory dropped (`/bin/rm x` → `rm x`), with
    quotes removed and with brace expansion applied (`{rm,-rf,x}` → `rm -rf x`).

Needs approval (no allow rule can pass the line)
    - command substitution (`$(…)`, backquotes) and process substitution (`<(…)`, `>(…)`),
      wherever they are: in double quotes, `${…}`, arithmetic, unquoted here-documents;
    - output redirected anywhere but `/dev/null`, `/dev/stdout`, `/dev/stderr` (`>`, `>>`, `>|`,
      `&>`, `&>>`, `<>`, `>&file`), and any redirection to `/dev/tcp/…` or `/dev/udp/…`;
      descriptor duplication (`2>&1`, `>&2`, `>&-`) and input redirection are fine;
    - `eval`; a command name that is not literal (`$cmd`, `*`, `{a,b}`, `x[…]`); a command
      string that is not literal (`bash -c "$x"`, `alias a="$x"`);
    - a shell reading its commands from standard input (`… | sh`, `bash <<EOF`, `sudo -s`, `su`);
    - a wrapper option this module does not know (`env -S`, `timeout --foo`);
    - setting an environment variable whose name has an upper-case letter and is not on a short
      harmless list (`_SAFE_ENV`), before a command, alone, after `env`/`sudo` or in
      `export`/`declare`: `PATH`, `LD_PRELOAD`, `GIT_*`, `BASH_ENV`… change what an allowed
      program does. Lower-case names are shell variables by convention and pass;
    - arithmetic that reads variables (`$((i+1))`, `((…))`, `let`, `[[ a -eq b ]]`, `${a[i]}`,
      `${#a[i]}`, `${s:i:n}`, `a=([k]=v)`, `{a[i]}>f`, `declare -i`, `RANDOM=…`, `OPTIND=…`)
      and array subscripts that read a variable in the names builtins evaluate (`unset`,
      `read`, `test -v`, `[[ -v`, `wait -p`, `printf -v`…): bash evaluates them, and a
      variable's value can hold `$(…)`; `${x@P}` likewise; a compound assignment's subscript
      holding `$` or a backquote (`a=([$x]=1)`), which bash expands twice;
    - a line that cannot be parsed (unbalanced quotes, an unterminated substitution or
      here-document): `parse_error` is set.
    A here-document body is data unless a shell reads it, and only its expansions count when
    its delimiter is unquoted. The analysis follows bash 5.2, checked against it.

Opaque to deny rules (`opaque_reasons`, `unreadable_arguments`)
    A deny rule reads the line; it cannot see what bash only knows when it runs it. The gate
    refuses such a line whenever a deny rule for bash exists (in every mode, in the sandbox too).
    `opaque_reasons` lists, in the order found:
    - a program name that is not literal: `$x`, `${x}`, `$a$b`, `$(…)`, backquotes, `rm${IFS}x`,
      `"$@"`, a glob (`/???/r[m]`), a placeholder that `find -exec`, `fd -x` or `xargs -I`
      fill in (`{}`), also behind wrappers (`env $x`, `command $x`, `exec $x`, `xargs $x`);
      a quoted directory before a literal file name is known (`"$HOME/bin/tool"`: deny rules
      compare programs by file name), an unquoted one is not (`$D/tool` may split);
    - a word before a wrapper's program that is not literal (`timeout $t rm x`, `timeout "$o" 5
      rm x`), or that may split (`nice -n $n …`); an unknown wrapper option (`env -S`);
      `find`/`fd` words that could be actions (`find . $o`);
    - a command string that is not literal (`eval "$c x"`, `bash -c "$v"`, `trap "$x" EXIT`,
      `watch $x`, `sh <<< "$x"`); literal strings are followed (`eval 'rm x'` is `rm x`);
    - a shell reading commands from a pipe, a file or a descriptor (`… | sh`, `bash -s < f`,
      `sh <&3`, `su`, `sudo -s`), or from `/dev/stdin`, `/proc/…`, `<(…)`, a placeholder;
      a literal here-document or here-string is followed unless it expands (`bash <<EOF` with
      `$`, a backquote or a backslash in its body); `bash --rcfile FILE`;
    - `source`/`.` of any script;
    - words that `xargs` appends landing where the program or a command string goes (`xargs
      env`, `xargs sh -c`, `xargs sh`), or completing a `find -exec`;
    - bash state that changes what a name runs: an alias definition, `command_not_found_handle`,
      a function the line defines and calls, `hash -p`, `enable -f`, setting `PATH`,
      `BASH_CMDS`, `BASH_ALIASES`, `BASH_ENV`, `ENV`, `LD_PRELOAD`… (also through `read`,
      `for`, `printf -v`, `declare -n`);
    - a program or script that the line itself writes (`> s.sh`, `tee`, `cp`, `ln`, `chmod`,
      `dd of=`…; compared by base name) and runs (`sh s.sh`, `./s`, `cp /bin/rm r; ./r`);
    - a variable name that bash evaluates taken from a value, whatever the line holds (a
      subscript in the name runs `$(…)`): `${!x}`, `${!1}` (not `${!prefix*}`, `${!a[@]}`,
      `${!#}`), `[[ -v $x ]]`, `test -v "$x"`, `unset "$x"`, `wait -p "$x"`; `read "$x"`,
      `declare "$x"=…` above; a compound assignment's subscript with `$` or a backquote
      (`a=([$x]=1)`, `a=(['$(…)']=1)`), which bash expands twice;
    - arithmetic, `${x@P}`, array subscripts, or a value where an option naming a variable may
      stand (`printf "$f"`, `wait "$p"`, `[ "$o" "$x" ]`), when the line also holds code as
      data: a literal `$` or backquote anywhere (`x='a[$(rm y)]'; $((x))`, `d='$'`,
      `$'\\x24'`), a substitution, `read`/`mapfile`/`select`, a glob (a file name can hold
      code), `${x@Q}`/`@E`/`@A`/`@K`, or `BASH_COMMAND` (the line's own text);
    - launchers keel does not unwrap (`strace`, `chroot`, `flock`, `busybox`, `parallel`…);
    - a line that does not parse.
    `unreadable_arguments(pattern, …)` names a command whose program is literal but whose
    words, once expanded, might still match the deny pattern (`git $sub` or `xargs git` for
    `git push *`); words elsewhere do not count (`git commit -m "$msg"`).

Safe list (`is_read_only`)
    Only plain commands, or pipes between them, with no other operator, no assignment and no
    approval reason: `pwd`, `whoami`, `date` (with `+FORMAT`, `-u`, `-R`, `-I…` only), `ls`,
    `cat`, `head`, `tail`, `wc`, `which`, `echo`, `du`, `df`, `grep` (any arguments), `rg`
    (literal arguments, no `--pre` or `--hostname-bin`), `git status|diff|log|show` (optionally
    after `--no-pager`; literal arguments, no `--output` or `--ext-diff`), `git branch` with
    listing flags only, and the version queries in `_READ_ONLY_EXACT`.

Suggestions (`suggest_rule`, `suggest_rules`)
    `bash(<prefix> *)` for one command: the program, plus its subcommand for tools that have them
    (`git commit`, `npm test`), plus the script or package for runners (`npm run build`,
    `uv run pytest`, `npx jest`, `python -m pytest`, `python app.py`). When the word after the
    program is an option (`git -C x status`), the suggestion is the exact command. `suggest_rule`
    covers the first command; `suggest_rules` gives one rule per command, which is what a line
    with several commands needs. Offer them only when `needs_approval` is empty.
"""

from __future__ import annotations

import functools
import itertools
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from keel.frozen import frozen

__all__ = [
    "CommandAnalysis",
    "analyze",
    "is_read_only",
    "match_prefix",
    "opaque_reasons",
    "rule_allows",
    "rule_denies",
    "suggest_rule",
    "suggest_rules",
    "unreadable_arguments",
]


@frozen
class CommandAnalysis:
    """What a command line would start, as permission rules see it.

    `commands`: each simple command, normalised (module docstring), in the order found.
    `needs_approval`: why no rule may allow the line; deduplicated, in the order found.
    `parse_error`: why the line could not be followed (it then needs approval as well).
    """

    commands: tuple[str, ...]
    needs_approval: tuple[str, ...]
    parse_error: str | None


def analyze(command: str) -> CommandAnalysis:
    """Split `command` into the simple commands it would run and the reasons it needs a human."""
    out = _parse(command)
    return CommandAnalysis(
        commands=tuple(c.text for c in out.commands),
        needs_approval=tuple(dict.fromkeys(out.reasons)),
        parse_error=out.error,
    )


def match_prefix(pattern: str, command: str) -> bool:
    """Whether the normalised `command` matches a rule pattern such as `git commit *`."""
    return re.fullmatch(_pattern_regex(pattern), command, re.DOTALL) is not None


def rule_allows(patterns: Iterable[str], command: str) -> bool:
    """True when the line parses, needs no approval, runs something, and every one of its
    commands matches at least one of `patterns`."""
    out = _parse(command)
    if out.error is not None or out.reasons or not out.commands:
        return False
    if opaque_reasons(command):
        return False  # what runs is not what the rule read (`hash -p`, `mapfile -C`, `read PATH`)
    regexes = [_pattern_regex(p) for p in patterns]
    return all(any(re.fullmatch(r, c.text, re.DOTALL) for r in regexes) for c in out.commands)


def rule_denies(patterns: Iterable[str], command: str) -> str | None:
    """The first command of the line, wherever it is nested, that matches one of `patterns`;
    None if none does. On a line that does not parse, every run of words between operators is
    tried as well (from each of its words on), so a broken line errs towards denial."""
    regexes = [_pattern_regex(p) for p in patterns]
    out = _parse(command)
    for cmd in out.commands:
        for view in _deny_views(cmd):
            if any(re.fullmatch(r, view, re.DOTALL) for r in regexes):
                return cmd.text
    if out.error is not None:
        for fragment in _fragments(command):
            if any(re.fullmatch(r, fragment, re.DOTALL) for r in regexes):
                return fragment
    return None


def opaque_reasons(command: str) -> tuple[str, ...]:
    """Why no deny rule can tell which programs the line runs (module docstring); empty when
    every program it starts is named plainly. In the order found, deduplicated."""
    out = _parse(command)
    reasons = list(out.opaque)
    if out.variable_code and (out.substitutions or out.unknown_values):
        reasons.append(
            f"bash evaluates a variable that may hold a command ({out.variable_code[0]})"
        )
    for cmd in out.commands:
        if cmd.known == 0:
            continue
        program = cmd.words[0].value or cmd.words[0].text
        if program in out.functions:
            reasons.append(f"calls {_clip(program)}, a function the line defines")
        elif posixpath.basename(program) in out.written or (out.writes_unknown and "/" in program):
            reasons.append(f"runs {_clip(program)}, a file the line writes")
    for script in out.scripts:
        if posixpath.basename(script) in out.written or out.writes_unknown:
            reasons.append(f"runs the script {_clip(script)}, a file the line writes")
    if out.error is not None:
        reasons.append(f"keel cannot parse the line ({out.error})")
    return tuple(dict.fromkeys(reasons))


def unreadable_arguments(pattern: str, command: str) -> str | None:
    """The first command whose program is literal but whose words, once bash expands them,
    might match the deny `pattern` (`git $sub x` for `git push *`, `xargs git` reading
    `push`); None when none might."""
    for cmd in _parse(command).commands:
        if cmd.known == 0 or (cmd.known == len(cmd.words) and not cmd.tail):
            continue
        values = [w.text if w.value is None else w.value for w in cmd.words[: cmd.known]]
        texts = [w.text for w in cmd.words[: cmd.known]]
        views = {" ".join(values), " ".join(texts)}
        views.add(" ".join([posixpath.basename(values[0]), *values[1:]]))
        if any(_could_match(pattern, view) for view in views):
            return cmd.text
    return None


def is_read_only(command: str) -> bool:
    """Whether the line is on the built-in safe list (module docstring): it may run unasked."""
    out = _parse(command)
    if out.error is not None or out.reasons or not out.commands:
        return False
    if out.compound or out.assignments or out.ops - {"|", "|&"} or opaque_reasons(command):
        return False
    return all(not c.nested and _is_read_only_command(c) for c in out.commands)


def suggest_rule(command: str) -> str:
    """The rule an "always allow" button offers for the line's first command, such as
    `bash(git commit *)`; "" when the line has no command or no rule can name it exactly."""
    out = _parse(command)
    return _rule_for(out.commands[0]) if out.commands else ""


def suggest_rules(command: str) -> tuple[str, ...]:
    """One suggested rule per distinct command of the line, in order (see `suggest_rule`)."""
    rules = (_rule_for(c) for c in _parse(command).commands)
    return tuple(dict.fromkeys(r for r in rules if r))


# -- values ----------------------------------------------------------------------------------


@frozen
class _Word:
    text: str  # canonical rendering
    raw: str  # source text
    value: str | None  # quotes removed; None when the word holds an expansion
    plain: bool  # no expansion, no unquoted glob or brace pattern: the shell keeps it as is
    splits: bool = False  # an expansion may become several words (unquoted, or `"$@"`)
    lead: str = ""  # the literal text before its first expansion
    base: str = ""  # a literal last path component after expansions (`"$HOME/bin/tool"`)
    globs: bool = False  # an unquoted glob: pathname expansion fills it in from file names


@frozen
class _Command:
    words: tuple[_Word, ...]
    text: str
    nested: bool  # exposed from inside a wrapper (`timeout 5 rm x` → `rm x`)
    known: int = 0  # how many leading words are literal (the rest a deny rule cannot read)
    tail: bool = False  # words are appended that the line does not show (`xargs CMD`)


@frozen
class _Heredoc:
    delimiter: str
    strip_tabs: bool
    expands: bool
    nesting: int
    shell_input: bool = False  # the body is a script for `bash`/`sh` reading standard input


@frozen
class _Wrapper:
    """The options of a command that runs another one (`timeout 5 rm x`)."""

    short_flags: str = ""
    short_args: str = ""
    short_optional: str = ""  # the rest of the cluster is an optional argument (`xargs -i{}`)
    long_flags: frozenset[str] = frozenset()
    long_args: frozenset[str] = frozenset()
    operands: int = 0  # words between the options and the command (`timeout DURATION`)
    assignments: bool = False  # `NAME=value` words may come before the command (`env`, `sudo`)
    no_command: str = ""  # short flags that make it run nothing (`command -v NAME`)
    shell_flags: str = ""  # short flags that, with no command, start a shell (`sudo -s`)

    def arity(self, option: str) -> int | None:
        """How many words follow `option` as its argument; None for an unknown option."""
        if option.startswith("--"):
            name, eq, _ = option.partition("=")
            if name in self.long_flags:
                return 0
            if name in self.long_args:
                return 0 if eq else 1
            return None
        if option[1:].isdigit():  # `nice -10`
            return 0
        for index, letter in enumerate(option[1:], start=2):
            if letter in self.short_optional:
                return 0
            if letter in self.short_args:
                return 0 if index < len(option) else 1
            if letter not in self.short_flags:
                return None
        return 0


class _ParseError(Exception):
    pass


class _NotArithmetic(Exception):
    """`((` or `$((` turned out to open a subshell, not arithmetic."""


class _Out:
    """What the parsers of one line (and of the strings it hands to `bash -c`) found."""

    __slots__ = (
        "assignments",
        "commands",
        "compound",
        "error",
        "functions",
        "level",
        "opaque",
        "ops",
        "placeholders",
        "reasons",
        "scripts",
        "substitutions",
        "unknown_values",
        "variable_code",
        "writes_unknown",
        "written",
    )

    def __init__(self) -> None:
        self.commands: list[_Command] = []
        self.reasons: list[str] = []
        # What a deny rule cannot see through (module docstring, `opaque_reasons`):
        self.opaque: list[str] = []
        self.functions: set[str] = set()  # names of functions the line defines
        self.written: set[str] = set()  # base names of files the line writes or creates
        self.writes_unknown = False  # a file whose name is not literal is written
        self.scripts: list[str] = []  # script files a shell runs (`sh s.sh`)
        self.placeholders: list[tuple[str, str]] = []  # (owner, token): `find -exec … {}`
        self.substitutions = False  # a command substitution somewhere
        self.variable_code: list[str] = []  # arithmetic or `${x@P}` that evaluates a variable
        self.unknown_values = False  # a variable may hold code: `'$(…)'` as data, `read`
        self.ops: set[str] = set()
        self.compound = False  # a keyword, subshell, group, function, `[[` or `((` was seen
        self.assignments = False
        self.error: str | None = None
        self.level = 0  # recursion depth, bounded so that no input can exhaust the stack


@functools.lru_cache(maxsize=32)
def _parse(command: str) -> _Out:
    """The parse of one line. Cached: the gate reads the same line for each rule, and nothing
    changes an `_Out` once its parse is done."""
    out = _Out()
    try:
        _Parser(command, out).parse_all()
    except _ParseError as exc:
        out.error = out.error or str(exc)
    return out


# -- grammar ---------------------------------------------------------------------------------

_MAX_NESTING = 40
_WORD_BREAK = frozenset(" \t\n;&|()<>")
_UNQUOTED_RUN = re.compile(r"[^ \t\n;&|()<>\\'\"$`]+")
_DQUOTE_RUN = re.compile(r"[^\"$`\\]+")
_PLAIN_WORD = re.compile(r"[^ \t\n;&|()<>\\'\"$`]+(?=[ \t\n;&|()<>]|\Z)")
_REDIRECT = re.compile(r"(?:\d+|\{[A-Za-z_]\w*\})?(?:<<<|<<-|<<|<>|<&|>>|>&|>\||&>>|&>|<|>)")
_IO_NUMBER = re.compile(r"^(?:\d+|\{[A-Za-z_]\w*\})")
_CONTROL = re.compile(r";;&|;;|;&|&&|\|\||\|&|[;&|()\n]")
_COND_OPERATOR = re.compile(r"&&|\|\||<(?!\()|>(?!\()|[()|]")
_SUBSCRIPTED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[")
_FUNCTION_PARENS = re.compile(r"\([ \t]*\)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
_ENV_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_HEX = re.compile(r"[0-9A-Fa-f]+")
_OCTAL = re.compile(r"[0-7]{1,3}")
_SHELL_SPECIAL = re.compile(r"[^\w@%+=:,./-]", re.ASCII)  # what `shlex.quote` would quote
_TRAILING_PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)\Z")
_GLOB = re.compile(r"[*?]|\[[^\]]*\]")
_BRACE = re.compile(r"\{[^{}]*(?:,|\.\.)[^{}]*\}")
_ARITH_VARIABLE = re.compile(r"[A-Za-z_$`]")
_SUBSCRIPT_CODE = re.compile(r"\[[^\]]*[$`]")
_INDEXED = re.compile(r"\$\{[!#]?[A-Za-z_]\w*\[([^\]]*)\]")
# `${!name}` takes a variable name from a value; these forms only list names or keys, or read a
# positional parameter (`${!#}`).
_NAME_LISTING = re.compile(r"\$\{!(?:[A-Za-z_]\w*(?:[*@]|\[[*@]\])|#)\}")
# `${name:offset:length}`: both are arithmetic (`${name:-…}`, `:=`, `:?`, `:+` are not this).
_SUBSTRING = re.compile(
    r"\$\{[!#]?(?:[A-Za-z_]\w*|\d+|[@*#?$!-])(?:\[[^\]]*\])?:(?![-=?+])(.*)\}", re.DOTALL
)
# `${x@Q}`, `${x@E}`…: new text, which can hold a `$(` that the line never shows.
_REQUOTING = re.compile(r"@[QEAKk]\}\Z")
# Variables that hold the line's own text, `$` included (`${BASH_COMMAND:5:1}`).
_SELF_TEXT = re.compile(r"BASH_COMMAND|BASH_EXECUTION_STRING")
# `{name[subscript]}>file`: bash stores the new descriptor in that element.
_VARIABLE_FD = re.compile(r"\{[A-Za-z_]\w*\[(.*)\]\}", re.DOTALL)
# The `[subscript]=` of an element of a compound assignment (`a=([k]=v)`).
_ELEMENT_SUBSCRIPT = re.compile(r"\[(.*)\]\+?=", re.DOTALL)
_INTEGER = re.compile(r"-?\d+")
# Parameters that always hold a number (`$#`, `$?`, `${#name}`): safe in arithmetic.
_NUMERIC_PARAMETER = re.compile(r"\$(?:[#?$!]|\{#\w*(?:\[[@*]\])?\})")
_FD = re.compile(r"\d+-?|-")

_NO_CLOSERS: frozenset[str] = frozenset()
_CLOSE_PAREN = frozenset({")"})
_CASE_CLOSERS = frozenset({";;", ";&", ";;&", "esac"})
_SEPARATORS = frozenset({";", "&", "&&", "||", "|", "|&", "\n"})
_RESERVED = frozenset(
    {"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until"}
    | {"for", "select", "case", "function", "time", "coproc", "[["}
)
_DECLARATIONS = frozenset({"declare", "typeset", "local", "export", "readonly"})
_INPUT_REDIRECTS = frozenset({"<", "<<<", "<&"})
_HARMLESS_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_ARITH_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
# `test`/`[` operators between two operands: the word before one is an operand, not `-v`.
_TEST_BINARY = _ARITH_TESTS | {"=", "==", "!=", "<", ">", "-a", "-o", "-nt", "-ot", "-ef"}
# Variables with the integer attribute: bash evaluates what is assigned to them as arithmetic.
_INTEGER_VARIABLES = frozenset({"RANDOM", "SRANDOM", "OPTIND", "HISTCMD"})
# Assignments a rule may let through: they only change output format, locale or logging.
# Anything else with an upper-case letter (PATH, LD_PRELOAD, GIT_*, PYTHONPATH, BASH_ENV…) can
# make an allowed program run other code. Lower-case names are shell variables by convention.
_SAFE_ENV = frozenset(
    {"CI", "DEBUG", "NODE_ENV", "RUST_LOG", "RUST_BACKTRACE", "NO_COLOR", "FORCE_COLOR"}
    | {"CLICOLOR", "CLICOLOR_FORCE", "TERM", "COLUMNS", "LINES", "LANG", "LANGUAGE", "TZ"}
    | {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONIOENCODING"}
    | {"GOOS", "GOARCH", "CGO_ENABLED", "GOMAXPROCS", "NODE_NO_WARNINGS"}
)
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
    "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip
_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}


class _WordBuf:
    """The parts of one word as it is read: unquoted text, quoted text, expansions."""

    __slots__ = ("parts", "splits")
    _UNQUOTED, _QUOTED, _EXPANSION = 0, 1, 2

    def __init__(self) -> None:
        self.parts: list[tuple[int, str]] = []
        self.splits = False

    def lit(self, text: str, *, quoted: bool) -> None:
        self.parts.append((self._QUOTED if quoted else self._UNQUOTED, text))

    def exp(self, text: str, *, quoted: bool = False) -> None:
        self.parts.append((self._EXPANSION, text))
        self.splits = self.splits or not quoted or "@" in text

    def word(self, raw: str) -> _Word:
        if len(self.parts) == 1 and self.parts[0][0] == self._UNQUOTED:  # most words
            text = self.parts[0][1]
            globs = bool(_GLOB.search(text))
            plain = not globs and not _BRACE.search(text)
            return _Word(text, raw, text, plain, lead=text, globs=globs)
        lead = "".join(
            t for _, t in itertools.takewhile(lambda p: p[0] != self._EXPANSION, self.parts)
        )
        has_expansion = any(kind == self._EXPANSION for kind, _ in self.parts)
        unquoted = "".join(t for kind, t in self.parts if kind == self._UNQUOTED)
        value = None if has_expansion else "".join(t for _, t in self.parts)
        globs = bool(_GLOB.search(unquoted))
        plain = value is not None and not globs and not _BRACE.search(unquoted)
        if value is not None and not _SHELL_SPECIAL.search(unquoted):
            # One spelling per literal word: `a\ b`, `"a b"` and `a' 'b` all read `'a b'`,
            # `r''m` and `\rm` read `rm`.
            return _Word(shlex.quote(value), raw, value, plain, lead=value, globs=globs)
        rendered: list[str] = []
        for kind, group in itertools.groupby(self.parts, key=lambda part: part[0]):
            text = "".join(t for _, t in group)
            # Unquoted globs, braces, `~` and expansions stay bare; quoted text is re-quoted.
            piece = shlex.quote(text) if kind == self._QUOTED and text else text
            tail = _TRAILING_PARAMETER.search(rendered[-1]) if rendered else None
            if tail is not None and re.match(r"\w", piece):  # `"$x"y` is `${x}y`, not `$xy`
                rendered[-1] = f"{rendered[-1][: tail.start()]}${{{tail.group(1)}}}"
            rendered.append(piece)
        base = self._literal_base() if has_expansion else ""
        text = "".join(rendered) or "''"
        return _Word(text, raw, value, plain, self.splits, lead, base, globs)

    def _literal_base(self) -> str:
        """`tool` for `"$HOME/bin/tool"`: the file name after the last `/`, when nothing after
        the last expansion is a glob, a brace or another expansion."""
        trail = list(itertools.takewhile(lambda p: p[0] != self._EXPANSION, reversed(self.parts)))
        unquoted = "".join(t for kind, t in trail if kind == self._UNQUOTED)
        if _GLOB.search(unquoted) or _BRACE.search(unquoted) or "{" in unquoted:
            return ""
        text = "".join(t for _, t in reversed(trail))
        return text.rpartition("/")[2] if "/" in text else ""


class _Parser:
    """A recursive-descent reader of one command string. Lenient where leniency only adds
    commands (a stray `fi` is skipped), strict where a wrong guess could hide one."""

    __slots__ = ("heredocs", "nesting", "out", "pos", "src", "stdin_shell")

    def __init__(self, src: str, out: _Out) -> None:
        self.src = src
        self.pos = 0
        self.out = out
        self.heredocs: list[_Heredoc] = []
        self.nesting = 0  # depth of `$(` / `<(` in this string, for here-documents
        self.stdin_shell = ""  # set by the command just emitted when it is a shell reading stdin

    def parse_all(self) -> None:
        if _SELF_TEXT.search(self.src):
            self.out.unknown_values = True
        self._parse_list(_NO_CLOSERS)
        if self.heredocs:
            raise _ParseError(f"here-document without a body ({self.heredocs[0].delimiter})")

    def scan_expanding_text(self) -> None:
        """Find the substitutions in the body of a here-document with an unquoted delimiter."""
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            if c == "\\":
                self.pos += 2
            elif c in "$`":
                self._read_expansion(_WordBuf(), in_dquote=True)
            else:
                self.pos += 1

    # -- lists and commands

    @contextmanager
    def _deeper(self) -> Iterator[None]:
        self.out.level += 1
        try:
            if self.out.level > _MAX_NESTING:
                raise _ParseError("nested too deeply")
            yield
        finally:
            self.out.level -= 1

    def _parse_list(self, closers: frozenset[str]) -> str:
        """Commands up to one of `closers` (operators or keywords) or the end; returns the
        closer it consumed, "" at the end."""
        with self._deeper():
            return self._list_items(closers)

    def _list_items(self, closers: frozenset[str]) -> str:
        while True:
            self._skip_blanks()
            if self.pos >= len(self.src):
                return ""
            if self._peek_redirect() is None:
                op = self._peek_control()
                if op is not None and op in closers:
                    self._take(op)
                    return op
                if op in _SEPARATORS:
                    self._take(op)
                    continue
                word = self._peek_plain()
                if op is None and word is not None and word in closers:
                    self.pos += len(word)
                    return word
            self._parse_command()

    def _parse_command(self) -> None:
        if self._peek_redirect() is None:
            op = self._peek_control()
            if op == "(":
                self._parse_parenthesised()
                return
            if op is not None:
                raise _ParseError(f"unexpected {op!r}")
            word = self._peek_plain()
            if word is not None and word in _RESERVED:
                self.pos += len(word)
                self.out.compound = True
                handler = _KEYWORD_HANDLERS.get(word)
                if handler is not None:
                    handler(self)
                return
        self._parse_simple()

    def _parse_parenthesised(self) -> None:
        self.out.compound = True
        if self.src.startswith("((", self.pos):
            mark = self._mark()
            try:
                body = self._read_arith(self.pos)
            except _NotArithmetic:
                self._restore(mark)
            else:
                self._check_arith(f"(({body}))", body)
                return
        self._take("(")
        if self._parse_list(_CLOSE_PAREN) != ")":
            raise _ParseError("unterminated subshell '('")

    def _parse_simple(self) -> None:
        words: list[_Word] = []
        assignments: list[_Word] = []
        here_strings: list[_Word] = []
        inputs: list[_Word] = []
        first_heredoc = len(self.heredocs)
        while True:
            self._skip_blanks()
            if self.pos >= len(self.src):
                break
            redirect = self._peek_redirect()
            if redirect is not None:
                self._read_redirection(redirect, here_strings, inputs)
                continue
            op = self._peek_control()
            if op == "(" and len(words) == 1 and not assignments and self._function_parens():
                self.out.compound = True  # `name() …`: the body follows as a command
                self._define_function(words[0])
                return
            if op == "(":
                raise _ParseError("unexpected '('")
            if op is not None:
                break
            word = self._read_word(assignable=not words)
            if self._variable_fd(word, here_strings, inputs):
                continue
            is_assignment = _ASSIGNMENT.match(word.raw) is not None
            # `a=(1 2)`, also as an argument of `declare`, `local`…: an array, not a subshell.
            if is_assignment and word.raw.endswith("=") and self.src.startswith("(", self.pos):
                if words and words[0].value not in _DECLARATIONS:
                    raise _ParseError("unexpected '('")
                word = self._read_array_literal(word)
            (words if words or not is_assignment else assignments).append(word)
        for word in assignments:
            self._check_assignment(word.raw)
        self.out.assignments = self.out.assignments or bool(assignments)
        if words:
            self.stdin_shell = ""
            self._emit(tuple(words), nested=False)
            if self.stdin_shell:
                fed = bool(here_strings) or len(self.heredocs) > first_heredoc
                if inputs or not fed:  # a pipe, a file, a descriptor: what it reads is unknown
                    self._opaque(f"{self.stdin_shell} reads its commands from standard input")
                self._feed_shell(self.stdin_shell, here_strings, first_heredoc)

    def _define_function(self, name: _Word) -> None:
        function = name.value if name.value is not None else name.text
        self.out.functions.add(function)
        if function == "command_not_found_handle":  # bash calls it for every unknown program
            self._opaque("defines command_not_found_handle")

    def _feed_shell(self, program: str, here_strings: list[_Word], first_heredoc: int) -> None:
        """`bash <<EOF … EOF`, `sh <<< '…'`: what the shell reads is a script; look inside."""
        for word in here_strings:
            self._parse_string(word, f"{program} <<<")
        self.heredocs[first_heredoc:] = [
            _Heredoc(d.delimiter, d.strip_tabs, d.expands, d.nesting, shell_input=True)
            for d in self.heredocs[first_heredoc:]
        ]

    def _function_parens(self) -> bool:
        match = _FUNCTION_PARENS.match(self.src, self.pos)
        if match is None:
            return False
        self.pos = match.end()
        return True

    def _read_array_literal(self, name: _Word) -> _Word:
        """`name=(a b …)`: the elements are words (their substitutions run), not commands."""
        self.pos += 1
        elements: list[_Word] = []
        while True:
            self._skip_blanks()
            if self.pos >= len(self.src):
                raise _ParseError("unterminated array '('")
            if self.src[self.pos] == ")":
                self.pos += 1
                text = f"{name.text}({' '.join(e.text for e in elements)})"
                self._check_elements(text, elements)
                return _Word(text, name.raw, None, False, lead=name.raw)
            if self.src[self.pos] == "\n":
                self.pos += 1
                continue
            elements.append(self._read_word())

    def _check_elements(self, shown: str, elements: list[_Word]) -> None:
        """`a=([$x]=1)`: bash expands a subscript here twice, so a `$(…)` in its value runs, and
        evaluates it as arithmetic (an indexed array); `a=(*)` holds file names."""
        for element in elements:
            subscript = _ELEMENT_SUBSCRIPT.match(element.raw)
            if subscript is None:
                self._note_glob(element)
            elif any(c in _NUMERIC_PARAMETER.sub("0", subscript[1]) for c in "$`"):
                why = f"bash expands an array subscript twice ({_clip(shown)})"
                self._reason(why)
                self._opaque(why)
            elif _reads_variables(subscript[1]):
                self._variable_code(f"arithmetic on variables ({_clip(shown)})")

    def _variable_fd(self, word: _Word, here_strings: list[_Word], inputs: list[_Word]) -> bool:
        """`{a[i]}>file`: a redirection that stores the descriptor in an array element, whose
        subscript bash evaluates. Read as the redirection it is; True when it was one."""
        match = _VARIABLE_FD.fullmatch(word.raw)
        redirect = self._peek_redirect() if match is not None else None
        if match is None or redirect is None or redirect[0] not in "<>&":
            return False
        if _reads_variables(match[1]):
            self._variable_code(f"arithmetic on variables ({_clip(word.raw)})")
        self._read_redirection(redirect, here_strings, inputs)
        return True

    def _note_glob(self, word: _Word) -> None:
        """A word that pathname expansion fills in (not an assignment: that is not expanded)."""
        if word.globs and not _ASSIGNMENT.match(word.raw):
            # A file name can hold code: `touch 'a[$(rm x)]'` in one call, `$((f))` in the next.
            self.out.unknown_values = True

    def _note_data(self, text: str) -> None:
        """A literal `$` or backquote (`'$'`, `\\$`, `$'\\x24'`): text a later expansion can put
        together into code (`d='$'; x="a[${d}(rm y)]"; $((x))`)."""
        if "$" in text or "`" in text:
            self.out.unknown_values = True

    # -- keywords

    def _parse_for_header(self) -> None:
        self._skip_blanks()
        if self.src.startswith("((", self.pos):
            try:
                body = self._read_arith(self.pos)
            except _NotArithmetic:
                raise _ParseError("bad arithmetic 'for ((…))'") from None
            self._check_arith(f"(({body}))", body)
            return
        variable = self._read_word()  # the loop variable
        self._check_lookup_variables("for", (variable,))
        self._skip_newlines()
        if self._peek_plain() != "in":
            return
        self.pos += 2
        while True:  # the words looped over: data, though their substitutions run
            self._skip_blanks()
            if self.pos >= len(self.src) or self._peek_control() or self._peek_redirect():
                return
            self._note_glob(self._read_word())

    def _parse_select_header(self) -> None:
        self.out.unknown_values = True  # `select` reads REPLY from standard input
        self._parse_for_header()

    def _parse_case(self) -> None:
        self._skip_blanks()
        self._read_word()
        self._skip_newlines()
        if self._peek_plain() != "in":
            raise _ParseError("'case' without 'in'")
        self.pos += 2
        while True:
            self._skip_newlines()
            if self.pos >= len(self.src):
                raise _ParseError("unterminated 'case'")
            if self._peek_plain() == "esac":
                self.pos += 4
                return
            self._read_case_patterns()
            closer = self._parse_list(_CASE_CLOSERS)
            if closer == "esac":
                return
            if not closer:
                raise _ParseError("unterminated 'case'")

    def _read_case_patterns(self) -> None:
        self._skip_blanks()
        if self._peek_control() == "(":
            self.pos += 1
        while True:
            self._skip_blanks()
            op = self._peek_control()
            if op in (")", "|"):
                self.pos += 1
                if op == ")":
                    return
                continue
            if op is not None or self.pos >= len(self.src) or self._peek_redirect():
                raise _ParseError("bad 'case' pattern")
            self._read_word()

    def _parse_function_header(self) -> None:
        self._skip_blanks()
        self._define_function(self._read_word())
        self._skip_blanks()
        self._function_parens()

    def _skip_time_options(self) -> None:
        self._skip_blanks()
        if self._peek_plain() == "-p":
            self.pos += 2

    def _skip_coproc_name(self) -> None:
        self._skip_blanks()
        name = self._peek_plain()
        if name in ("time", "!"):  # not keywords here: `coproc time x` runs the program `time`
            self._parse_simple()
            return
        if name is None or not _NAME.fullmatch(name):
            return
        after = self.pos + len(name)
        if self.src[after:].lstrip(" \t").startswith(("{ ", "{\t", "{\n", "(")):
            self.pos = after  # `coproc NAME { …; }`: NAME is not a command

    def _parse_cond(self) -> None:
        """`[[ … ]]`: its words are operands, not commands; `<`, `>`, `(`, `&&` are operators."""
        tokens: list[tuple[str, str | None]] = []  # (text, value)
        while True:
            self._skip_blanks()
            if self.pos >= len(self.src):
                raise _ParseError("unterminated '[['")
            if self._peek_plain() == "]]":
                self.pos += 2
                break
            if self.src[self.pos] == "\n":
                self.pos += 1
                continue
            operator = _COND_OPERATOR.match(self.src, self.pos)
            if operator is not None:
                self.pos = operator.end()
                tokens.append((operator.group(), operator.group()))
            else:
                operand = self._read_word()
                tokens.append((operand.text, operand.value))
        words = [text for text, _ in tokens]
        for index, word in enumerate(words):
            operands = words[index - 1 : index] + words[index + 1 : index + 2]
            numeric = all(_INTEGER.fullmatch(_NUMERIC_PARAMETER.sub("0", o)) for o in operands)
            if word in _ARITH_TESTS and not numeric:
                shown = _clip(" ".join(["[[", *words, "]]"]))
                self._variable_code(f"arithmetic on variables ({shown})")
        if any(_SUBSCRIPT_CODE.search(w) for w in words):
            self._variable_code("array subscript in a variable name can run a command")
        for (first, _), (text, value) in itertools.pairwise(tokens):
            if first != "-v":  # `[[ -v NAME ]]` evaluates a subscript in NAME
                continue
            if value is None:
                shown = _clip(f"[[ -v {text} ]]")
                self._opaque(f"bash evaluates a variable name that is not literal ({shown})")
            elif _subscript_reads_variables(value):
                self._variable_code("array subscript in a variable name can run a command")

    # -- commands found

    def _emit(self, words: tuple[_Word, ...], *, nested: bool, tail: bool = False) -> None:
        with self._deeper():
            name = words[0]
            if not name.plain:
                self._reason(f"command name is not literal ({_clip(name.text)})")
            known = self._known_words(words)
            text = " ".join(w.text for w in words)
            self.out.commands.append(_Command(words, text, nested, known, tail))
            if known == 0:
                owner = self._placeholder_owner(name)
                if owner:
                    self._opaque(f"{owner} fills in the program ({_clip(name.text)})")
                else:
                    self._opaque(f"the program name is not literal ({_clip(name.text)})")
            self._check_arguments(words)
            program = posixpath.basename(name.value) if name.value is not None else ""
            self._note_effects(program, words[1:])
            unwrap = _UNWRAPPERS.get(program)
            if unwrap is not None:
                unwrap(self, program, words[1:], tail)

    def _known_words(self, words: tuple[_Word, ...]) -> int:
        """How many leading words are literal: no expansion, glob or placeholder. A program
        whose directory is an expansion but whose file name is literal counts as known
        (`"$HOME/bin/tool"`): deny rules compare programs by file name."""
        for index, word in enumerate(words):
            named = index == 0 and bool(word.base) and not word.splits
            if (not word.plain and not named) or self._placeholder_owner(word):
                return index
        return len(words)

    def _placeholder_owner(self, word: _Word) -> str:
        return next((owner for owner, token in self.out.placeholders if token in word.text), "")

    def _opaque(self, reason: str) -> None:
        self.out.opaque.append(reason)

    def _note_effects(self, program: str, args: tuple[_Word, ...]) -> None:
        """What deny rules must know of a command beyond its words: the files it writes, a
        script it sources, a program it runs that keel does not follow."""
        if program in _SOURCES:
            shown = " ".join([program, *(w.text for w in args[:1])])
            self._opaque(f"{program} runs a script, which deny rules cannot read ({_clip(shown)})")
        elif program in _LAUNCHERS:
            self._opaque(f"{program} runs a program that keel does not follow")
        elif program in _WRITERS:
            for word in args:
                value = word.value
                if value is None or not word.plain:
                    self.out.writes_unknown = True
                elif not value.startswith("-") or "=" in value:
                    self._note_written(value.rpartition("=")[2] if "=" in value else value)
        if program in _VARIABLE_READERS:
            self.out.unknown_values = True

    def _note_written(self, path: str) -> None:
        name = posixpath.basename(path.rstrip("/"))
        if name:
            self.out.written.add(name)

    def _check_arguments(self, words: tuple[_Word, ...]) -> None:
        for word in words:
            self._note_glob(word)
        check = _ARGUMENT_CHECKS.get(words[0].value or "")
        if check is not None:
            check(self, words[0].value or "", words[1:])

    def _check_variable_names(self, program: str, args: tuple[_Word, ...]) -> None:
        evaluated = _evaluated_names(program, args)
        if any(_SUBSCRIPT_CODE.search(w.text) for w in args) or any(
            _subscript_reads_variables(w.value) for w in evaluated
        ):
            self._variable_code("array subscript in a variable name can run a command")
        if program in _NAME_TAKERS:
            self._check_name_words(program, args, evaluated)
        if program in _VARIABLE_READERS:
            names = args[1:2] if program == "getopts" else _skip_option_arguments(args)
            self._check_lookup_variables(program, names)
        if program in ("mapfile", "readarray") and any(
            "C" in _short_options(w.value) for w in args
        ):
            self._opaque(f"{program} -C runs a command for each line")

    def _check_name_words(
        self, program: str, args: tuple[_Word, ...], names: tuple[_Word, ...]
    ) -> None:
        """`unset "$x"`, `test -v "$x"`, `wait -p "$x"`: a name taken from a value, whose
        subscript bash evaluates, whatever the line holds. `wait "$o"`, `[ "$o" "$x" ]`: a value
        where an option that names a variable may stand (o='-pa[$(…)]', o=-v)."""
        shown = _clip(f"{program} {_shown(args)}")
        if any(w.value is None for w in names):
            self._opaque(f"bash evaluates a variable name that is not literal ({shown})")
        elif _may_be_name_option(program, args):
            self._may_name_variable(shown)

    def _may_name_variable(self, shown: str) -> None:
        """Like arithmetic on a variable, this matters when the line holds code as data; no
        approval reason, as `printf "$format" …` is everyday shell."""
        self.out.variable_code.append(f"a word that is not literal may name a variable ({shown})")

    def _check_lookup_variables(self, program: str, names: tuple[_Word, ...]) -> None:
        """`read PATH`, `for PATH in …`: a variable that decides which program runs."""
        for word in names:
            if word.value in _LOOKUP_ENV:
                self._opaque(f"{program} sets {word.value}, which decides which program runs")
            elif word.value in _INTEGER_VARIABLES:
                self._variable_code(f"arithmetic on variables ({program} {word.value})")
            elif word.value is None:  # `read $v` with v=PATH
                self._opaque(f"cannot tell which variable {program} sets ({_clip(word.text)})")

    def _check_declaration(self, program: str, args: tuple[_Word, ...]) -> None:
        """`export NAME=…`, `declare -i …`: assignments like any other, arithmetic for `-i`."""
        self._check_variable_names(program, args)
        for word in args:
            if word.value is None and not _ASSIGNMENT.match(word.lead):  # `export $x`
                self._opaque(f"cannot tell what {program} sets ({_clip(word.text)})")
            value = word.value if word.value is not None else word.text
            if program != "export" and value.startswith("-") and "n" in value:
                self._opaque(f"declares a name reference ({program} {value})")  # `-n p=PATH`
            if value.startswith("-") and "i" in value:
                self._variable_code(f"arithmetic on variables ({program} {value})")
            elif _ASSIGNMENT.match(value):
                self._check_assignment(value)

    def _check_printf(self, program: str, args: tuple[_Word, ...]) -> None:
        if args and args[0].value is None and not _numeric(args[0]):  # `printf "$f"`, f='-vNAME'
            self._may_name_variable(_clip(f"{program} {_shown(args)}"))
        values = [w.value for w in args]
        if "-v" in values:  # only `printf -v NAME` assigns
            target = args[values.index("-v") + 1 :][:1]
            self._check_variable_names(program, target)
            self._check_lookup_variables(program, target)
            self.out.unknown_values = True

    def _check_let(self, program: str, args: tuple[_Word, ...]) -> None:
        expression = " ".join(w.text for w in args)
        self._check_arith(f"let {expression}", expression)

    def _check_hash(self, program: str, args: tuple[_Word, ...]) -> None:
        """`hash -p /bin/rm ls` and `enable -f lib.so NAME` change what a command name runs;
        `compgen -C CMD` runs one."""
        options = set().union(*(_short_options(w.value) for w in args))
        flag, effect = _NAME_CHANGERS[program]
        if options & set(flag):
            self._opaque(f"{program} -{'/-'.join(flag)} {effect}")
        elif any(w.value is None for w in args):
            self._opaque(f"cannot tell what {program} does ({_clip(_shown(args))})")

    def _check_compgen(self, program: str, args: tuple[_Word, ...]) -> None:
        """`compgen -W LIST` expands LIST as bash words: a `$(…)` in it runs."""
        self._check_hash(program, args)
        for index, word in enumerate(args):
            value = word.value or ""
            if not value.startswith("-") or value.startswith("--") or "W" not in value:
                continue
            attached = value.partition("W")[2]
            following = args[index + 1].value if index + 1 < len(args) else None
            wordlist = attached or following
            if wordlist:
                _Parser(wordlist, self.out).scan_expanding_text()

    def _check_assignment(self, raw: str) -> None:
        match = _ASSIGNMENT.match(raw)
        if match is None:
            return
        self._check_env_name(match.group(1))
        subscript = match.group(2)
        if subscript and _ARITH_VARIABLE.search(subscript):
            self._variable_code(f"arithmetic on variables ({_clip(match.group())})")
        if match.group(1) in _INTEGER_VARIABLES and _reads_variables(raw[match.end() :]):
            self._variable_code(f"arithmetic on variables ({_clip(raw)})")

    def _check_env_name(self, name: str) -> None:
        if name != name.lower() and name not in _SAFE_ENV and not name.startswith("LC_"):
            self._reason(f"sets environment variable {name}")
        if name in _LOOKUP_ENV:
            self._opaque(f"sets {name}, which decides which program runs")

    def _check_arith(self, display: str, body: str) -> None:
        if _reads_variables(body):
            self._variable_code(f"arithmetic on variables ({_clip(display)})")

    def _variable_code(self, reason: str) -> None:
        """Bash evaluates a variable's value here, and a value can hold `$(…)`."""
        self._reason(reason)
        self.out.variable_code.append(reason)

    def _reason(self, reason: str) -> None:
        self.out.reasons.append(reason)

    # -- commands inside commands

    def _unwrap_wrapper(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        spec = _WRAPPERS[program]
        start = self._wrapper_operands(program, spec, args)
        if start is None:  # `command -v NAME`: runs nothing
            return
        appends = tail  # words appended to this command land in the one it runs
        replace = _xargs_replace_string(args[:start]) if program == "xargs" else None
        if program == "xargs" and replace is None:
            appends = True  # xargs appends the words it reads to the command
        if start < len(args):
            with self._placeholder(program, replace or ""):
                self._emit(args[start:], nested=True, tail=appends)
        elif tail:
            self._opaque(f"{program} takes the program from words the line does not show")
        elif any(_short_options(w.value) & set(spec.shell_flags) for w in args):
            self._reason(f"{program} reads commands from standard input")  # `sudo -s`
            self._opaque(f"{program} reads commands from standard input")

    @contextmanager
    def _placeholder(self, owner: str, *tokens: str) -> Iterator[None]:
        added = [(owner, token) for token in tokens if token]
        self.out.placeholders.extend(added)
        try:
            yield
        finally:
            del self.out.placeholders[len(self.out.placeholders) - len(added) :]

    def _wrapper_operands(
        self, program: str, spec: _Wrapper, args: tuple[_Word, ...]
    ) -> int | None:
        """The index of the first word of the command that `program` runs; None when it runs
        none (`command -v NAME`)."""
        index = 0
        while index < len(args):
            word = args[index]
            value = word.value
            if value is None:
                if spec.operands:  # an option, or the operand? (`timeout "$o" 5 rm x`)
                    self._opaque(f"cannot tell what {program} runs ({_clip(word.text)})")
                break
            if value == "--":
                index += 1
                break
            assignment = _ENV_ASSIGNMENT.match(value) if spec.assignments else None
            if assignment is not None:
                self._check_env_name(assignment.group(1))
                index += 1
                continue
            if value == "-":  # `env -`: the same as `env -i`
                index += 1
                continue
            if not value.startswith("-"):
                if spec.assignments and "=" in value:  # env takes any NAME=VALUE
                    self._opaque(f"{program} sets {_clip(value.partition('=')[0])}")
                break
            if _short_options(value) & set(spec.no_command):
                return None
            arity = spec.arity(value)
            if arity is None:
                self._reason(f"cannot tell what {program} runs (unknown option {value})")
                self._opaque(f"cannot tell what {program} runs (unknown option {value})")
            index += 1 + (arity or 0)
        for word in args[: index + spec.operands + 1]:
            if word.splits:  # `timeout $t rm x`, `nice -n $n …`: one word may become several
                self._opaque(f"cannot tell what {program} runs ({_clip(word.text)})")
        return index + spec.operands

    def _unwrap_shell(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        index, mode = _shell_operands(args)
        if any(w.splits for w in args[:index]) or (index < len(args) and args[index].splits):
            self._opaque(f"cannot tell what {program} runs ({_clip(_shown(args))})")
        for option, script in itertools.pairwise(args[:index]):
            if option.value in ("--rcfile", "--init-file"):
                self._opaque(f"{program} {option.value} runs a script ({_clip(script.text)})")
        if mode == "c" and index < len(args):
            self._parse_string(args[index], f"{program} -c")
        elif mode == "s" or (mode == "" and index >= len(args)):
            self._reason(f"{program} reads commands from standard input")
            self.stdin_shell = program
        elif mode == "":
            self._note_script(program, args[index])
        if tail and index >= len(args):  # `xargs sh -c`, `xargs sh`
            self._opaque(f"{program} takes its commands from words the line does not show")

    def _note_script(self, program: str, script: _Word) -> None:
        """`sh FILE`: a script deny rules cannot read; refused when the line writes it."""
        value = script.value
        if value is None or not script.plain or self._placeholder_owner(script):
            self._opaque(
                f"{program} runs a script whose name is not literal ({_clip(script.text)})"
            )
        elif value.startswith(("/dev/", "/proc/")):
            self._opaque(f"{program} reads its commands from {_clip(value)}")
        else:
            self.out.scripts.append(value)

    def _unwrap_eval(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        self._reason("eval")
        self._parse_joined(args, program)

    def _unwrap_trap(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        index = 0
        while index < len(args) and args[index].value in ("-p", "-l", "-P", "--"):
            index += 1
        if index < len(args) and args[index].value not in ("-", ""):
            self._parse_string(args[index], program)

    def _unwrap_watch(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        start = self._wrapper_operands(program, _WATCH, args)
        if start is None:
            return
        if tail and start >= len(args):
            self._opaque(f"{program} takes the program from words the line does not show")
        self._parse_joined(args[start:], program)  # watch hands its words to `sh -c`

    def _unwrap_su(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        commands = 0
        for index, word in enumerate(args):
            value = word.value or ""
            if word.splits:
                self._opaque(f"cannot tell what {program} runs ({_clip(word.text)})")
            if value in ("-s", "--shell") or value.startswith("--shell="):
                self._opaque(f"{program} {value} picks the program that runs")
            if value in ("-c", "--command") and index + 1 < len(args):
                commands += 1
                self._parse_string(args[index + 1], f"{program} -c")
            elif value.startswith("--command="):
                commands += 1
                self._parse_text(value.partition("=")[2], f"{program} -c")
        if not commands:
            self._reason(f"{program} reads commands from standard input")
            self._opaque(f"{program} reads commands from standard input")

    def _unwrap_alias(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        for word in args:
            if word.value is None and "=" in word.text:
                self._reason(f"command string is not literal ({_clip(f'alias {word.text}')})")
            name, eq, body = (word.value or "").partition("=")
            if eq or word.value is None:
                self._opaque(f"defines an alias ({_clip(f'alias {word.text}')})")
            if eq and body:
                self._parse_text(body, f"alias {name}")

    def _unwrap_exec_option(self, program: str, args: tuple[_Word, ...], tail: bool) -> None:
        """`find … -exec CMD … ;` and `fd … --exec CMD …`."""
        options, terminators = _EXEC_OPTIONS[program]
        tokens = ("{}",) if program == "find" else _FD_PLACEHOLDERS
        self._check_find_words(program, args, options)
        index = 0
        while index < len(args):
            if args[index].value in options:
                end = index + 1
                while end < len(args) and args[end].value not in terminators:
                    end += 1
                if end >= len(args) and tail:  # the terminator could come from the input
                    self._opaque(f"{program} runs a command the line does not show in full")
                command = args[index + 1 : end]
                # fd appends the path when the command has no placeholder.
                appends = program != "find" and not any(
                    t in w.text for w in command for t in tokens
                )
                if command:
                    with self._placeholder(program, *tokens):
                        self._emit(command, nested=True, tail=appends)
                index = end
            index += 1

    def _check_find_words(
        self, program: str, args: tuple[_Word, ...], options: frozenset[str]
    ) -> None:
        """A word that is not literal may be an action: `find . $x` with x='-exec rm {} ;'."""
        for index, word in enumerate(args):
            if word.value is not None and word.plain:
                continue
            previous = args[index - 1].value if index else None
            takes_it = previous in _FIND_ARGUMENT_OPTIONS
            lead = word.lead
            not_option = bool(lead) and not lead.startswith(("-", "(", "!", ")"))
            if previous in options or word.splits or not (takes_it or not_option):
                self._opaque(f"cannot tell what {program} runs ({_clip(word.text)})")
                return

    def _parse_joined(self, args: tuple[_Word, ...], what: str) -> None:
        if any(w.value is None for w in args):
            shown = " ".join(w.text for w in args)
            self._reason(f"command string is not literal ({_clip(f'{what} {shown}')})")
            self._opaque(f"the command string is not literal ({_clip(f'{what} {shown}')})")
        elif args:
            self._parse_text(" ".join(w.value or "" for w in args), what)

    def _parse_string(self, word: _Word, what: str) -> None:
        if word.value is None:
            self._reason(f"command string is not literal ({_clip(f'{what} {word.text}')})")
            self._opaque(f"the command string is not literal ({_clip(f'{what} {word.text}')})")
        else:
            self._parse_text(word.value, what)

    def _parse_text(self, text: str, what: str) -> None:
        try:
            _Parser(text, self.out).parse_all()
        except _ParseError as exc:
            self.out.error = self.out.error or f"{what}: {exc}"

    # -- redirections and here-documents

    def _read_redirection(self, op: str, here_strings: list[_Word], inputs: list[_Word]) -> None:
        self.pos += len(op)
        base = _IO_NUMBER.sub("", op)
        self._skip_blanks()
        if self.pos >= len(self.src) or self._peek_control() or self._peek_redirect():
            raise _ParseError(f"missing target after {base!r}")
        if base in ("<<", "<<-"):
            delimiter = self._read_word()
            if delimiter.value is None:
                raise _ParseError("here-document delimiter with an expansion")
            quoted = any(c in delimiter.raw for c in "'\"\\")
            self.heredocs.append(_Heredoc(delimiter.value, base == "<<-", not quoted, self.nesting))
            return
        target = self._read_word()
        if base == "<<<":
            here_strings.append(target)
        elif base in ("<", "<&", "<>") and (_IO_NUMBER.match(op) is None or op.startswith("0")):
            inputs.append(target)  # standard input from a file or a descriptor
        if (target.value or target.text).startswith(("/dev/tcp/", "/dev/udp/")):
            self._reason(f"network connection ({_clip(target.text)})")
        elif not _harmless_redirect(base, target):
            self._reason(f"output redirected to a file ({_clip(target.text)})")
            if target.value is None or not target.plain:
                self.out.writes_unknown = True
            else:
                self._note_written(target.value)

    def _read_heredocs(self) -> None:
        pending, self.heredocs = self.heredocs, []
        for doc in pending:
            if doc.nesting != self.nesting:
                raise _ParseError("here-document inside a multi-line substitution")
            body = self._heredoc_body(doc)
            if doc.shell_input and doc.expands and any(c in body for c in "$`\\"):
                # The shell reads the body after expansion, which is not the text keel sees.
                self._opaque("a shell reads a here-document with expansions")
            if doc.shell_input:
                self._parse_text(body, "here-document")
            elif doc.expands:
                _Parser(body, self.out).scan_expanding_text()

    def _heredoc_body(self, doc: _Heredoc) -> str:
        lines: list[str] = []
        while self.pos < len(self.src):
            line = self._heredoc_line(join=doc.expands)
            if (line.lstrip("\t") if doc.strip_tabs else line) == doc.delimiter:
                return "\n".join(lines)
            lines.append(line)
        raise _ParseError(f"here-document not terminated by {doc.delimiter}")

    def _heredoc_line(self, *, join: bool) -> str:
        """The next line of a here-document body. With an unquoted delimiter, bash joins
        backslash-newlines before comparing: `EO\\` + `F` ends the body as `EOF` does."""
        src = self.src
        parts: list[str] = []
        while True:
            end = src.find("\n", self.pos)
            end = len(src) if end < 0 else end
            line = src[self.pos : end]
            self.pos = min(end + 1, len(src))
            trailing = len(line) - len(line.rstrip("\\"))
            if not join or trailing % 2 == 0 or end >= len(src):
                parts.append(line)
                return "".join(parts)
            parts.append(line[:-1])

    # -- tokens

    def _skip_blanks(self) -> None:
        """Blanks, backslash-newlines and a comment (it can only start where a word could)."""
        src = self.src
        while self.pos < len(src):
            c = src[self.pos]
            if c in " \t":
                self.pos += 1
            elif src.startswith("\\\n", self.pos):
                self.pos += 2
            elif c == "#":
                end = src.find("\n", self.pos)
                self.pos = len(src) if end < 0 else end
            else:
                return

    def _skip_newlines(self) -> None:
        while True:
            self._skip_blanks()
            if not self.src.startswith("\n", self.pos):
                return
            self._take("\n")

    def _take(self, op: str) -> None:
        self.pos += len(op)
        self.out.ops.add(op)
        if op == "\n" and self.heredocs:
            self._read_heredocs()

    def _peek_control(self) -> str | None:
        match = _CONTROL.match(self.src, self.pos)
        return match.group() if match else None

    def _peek_redirect(self) -> str | None:
        match = _REDIRECT.match(self.src, self.pos)
        if match is None:
            return None
        if match.group()[-1] in "<>" and self.src.startswith("(", match.end()):
            return None  # `<(…)`: a process substitution, part of a word
        return match.group()

    def _peek_plain(self) -> str | None:
        """The next word when it is unquoted plain text (how keywords are recognised)."""
        match = _PLAIN_WORD.match(self.src, self.pos)
        return match.group() if match else None

    def _mark(self) -> tuple[int, int, int, int]:
        return self.pos, len(self.out.commands), len(self.out.reasons), len(self.heredocs)

    def _restore(self, mark: tuple[int, int, int, int]) -> None:
        self.pos, commands, reasons, heredocs = mark
        del self.out.commands[commands:]
        del self.out.reasons[reasons:]
        del self.heredocs[heredocs:]

    # -- words

    def _read_word(self, *, assignable: bool = False) -> _Word:
        start = self.pos
        buf = _WordBuf()
        src = self.src
        subscripted = _SUBSCRIPTED.match(src, self.pos) if assignable else None
        if subscripted is not None:
            # Where an assignment may stand, bash reads `name[…]` to the matching `]` as one
            # word, blanks and operators included: `x[ <<EOF ]` is a word, not a here-document.
            buf.lit(subscripted.group(1), quoted=False)
            self.pos = subscripted.end(1)
            self._read_subscript(buf)
        while self.pos < len(src):
            c = src[self.pos]
            if c in _WORD_BREAK:
                if c in "<>" and src.startswith("(", self.pos + 1):
                    self._read_process_substitution(buf)
                    continue
                break
            if c == "\\":
                self._read_escape(buf)
            elif c == "'":
                self._read_single_quoted(buf)
            elif c in '$`"':
                self._read_expansion(buf, in_dquote=False)
            else:
                match = _UNQUOTED_RUN.match(src, self.pos)
                end = match.end() if match else self.pos + 1
                buf.lit(src[self.pos : end], quoted=False)
                self.pos = end
        if self.pos == start:
            raise _ParseError(f"unexpected {src[start : start + 1]!r}")
        return buf.word(src[start : self.pos])

    def _read_subscript(self, buf: _WordBuf) -> None:
        src = self.src
        depth = 0
        while True:
            if self.pos >= len(src):
                raise _ParseError("unterminated '['")
            c = src[self.pos]
            if c in '$`"':
                self._read_expansion(buf, in_dquote=False)
            elif c == "'":
                self._read_single_quoted(buf)
            elif c == "\\":
                self._read_escape(buf)
            else:
                buf.lit(c, quoted=False)
                self.pos += 1
                depth += (c == "[") - (c == "]")
                if depth == 0:
                    return

    def _read_escape(self, buf: _WordBuf) -> None:
        following = self.src[self.pos + 1 : self.pos + 2]
        self._note_data(following)
        if following != "\n":  # a backslash-newline joins lines
            buf.lit(following or "\\", quoted=True)
        self.pos += 2 if following else 1

    def _read_single_quoted(self, buf: _WordBuf) -> None:
        end = self.src.find("'", self.pos + 1)
        if end < 0:
            raise _ParseError("unterminated single quote")
        self._note_data(self.src[self.pos + 1 : end])  # code kept as data: `x='a[$(rm y)]'`
        buf.lit(self.src[self.pos + 1 : end], quoted=True)
        self.pos = end + 1

    def _read_double_quoted(self, buf: _WordBuf) -> None:
        src = self.src
        self.pos += 1
        buf.lit("", quoted=True)  # `""` is still an argument
        while True:
            if self.pos >= len(src):
                raise _ParseError("unterminated double quote")
            c = src[self.pos]
            if c == '"':
                self.pos += 1
                return
            if c in "$`":
                self._read_expansion(buf, in_dquote=True)
            elif c == "\\":
                following = src[self.pos + 1 : self.pos + 2]
                if following == "\n":  # a backslash-newline joins lines
                    self.pos += 2
                elif following in ("$", "`", '"', "\\"):
                    self._note_data(following)
                    buf.lit(following, quoted=True)
                    self.pos += 2
                else:  # any other backslash is kept
                    buf.lit("\\", quoted=True)
                    self.pos += 1
            else:
                match = _DQUOTE_RUN.match(src, self.pos)
                end = match.end() if match else self.pos + 1
                buf.lit(src[self.pos : end], quoted=True)
                self.pos = end

    def _read_expansion(self, buf: _WordBuf, *, in_dquote: bool) -> None:
        c = self.src[self.pos]
        if c == "$":
            with self._deeper():
                self._read_dollar(buf, in_dquote=in_dquote)
        elif c == "`":
            self._read_backtick(buf, in_dquote=in_dquote)
        else:
            self._read_double_quoted(buf)

    def _read_dollar(self, buf: _WordBuf, *, in_dquote: bool) -> None:
        src, at = self.src, self.pos
        following = src[at + 1 : at + 2]
        if following == "(":
            self._read_dollar_paren(buf, in_dquote=in_dquote)
        elif following in ("{", "["):
            self._read_bracketed(buf, in_dquote=in_dquote)
        elif following == "'" and not in_dquote:
            self._read_ansi_c(buf)
        elif following == '"' and not in_dquote:
            self.pos += 1  # `$"…"`: a translated string, otherwise double quotes
            self._read_double_quoted(buf)
        else:
            match = _PARAMETER.match(src, at + 1)
            if match is None:
                self._note_data("$")
                buf.lit("$", quoted=in_dquote)
                self.pos += 1
            else:
                buf.exp(src[at : match.end()], quoted=in_dquote)
                self.pos = match.end()

    def _read_dollar_paren(self, buf: _WordBuf, *, in_dquote: bool) -> None:
        at = self.pos
        if self.src.startswith("$((", at):
            mark = self._mark()
            try:
                body = self._read_arith(at + 1)
            except _NotArithmetic:
                self._restore(mark)
            else:
                self._check_arith(self.src[at : self.pos], body)
                buf.exp(self.src[at : self.pos], quoted=in_dquote)
                return
        self.pos = at + 2
        self._read_substitution_body("$(")
        self._reason("command substitution $(…)")
        self.out.substitutions = True
        buf.exp(self.src[at : self.pos], quoted=in_dquote)

    def _read_process_substitution(self, buf: _WordBuf) -> None:
        at = self.pos
        opener = self.src[at : at + 2]
        self.pos += 2
        self._read_substitution_body(opener)
        self._reason(f"process substitution {opener}…)")
        buf.exp(self.src[at : self.pos])

    def _read_substitution_body(self, opener: str) -> None:
        self.nesting += 1
        closer = self._parse_list(_CLOSE_PAREN)
        self.nesting -= 1
        if closer != ")":
            raise _ParseError(f"unterminated {opener}")

    def _read_arith(self, at: int) -> str:
        """Arithmetic `((…))` starting at `at`; returns its body, leaves `pos` after `))`.
        Raises `_NotArithmetic` when the parentheses close otherwise (`((a) | b)`)."""
        src = self.src
        start = self.pos = at + 2
        depth = 0
        while self.pos < len(src):
            c = src[self.pos]
            if c in '$`"':
                self._read_expansion(_WordBuf(), in_dquote=True)
                continue
            if c == ")" and depth == 0:
                if not src.startswith("))", self.pos):
                    raise _NotArithmetic
                self.pos += 2
                return src[start : self.pos - 2]
            depth += (c == "(") - (c == ")")
            self.pos += 1
        raise _NotArithmetic

    def _read_bracketed(self, buf: _WordBuf, *, in_dquote: bool) -> None:
        """`${…}` (parameter expansion) or `$[…]` (old arithmetic), nested substitutions too.
        As in bash 5.2, single quotes protect `}` even inside double quotes, a plain `{` does
        not nest (`${x:-a{b}c}` is `a{bc}`), a `[` does."""
        src, at = self.src, self.pos
        opener = src[at + 1]
        closer = "}" if opener == "{" else "]"
        self.pos += 2
        depth = 1
        while depth:
            if self.pos >= len(src):
                raise _ParseError(f"unterminated ${opener}")
            c = src[self.pos]
            if c in '$`"':
                self._read_expansion(_WordBuf(), in_dquote=in_dquote)
                continue
            if c == "'":
                end = src.find("'", self.pos + 1)
                if end < 0:
                    raise _ParseError("unterminated single quote")
                self._note_data(src[self.pos + 1 : end])
                self.pos = end
            elif c == "\\":
                self._note_data(src[self.pos + 1 : self.pos + 2])
                self.pos += 1
            depth += (c == "[" == opener) - (c == closer)
            self.pos += 1
        text = src[at : self.pos]
        if opener == "[":
            self._check_arith(text, text[2:-1])
        else:
            self._check_parameter(text)
        buf.exp(text, quoted=in_dquote)

    def _check_parameter(self, text: str) -> None:
        if text.endswith("@P}"):
            self._variable_code("prompt expansion ${…@P}")
        elif _REQUOTING.search(text):
            self.out.unknown_values = True
        if text.startswith("${!") and not _NAME_LISTING.fullmatch(text):  # `${!x}`, `${!1}`
            self._opaque(f"bash evaluates a variable name that is not literal ({_clip(text)})")
        indexed = _INDEXED.match(text)
        if indexed and indexed.group(1) not in ("@", "*") and _reads_variables(indexed[1]):
            self._variable_code(f"arithmetic on variables ({_clip(text)})")
        substring = _SUBSTRING.fullmatch(text)
        if substring and _reads_variables(substring[1]):  # `${s:x}`, `${@:$n:1}`
            self._variable_code(f"arithmetic on variables ({_clip(text)})")

    def _read_ansi_c(self, buf: _WordBuf) -> None:
        """`$'…'`, with its backslash escapes decoded (`$'\\x72m'` is `rm`)."""
        src = self.src
        index = self.pos + 2
        chars: list[str] = []
        while True:
            if index >= len(src):
                raise _ParseError("unterminated $'")
            c = src[index]
            if c == "'":
                break
            if c == "\\" and index + 1 < len(src):
                text, index = _ansi_c_escape(src, index + 1)
                chars.append(text)
                continue
            chars.append(c)
            index += 1
        self._note_data("".join(chars))
        buf.lit("".join(chars), quoted=True)
        self.pos = index + 1

    def _read_backtick(self, buf: _WordBuf, *, in_dquote: bool) -> None:
        src, at = self.src, self.pos
        self.pos += 1
        body: list[str] = []
        while True:
            if self.pos >= len(src):
                raise _ParseError("unterminated backquote")
            c = src[self.pos]
            if c == "`":
                break
            following = src[self.pos + 1 : self.pos + 2]
            if c == "\\" and (following in ("$", "`", "\\") or (in_dquote and following == '"')):
                body.append(following)
                self.pos += 2
                continue
            body.append(c)
            self.pos += 1
        self.pos += 1
        self._reason("command substitution `…`")
        self.out.substitutions = True
        _Parser("".join(body), self.out).parse_all()
        buf.exp(src[at : self.pos], quoted=in_dquote)


_KEYWORD_HANDLERS: dict[str, Callable[[_Parser], None]] = {
    "for": _Parser._parse_for_header,
    "select": _Parser._parse_select_header,
    "case": _Parser._parse_case,
    "function": _Parser._parse_function_header,
    "time": _Parser._skip_time_options,
    "coproc": _Parser._skip_coproc_name,
    "[[": _Parser._parse_cond,
}


def _short_options(value: str | None) -> set[str]:
    """The letters of a short-option cluster (`-su` → s, u); empty for anything else."""
    if value is None or not value.startswith("-") or value.startswith("--"):
        return set()
    return set(value[1:])


def _harmless_redirect(base: str, target: _Word) -> bool:
    if base in _INPUT_REDIRECTS:
        return True
    if base == ">&" and target.value is not None and _FD.fullmatch(target.value):
        return True  # `2>&1`, `>&2`, `>&-`: duplicating or closing a descriptor
    return target.plain and target.value in _HARMLESS_SINKS


def _shell_operands(args: tuple[_Word, ...]) -> tuple[int, str]:
    """For `bash ARGS`: the index of the first operand and the mode, "c" (`-c STRING`), "s"
    (`-s`, commands from standard input) or "" (a script file, or standard input if none)."""
    mode = ""
    index = 0
    while index < len(args):
        value = args[index].value
        if value is None:
            break
        if value in ("-", "--"):
            return index + 1, mode
        if value in ("--rcfile", "--init-file"):
            index += 2
            continue
        if value.startswith("--"):  # `--norc`, `--login`…
            index += 1
            continue
        if len(value) < 2 or value[0] not in "-+":
            break
        letters = value[1:]
        if value[0] == "-" and "c" in letters:
            mode = "c"
        elif value[0] == "-" and "s" in letters and mode != "c":
            mode = "s"
        index += 2 if ("o" in letters or "O" in letters) else 1  # `-o pipefail`
    return index, mode


def _ansi_c_escape(src: str, index: int) -> tuple[str, int]:
    """Decode the escape whose letter is at `src[index]`; returns the text and the next index."""
    c = src[index]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], index + 1
    if c in _HEX_WIDTH:
        digits = _HEX.match(src, index + 1, index + 1 + _HEX_WIDTH[c])
        if digits is None:
            return "\\" + c, index + 1
        code = int(digits.group(), 16)
        return (chr(code) if code <= 0x10FFFF else "\ufffd"), digits.end()
    octal = _OCTAL.match(src, index)
    if octal is not None:
        return chr(int(octal.group(), 8) & 0xFF), octal.end()
    if c == "c" and index + 1 < len(src):
        return chr(ord(src[index + 1]) & 0x1F), index + 2
    return "\\" + c, index + 1


def _clip(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- wrappers ----------------------------------------------------------------------------------

_SUDO_LONG_FLAGS = frozenset(
    {"--askpass", "--background", "--preserve-env", "--edit", "--set-home", "--login"}
    | {"--remove-timestamp", "--reset-timestamp", "--list", "--non-interactive", "--stdin"}
    | {"--preserve-groups", "--shell", "--version", "--validate", "--help"}
)
_SUDO_LONG_ARGS = frozenset(
    {"--close-from", "--chdir", "--group", "--host", "--prompt", "--chroot", "--role"}
    | {"--command-timeout", "--type", "--other-user", "--user"}
)
_WRAPPERS: dict[str, _Wrapper] = {
    "command": _Wrapper(short_flags="pvV", no_command="vV"),
    "builtin": _Wrapper(),
    "exec": _Wrapper(short_flags="cl", short_args="a"),
    "nohup": _Wrapper(),
    "setsid": _Wrapper(short_flags="cfw", long_flags=frozenset({"--ctty", "--fork", "--wait"})),
    "nice": _Wrapper(short_args="n", long_args=frozenset({"--adjustment"})),
    "ionice": _Wrapper(
        short_flags="t",
        short_args="cnpPu",
        long_flags=frozenset({"--ignore"}),
        long_args=frozenset({"--class", "--classdata", "--pid", "--pgid", "--uid"}),
    ),
    "timeout": _Wrapper(
        short_flags="vfp",
        short_args="sk",
        long_flags=frozenset({"--verbose", "--foreground", "--preserve-status"}),
        long_args=frozenset({"--signal", "--kill-after"}),
        operands=1,
    ),
    "stdbuf": _Wrapper(short_args="ioe", long_args=frozenset({"--input", "--output", "--error"})),
    "time": _Wrapper(
        short_flags="apqv",
        short_args="fo",
        long_flags=frozenset({"--append", "--portability", "--quiet", "--verbose"}),
        long_args=frozenset({"--format", "--output"}),
    ),
    "env": _Wrapper(
        short_flags="iv0",
        short_args="uC",
        long_flags=frozenset({"--ignore-environment", "--null", "--debug"}),
        long_args=frozenset({"--unset", "--chdir"}),
        assignments=True,
    ),
    "sudo": _Wrapper(
        short_flags="AbEeHiKklnPSsVv",
        short_args="CDghpRrTtUu",
        long_flags=_SUDO_LONG_FLAGS,
        long_args=_SUDO_LONG_ARGS,
        assignments=True,
        shell_flags="is",
    ),
    "doas": _Wrapper(short_flags="nsL", short_args="uC", shell_flags="s"),
    "xargs": _Wrapper(
        short_flags="0oprtx",
        short_args="adEILnPs",
        short_optional="eil",
        long_flags=frozenset(
            {"--null", "--interactive", "--no-run-if-empty", "--verbose", "--exit", "--eof"}
            | {"--open-tty", "--show-limits", "--replace", "--max-lines"}
        ),
        long_args=frozenset(
            {"--arg-file", "--delimiter", "--max-args", "--max-procs", "--max-chars"}
            | {"--process-slot-var"}
        ),
    ),
}
_WATCH = _Wrapper(
    short_flags="bcCdefgprtwx",
    short_args="nq",
    long_flags=frozenset(
        {"--beep", "--color", "--no-color", "--differences", "--errexit", "--chgexit"}
        | {"--precise", "--no-rerun", "--no-title", "--no-wrap", "--exec"}
    ),
    long_args=frozenset({"--interval", "--equexit"}),
)
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish"})
_EXEC_OPTIONS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "find": (frozenset({"-exec", "-execdir", "-ok", "-okdir"}), frozenset({";", "+"})),
    "fd": (frozenset({"-x", "--exec", "-X", "--exec-batch"}), frozenset({";"})),
    "fdfind": (frozenset({"-x", "--exec", "-X", "--exec-batch"}), frozenset({";"})),
}
_UNWRAPPERS: dict[str, Callable[[_Parser, str, tuple[_Word, ...], bool], None]] = {
    **dict.fromkeys(_WRAPPERS, _Parser._unwrap_wrapper),
    **dict.fromkeys(_SHELLS, _Parser._unwrap_shell),
    **dict.fromkeys(_EXEC_OPTIONS, _Parser._unwrap_exec_option),
    "eval": _Parser._unwrap_eval,
    "trap": _Parser._unwrap_trap,
    "watch": _Parser._unwrap_watch,
    "su": _Parser._unwrap_su,
    "runuser": _Parser._unwrap_su,
    "alias": _Parser._unwrap_alias,
}
# Builtins that take variable names: bash evaluates an array subscript in a name (`a[$(id)]`).
_ARGUMENT_CHECKS: dict[str, Callable[[_Parser, str, tuple[_Word, ...]], None]] = {
    **dict.fromkeys(
        ("unset", "read", "mapfile", "readarray", "test", "[", "wait", "getopts"),
        _Parser._check_variable_names,
    ),
    **dict.fromkeys(_DECLARATIONS, _Parser._check_declaration),
    "printf": _Parser._check_printf,
    "let": _Parser._check_let,
    "hash": _Parser._check_hash,
    "enable": _Parser._check_hash,
    "compgen": _Parser._check_compgen,
}
# -- what deny rules cannot see through (`opaque_reasons`)

_SOURCES = frozenset({"source", "."})
# Programs that run another program keel does not unwrap: a deny rule would see only them.
_LAUNCHERS = frozenset(
    {"busybox", "toybox", "strace", "ltrace", "chroot", "flock", "taskset", "chrt", "unshare"}
    | {"nsenter", "setpriv", "prlimit", "fakeroot", "proot", "parallel", "unbuffer", "script"}
    | {"catchsegv", "valgrind", "systemd-run", "run-parts", "at", "batch", "sg", "pkexec"}
    | {"firejail", "bwrap", "xvfb-run", "dbus-run-session", "numactl", "gdb", "rlwrap", "ssh"}
)
# Programs that write the files named in their arguments (a script run later in the line).
_WRITERS = frozenset(
    {"cp", "mv", "ln", "install", "tee", "touch", "chmod", "dd", "truncate", "rsync", "sed"}
    | {"curl", "wget", "mkfifo", "sponge", "scp"}
)
# Builtins that fill variables with text keel cannot see.
_VARIABLE_READERS = frozenset({"read", "mapfile", "readarray", "getopts"})
# Variables that decide which program a name runs, or run code in every shell.
_LOOKUP_ENV = frozenset(
    {"PATH", "BASH_ENV", "ENV", "BASH_ALIASES", "BASH_CMDS", "BASHOPTS", "SHELLOPTS", "PS4"}
    | {"PROMPT_COMMAND", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "EXECIGNORE"}
)
_FD_PLACEHOLDERS = ("{}", "{/}", "{//}", "{.}", "{/.}")
# find options whose next word is their argument (a value, not an action).
_FIND_ARGUMENT_OPTIONS = frozenset(
    {"-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex"}
    | {"-lname", "-ilname", "-type", "-xtype", "-newer", "-anewer", "-cnewer", "-user"}
    | {"-group", "-perm", "-size", "-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin"}
    | {"-maxdepth", "-mindepth", "-samefile", "-inum", "-links", "-uid", "-gid", "-fstype"}
    | {"-used", "-context", "-printf", "-regextype"}
    | {"-e", "--extension", "-t", "--type", "--max-depth", "-E", "--exclude", "-S"}
)


# Builtins whose option makes a name run something else, or runs a command.
_NAME_CHANGERS = {
    "hash": ("p", "changes which program a name runs"),
    "enable": ("f", "changes which program a name runs"),
    "compgen": ("CF", "runs a command or a function"),
}


def _skip_option_arguments(args: tuple[_Word, ...]) -> tuple[_Word, ...]:
    """The words of `read`/`mapfile` that are not options or their values: variable names."""
    names: list[_Word] = []
    skip = False
    for word in args:
        if skip:
            skip = False
        elif word.value is not None and word.value.startswith("-") and len(word.value) > 1:
            skip = word.value[-1] in "dinNptuOsCc"  # the option's value follows
        else:
            names.append(word)
    return tuple(names)


# Builtins that take a variable name from an argument (`_evaluated_names`).
_NAME_TAKERS = frozenset({"unset", "test", "[", "wait"})


def _evaluated_names(program: str, args: tuple[_Word, ...]) -> tuple[_Word, ...]:
    """The words `program` takes as variable names and evaluates, a subscript included (checked
    against bash 5.2): `unset`'s names (not with `-f`), the operand of `test -v`, `wait -p
    NAME`, `read`'s names, the `printf -v` target (`_check_printf` passes only that)."""
    if program == "unset":
        options = list(itertools.takewhile(lambda w: (w.value or "").startswith("-"), args))
        if any("f" in _short_options(w.value) for w in options):
            return ()
        return args[len(options) :]
    if program in ("test", "["):
        return tuple(name for flag, name in itertools.pairwise(args) if flag.value == "-v")
    if program == "wait":
        return tuple(
            name
            for flag, name in itertools.pairwise(args)
            if _short_options(flag.value) and (flag.value or "").endswith("p")
        )
    if program == "read":
        return _skip_option_arguments(args)
    return args if program == "printf" else ()


def _may_be_name_option(program: str, args: tuple[_Word, ...]) -> bool:
    """Whether a word that is not literal may be an option naming a variable: any in `wait`
    but `$!` (`-pNAME`), one in `test`/`[` followed by an operand (`-v`)."""
    if program == "wait":
        return any(w.value is None and not _numeric(w) for w in args)
    if program in ("test", "["):
        operands = args[:-1] if program == "[" and args and args[-1].value == "]" else args
        return any(
            first.value is None and second.value not in _TEST_BINARY
            for first, second in itertools.pairwise(operands)
        )
    return False


def _numeric(word: _Word) -> bool:
    """`$!`, `"$#"`: a parameter that always holds a number."""
    return _INTEGER.fullmatch(_NUMERIC_PARAMETER.sub("0", word.text)) is not None


def _reads_variables(expression: str) -> bool:
    """Whether arithmetic on `expression` reads a variable, whose value bash evaluates in turn
    (`$#` and `${#x}` only ever hold numbers)."""
    return _ARITH_VARIABLE.search(_NUMERIC_PARAMETER.sub("0", expression)) is not None


def _subscript_reads_variables(name: str | None) -> bool:
    """`a[i]`, `a[$x]`: bash evaluates the subscript of a variable name as arithmetic."""
    return name is not None and "[" in name and _reads_variables(name.partition("[")[2])


def _xargs_replace_string(options: tuple[_Word, ...]) -> str | None:
    """The replace string of `xargs -I R` / `-i[R]` / `--replace[=R]`, None without one."""
    for index, word in enumerate(options):
        value = word.value or ""
        if value == "-I" and index + 1 < len(options):
            return options[index + 1].value or options[index + 1].text
        if value.startswith("-I") and len(value) > 2:
            return value[2:]
        if value.startswith("-i"):
            return value[2:] or "{}"
        if value == "--replace" or value.startswith("--replace="):
            return value.partition("=")[2] or "{}"
    return None


def _shown(words: Iterable[_Word]) -> str:
    return " ".join(w.text for w in words)


# -- matching ----------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> str:
    pattern = " ".join(pattern.split())
    tail = ""
    if pattern.endswith((":*", " *")):
        pattern, tail = pattern[:-2].rstrip(), "(?: .*)?"  # whole words: `git commit *`
    return ".*".join(re.escape(part) for part in pattern.split("*")) + tail


def _could_match(pattern: str, prefix: str) -> bool:
    """Whether `pattern` matches `prefix` or some command that goes on from `prefix` with
    more words (the ones keel cannot read)."""
    if re.fullmatch(_pattern_regex(pattern), prefix, re.DOTALL):
        return True
    pattern = " ".join(pattern.split())
    whole_words = pattern.endswith((":*", " *"))
    head = pattern[:-2].rstrip() if whole_words else pattern
    first, star, _ = head.partition("*")
    more = prefix + " "
    if star:
        return more.startswith(first) or first.startswith(more)
    if whole_words:
        return head.startswith(more) or more.startswith(head + " ")
    return head.startswith(more)


def _deny_views(command: _Command) -> list[str]:
    """The command as written, and as it could run: quotes removed, the program without its
    directory (`/bin/rm`), braces expanded (`{rm,-rf,x}`)."""
    values = [w.value if w.value is not None else w.text for w in command.words]
    views = [command.text, " ".join(values)]
    if "/" in values[0]:
        views.append(" ".join([posixpath.basename(values[0]), *values[1:]]))
    if any("{" in v for v in values):
        views.append(" ".join(part for v in values for part in _brace_expand(v)))
    return views


def _brace_expand(word: str, limit: int = 64) -> list[str]:
    """Bash brace expansion of comma lists (`r{m,}` → `rm`, `r`), at most `limit` results."""
    done: list[str] = []
    todo = [word]
    while todo and len(done) < limit:
        item = todo.pop(0)
        span = _brace_span(item)
        if span is None or len(todo) > limit:
            done.append(item)
            continue
        start, end, alternatives = span
        todo[0:0] = [item[:start] + a + item[end + 1 :] for a in alternatives]
    return done


def _brace_span(text: str) -> tuple[int, int, list[str]] | None:
    """The first `{a,b}` group of `text`: its start, end and alternatives."""
    for start, c in enumerate(text):
        if c != "{":
            continue
        depth, cuts = 0, [start]
        for index in range(start, len(text)):
            depth += (text[index] == "{") - (text[index] == "}")
            if text[index] == "," and depth == 1:
                cuts.append(index)
            if depth == 0:
                if len(cuts) > 1:
                    cuts.append(index)
                    return start, index, [text[a + 1 : b] for a, b in itertools.pairwise(cuts)]
                break
    return None


_FRAGMENT_SPLIT = re.compile(r"[;&|()\n`{}<>]|\$\(")
_STRIP_QUOTES = str.maketrans("", "", "'\"\\")


def _fragments(command: str) -> Iterator[str]:
    """For a line that does not parse: every run of words between operators, from each word."""
    for part in _FRAGMENT_SPLIT.split(command):
        words = part.replace("\\\n", "").translate(_STRIP_QUOTES).split()
        for start in range(len(words)):
            yield " ".join(words[start:])


# -- safe list ---------------------------------------------------------------------------------

_READ_ONLY_ANY_ARGS = frozenset(
    {"ls", "cat", "head", "tail", "wc", "which", "echo", "du", "df", "grep"}
)
_READ_ONLY_EXACT = frozenset(
    {"pwd", "whoami", "date", "go version", "go env", "git --version", "uv --version"}
    | {f"{tool} --version" for tool in ("python", "python3", "node", "npm", "pnpm", "yarn")}
    | {f"{tool} --version" for tool in ("bun", "deno", "cargo", "rustc", "pip", "pip3")}
)
_GIT_READ_ONLY = frozenset({"status", "diff", "log", "show", "branch"})
_GIT_BRANCH_LISTING = frozenset(
    {"-a", "-r", "-v", "-vv", "-l", "--all", "--remotes", "--verbose", "--list"}
    | {"--show-current", "--color", "--no-color", "--no-column"}
)
_DATE_FLAGS = frozenset({"-u", "--utc", "--universal", "-R", "--rfc-email"})


def _git_read_only(args: list[str]) -> bool:
    if args[:1] == ["--no-pager"]:
        args = args[1:]
    if not args or args[0] not in _GIT_READ_ONLY:
        return False
    rest = args[1:]
    if any(a.startswith(("--output", "--ext-diff")) for a in rest):
        return False  # `git diff --output=FILE` writes a file
    if args[0] == "branch":  # `git branch NAME`, `-d`, `-m`… change branches
        return all(a in _GIT_BRANCH_LISTING or a.startswith(("--format=", "--sort=")) for a in rest)
    return True


def _date_read_only(args: list[str]) -> bool:
    return all(
        a.startswith(("+", "-I", "--iso-8601", "--rfc-3339=")) or a in _DATE_FLAGS for a in args
    )


def _rg_read_only(args: list[str]) -> bool:
    return not any(a.startswith(("--pre", "--hostname-bin")) for a in args)  # both run programs


_READ_ONLY_CHECKS: dict[str, Callable[[list[str]], bool]] = {
    "git": _git_read_only,
    "date": _date_read_only,
    "rg": _rg_read_only,
}


def _is_read_only_command(command: _Command) -> bool:
    words = command.words
    if words[0].value in _READ_ONLY_ANY_ARGS:
        return True
    # Flags decide what the others do, so their arguments must be literal: no `$x`, no glob.
    if not all(w.plain for w in words):
        return False
    values = [w.value or "" for w in words]
    if " ".join(values) in _READ_ONLY_EXACT:
        return True
    check = _READ_ONLY_CHECKS.get(values[0])
    return check is not None and check(values[1:])


# -- suggestions -------------------------------------------------------------------------------

_SUBCOMMAND_TOOLS = frozenset(
    {"git", "go", "npm", "pnpm", "yarn", "cargo", "docker", "kubectl", "make", "uv", "bun"}
    | {"pip", "pip3", "poetry", "gh", "dotnet", "helm", "terraform", "deno"}
    | {"npx", "pnpx", "bunx", "uvx"}
)
# Subcommands that run whatever the next word names: the rule must name it too.
_RUNNERS: dict[str, frozenset[str]] = {
    "npm": frozenset({"run", "run-script", "exec", "x"}),
    "pnpm": frozenset({"run", "exec", "dlx"}),
    "yarn": frozenset({"run", "exec", "dlx"}),
    "bun": frozenset({"run", "x"}),
    "uv": frozenset({"run"}),
    "poetry": frozenset({"run"}),
    "go": frozenset({"run"}),
    "docker": frozenset({"run", "exec"}),
    "kubectl": frozenset({"exec"}),
    "deno": frozenset({"run"}),
}
_INTERPRETERS = frozenset({"python", "python3", "node", "ruby", "perl", "php", "bash", "sh", "zsh"})


def _rule_for(command: _Command) -> str:
    words = [w.text for w in command.words]
    length = _rule_prefix_length(words)
    if length is None:
        body, rule = command.text, command.text
    else:
        body = " ".join(words[:length])
        rule = f"{body} *"
    # A `*` in the command would read as a wildcard and allow more than was approved.
    return "" if "*" in body else f"bash({rule})"


def _rule_prefix_length(words: list[str]) -> int | None:
    """How many leading words the suggested rule keeps; None for the exact command."""
    program = words[0]
    if program not in _SUBCOMMAND_TOOLS and program not in _INTERPRETERS:
        return 1
    if len(words) == 1:  # `make`, `python`: the exact command (`python *` would allow `-c …`)
        return None
    second = words[1]
    if (second == "-m" and program in _INTERPRETERS) or second in _RUNNERS.get(program, ()):
        return 3 if len(words) > 2 and not words[2].startswith("-") else None
    return None if second.startswith("-") else 2
