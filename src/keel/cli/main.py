"""`keel`: the command-line entry point.

Parses arguments with argparse (cheap to import: `keel --version` must load nothing heavy),
dispatches subcommands, and turns every keel error into one line with a hint and a documented
exit code. Tracebacks only with `--debug`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence

from keel import __version__

# Exit codes (documented in docs/headless.md).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3  # budget, max_turns, loop guard
EXIT_INCOMPLETE = 4  # max_tokens, refusal
EXIT_BLOCKED = 5  # a hook blocked or stopped the run
EXIT_SUSPENDED = 6
EXIT_UNKNOWN_OUTCOME = 7  # a call not safe to repeat was cut off: resume with --rerun or --skip
EXIT_NOT_WRITTEN = 8  # keel init: a change was proposed and not written (declined, or no --yes)
EXIT_INTERRUPTED = 130
EXIT_OUTPUT_CLOSED = 141  # the reader of stdout went away (`keel -p … | head`), as for SIGPIPE


class ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so errors get keel's one-line format."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ArgumentError(message)


def _dollars(text: str) -> float:
    """A USD budget: a finite number above 0 (`nan`, `inf` and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of dollars, not {text!r}")
    return value


def _whole(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text) if text.strip().lstrip("+-").isdigit() else None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be a whole number from {low} to {high:,}{what}, not {text!r}"
            )
        return value

    return parse


