"""Tool output costs about its budget in memory, not the size of the input: each tool runs in a
fresh Python process on a big generated input, and that process's peak RSS (and its children's:
ripgrep, the fallback grep worker) is measured with getrusage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The most a tool call may add to the peak RSS of the process running it, and the most a child
#: process (ripgrep, a grep worker) may reach.
BOUND_KB = 150 * 1024

DRIVER = """
import asyncio, json, os, resource, sys
from pathlib import Path

from keel.tools.base import ToolContext
from keel.tools.builtin import {tool} as tool

def peak(who):
    return resource.getrusage(who).ru_maxrss

async def main():
    cwd = Path(sys.argv[1])
    ctx = ToolContext(cwd=cwd, root=cwd, env=dict(os.environ))
    before = peak(resource.RUSAGE_SELF)
    try:
        out = await tool.run(ctx, json.loads(sys.argv[2]))
        content, error = out.content, out.is_error
    except Exception as exc:
        content, error = f"{{type(exc).__name__}}: {{exc}}", True
    print(json.dumps({{
        "grew_kb": peak(resource.RUSAGE_SELF) - before,
        "children_kb": peak(resource.RUSAGE_CHILDREN),
        "content": content if isinstance(content, str) else repr(content),
        "is_error": error,
    }}))

asyncio.run(main())
"""


def measure(tool: str, cwd: Path, env: dict[str, str] | None = None, **args: Any) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER.format(tool=tool), str(cwd), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KEEL_NO_SANDBOX": "1", **(env or {})},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def one_huge_line(path: Path, size: int) -> None:
    """A text file of one `size`-byte line: 8 kB of `x` (so it is not taken for binary), then a
    sparse run of zero bytes, instant to make and to read."""
    with path.open("wb") as f:
        f.write(b"x" * 8192)
        f.truncate(size)


def test_read_of_one_200_mb_line_stays_small(tmp_path: Path) -> None:
    size = 200 * 1024 * 1024
    one_huge_line(tmp_path / "huge.txt", size)
    result = measure("read", tmp_path, path="huge.txt")
    assert result["content"] == f"     1\t{'x' * 2000}… [line truncated, {size} chars]"
    assert result["grew_kb"] < BOUND_KB, result["grew_kb"]


def test_read_counts_millions_of_lines_without_holding_them(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("line\n" * 3_000_000, encoding="utf-8")
    result = measure("read", tmp_path, path="many.txt", offset=2_999_999)
    assert result["content"] == "2999999\tline\n3000000\tline"
    assert result["grew_kb"] < BOUND_KB, result["grew_kb"]


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep (rg) is not installed")
def test_grep_with_millions_of_matches_stops_ripgrep_at_the_budget(tmp_path: Path) -> None:
    (tmp_path / "m.txt").write_text("match\n" * 4_000_000, encoding="utf-8")
    result = measure("grep", tmp_path, pattern="match")
    lines = result["content"].splitlines()
    assert lines[:2] == ["m.txt:1:match", "m.txt:2:match"]
    assert lines[-1] == "[stopped at 500 lines; narrow the pattern or the path to see more]"
    assert len(lines) == 501
    assert result["grew_kb"] < BOUND_KB, result["grew_kb"]
    assert result["children_kb"] < BOUND_KB, result["children_kb"]


def test_fallback_grep_of_one_200_mb_line_stays_small(tmp_path: Path) -> None:
    one_huge_line(tmp_path / "huge.txt", 200 * 1024 * 1024)
    result = measure("grep", tmp_path, env={"KEEL_NO_RIPGREP": "1"}, pattern="^xx")
    assert result["content"] == "huge.txt:1:" + "x" * 500
    assert result["grew_kb"] < BOUND_KB, result["grew_kb"]
    assert result["children_kb"] < BOUND_KB, result["children_kb"]


def test_bash_flood_of_200_mb_keeps_a_bounded_head_and_tail(tmp_path: Path) -> None:
    command = "head -c 200000000 /dev/zero | tr '\\0' x; echo; echo end"
    result = measure("bash", tmp_path, command=command, sandbox=False)
    content = result["content"]
    assert content.startswith("x" * 1000)
    assert content.endswith("x\nend\n[exit code 0]")
    assert "bytes truncated] ..." in content
    assert len(content) < 200_000
    assert result["grew_kb"] < BOUND_KB, result["grew_kb"]


MCP_DRIVER = """
import json, resource, sys
from mcp_types import CallToolResult, TextContent
from keel.agent.tool_runner import finish
from keel.llm.messages import ToolUse
from keel.mcp.tools import to_output

huge = "x" * (200 * 1024 * 1024)
result = CallToolResult(content=[TextContent(type="text", text=huge), TextContent(type="text", text=huge)])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
output = to_output(result)
shown = finish(ToolUse("call-1", "mcp__s__t", {}), output)
print(json.dumps({
    "grew_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before,
    "kept": [len(b.text) for b in output.blocks()],
    "shown": [len(b.text.encode()) for b in shown.content],
}))
"""


def test_mcp_result_text_is_cut_as_it_is_converted() -> None:
    """Two 200 MB texts in one result: at most `MAX_RESULT_CHARS` survive the conversion, and
    what the model sees is the runner's 30 kB."""
    pytest.importorskip("mcp_types")
    from keel.mcp.tools import MAX_RESULT_CHARS

    out = subprocess.run(
        [sys.executable, "-c", MCP_DRIVER], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    marker = f"\n... [{200 * 1024 * 1024 - MAX_RESULT_CHARS} characters cut] ...\n"
    omitted = f"[{200 * 1024 * 1024} characters omitted: the result is over {MAX_RESULT_CHARS}]"
    assert result["kept"] == [MAX_RESULT_CHARS + len(marker), len(omitted)]
    assert result["shown"][0] < 31_000
    assert result["grew_kb"] < BOUND_KB, result["grew_kb"]


SERVER = str(Path(__file__).parent / "mcp_servers" / "tools_server.py")


async def test_an_mcp_answer_over_the_message_limit_fails_the_call_and_keeps_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stdio server's answer longer than `MAX_MESSAGE_BYTES` is dropped as it arrives (never
    held whole); the call fails with a message saying so, and the server stays usable."""
    pytest.importorskip("mcp")
    from keel.mcp import McpCallError, McpManager, load_servers
    from keel.mcp import client as mcp_client

    monkeypatch.setattr(mcp_client, "MAX_MESSAGE_BYTES", 1024 * 1024)
    settings = tmp_path.parent / f"{tmp_path.name}-user-settings.json"  # outside the project
    servers, _ = load_servers(
        tmp_path, [(settings, {"main": {"command": sys.executable, "args": [SERVER]}})], os.environ
    )
    async with McpManager(servers, root=tmp_path, env=os.environ, log_dir=tmp_path / "l") as m:
        assert await m.wait_ready(30)
        with pytest.raises(McpCallError) as info:
            await m.call("main", "echo", {"text": "x" * 1000, "times": 3000})
        assert "over keel's limit of 1048576 bytes, and was dropped" in str(info.value)
        small = await m.call("main", "echo", {"text": "still here"})
        assert [c.text for c in small.content] == ["still here"]  # type: ignore[union-attr]
