"""The sandbox's placeholders for missing protected paths (an empty `.git`, `.mcp.json`, …) exist
in the tree while a command runs, or after a stalled keel left them. What keel reads about the
project must not change because of them: the system prompt's git line (a resume compares it)
and the settings (a placeholder is a missing file, not an unreadable one)."""

from __future__ import annotations

from pathlib import Path

from keel.agent.prompt import git_root
from keel.config.settings import read_json_object
from keel.permissions.sandbox import Placeholders, project_policy


def test_a_held_placeholder_git_is_not_a_repository_but_an_empty_one_made_by_the_user_is(
    tmp_path: Path,
) -> None:
    project = tmp_path / "p"
    project.mkdir()
    root = project.resolve()
    warnings: list[str] = []
    holds = Placeholders(root)
    holds.hold(project_policy(root))
    try:
        assert (root / ".git").is_dir()  # the placeholder is there while the hold lasts
        assert git_root(root) is None
        assert read_json_object(root / ".mcp.json", warnings, skipped="x") is None
        assert warnings == []
    finally:
        holds.release_all()
    assert not (root / ".git").exists()
    (root / ".git").mkdir()  # the user's own (tests and tools make such "repositories")
    assert git_root(root) == root


def test_a_directory_with_something_in_it_where_a_settings_file_belongs_is_a_warning(
    tmp_path: Path,
) -> None:
    (tmp_path / ".mcp.json").mkdir()
    (tmp_path / ".mcp.json" / "x").write_text("{}", encoding="utf-8")
    warnings: list[str] = []
    assert (
        read_json_object(tmp_path / ".mcp.json", warnings, skipped="its servers are skipped")
        is None
    )
    assert warnings == [
        f"{tmp_path / '.mcp.json'}: is a directory, not a file; its servers are skipped"
    ]
