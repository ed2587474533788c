"""Shared fixtures. Every test runs with its own KEEL_HOME and config dir, and with no provider
credentials from the developer's environment, so nothing leaks in or out."""

from __future__ import annotations

from pathlib import Path

import pytest

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
