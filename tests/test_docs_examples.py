"""Every runnable example in README.md and docs/ is run, so the docs cannot rot.

A fenced block preceded by `<!-- runnable -->` on the line just above it is run as it is written:
Python blocks with `python`, shell blocks (`sh`, `bash`) with `bash` under `set -eo pipefail` and
`keel` on PATH, each in a fresh temporary project (two Python files, a README, an error.log, a
git repository) with its own KEEL_HOME. No network: the providers the examples name are loopback
servers on 127.0.0.1 (Anthropic, OpenAI, Gemini, Ollama) that answer every request with
"Done.", reached through the variables a user would set (`ANTHROPIC_API_KEY` and
`ANTHROPIC_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_BASE_URL`, `GEMINI_API_KEY` and
`GEMINI_BASE_URL`, `OLLAMA_HOST`).

A Python or shell block that cannot run that way says why, just above it:
`<!-- not runnable: REASON -->`; a block with neither marker fails
`test_every_example_is_marked`. One that needs what `needs(...)` names in tests/conftest.py says
so: `<!-- runnable (needs sandbox) -->`, and is skipped with the reason where it is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from keel.llm.script import Step, reply
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.gemini_server import GeminiServer
from keel.testing.ollama_server import DEFAULT_MODELS, FakeModel, OllamaServer
from keel.testing.openai_server import OpenAIResponsesServer
from keel.testing.server import RecordedRequest, ScriptedHTTPServer

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = "<!-- runnable -->"
RUNNABLE_NEEDING = re.compile(r"<!-- runnable \(needs (?P<needs>[a-z-]+(?:, [a-z-]+)*)\) -->")
NOT_RUNNABLE = re.compile(r"<!-- not runnable: (?P<why>.+\S) -->")
LANGUAGES = {"python": "python", "py": "python", "sh": "shell", "bash": "shell", "shell": "shell"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str  # python or shell; "" for other blocks
    code: str
    marker: str  # the comment line above the fence, or "" (RUNNABLE also for "needs" ones)
    needs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if fence is None:
                i += 1
                continue
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            indent = len(fence["indent"])
            code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
            language = LANGUAGES.get(fence["info"].split(" ")[0].strip(), "")
            above = lines[i - 1].strip() if i > 0 else ""
            marker = above if above == RUNNABLE or NOT_RUNNABLE.fullmatch(above) else ""
            needs: tuple[str, ...] = ()
            if wanting := RUNNABLE_NEEDING.fullmatch(above):
                marker, needs = RUNNABLE, tuple(wanting["needs"].split(", "))
            found.append(Example(path, i + 1, language, code, marker, needs))
            i = end + 1
    return found


RUN = [e for e in examples() if e.marker == RUNNABLE]


def test_every_example_is_marked() -> None:
    """A Python or shell example is run, or says why it cannot be."""
    unmarked = [e.name for e in examples() if e.language and not e.marker]
    assert unmarked == []
    misplaced = [e.name for e in examples() if e.marker == RUNNABLE and not e.language]
    assert misplaced == []  # only Python and shell blocks can be run


def test_the_docs_have_runnable_examples() -> None:
    names = {e.name.split(":")[0] for e in RUN}
    assert {"README.md", "docs/headless.md", "docs/library.md", "docs/testing.md"} <= names


def done(request: RecordedRequest) -> Step:
    """A model that answers "Done.", and proposes an AGENTS.md when `keel init` asks for one."""
    body = request.json or {}
    tools = {tool.get("name") for tool in body.get("tools") or []}
    answered = any(m.get("role") == "assistant" for m in body.get("messages") or [])
    if "propose_instructions" in tools and not answered:
        content = "# AGENTS.md\n\nRun the app with `python app.py`.\n"
        return reply("", ("propose_instructions", {"content": content}))
    return reply("Done.")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ScriptedHTTPServer]]:
    running: dict[str, ScriptedHTTPServer] = {
        "anthropic": AnthropicServer(responder=done, api_key="sk-ant-docs"),
        "openai": OpenAIResponsesServer(responder=done, api_key="sk-docs"),
        "gemini": GeminiServer(responder=done, api_key="gemini-docs"),
        "ollama": OllamaServer(
            responder=done, models=(*DEFAULT_MODELS, FakeModel("qwen3-coder:30b"))
        ),
    }
    for server in running.values():
        server.start()
    try:
        yield running
    finally:
        for server in running.values():
            server.stop()


def example_project(root: Path) -> Path:
    root.mkdir()
    (root / "app.py").write_text("def main():\n    print('hello')\n\n\nmain()\n", encoding="utf-8")
    (root / "utils.py").write_text("def add(a, b):\n    return a + b\n", encoding="utf-8")
    (root / "README.md").write_text("# demo\n", encoding="utf-8")
    (root / "error.log").write_text("ValueError: bad input\n", encoding="utf-8")
    git = ["git", "-c", "user.name=docs", "-c", "user.email=docs@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], cwd=root, check=True)
    (root / "app.py").write_text("def main():\n    print('hi')\n\n\nmain()\n", encoding="utf-8")
    return root


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (the example project)")
@pytest.mark.parametrize("example", RUN, ids=[e.name for e in RUN])
def test_example_runs(
    example: Example, servers: dict[str, ScriptedHTTPServer], tmp_path: Path
) -> None:
    from tests.conftest import missing

    for need in example.needs:
        if (why := missing(need)) is not None:
            pytest.skip(why)
    project = example_project(tmp_path / "project")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "ANTHROPIC_API_KEY": "sk-ant-docs",
        "ANTHROPIC_BASE_URL": servers["anthropic"].url,
        "OPENAI_API_KEY": "sk-docs",
        "OPENAI_BASE_URL": f"{servers['openai'].url}/v1",
        "GEMINI_API_KEY": "gemini-docs",
        "GEMINI_BASE_URL": servers["gemini"].url,
        "OLLAMA_HOST": servers["ollama"].url,
    }
    before = {name: len(server.errors) for name, server in servers.items()}
    if example.language == "python":
        script = tmp_path / "example.py"
        script.write_text(example.code, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-c", "set -eo pipefail\n" + example.code]
    out = subprocess.run(
        argv,
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, f"{example.name}\n{example.code}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr
    assert "internal error" not in out.stderr
    assert {name: len(server.errors) for name, server in servers.items()} == before