def _run_options(p: argparse.ArgumentParser) -> None:
    """Options of anything that runs the agent (a new run, or a resumed one)."""
    p.add_argument(
        "-m",
        "--model",
        help="provider/model, e.g. anthropic/claude-sonnet-4-5, "
        "openai/gpt-5, openai-compatible/NAME, scripted:FILE",
    )
    p.add_argument(
        "--output-format",
        choices=("text", "json", "stream-json"),
        default="text",
        help="text (default), json (one object at the end), stream-json (one event per line)",
    )
    p.add_argument(
        "--input-format",
        choices=("text", "stream-json"),
        default="text",
        help="with -p: text (the prompt, default) or stream-json (prompts, answers to permission "
        "questions and interrupts, one JSON object per line on stdin; needs --output-format "
        "stream-json)",
    )
    p.add_argument(
        "--max-turns", type=int, help="model turns per prompt before stopping (default 200)"
    )
    p.add_argument(
        "--max-budget-usd", type=_dollars, help="stop once the session has cost this much"
    )
    p.add_argument(
        "--max-tokens-budget",
        type=_whole(0, 10**12, " (0: no token budget)"),
        help="stop once the session has used this many tokens (input + output + cache reads + "
        "cache writes; keel -p default 10000000, 0 for none)",
    )
    p.add_argument(
        "--max-subagents",
        type=_whole(0, 10_000, ""),
        help="subagents one prompt may start (default 32, or subagents.max_total in settings)",
    )
    p.add_argument(
        "--max-retries",
        type=_whole(0, 20, ""),
        default=3,
        help="retries of a failed model request before giving up (default 3)",
    )
    p.add_argument("--effort", choices=("low", "medium", "high", "max"), help="reasoning effort")
    p.add_argument(
        "--force", action="store_true", help="resume even though the model or configuration changed"
    )
    p.add_argument(
        "--mode",
        choices=("default", "accept-edits", "plan", "bypass", "auto"),
        help="permission mode (default: asks before edits and unsandboxed commands; "
        "headless runs deny what would ask; auto: a model classifier decides those questions)",
    )
    add_rule_flags(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no tool activity on stderr")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def add_rule_flags(p: argparse.ArgumentParser) -> None:
    """`--allowed-tools` / `--disallowed-tools`, for every command that builds an agent."""
    p.add_argument(
        "--allowed-tools",
        action="append",
        default=[],
        metavar="RULES",
        help='pre-approve, e.g. "bash(npm test*),edit(src/**)" (repeatable)',
    )
    p.add_argument(
        "--disallowed-tools",
        action="append",
        default=[],
        metavar="RULES",
        help='deny, e.g. "bash(git push*),web_fetch" (repeatable)',
    )


#: `keel --help`'s list of subcommands: (`keel …` usage, what it does). Every command
#: `SUBCOMMANDS` dispatches is here (a test checks it).
COMMAND_HELP: tuple[tuple[str, str], ...] = (
    ("init [--yes]", "write or update AGENTS.md"),
    ("resume ID [PROMPT]", "continue a session that stopped"),
    ("suspend ID", "stop a running session at a safe point"),
    ("fork ID [--at SEQ]", "copy a session (up to prompt SEQ)"),
    ("compact ID", "summarize a stopped session now"),
    ("undo ID [--list] [N]", "put back the files a session changed"),
    ("sessions list|show|rm|path", "this project's sessions (--all: all)"),
    ("replay ID", "re-drive a session offline: the diff"),
    ("trace [ID] [stats|--html|--atif]", "a session's debug trace"),
    ("doctor", "what keel sees here, and what is wrong"),
    ("trust [list|approve|revoke]", "approve what the project asks for"),
    ("hooks [list|approve]", "the hooks that apply here"),
    ("mcp [list|approve|login|serve]", "MCP servers here; serve: keel as one"),
    ("skills", "skills and custom commands found here"),
    ("plugin [list|install|enable|…]", "Claude Code plugins and marketplaces"),
    ("models [PROVIDER] [--json]", "models keel knows: window, prices"),
    ("worktrees [list|rm]", "subagents' worktrees kept for review"),
    ("memory list|show|rm", "notes the model keeps across sessions"),
    ("knowledge index|search|status", "a search index of the project's docs"),
    ("bench --models M[,M…]", "graded tasks: a report per model"),
    ("serve [--port N]", "an HTTP + SSE API for UIs and scripts"),
    ("attach URL [SESSION]", "drive a served session from here"),
    ("acp", "an agent for editors (ACP)"),
    ("serve-tools --identity NAME", "serve tools to keel agents over NATS"),
    ("fleet up|down|status|init", "the fleet's NATS server"),
    ("submit PROMPT --workspace W", "queue a run for the fleet's workers"),
    ("worker [--concurrency N]", "take queued runs until SIGTERM"),
    ("runs list|show|answer|retry|…", "the fleet's runs (also wait, cancel)"),
    ("schedules list|show|rm", "runs queued later or on a cron"),
    ("workers", "the fleet's live workers and their runs"),
)

PROMPT_OR_COMMAND = """\
Prompt or command: `keel WORDS…` is a prompt, unless its first word is a
command of other tools (login, update, config, help…) or close to one of
keel's (sesions), and nothing follows it but arguments (list, show, ids,
paths, options): that is an unknown command (one line, exit 2, nothing is
sent to a model). A sentence is a prompt (keel explain this code), and so is
every word after -- (keel -- login)."""


def _epilog() -> str:
    width = max(len(usage) for usage, _ in COMMAND_HELP) + len("keel ")
    lines = [f"  {'keel ' + usage:<{width}}  {what}" for usage, what in COMMAND_HELP]
    return "\n".join(
        [
            "commands (`keel COMMAND --help` for each; ID and RUN: an id or a unique prefix):",
            *lines,
            "",
            PROMPT_OR_COMMAND,
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel",
        description="keel: a coding agent and durable agent runtime.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "prompt_words",
        nargs="*",
        metavar="PROMPT",
        help="the prompt (with -p); without -p, the interactive session's first prompt",
    )
    p.add_argument(
        "-p",
        "--print",
        dest="headless",
        action="store_true",
        help="run one prompt headless and print the result (prompt from args or stdin)",
    )
    _run_options(p)
    p.add_argument("-r", "--resume", metavar="ID", help="continue session ID")
    p.add_argument(
        "-c",
        "--continue",
        dest="continue_session",
        action="store_true",
        help="continue the latest session in this directory",
    )
    p.add_argument("--cwd", help="work in this directory instead of the current one")
    p.add_argument("--no-session", action="store_true", help="do not write a session file")
    p.add_argument(
        "--no-tui",
        action="store_true",
        help="interactive, but line by line on stdin/stdout (also when they are not a terminal)",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="with -p: end after the answer, stopping background tasks still running",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def resume_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel resume",
        description="Continue a session that stopped (suspended, "
        "crashed, over budget…): unanswered tool calls run, then the model goes on. "
        "With a prompt, it then runs that prompt too.",
    )
    p.add_argument("session", metavar="ID", help="session id or a unique prefix")
    p.add_argument("prompt_words", nargs="*", metavar="PROMPT", help="a prompt to run afterwards")
    p.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="CALL_ID",
        help="run again a call whose outcome is unknown (keel stopped while it ran)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CALL_ID",
        help="do not run it again: the model is told its outcome is unknown",
    )
    _run_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # httpx imports its own command-line client (click and rich, ~30 ms) whenever click is
    # installed, which the mcp package brings in. keel never runs it; this process is ours.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    debug = "--debug" in args_list or os.environ.get("KEEL_DEBUG") == "1"
    if debug:
        _show_sdk_log()
    if argv is None and _headless(args_list):  # this process is `keel -p`, not a caller's
        from keel.startup import pause_gc

        pause_gc()  # until the first model reply (keel.startup)
    fmt = _output_format(args_list)
    try:
        return _dispatch(args_list)
    except ArgumentError as exc:
        return _fail(EXIT_USAGE, f"{exc}", "run `keel --help` for usage", fmt)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `keel sessions list | head`: the reader has what it wanted
        _quiet_stdout()
        return EXIT_OUTPUT_CLOSED
    except Exception as exc:
        from keel.errors import KeelError, UserError

        if debug:
            import traceback

            traceback.print_exc()
        error: Exception = exc
        if isinstance(exc, OSError):  # a data folder keel cannot write, found late
            from keel.cli.datafolder import data_folder_error

            error = data_folder_error(exc) or exc
        if isinstance(error, KeelError):
            code = EXIT_USAGE if isinstance(error, UserError) else EXIT_ERROR
            return _fail(code, error.message.replace("\n", " "), error.hint, fmt)
        message = f"internal error: {type(exc).__name__}: {exc}"
        if debug:  # the traceback is on stderr already
            return _fail(EXIT_ERROR, message, "", fmt, say=False)
        return _fail(EXIT_ERROR, message, "run with --debug for the traceback", fmt)
    finally:
        if (startup := sys.modules.get("keel.startup")) is not None:
            startup.resume_gc()  # a run that ended before any reply
        _flush_exports()


def _show_sdk_log() -> None:
    """With --debug, the MCP SDK's log (tracebacks included) is printed on stderr; otherwise it
    stays quiet (keel.mcp.client), as keel reports each failure in one line of its own."""
    import logging

    logging.getLogger("mcp").addHandler(logging.StreamHandler(sys.stderr))


def _headless(argv: list[str]) -> bool:
    """A one-shot run (`keel -p`, `keel resume`): the ones whose start-up pauses the collector.
    Never the TUI, the server or a worker, which may wait long before their first reply."""
    if argv and argv[0] in SUBCOMMANDS:
        return argv[0] == "resume"
    return any(
        a in ("-p", "--print") or (a.startswith("-p") and not a.startswith("--")) for a in argv
    )


def _flush_exports() -> None:
    """Send what an OpenTelemetry export still buffers (loaded only when it was on)."""
    otel = sys.modules.get("keel.trace.otel")
    if otel is not None:
        for line in otel.shutdown():
            print(f"keel: warning: {line}", file=sys.stderr)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass  # no real stdout: nothing will be flushed to it


def _error(message: str, hint: str = "") -> None:
    from keel.safetext import terminal_safe  # a server's or a file's words: no escapes

    one_line = hint.replace("\n", " ")
    suffix = f" (hint: {one_line})" if hint else ""
    print(terminal_safe(f"keel: error: {message}{suffix}"), file=sys.stderr)


#: The output formats that print JSON on stdout (docs/headless.md).
JSON_FORMATS = ("json", "stream-json")


def _output_format(argv: list[str]) -> str:
    """The JSON `--output-format` this invocation asks for ("" for text or none), read before
    parsing: an error in the arguments themselves must still answer in JSON."""
    fmt = ""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if len(name) > len("--o") and "--output-format".startswith(name):
            fmt = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return fmt if fmt in JSON_FORMATS else ""


def error_result(message: str, hint: str, exit_code: int) -> dict[str, object]:
    """The `result` object of a run that never ran (bad input, exit 2) or failed outside the
    loop: the keys of a finished run's (`keel.app.jsonout.result_json`), plus `subtype`,
    `hint` and `exit_code`."""
    return {
        "type": "result",
        "subtype": "error",
        "result": "",
        "stop_reason": None,
        "is_error": True,
        "error": message,
        "hint": hint,
        "exit_code": exit_code,
        "session_id": None,
        "session_path": None,
        "model": None,
        "turns": 0,
        "usage": {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0},
        "cache_read_share": 0.0,
        "cost_usd": 0.0,
        "duration_ms": 0,
    }


def _fail(code: int, message: str, hint: str, fmt: str, *, say: bool = True) -> int:
    """Report an error: one line on stderr; with a JSON output format, also its `result`
    object on stdout, so a script reading stdout learns what went wrong."""
    if say:
        _error(message, hint)
    if fmt:
        import json

        try:
            print(json.dumps(error_result(message, hint, code), ensure_ascii=False), flush=True)
        except BrokenPipeError:
            _quiet_stdout()
    return code


def _resume(argv: list[str]) -> int:
    from pathlib import Path

    from keel.cli.headless import read_prompt, resume_target, run_resume

    args = resume_parser().parse_args(argv)
    target = resume_target(args.session, Path.cwd())
    prompt = read_prompt(args.prompt_words, sys.stdin, required=False)
    return run_resume(target, prompt, args)


def compact_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel compact",
        description="Summarize a session's conversation now, so "
        "the next resume starts from the summary (the session must not be running).",
    )
    p.add_argument("session", metavar="ID", help="session id or a unique prefix")
    p.add_argument("instructions", nargs="*", help="what the summary should keep in particular")
    _run_options(p)
    return p


