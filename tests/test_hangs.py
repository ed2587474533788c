"""Nothing hangs: tools refuse files that would block, hooks and commands end at their deadline
with every process they started (detached ones included), cancellation returns at once, and keel
itself ends on SIGTERM / SIGINT without a traceback.

Every attack runs for real (FIFOs, devices, detached `sleep`s, a real `keel -p` process) and is
bounded by a watchdog thread, so that on code that hangs the test fails instead of hanging too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from keel.hooks.config import HookCommand
from keel.hooks.runner import HookRun, _run_command
from keel.permissions.sandbox import Sandbox, probe
from keel.tools.base import ToolContext, ToolError, ToolOutput
from keel.tools.builtin import bash, edit, glob, grep, read, write
from keel.tools.builtin import files as files_module
from tests.test_cli import session_files, write_script

T = TypeVar("T")
needs_bwrap = pytest.mark.skipif(not probe().ok, reason=f"no working bubblewrap: {probe().detail}")
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
SEARCH_MODES = ["ripgrep", "python"]


def bounded(make: Callable[[], Awaitable[T]], seconds: float) -> tuple[T, float]:
    """Run `make()` on its own event loop in a daemon thread; fail (rather than hang) when it
    has not finished after `seconds`. Returns (result, wall seconds)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(make())  # type: ignore[arg-type]
        except BaseException as exc:  # handed back to the test below
            box["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    took = time.monotonic() - start
    assert not thread.is_alive(), f"still running after {seconds} s: it hangs"
    if "error" in box:
        raise box["error"]
    return box["value"], took


async def call(tool: object, ctx: ToolContext, **args: object) -> ToolOutput:
    assert hasattr(tool, "run")
    return await tool.run(ctx, args)  # type: ignore[no-any-return]


async def error_of(tool: object, ctx: ToolContext, **args: object) -> str:
    with pytest.raises(ToolError) as info:
        await call(tool, ctx, **args)
    return str(info.value)


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    return ToolContext(cwd=project, root=project, env=dict(os.environ))


@pytest.fixture
def fifo(project: Path) -> Iterator[Path]:
    path = project / "pipe"
    os.mkfifo(path)
    yield path
    # Release anything still blocked opening it for reading (only code that hangs is).
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture(params=SEARCH_MODES)
def search_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    mode: str = request.param
    if mode == "python":
        monkeypatch.setenv("KEEL_NO_RIPGREP", "1")
    else:
        monkeypatch.delenv("KEEL_NO_RIPGREP", raising=False)
        if not __import__("shutil").which("rg"):
            pytest.skip("ripgrep (rg) is not installed")
    return mode


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def with_marker(command: str) -> list[int]:
    """Live processes whose command line is exactly `command` (words split on spaces)."""
    wanted = b"".join(word.encode() + b"\0" for word in command.split(" "))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == wanted and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def gone_soon(check: Callable[[], bool], seconds: float = 2.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


def pids_in(directory: Path, *names: str) -> list[int]:
    for _ in range(200):
        if all((directory / n).exists() and (directory / n).read_text().strip() for n in names):
            break
        time.sleep(0.01)
    return [int((directory / n).read_text()) for n in names]


# -- files that would block --------------------------------------------------------------------


FIFO_HINT = (
    "not a regular file; the file tools only open regular files (for a special file use bash "
    "with a bounded command, e.g. `timeout 5 head -c 4096 {path}`)"
)


def test_read_of_a_fifo_is_refused_at_once(ctx: ToolContext, fifo: Path) -> None:
    message, took = bounded(lambda: error_of(read, ctx, path="pipe"), 5)
    assert message == "pipe is a named pipe (FIFO), " + FIFO_HINT.format(path="pipe")
    assert took < 2


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/dev/zero", "a character device"), ("/dev/null", "a character device")],
)
def test_read_refuses_devices(ctx: ToolContext, path: str, kind: str) -> None:
    message, took = bounded(lambda: error_of(read, ctx, path=path), 5)
    assert message == f"{path} is {kind}, " + FIFO_HINT.format(path=path)
    assert took < 2


def test_read_refuses_a_unix_socket(ctx: ToolContext, project: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(project / "sock"))
    try:
        message, _ = bounded(lambda: error_of(read, ctx, path="sock"), 5)
    finally:
        server.close()
    assert message == "sock is a socket, " + FIFO_HINT.format(path="sock")


def test_write_and_edit_of_a_fifo_are_refused(ctx: ToolContext, fifo: Path) -> None:
    async def both() -> list[str]:
        return [
            await error_of(write, ctx, path="pipe", content="x"),
            await error_of(edit, ctx, path="pipe", old_string="a", new_string="b"),
        ]

    messages, _ = bounded(both, 5)
    assert messages == ["pipe is a named pipe (FIFO), " + FIFO_HINT.format(path="pipe")] * 2
    assert fifo.exists()  # nothing replaced it


def test_grep_refuses_a_fifo_path_and_skips_fifos_in_a_tree(
    ctx: ToolContext, fifo: Path, search_mode: str
) -> None:
    async def both() -> tuple[str, ToolOutput, ToolOutput]:
        refused = await error_of(grep, ctx, pattern="x", path="pipe")
        return refused, await call(grep, ctx, pattern="hello"), await call(glob, ctx, pattern="*")

    (refused, found, listed), _ = bounded(both, 10)
    assert refused == "pipe is a named pipe (FIFO), " + FIFO_HINT.format(path="pipe")
    assert found.content == "app.py:2:    print('hello')"
    assert listed.content == "README.md\napp.py\nutil.py"


def test_a_read_that_never_returns_is_abandoned_at_its_limit(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch, fifo: Path
) -> None:
    """A regular file on a filesystem that stops answering (stood in for by a blocking FIFO
    open inside the worker): the read ends with an error at READ_TIMEOUT, the loop stays free."""
    monkeypatch.setattr(files_module, "READ_TIMEOUT", 0.5)

    async def stuck() -> str:
        with pytest.raises(ToolError) as info:
            await files_module.off_loop("slow.txt", fifo.read_bytes)
        return str(info.value)

    message, took = bounded(stuck, 5)
    assert message == (
        "reading slow.txt took longer than 0.5 s and was abandoned (a network or special "
        "filesystem that does not answer?)"
    )
    assert took < 2


# -- hooks ---------------------------------------------------------------------------------------


def hook_run(command: str, cwd: Path, timeout: float) -> tuple[HookRun, float]:
    hook = HookCommand("PreToolUse", "", command, timeout, "personal", "settings.json")
    return bounded(lambda: _run_command(hook, b'{"x": 1}', cwd, dict(os.environ)), 30)


DETACHED = {
    "background": "sleep 300 & echo $! > {d}/a; echo '{{}}'",
    "subshell": "(sh -c 'echo $$ > {d}/a; exec sleep 300' &); echo '{{}}'",
    "setsid": "setsid sh -c 'echo $$ > {d}/a; exec sleep 300' & echo '{{}}'",
    "nohup": "nohup sh -c 'echo $$ > {d}/a; exec sleep 300' 2>&1 & echo '{{}}'",
}


@needs_proc
@pytest.mark.parametrize("form", sorted(DETACHED))
def test_a_hook_whose_detached_child_holds_stdout_returns_and_the_child_dies(
    tmp_path: Path, form: str
) -> None:
    run, took = hook_run(DETACHED[form].format(d=tmp_path), tmp_path, timeout=20)
    (pid,) = pids_in(tmp_path, "a")
    assert (run.exit_code, run.stdout, run.timed_out) == (0, "{}\n", False)
    assert took < 5  # the hook's answer after the 2 s drain, not the 20 s timeout
    assert gone_soon(lambda: not alive(pid)), f"{form}: pid {pid} outlived the hook"


@needs_proc
def test_a_hook_that_hangs_with_detached_children_ends_at_its_timeout(tmp_path: Path) -> None:
    command = (
        f"setsid sh -c 'echo $$ > {tmp_path}/a; exec sleep 300' & "
        f"sh -c 'echo $$ > {tmp_path}/b; exec sleep 300' & disown; trap '' TERM; sleep 300"
    )
    run, took = hook_run(command, tmp_path, timeout=1.5)
    pids = pids_in(tmp_path, "a", "b")
    assert (run.exit_code, run.timed_out) == (None, True)
    assert 1.4 < took < 5
    assert gone_soon(lambda: not any(alive(p) for p in pids)), "a hook's child outlived it"


# -- bash ----------------------------------------------------------------------------------------


def escaping_command(marker: str) -> str:
    """Children that leave bash's job table, its process group and its session."""
    return (
        f"sleep {marker} & disown; "
        f"setsid sleep {marker} & "
        f"nohup sleep {marker} >/dev/null 2>&1 & "
        f"(sleep {marker} &); "
        f"sleep {marker}"
    )


def bash_ctx(project: Path, sandboxed: bool) -> ToolContext:
    box = Sandbox(project) if sandboxed else None
    return ToolContext(cwd=project, root=project, env=dict(os.environ), sandbox=box)


@needs_proc
@pytest.mark.parametrize("sandboxed", [False, pytest.param(True, marks=needs_bwrap)])
def test_bash_timeout_kills_every_detached_child(project: Path, sandboxed: bool) -> None:
    marker = f"30{os.getpid() % 1000}.{int(sandboxed)}1"
    ctx = bash_ctx(project, sandboxed)
    out, took = bounded(
        lambda: call(bash, ctx, command=escaping_command(marker), timeout=2, sandbox=sandboxed), 30
    )
    assert out == ToolOutput("[timed out after 2 s; process group killed]", is_error=True)
    assert 1.9 < took < 8
    assert gone_soon(lambda: not with_marker(f"sleep {marker}")), with_marker(f"sleep {marker}")


@needs_proc
@pytest.mark.parametrize("sandboxed", [False, pytest.param(True, marks=needs_bwrap)])
def test_bash_that_exits_leaves_no_detached_child(project: Path, sandboxed: bool) -> None:
    marker = f"30{os.getpid() % 1000}.{int(sandboxed)}2"
    ctx = bash_ctx(project, sandboxed)
    command = f"setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & echo done"
    out, took = bounded(lambda: call(bash, ctx, command=command, sandbox=sandboxed), 30)
    assert out == ToolOutput("done\n[exit code 0]")
    assert took < 5
    assert gone_soon(lambda: not with_marker(f"sleep {marker}")), with_marker(f"sleep {marker}")


# -- cancellation ------------------------------------------------------------------------------


async def cancelled_after(coro: Awaitable[object], seconds: float) -> float:
    """Cancel `coro` after `seconds`; how long the cancellation took to land."""
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(seconds)
    assert not task.done(), "finished before it could be cancelled"
    start = time.monotonic()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return time.monotonic() - start


@needs_proc
def test_cancelling_a_running_bash_kills_it_at_once(ctx: ToolContext, project: Path) -> None:
    marker = f"30{os.getpid() % 1000}.03"
    command = f"setsid sleep {marker} & sleep {marker}"
    took, _ = bounded(
        lambda: cancelled_after(call(bash, ctx, command=command, sandbox=False), 0.5), 20
    )
    assert took < 3
    assert gone_soon(lambda: not with_marker(f"sleep {marker}")), with_marker(f"sleep {marker}")


def test_cancelling_a_blocked_read_worker_returns_at_once(fifo: Path) -> None:
    took, _ = bounded(
        lambda: cancelled_after(files_module.off_loop("pipe", fifo.read_bytes), 0.3), 5
    )
    assert took < 0.5


def test_cancelling_a_running_grep_returns_at_once(
    tmp_path: Path, search_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "big"
    tree.mkdir()
    with (tree / "data.txt").open("w", encoding="utf-8") as f:
        for _ in range(200):
            f.write("x" * 999_999 + "\n")  # 200 MB without a match: a search takes a while
    ctx = ToolContext(cwd=tree, root=tree)
    # `\w+\d` keeps even ripgrep busy for a while (no literal to skip ahead with).
    took, _ = bounded(lambda: cancelled_after(call(grep, ctx, pattern=r"\w+\d"), 0.05), 20)
    assert took < 1


# -- keel itself ---------------------------------------------------------------------------------


def start(project: Path, script: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keel", "-p", "go", "--model", f"scripted:{script}", *extra],
        cwd=project,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KEEL_NO_SANDBOX": "1"},
    )


def fifo_then_sleep(project: Path, tmp_path: Path) -> Path:
    os.mkfifo(project / "pipe")
    return write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "read", "input": {"path": "pipe"}}]},
            {
                "tool_calls": [
                    {
                        "name": "bash",
                        "input": {"command": "sleep 301.7 & echo $! > pid; touch started; wait"},
                    }
                ]
            },
            {"text": "never reached"},
        ],
    )


