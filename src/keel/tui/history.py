"""Prompt history for ↑/↓: the prompts sent in this project, oldest first, kept in
`<KEEL_HOME>/history/<project>.jsonl` (one JSON string per line, the last `LIMIT` kept)."""

from __future__ import annotations

import json
from pathlib import Path

LIMIT = 500


class History:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: list[str] = self._load() if path is not None else []

    def _load(self) -> list[str]:
        assert self.path is not None
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        entries = []
        for line in lines[-LIMIT:]:
            try:
                value = json.loads(line)
            except ValueError:
                continue  # a torn line from a crash: skip it
            if isinstance(value, str):
                entries.append(value)
        return entries

    def add(self, text: str) -> None:
        if not text.strip() or (self.entries and self.entries[-1] == text):
            return
        self.entries.append(text)
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(text) + "\n")
            if len(self.entries) > 2 * LIMIT:
                del self.entries[:-LIMIT]
                self.path.write_text(
                    "".join(json.dumps(e) + "\n" for e in self.entries), encoding="utf-8"
                )
        except OSError:
            self.path = None  # an unwritable home: keep the history in memory only


def history_path(root: Path) -> Path:
    from keel.config.trust import project_key
    from keel.session.store import keel_home

    return keel_home() / "history" / f"{project_key(root)}.jsonl"


__all__ = ["History", "history_path"]