def _compact(argv: list[str]) -> int:
    from pathlib import Path

    from keel.cli.headless import run_compact
    from keel.session.index import find_session

    args = compact_parser().parse_args(argv)
    return run_compact(find_session(args.session, Path.cwd()), " ".join(args.instructions), args)


def _sessions_command(name: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from keel.cli import sessions

        return sessions.COMMANDS[name](argv)

    return run


def _doctor(argv: list[str]) -> int:
    from keel.cli.doctor import doctor

    return doctor(argv)


def _hooks(argv: list[str]) -> int:
    from keel.cli.hooks import hooks

    return hooks(argv)


def _mcp(argv: list[str]) -> int:
    from keel.cli.extensions import mcp

    return mcp(argv)


def _skills(argv: list[str]) -> int:
    from keel.cli.extensions import skills

    return skills(argv)


def _trust(argv: list[str]) -> int:
    from keel.cli.trust import trust

    return trust(argv)


def _models(argv: list[str]) -> int:
    from keel.cli.models import models

    return models(argv)


def _init(argv: list[str]) -> int:
    from keel.cli.init import init

    return init(argv)


def _undo(argv: list[str]) -> int:
    from keel.cli.undo import undo

    return undo(argv)


def _replay(argv: list[str]) -> int:
    from keel.cli.replay import replay

    return replay(argv)


def _serve(argv: list[str]) -> int:
    from keel.cli.serve import serve

    return serve(argv)


def _attach(argv: list[str]) -> int:
    from keel.cli.attach import attach

    return attach(argv)


def _serve_tools(argv: list[str]) -> int:
    from keel.cli.serve_tools import serve_tools

    return serve_tools(argv)


def _acp(argv: list[str]) -> int:
    from keel.cli.acp import acp

    return acp(argv)


def _trace(argv: list[str]) -> int:
    from keel.cli.trace import trace

    return trace(argv)


def _knowledge(argv: list[str]) -> int:
    from keel.cli.knowledge import knowledge

    return knowledge(argv)


def _bench(argv: list[str]) -> int:
    from keel.cli.bench import bench

    return bench(argv)


def _memory(argv: list[str]) -> int:
    from keel.cli.memory import memory

    return memory(argv)


def _worktrees(argv: list[str]) -> int:
    from keel.cli.worktrees import worktrees

    return worktrees(argv)


def _plugin(argv: list[str]) -> int:
    from keel.cli.plugin import plugin

    return plugin(argv)


def _fleet(argv: list[str]) -> int:
    from keel.cli.fleet_ops import fleet

    return fleet(argv)


def _schedules(argv: list[str]) -> int:
    from keel.cli.schedules import schedules

    return schedules(argv)


def _runs_command(name: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from keel.cli import runs

        command: Callable[[list[str]], int] = getattr(runs, name)
        return command(argv)

    return run


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "doctor": _doctor,
    "init": _init,
    "hooks": _hooks,
    "mcp": _mcp,
    "trust": _trust,
    "skills": _skills,
    "plugin": _plugin,
    "models": _models,
    "worktrees": _worktrees,
    "memory": _memory,
    "trace": _trace,
    "knowledge": _knowledge,
    "bench": _bench,
    "resume": _resume,
    "compact": _compact,
    "suspend": _sessions_command("suspend"),
    "undo": _undo,
    "replay": _replay,
    "serve": _serve,
    "attach": _attach,
    "serve-tools": _serve_tools,
    "fork": _sessions_command("fork"),
    "sessions": _sessions_command("sessions"),
    "acp": _acp,
    "fleet": _fleet,
    "submit": _runs_command("submit"),
    "worker": _runs_command("worker"),
    "runs": _runs_command("runs"),
    "schedules": _schedules,
    "workers": _runs_command("workers"),
}


def _mistyped(argv: list[str], words: list[str]) -> Exception | None:
    """The error for prompt `words` that read as a mistyped command (keel.cli.mistyped);
    never after `--` (`keel -- login`: the words are a prompt, whatever they are)."""
    if "--" in argv or not words or words[0].startswith("-"):
        return None
    from keel.cli.mistyped import mistyped_command

    return mistyped_command(words, SUBCOMMANDS)


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except ArgumentError:  # `keel sesions list --all`: the typo is the error to report
        if (mistyped := _mistyped(argv, argv)) is not None:
            raise mistyped from None
        raise
    if args.version:
        print(f"keel {__version__}")
        return EXIT_OK
    if args.resume and args.continue_session:
        raise ArgumentError("--resume and --continue cannot be used together")
    if (mistyped := _mistyped(argv, args.prompt_words)) is not None:
        raise mistyped
    if not args.headless:
        from keel.cli.interactive import run_interactive

        return run_interactive(args)
    from keel.permissions.sandbox import start_probe

    start_probe()  # its wait for bubblewrap overlaps the imports and set-up below
    from keel.cli.headless import run_headless

    return run_headless(args)


if __name__ == "__main__":
    sys.exit(main())