@needs_proc
@pytest.mark.parametrize(
    ("signals", "extra"),
    [
        ([signal.SIGTERM], ["--no-session"]),
        ([signal.SIGINT], ["--no-session"]),
        ([signal.SIGTERM, signal.SIGTERM], []),
        ([signal.SIGINT, signal.SIGTERM], []),
    ],
    ids=["sigterm", "sigint", "sigterm-twice", "sigint-then-sigterm"],
)
def test_keel_reading_a_fifo_then_busy_ends_on_signals_without_a_traceback(
    project: Path,
    tmp_path: Path,
    isolated_env: Path,
    signals: list[signal.Signals],
    extra: list[str],
) -> None:
    script = fifo_then_sleep(project, tmp_path)
    proc = start(project, script, "--mode", "bypass", "--output-format", "json", *extra)
    try:
        for _ in range(400):  # the FIFO read returned (refused) and the next tool is running
            if (project / "started").exists() or proc.poll() is not None:
                break
            time.sleep(0.025)
        assert (project / "started").exists(), "the run never got past reading the FIFO"
        sleeper = int((project / "pid").read_text())
        began = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.3)
        stdout, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert time.monotonic() - began < 6
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert json.loads(stdout)["stop_reason"] == "interrupted"
    assert gone_soon(lambda: not alive(sleeper)), "the command outlived keel"
    if not extra:
        (path,) = session_files(isolated_env)
        text = path.read_text(encoding="utf-8")
        assert "pipe is a named pipe (FIFO)" in text


