"""`keel` without `-p`: the interactive session. Picks the front end (the Textual app on a
terminal, the line mode with `--no-tui` or when stdin or stdout is not a terminal), builds the
first agent before any screen opens (so a bad model or a missing key is one line on stderr, exit
2), and explains how to get started when no model can be chosen at all (exit 0). Checkpoints
older than the retention are pruned here, for every project.

textual and rich are imported only here and below, never by `keel --version` or `keel -p`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keel.cli import main as cli
from keel.config.settings import Settings, load_settings, user_config_dir
from keel.errors import UserError
from keel.llm.catalog import ModelRef
from keel.llm.events import Notice

if TYPE_CHECKING:
    from keel.tui.control import Controller

FIRST_RUN = """\
keel needs a model to talk to, and found no API key and no local server.

  Anthropic:  export ANTHROPIC_API_KEY=sk-ant-…   then run keel
  OpenAI:     export OPENAI_API_KEY=sk-…          then run keel
  Gemini:     export GEMINI_API_KEY=…             then run keel
  Ollama:     keel --model ollama/qwen3:8b        (a model you have pulled; the server is
              expected at http://localhost:11434, else export OLLAMA_HOST=URL)
  LM Studio:  keel --model lmstudio/MODEL         (the model you loaded; the server is
              expected at http://localhost:1234/v1, else export LMSTUDIO_BASE_URL=URL)

A default model can go in {settings} as {{"model": "anthropic/claude-sonnet-4-5"}}.
To look around offline first: keel --model scripted:demo
"""

#: A local server named by one of these (its model must still be chosen).
LOCAL_SERVER_VARIABLES = ("OLLAMA_HOST", "LMSTUDIO_BASE_URL", "OPENAI_COMPATIBLE_BASE_URL")


class FirstRun(Exception):
    """No model, no key, no local server: the user needs the getting-started text."""


def pick_model(args: argparse.Namespace, settings: Settings) -> ModelRef:
    """The model to start with. Raises `FirstRun` when nothing at all is configured, and a
    `UserError` when only a local server is (its model must be named)."""
    from keel.app import DEFAULT_MODELS, choose_model

    keys = any(os.environ.get(var) for var, _model in DEFAULT_MODELS)
    if not (args.model or settings.model or keys):
        local = next(
            ((var, os.environ[var]) for var in LOCAL_SERVER_VARIABLES if os.environ.get(var)),
            None,
        )
        if local is None:
            raise FirstRun
        provider = {"OLLAMA_HOST": "ollama", "LMSTUDIO_BASE_URL": "lmstudio"}.get(
            local[0], "openai-compatible"
        )
        raise UserError(
            f"a local server is configured ({local[0]}={local[1]}) but no model",
            hint=f"name the model it serves: keel --model {provider}/NAME, or set "
            '"model" in settings',
        )
    return choose_model(args.model, settings)


def _prune_checkpoints() -> None:
    """Snapshots for /undo older than 7 days go, in every project (sessions never reopened
    would otherwise keep theirs forever)."""
    from keel.checkpoints import prune_all
    from keel.session.store import keel_home

    try:
        prune_all(keel_home() / "sessions")
    except OSError as exc:  # a shared or read-only home: keep going, say why
        sys.stderr.write(f"keel: warning: could not prune old checkpoints: {exc}\n")


def use_tui(args: argparse.Namespace) -> bool:
    return not args.no_tui and sys.stdout.isatty() and sys.stdin.isatty()


def run_interactive(args: argparse.Namespace) -> int:
    if args.output_format != "text":
        raise cli.ArgumentError("--output-format needs -p (it shapes a headless run's output)")
    if args.input_format != "text":
        raise cli.ArgumentError("--input-format needs -p (it feeds a headless run)")
    cwd = Path(args.cwd).expanduser().resolve() if args.cwd else Path.cwd()
    if not cwd.is_dir():
        raise UserError(f"--cwd {args.cwd}: no such directory")
    from keel.permissions.sandbox import start_probe

    start_probe()  # its wait for bubblewrap overlaps the set-up and the UI's imports below
    session: Path | None = None
    if args.resume or args.continue_session:
        from keel.session.index import find_session, latest_session

        session = find_session(args.resume, cwd) if args.resume else latest_session(cwd)
    settings = load_settings(cwd)
    ref: ModelRef | None = None
    if session is None:
        try:
            ref = pick_model(args, settings)
        except FirstRun:
            sys.stderr.write(FIRST_RUN.format(settings=user_config_dir() / "settings.json"))
            return cli.EXIT_OK  # nothing went wrong: there is just nothing to talk to yet
    from keel.cli.datafolder import check_data_folder

    check_data_folder(writing=not args.no_session)  # before any screen opens
    prompt = " ".join(args.prompt_words).strip()
    _prune_checkpoints()
    return asyncio.run(_session(args, cwd, settings, ref, session, prompt))


async def _session(
    args: argparse.Namespace,
    cwd: Path,
    settings: Settings,
    ref: ModelRef | None,
    session: Path | None,
    prompt: str,
) -> int:
    from keel.tui.control import AgentFactory, Controller

    controller = Controller(AgentFactory(args, cwd=cwd, settings=settings))
    for warning in settings.warnings:
        controller.show(Notice(warning, "warning"))
    if session is not None:
        await controller.start_session(session)
    else:
        assert ref is not None
        await controller.start_fresh(ref)
    if use_tui(args):
        from keel.tui.app import KeelApp

        app = KeelApp(controller, prompt=prompt)
        try:
            await app.run_async()
        finally:
            await controller.close()
        _print_resume_hint(controller)
        return cli.EXIT_OK
    from keel.tui.line import run_line

    code = await run_line(controller, prompt=prompt)
    _print_resume_hint(controller)
    return code


def _print_resume_hint(controller: Controller) -> None:
    """After the session closed (its file unlocked): how to go on with it, when one was
    written to."""
    hint = controller.resume_hint()
    if hint:
        sys.stdout.write(hint + "\n")
        sys.stdout.flush()


__all__ = [
    "FIRST_RUN",
    "LOCAL_SERVER_VARIABLES",
    "FirstRun",
    "pick_model",
    "run_interactive",
    "use_tui",
]
