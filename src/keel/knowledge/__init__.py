"""Project knowledge: a local search index of the project's docs and the `knowledge_search`
tool over it (docs/knowledge.md).

- `keel.knowledge.chunking`: documents cut into cited chunks (pure).
- `keel.knowledge.paths`: where a project's index lives.
- `keel.knowledge.index`: the SQLite/FTS5 index: the one writer, incremental updates, search.
- `keel.knowledge.embeddings`: optional vectors from a local `/embeddings` endpoint, and fusion.
- `keel.knowledge.tool`: the model's tool.

Importing this package costs nothing: `tool_for_project` looks for the index file without
opening it, so an agent built for a project with no index loads no SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

#: The tool's name (keel.knowledge.tool.NAME, here without importing it).
NAME = "knowledge_search"

if TYPE_CHECKING:
    from keel.config.settings import KnowledgeSettings
    from keel.tools.base import FunctionTool


def tool_for_project(
    cwd: Path, settings: KnowledgeSettings, env: Mapping[str, str] | None = None
) -> FunctionTool | None:
    """The `knowledge_search` tool for the project around `cwd`, or None when knowledge is off
    in settings or the project has no index (the tool is offered only where it can answer)."""
    if not settings.enabled:
        return None
    from keel.knowledge.paths import index_path, project_root

    root = project_root(cwd)
    db_path = index_path(root, env)
    if not db_path.is_file():
        return None
    from keel.knowledge.tool import knowledge_tool

    return knowledge_tool(db_path, root, embeddings_config(settings))


def offered_anyway(
    cwd: Path, settings: KnowledgeSettings, env: Mapping[str, str] | None = None
) -> FunctionTool:
    """The tool for the project around `cwd` whether or not it has an index (a resumed session
    that had it keeps it; without an index it answers how to build one)."""
    from keel.knowledge.paths import index_path, project_root
    from keel.knowledge.tool import knowledge_tool

    root = project_root(cwd)
    return knowledge_tool(index_path(root, env), root, embeddings_config(settings))


def embeddings_config(settings: KnowledgeSettings) -> EmbeddingsConfig | None:
    from keel.knowledge.embeddings import EmbeddingsConfig

    if not settings.embeddings_url:
        return None
    return EmbeddingsConfig(
        settings.embeddings_url, settings.embeddings_model, settings.embeddings_key_env
    )


if TYPE_CHECKING:
    from keel.knowledge.embeddings import EmbeddingsConfig