@needs_proc
@pytest.mark.parametrize(
    ("signals", "extra"),
    [([signal.SIGTERM], ["--no-session"]), ([signal.SIGTERM, signal.SIGTERM], [])],
    ids=["sigterm", "sigterm-twice"],
)
def test_keel_in_a_hanging_hook_ends_on_signals_without_a_traceback(
    project: Path,
    tmp_path: Path,
    isolated_env: Path,
    signals: list[signal.Signals],
    extra: list[str],
) -> None:
    """A UserPromptSubmit hook that ignores SIGTERM, leaves a `setsid` child holding its stdout
    and sleeps: the signals end keel at once, and the hook's child dies with it."""
    command = (
        f"setsid sh -c 'echo $$ > {tmp_path}/child; exec sleep 301.8' & "
        f"trap '' TERM; touch {tmp_path}/started; sleep 300"
    )
    config = isolated_env / "config"
    config.mkdir(parents=True, exist_ok=True)
    hooks = {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": command}]}]}
    (config / "settings.json").write_text(json.dumps({"hooks": hooks}), encoding="utf-8")
    script = write_script(tmp_path / "s.json", [{"text": "never reached"}])
    proc = start(project, script, "--output-format", "json", *extra)
    try:
        (child,) = pids_in(tmp_path, "child")
        assert (tmp_path / "started").exists()
        began = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.3)
        stdout, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert time.monotonic() - began < 6
    assert "Traceback" not in stderr
    assert proc.returncode == 130, stderr
    assert json.loads(stdout)["stop_reason"] == "interrupted"
    assert gone_soon(lambda: not alive(child)), "the hook's child outlived keel"


