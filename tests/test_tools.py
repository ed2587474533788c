"""Built-in tools on real files and real subprocesses, and the @tool decorator's schemas."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import time
from pathlib import Path
from typing import Literal

import pytest

from keel.llm.messages import Image, Text
from keel.tools.base import ToolContext, ToolError, ToolOutput, tool
from keel.tools.builtin import bash, edit, glob, grep, read, write
from keel.tools.builtin.shell import clean_output, command_env
from keel.tools.truncate import truncate


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    return ToolContext(cwd=project, root=project, env=dict(os.environ))


async def run(t: object, ctx: ToolContext, **args: object) -> ToolOutput:
    assert hasattr(t, "run")
    return await t.run(ctx, args)  # type: ignore[no-any-return]


# -- @tool -------------------------------------------------------------------------------------


def test_tool_decorator_builds_schema_from_signature_and_docstring() -> None:
    @tool(read_only=True)
    async def search(
        ctx: ToolContext,
        query: str,
        limit: int = 10,
        mode: Literal["fast", "deep"] = "fast",
        tags: list[str] | None = None,
        exact: bool = False,
    ) -> str:
        """Search the index.

        Longer explanation.

        Args:
            query: What to look for.
            limit: Most results,
                counted after filtering.
            mode: How hard to look.
            tags: Only these tags.
        """
        return query

    assert search.name == "search"
    assert search.read_only is True
    assert search.description == "Search the index.\n\nLonger explanation."
    assert search.input_schema == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "limit": {
                "type": "integer",
                "description": "Most results, counted after filtering.",
                "default": 10,
            },
            "mode": {
                "type": "string",
                "enum": ["fast", "deep"],
                "description": "How hard to look.",
                "default": "fast",
            },
            "tags": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Only these tags.",
            },
            "exact": {"type": "boolean", "default": False},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert search.validate({"query": "x"}) is None
    assert search.validate(
        {"query": 1, "limit": True, "mode": "slow", "tags": ["a", 2], "extra": 1}
    ) == (  # a read-only tool ignores `extra` (FunctionTool.run says so in the result)
        "query: must be string, got integer; limit: must be integer, got boolean; "
        "mode: must be one of ['fast', 'deep'], got 'slow'; tags: item 1 must be string, got integer"
    )
    assert search.validate({"query": "x", "tags": None}) is None
    assert search.validate([1]) == "arguments must be a JSON object, got list"


def test_tool_decorator_rejects_functions_it_cannot_describe() -> None:
    with pytest.raises(TypeError, match="needs a docstring"):

        @tool
        async def nodoc(ctx: ToolContext) -> str:
            return ""

    with pytest.raises(TypeError, match="first parameter must be `ctx: ToolContext`"):

        @tool
        async def noctx(x: str) -> str:
            """Doc."""
            return x

    with pytest.raises(TypeError, match="must be an async function"):

        @tool  # type: ignore[arg-type]
        def sync(ctx: ToolContext) -> str:
            """Doc."""
            return ""


# -- truncation --------------------------------------------------------------------------------


def test_truncate_keeps_head_and_tail_within_limit() -> None:
    text = "a" * 50_000 + "END"
    out = truncate(text, 3000)
    assert out.startswith("a" * 2000)
    assert out.endswith("aEND")
    assert "... [47003 bytes truncated] ..." in out
    assert truncate("short") == "short"


def test_truncate_never_splits_a_character() -> None:
    out = truncate("é" * 10_000, 1001)
    out.encode("utf-8")  # would raise on a split surrogate
    assert "bytes truncated" in out


# -- read --------------------------------------------------------------------------------------


async def test_read_numbers_lines_and_records_the_file(ctx: ToolContext, project: Path) -> None:
    out = await run(read, ctx, path="app.py")
    assert out.content == (
        "     1\tdef main():\n     2\t    print('hello')\n     3\t\n     4\t\n     5\tmain()"
    )
    assert project / "app.py" in ctx.read_files


async def test_read_pages_long_files_with_offset_hint(ctx: ToolContext, project: Path) -> None:
    (project / "long.txt").write_text(
        "".join(f"line {i}\n" for i in range(1, 3001)), encoding="utf-8"
    )
    out = await run(read, ctx, path="long.txt")
    assert isinstance(out.content, str)
    assert out.content.splitlines()[1999] == "  2000\tline 2000"
    assert out.content.endswith(
        "[line limit: showed lines 1-2000 of 3000; continue with offset=2001]"
    )
    out = await run(read, ctx, path="long.txt", offset=2990, limit=5)
    assert out.content == "\n".join(f"{i:6d}\tline {i}" for i in range(2990, 2995)) + (
        "\n\n[line limit: showed lines 2990-2994 of 3000; continue with offset=2995]"
    )


async def test_read_cuts_at_60kb_on_a_line_boundary(ctx: ToolContext, project: Path) -> None:
    (project / "wide.txt").write_text(("x" * 999 + "\n") * 200, encoding="utf-8")
    out = await run(read, ctx, path="wide.txt")
    assert isinstance(out.content, str)
    body, note = out.content.split("\n\n[")
    assert len(body.encode()) <= 60_000
    assert all(line.endswith("x" * 999) for line in body.splitlines())
    assert note.startswith("size limit: showed lines 1-59 of 200; continue with offset=60]")


async def test_huge_files_are_bounded(ctx: ToolContext, project: Path) -> None:
    big = project / "big.log"
    with big.open("w", encoding="utf-8") as f:
        for i in range(1_000_000):  # ~25 MB
            f.write(f"line {i} of a very large log file\n")
    out = await run(read, ctx, path="big.log")
    assert isinstance(out.content, str)
    assert out.content.endswith(
        "[size limit: showed lines 1-1455 of 1000000; continue with offset=1456]"
    )
    sparse = project / "disk.img"
    with sparse.open("wb") as f:
        f.truncate(2 * 1024**3)  # 2 GB of zeros, sparse
    with pytest.raises(ToolError, match=r"disk.img is a binary file \(2147483648 bytes\)"):
        await run(read, ctx, path="disk.img")


async def test_read_truncates_very_long_lines(ctx: ToolContext, project: Path) -> None:
    (project / "min.js").write_text("y" * 5000 + "\n", encoding="utf-8")
    out = await run(read, ctx, path="min.js")
    assert out.content == "     1\t" + "y" * 2000 + "… [line truncated, 5000 chars]"


async def test_read_refuses_binary_and_directories_and_missing(
    ctx: ToolContext, project: Path
) -> None:
    (project / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(ToolError, match=r"blob.bin is a binary file \(300 bytes\)"):
        await run(read, ctx, path="blob.bin")
    with pytest.raises(ToolError, match="is a directory"):
        await run(read, ctx, path=".")
    with pytest.raises(ToolError, match=r"nope.py does not exist; check the path with glob"):
        await run(read, ctx, path="nope.py")


async def test_read_returns_images_as_image_blocks(ctx: ToolContext, project: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20
    (project / "pic.png").write_bytes(png)
    out = await run(read, ctx, path="pic.png")
    assert out.content == (
        Text("Image pic.png (28 bytes):"),
        Image("image/png", base64.b64encode(png).decode()),
    )


async def test_reread_of_unchanged_range_is_one_line(ctx: ToolContext, project: Path) -> None:
    await run(read, ctx, path="util.py")
    again = await run(read, ctx, path="util.py")
    assert (
        again.content
        == "util.py: unchanged since you last read it (same lines); use the content you already have"
    )
    await asyncio.sleep(0.01)
    (project / "util.py").write_text("X = 2\n", encoding="utf-8")
    changed = await run(read, ctx, path="util.py")
    assert changed.content == "     1\tX = 2"


# -- write / edit --------------------------------------------------------------------------------


async def test_write_creates_files_and_needs_a_read_to_overwrite(
    ctx: ToolContext, project: Path
) -> None:
    out = await run(write, ctx, path="pkg/new.py", content="A = 1\nB = 2\n")
    assert out.content == "Created pkg/new.py (2 lines)."
    assert out.display is not None
    assert "+A = 1" in out.display
    assert (project / "pkg/new.py").read_text(encoding="utf-8") == "A = 1\nB = 2\n"
    with pytest.raises(
        ToolError, match=r"util.py exists but was not read in this conversation; read it first"
    ):
        await run(write, ctx, path="util.py", content="X = 3\n")
    await run(read, ctx, path="util.py")
    out = await run(write, ctx, path="util.py", content="X = 3\n")
    assert out.content == "Updated util.py."
    assert out.display == "--- a/util.py\n+++ b/util.py\n@@ -1 +1 @@\n-X = 1\n+X = 3\n"


async def test_write_refuses_stale_reads(ctx: ToolContext, project: Path) -> None:
    await run(read, ctx, path="util.py")
    await asyncio.sleep(0.01)
    (project / "util.py").write_text("X = 'changed elsewhere'\n", encoding="utf-8")
    with pytest.raises(ToolError, match="changed since you read it; read it again"):
        await run(write, ctx, path="util.py", content="X = 3\n")


async def test_write_is_confined_to_the_project(
    ctx: ToolContext, project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(ToolError, match="outside the project root"):
        await run(write, ctx, path="../outside/x.txt", content="no")
    with pytest.raises(ToolError, match="outside the project root"):
        await run(write, ctx, path=str(outside / "y.txt"), content="no")
    (project / "link").symlink_to(outside)
    with pytest.raises(ToolError, match=r"outside the project root .* \(through a symlink\)"):
        await run(write, ctx, path="link/z.txt", content="no")
    assert list(outside.iterdir()) == []


async def test_write_refuses_project_configuration_at_any_depth(
    ctx: ToolContext, project: Path
) -> None:
    """`sub/.keel/settings.json` grants permissions as much as `.keel/settings.json` does, once
    keel starts in `sub`; a link named like configuration is refused by its name too."""
    (project / "notes.json").write_text("{}\n", encoding="utf-8")
    (project / "sub").mkdir()
    (project / "sub" / ".mcp.json").symlink_to("../notes.json")
    refused = {
        "sub/.keel/settings.json": "sub/.keel",
        "a/b/.mcp.json": "a/b/.mcp.json",
        "pkg/.claude/settings.local.json": "pkg/.claude",
        "tools/.codex/config.toml": "tools/.codex",
        "web/opencode.json": "web/opencode.json",
        "sub/.mcp.json": "sub/.mcp.json",
    }
    for path, where in refused.items():
        with pytest.raises(ToolError) as info:
            await run(write, ctx, path=path, content="{}")
        assert str(info.value).startswith(
            f"{path} is in {where}, which keel protects in every mode"
        ), path
    assert sorted(p.relative_to(project).as_posix() for p in project.rglob("*")) == [
        "README.md", "app.py", "notes.json", "sub", "sub/.mcp.json", "util.py",
    ]  # fmt: skip
    out = await run(write, ctx, path="sub/keel-notes.md", content="fine\n")
    assert out.content == "Created sub/keel-notes.md (1 lines)."


async def test_write_keeps_file_mode_and_leaves_no_temp_files(
    ctx: ToolContext, project: Path
) -> None:
    script = project / "run.sh"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o755)
    await run(read, ctx, path="run.sh")
    await run(write, ctx, path="run.sh", content="#!/bin/sh\necho hi\n")
    assert script.stat().st_mode & 0o777 == 0o755
    assert not [p for p in project.iterdir() if p.name.endswith(".keel-tmp")]


async def test_edit_replaces_unique_text(ctx: ToolContext, project: Path) -> None:
    await run(read, ctx, path="app.py")
    out = await run(
        edit, ctx, path="app.py", old_string="print('hello')", new_string="print('bye')"
    )
    assert out.content == "Edited app.py: 1 replacement."
    assert out.display == (
        "--- a/app.py\n+++ b/app.py\n@@ -1,5 +1,5 @@\n def main():\n-    print('hello')\n"
        "+    print('bye')\n \n \n main()\n"
    )
    assert "print('bye')" in (project / "app.py").read_text(encoding="utf-8")
    # The file it wrote counts as read: a second edit needs no re-read.
    await run(edit, ctx, path="app.py", old_string="bye", new_string="ciao")


async def test_edit_errors_tell_the_model_what_to_do(ctx: ToolContext, project: Path) -> None:
    (project / "dup.py").write_text("a = 1\na = 1\n", encoding="utf-8")
    with pytest.raises(ToolError, match="was not read"):
        await run(edit, ctx, path="dup.py", old_string="a = 1", new_string="a = 2")
    await run(read, ctx, path="dup.py")
    with pytest.raises(ToolError, match=r"occurs 2 times in dup.py; add surrounding lines"):
        await run(edit, ctx, path="dup.py", old_string="a = 1", new_string="a = 2")
    with pytest.raises(ToolError, match=r"old_string not found in dup.py; read the file again"):
        await run(edit, ctx, path="dup.py", old_string="b = 1", new_string="a = 2")
    with pytest.raises(ToolError, match="old_string is empty"):
        await run(edit, ctx, path="dup.py", old_string="", new_string="a = 2")
    with pytest.raises(ToolError, match="identical"):
        await run(edit, ctx, path="dup.py", old_string="a = 1", new_string="a = 1")
    out = await run(
        edit, ctx, path="dup.py", old_string="a = 1", new_string="a = 2", replace_all=True
    )
    assert out.content == "Edited dup.py: 2 replacements."
    assert (project / "dup.py").read_text(encoding="utf-8") == "a = 2\na = 2\n"


# -- bash --------------------------------------------------------------------------------------


async def test_bash_reports_exit_code_and_merges_stderr(ctx: ToolContext) -> None:
    out = await run(bash, ctx, command="echo out; echo err >&2; exit 3")
    assert out.content == "out\nerr\n[exit code 3]"
    assert out.is_error is True  # a failed command is a failure, as Claude Code reports it
    ok = await run(bash, ctx, command="echo fine")
    assert (ok.content, ok.is_error) == ("fine\n[exit code 0]", False)


async def test_bash_runs_in_cwd_with_clean_env(ctx: ToolContext, project: Path) -> None:
    ctx.env = {
        **ctx.env,
        "ANTHROPIC_API_KEY": "sk-secret",
        "MY_SERVICE_ACCESS_TOKEN": "t",
        "KEEP_ME": "1",
    }
    out = await run(
        bash,
        ctx,
        command="pwd; echo ${ANTHROPIC_API_KEY:-none} ${MY_SERVICE_ACCESS_TOKEN:-none} $KEEP_ME $NO_COLOR $PAGER $GIT_PAGER",
    )
    assert out.content == f"{project}\nnone none 1 1 cat cat\n[exit code 0]"


def test_command_env_scrubs_credentials() -> None:
    env = command_env(
        {"PATH": "/bin", "OPENAI_API_KEY": "x", "GITHUB_AUTH_TOKEN": "y", "GEMINI_API_KEY": "z"}
    )
    assert env == {
        "PATH": "/bin",
        "NO_COLOR": "1",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "TERM": "dumb",
    }


def test_clean_output_strips_ansi_and_carriage_return_redraws() -> None:
    assert clean_output("\x1b[31mred\x1b[0m\nprogress 10%\rprogress 50%\rprogress 100%\ndone") == (
        "red\nprogress 100%\ndone"
    )


async def test_bash_timeout_kills_the_whole_group(ctx: ToolContext, project: Path) -> None:
    marker = project / "child-alive"
    command = (
        "trap '' TERM; "  # ignores SIGTERM: needs SIGKILL
        f"(sleep 5; touch {marker}) & "
        "echo started; sleep 30"
    )
    start = time.monotonic()
    out = await run(bash, ctx, command=command, timeout=1)
    assert time.monotonic() - start < 20  # not the command's 30 s
    assert out.content == "started\n[timed out after 1 s; process group killed]"
    assert out.is_error
    await asyncio.sleep(5.5)
    assert not marker.exists()


async def test_bash_cancellation_kills_the_group(ctx: ToolContext, project: Path) -> None:
    pidfile = project / "pid"
    task = asyncio.create_task(run(bash, ctx, command=f"echo $$ > {pidfile}; sleep 60"))
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text(encoding="utf-8").strip():
            break
        await asyncio.sleep(0.02)
    pid = int(pidfile.read_text(encoding="utf-8"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_bash_caps_a_flood_of_output(ctx: ToolContext) -> None:
    out = await run(
        bash, ctx, command="head -c 100000000 /dev/zero | tr '\\0' 'x'; echo; echo tail-marker"
    )
    assert isinstance(out.content, str)
    # 100 MB is held as 64 kB of each end; the one truncation function cuts it further for the
    # model (and keeps these 128 kB for raw_output).
    assert len(out.content.encode()) < 2 * 65_536 + 200
    dropped = re.findall(r"\.\.\. \[(\d+) bytes truncated\] \.\.\.", out.content)
    assert len(dropped) == 1
    assert 99_800_000 < int(dropped[0]) < 100_000_000
    assert out.content.endswith("tail-marker\n[exit code 0]")


async def test_bash_does_not_wait_for_background_children(ctx: ToolContext) -> None:
    start = time.monotonic()
    out = await run(bash, ctx, command="sleep 30 & echo spawned")
    assert time.monotonic() - start < 15  # not the child's 30 s
    assert out.content == "spawned\n[exit code 0]"


async def test_bash_rejects_bad_arguments(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="between 1 and 600"):
        await run(bash, ctx, command="true", timeout=601)
    with pytest.raises(ToolError, match="command is empty"):
        await run(bash, ctx, command="  ")


# -- grep / glob (ripgrep and the pure-Python fallback) ----------------------------------------


@pytest.fixture(params=[pytest.param("ripgrep", marks=pytest.mark.needs("rg")), "python"])
def search_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "ripgrep":
        monkeypatch.delenv("KEEL_NO_RIPGREP", raising=False)
    else:
        monkeypatch.setenv("KEEL_NO_RIPGREP", "1")
    return str(request.param)


@pytest.fixture
def tree(project: Path) -> Path:
    (project / ".gitignore").write_text("build/\n*.log\n!keep.log\n", encoding="utf-8")
    (project / "build").mkdir()
    (project / "build" / "gen.py").write_text("def generated(): pass\n", encoding="utf-8")
    (project / "debug.log").write_text("def in_log\n", encoding="utf-8")
    (project / "keep.log").write_text("def kept\n", encoding="utf-8")
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "src" / "pkg" / "mod.py").write_text(
        "import os\n\ndef helper():\n    return os.sep\n", encoding="utf-8"
    )
    (project / "src" / "data.bin").write_bytes(b"def \x00\x01")
    (project / ".git").mkdir()
    (project / ".git" / "config").write_text("def not_me\n", encoding="utf-8")
    return project


async def test_grep_finds_lines_respecting_gitignore(search_mode: str, tree: Path) -> None:
    ctx = ToolContext(cwd=tree, root=tree)
    out = await run(grep, ctx, pattern=r"^def ")
    assert sorted(str(out.content).splitlines()) == [
        "app.py:1:def main():",
        "keep.log:1:def kept",
        "src/pkg/mod.py:3:def helper():",
    ]
    out = await run(grep, ctx, pattern="DEF HELPER", ignore_case=True, files_only=True)
    assert out.content == "src/pkg/mod.py"
    out = await run(grep, ctx, pattern="def", glob="*.py", path="src")
    assert out.content == "src/pkg/mod.py:3:def helper():"
    out = await run(grep, ctx, pattern="zzz_nothing")
    assert out.content == "No matches for 'zzz_nothing'."


async def test_glob_lists_files_respecting_gitignore(search_mode: str, tree: Path) -> None:
    ctx = ToolContext(cwd=tree, root=tree)
    out = await run(glob, ctx, pattern="*.py")
    assert out.content == "app.py\nsrc/pkg/mod.py\nutil.py"
    out = await run(glob, ctx, pattern="src/**/*.py")
    assert out.content == "src/pkg/mod.py"
    out = await run(glob, ctx, pattern="*.log")
    assert out.content == "keep.log"
    out = await run(glob, ctx, pattern="*.rs")
    assert out.content == "No files match '*.rs'."


async def test_hidden_files_and_folders_are_skipped_as_ripgrep_skips_them(
    search_mode: str, tree: Path
) -> None:
    """ripgrep leaves out dot-files and dot-folders (a .venv, an .env with a token); the Python
    fallback, used where ripgrep is not installed, must list and search the same files. A
    dot-folder given as the path is searched, as ripgrep searches a path it is given."""
    (tree / ".venv" / "lib").mkdir(parents=True)
    (tree / ".venv" / "lib" / "big.py").write_text("def vendored():\n", encoding="utf-8")
    (tree / ".venv" / "lib" / ".hidden.py").write_text("def deeper():\n", encoding="utf-8")
    (tree / ".env").write_text("def TOKEN=secret\n", encoding="utf-8")
    (tree / "src" / ".cache.py").write_text("def cached():\n", encoding="utf-8")
    ctx = ToolContext(cwd=tree, root=tree)
    out = await run(glob, ctx, pattern="*.py")
    assert out.content == "app.py\nsrc/pkg/mod.py\nutil.py"
    out = await run(grep, ctx, pattern=r"^def ")
    assert sorted(str(out.content).splitlines()) == [
        "app.py:1:def main():",
        "keep.log:1:def kept",
        "src/pkg/mod.py:3:def helper():",
    ]
    out = await run(grep, ctx, pattern="def", path=".venv")
    assert out.content == ".venv/lib/big.py:1:def vendored():"


async def test_search_output_stops_at_500_lines(search_mode: str, project: Path) -> None:
    (project / "many.txt").write_text("hit\n" * 800, encoding="utf-8")
    ctx = ToolContext(cwd=project, root=project)
    out = await run(grep, ctx, pattern="hit")
    lines = str(out.content).splitlines()
    assert len(lines) == 501
    assert lines[-1] == "[stopped at 500 lines; narrow the pattern or the path to see more]"
