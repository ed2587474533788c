"""`keel -p` end to end against loopback servers speaking each provider's wire API: a real
multi-tool task, and every bad input a user can hit on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.agent.prompt import build_system_prompt, context_text, env_block
from keel.llm.script import Fault, reply
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.openai_server import OpenAIChatServer, OpenAIResponsesServer
from keel.testing.server import ScriptedHTTPServer
from tests.helpers import free_port, unsandboxed_line_dropped

TASK = "list the Python files here and count their lines"


def task_script() -> list[Any]:
    return [
        reply("I'll find the Python files.", ("glob", {"pattern": "**/*.py"})),
        reply("", ("bash", {"command": "wc -l app.py util.py"})),
        reply("app.py has 5 lines and util.py has 1: 6 in all."),
    ]


def run_keel(
    args: list[str], project: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=project,
        input="",
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    with AnthropicServer(api_key="sk-ant-test") as server:
        yield server


@pytest.fixture
def responses() -> Iterator[OpenAIResponsesServer]:
    with OpenAIResponsesServer(api_key="sk-openai-test") as server:
        yield server


@pytest.fixture
def chat() -> Iterator[OpenAIChatServer]:
    with OpenAIChatServer() as server:
        yield server


def check_task_ran(server: ScriptedHTTPServer, out: subprocess.CompletedProcess[str]) -> list[Any]:
    assert out.returncode == 0, out.stderr
    assert out.stdout == "app.py has 5 lines and util.py has 1: 6 in all.\n"
    lines = out.stderr.splitlines()[-4:]  # each call, then its result
    assert [lines[0], lines[2]] == ["⏺ glob **/*.py", "⏺ bash wc -l app.py util.py"]
    assert lines[1].startswith("  └ ✓ ")
    assert lines[1].endswith("s  app.py (+1 more line)")
    assert lines[3].startswith("  └ ✓ ")
    assert lines[3].endswith("s  5 app.py (+3 more lines)")
    assert not server.script
    assert not server.errors
    return [r.json for r in server.model_requests]


def test_anthropic_multi_tool_task(anthropic: AnthropicServer, project: Path) -> None:
    anthropic.add(*task_script())
    out = run_keel(
        ["-p", TASK, "--model", "anthropic/claude-sonnet-4-5"],
        project,
        {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": anthropic.url},
    )
    bodies = check_task_ran(anthropic, out)
    assert len(bodies) == 3
    first, second, third = bodies
    assert first["model"] == "claude-sonnet-4-5"
    assert first["stream"] is True
    assert first["max_tokens"] == 64_000
    assert [t["name"] for t in first["tools"]] == [
        "bash",
        "bash_kill",
        "bash_output",
        "edit",
        "exit_plan_mode",
        "glob",
        "grep",
        "ls",
        "memory",  # on by default (docs/memory.md)
        "multi_edit",
        "raw_output",
        "read",
        "task",
        "task_stop",
        "task_wait",
        "todo_write",
        "web_fetch",
        "web_search",  # Anthropic's server tool (tests/llm/test_web_search.py)
        "write",
    ]
    assert first["tools"][-2]["type"] == "web_search_20250305"
    assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    # The system prompt is the same in every project; the environment opens the first message.
    assert first["system"] == [
        {"type": "text", "text": build_system_prompt(), "cache_control": {"type": "ephemeral"}}
    ]
    assert first["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": context_text(env_block(project))},
                {"type": "text", "text": TASK, "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]
    glob_call = second["messages"][1]["content"][1]
    assert glob_call["name"] == "glob"
    assert glob_call["input"] == {"pattern": "**/*.py"}
    glob_result = second["messages"][2]["content"][0]
    assert glob_result["tool_use_id"] == glob_call["id"]
    assert glob_result["content"][0]["text"] == "app.py\nutil.py"
    wc_result = third["messages"][4]["content"][0]
    assert wc_result["content"][0]["text"] == " 5 app.py\n 1 util.py\n 6 total\n[exit code 0]"
    anthropic_headers = anthropic.model_requests[0].headers
    assert anthropic_headers["x-api-key"] == "sk-ant-test"
    assert anthropic_headers["anthropic-version"] == "2023-06-01"


def test_openai_responses_multi_tool_task(responses: OpenAIResponsesServer, project: Path) -> None:
    responses.add(*task_script())
    out = run_keel(
        ["-p", TASK, "--model", "openai/gpt-5", "--output-format", "json"],
        project,
        {"OPENAI_API_KEY": "sk-openai-test", "OPENAI_BASE_URL": responses.url + "/v1"},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["result"] == "app.py has 5 lines and util.py has 1: 6 in all."
    assert result["turns"] == 3
    # gpt-5: $1.25/M input, $10/M output; the fake reports 100 in / 20 out per reply.
    assert result["cost_usd"] == pytest.approx(3 * (100 * 1.25 + 20 * 10) / 1e6)
    bodies = [r.json for r in responses.model_requests]
    assert [b["store"] for b in bodies] == [False, False, False]
    # gpt-5 searches the web on OpenAI's side: the sources of its searches are asked for too.
    include = ["reasoning.encrypted_content", "web_search_call.action.sources"]
    assert all(b["include"] == include for b in bodies)
    assert all(b["tools"][-1] == {"type": "web_search"} for b in bodies)
    assert len({b["prompt_cache_key"] for b in bodies}) == 1
    assert bodies[0]["prompt_cache_key"] == result["session_id"]
    outputs = [i for i in bodies[2]["input"] if i["type"] == "function_call_output"]
    assert [o["output"] for o in outputs] == [
        "app.py\nutil.py",
        " 5 app.py\n 1 util.py\n 6 total\n[exit code 0]",
    ]
    assert responses.model_requests[0].headers["authorization"] == "Bearer sk-openai-test"


def test_openai_compatible_multi_tool_task(chat: OpenAIChatServer, project: Path) -> None:
    chat.add(*task_script())
    out = run_keel(
        ["-p", TASK, "--model", "openai-compatible/qwen2.5-coder"],
        project,
        {"OPENAI_COMPATIBLE_BASE_URL": chat.url + "/v1"},
    )
    bodies = check_task_ran(chat, out)
    assert bodies[0]["model"] == "qwen2.5-coder"
    assert bodies[0]["stream_options"] == {"include_usage": True}
    # Chat Completions: the context and the prompt are one string, joined by a blank line.
    assert bodies[0]["messages"] == [
        {"role": "system", "content": build_system_prompt()},
        {"role": "user", "content": f"{context_text(env_block(project))}\n\n{TASK}"},
    ]
    assert "authorization" not in chat.model_requests[0].headers
    # A model the catalog does not know is noted once, not refused.
    assert unsandboxed_line_dropped(out.stderr).splitlines()[0] == (
        "keel: qwen2.5-coder is not in keel's catalog; the server is asked for its window (128k "
        "if it does not say)"
    )
    tool_messages = [m for m in bodies[2]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [
        "app.py\nutil.py",
        " 5 app.py\n 1 util.py\n 6 total\n[exit code 0]",
    ]


def test_wrong_key_is_one_line(anthropic: AnthropicServer, project: Path) -> None:
    out = run_keel(
        ["-p", "hi", "--model", "anthropic/claude-sonnet-4-5"],
        project,
        {"ANTHROPIC_API_KEY": "sk-wrong", "ANTHROPIC_BASE_URL": anthropic.url},
    )
    assert out.returncode == 1
    lines = unsandboxed_line_dropped(out.stderr).splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("keel: error: anthropic returned 401: ")
    assert lines[0].endswith("(hint: check ANTHROPIC_API_KEY)")
    assert len(anthropic.model_requests) == 1  # a 401 is not retried


def test_unreachable_server_is_one_line(project: Path) -> None:
    port = free_port()
    out = run_keel(
        ["-p", "hi", "--model", "openai/gpt-5", "--max-retries", "0"],
        project,
        {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"},
    )
    assert out.returncode == 1
    stderr = unsandboxed_line_dropped(out.stderr)
    assert stderr.startswith(f"keel: error: cannot reach openai at http://127.0.0.1:{port}/v1: ")
    assert stderr.endswith("(hint: check the server is running and the base URL is right)\n")
    assert stderr.count("\n") == 1


def test_unknown_model_from_the_server_is_one_line(
    anthropic: AnthropicServer, project: Path
) -> None:
    anthropic.add(Fault("status", status=404, message="model: claude-nope"))
    out = run_keel(
        ["-p", "hi", "--model", "anthropic/claude-nope"],
        project,
        {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": anthropic.url},
    )
    assert out.returncode == 1
    assert unsandboxed_line_dropped(out.stderr).splitlines() == [
        "keel: claude-nope is not in keel's catalog; assuming a 128k window and no prices",
        "keel: error: anthropic returned 404: model: claude-nope (hint: check the model name and the base URL)",
    ]


def test_rate_limit_is_retried_with_a_notice(anthropic: AnthropicServer, project: Path) -> None:
    anthropic.add(Fault("status", status=429, retry_after=0, message="slow down"), reply("fine"))
    out = run_keel(
        ["-p", "hi", "--model", "anthropic/claude-sonnet-4-5"],
        project,
        {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": anthropic.url},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "fine\n"
    assert unsandboxed_line_dropped(out.stderr) == (
        "keel: warning: anthropic returned 429: slow down; retrying in 0.0 s (attempt 2 of 4)\n"
    )


def test_context_overflow_is_an_error_with_a_hint(
    responses: OpenAIResponsesServer, project: Path
) -> None:
    responses.add(Fault("overflow"))
    out = run_keel(
        ["-p", "hi", "--model", "openai/gpt-5"],
        project,
        {"OPENAI_API_KEY": "sk-openai-test", "OPENAI_BASE_URL": responses.url + "/v1"},
    )
    assert out.returncode == 1
    stderr = unsandboxed_line_dropped(out.stderr)
    assert stderr.startswith("keel: error: ")
    assert stderr.startswith(
        "keel: error: the prompt alone does not fit the model's context window: "
    )
    assert stderr.endswith("(hint: shorten the prompt, or use a model with a larger window)\n")