@needs_proc
def test_a_background_bash_stopped_takes_its_detached_children_with_it(project: Path) -> None:
    from keel.tools.background import BackgroundTasks
    from keel.tools.builtin.tasks import bash_kill

    marker = f"30{os.getpid() % 1000}.04"
    tasks = BackgroundTasks()
    ctx = ToolContext(cwd=project, root=project, env=dict(os.environ), background=tasks)

    async def start_and_stop() -> str:
        command = f"setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}"
        await call(bash, ctx, command=command, run_in_background=True, sandbox=False)
        for _ in range(200):
            if len(with_marker(f"sleep {marker}")) == 3:
                break
            await asyncio.sleep(0.01)
        out = await call(bash_kill, ctx, id="bg-1")
        await tasks.aclose()
        return str(out.content)

    answer, took = bounded(start_and_stop, 20)
    assert answer == "bg-1: stopped"
    assert took < 5
    assert gone_soon(lambda: not with_marker(f"sleep {marker}")), with_marker(f"sleep {marker}")


KEEL_DIES = """
import asyncio, os, sys
from keel.proc import run_tree

class Out:
    def feed(self, data): pass

async def main():
    marker = sys.argv[1]
    await run_tree(["bash", "-c", f"setsid sleep {marker} & nohup sleep {marker} & sleep {marker}"],
                   cwd=".", env=os.environ, stdout=Out())

asyncio.run(main())
"""


@needs_proc
def test_commands_of_a_keel_killed_with_sigkill_do_not_outlive_it(tmp_path: Path) -> None:
    """keel dies without any cleanup: the supervisor sees its control socket close (and gets
    its parent-death signal) and kills the command's whole tree."""
    marker = f"30{os.getpid() % 1000}.05"
    keel = subprocess.Popen([sys.executable, "-c", KEEL_DIES, marker], cwd=tmp_path)
    try:
        assert gone_soon(lambda: len(with_marker(f"sleep {marker}")) == 3, 10)
    finally:
        keel.kill()
        keel.wait()
    assert gone_soon(lambda: not with_marker(f"sleep {marker}"), 5), with_marker(f"sleep {marker}")


def test_read_of_a_directory_says_to_list_it(ctx: ToolContext, project: Path) -> None:
    (project / "pkg").mkdir()
    for tool, args in ((read, {}), (edit, {"old_string": "a", "new_string": "b"})):
        message, _ = bounded(lambda: error_of(tool, ctx, path="pkg", **args), 5)  # noqa: B023
        assert message == "pkg is a directory, not a file; list it with ls (or glob)"
