"""The prefix a provider's cache (or a local server's) can serve to every new session: the system
prompt and the tools are the same bytes in every project and session with the same settings;
what varies (the working directory, the date, the instruction files, the skills and memory
indexes) opens the first user message as `<context>`, and is journaled with it. Also what
happens to it across a compaction and a resume, and the recovery of a summary request that does
not fit the window itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from keel.agent.compaction import COMPACT_PROMPT, TRIMMED_NOTE
from keel.agent.loop import Agent
from keel.agent.prompt import BASE_PROMPT
from keel.errors import RunError
from keel.llm.catalog import ModelInfo
from keel.llm.errors import ContextOverflow
from keel.llm.events import Done, Notice, StreamEvent
from keel.llm.messages import Message, Text, ToolResult, ToolUse, Usage
from keel.llm.request import Request
from keel.testing.openai_server import OpenAIChatServer
from keel.testing.script import Reply
from keel.tools.builtin import builtin_tools
from tests.test_cli import keel, session_files

MODEL = "openai-compatible/local-model"


def _project(root: Path, instructions: str) -> Path:
    (root / ".git").mkdir(parents=True)
    (root / "AGENTS.md").write_text(instructions, encoding="utf-8")
    return root


def _env(server: OpenAIChatServer) -> dict[str, str]:
    return {**os.environ, "OPENAI_COMPATIBLE_BASE_URL": f"{server.url}/v1"}


def _head(raw: bytes) -> bytes:
    """A Chat Completions body up to its first user message: model, tools, the system message."""
    body = json.loads(raw)
    return json.dumps([body["model"], body["tools"], body["messages"][0]]).encode()


def test_two_projects_send_the_same_system_prompt_and_tools(tmp_path: Path) -> None:
    one = _project(tmp_path / "one", "Use tabs.")
    two = _project(tmp_path / "elsewhere" / "two", "Use spaces.")
    heads, users = [], []
    for project in (one, two):
        with OpenAIChatServer([Reply(Message("assistant", (Text("ok"),)))]) as server:
            out = keel("-p", "hello", "--model", MODEL, cwd=project, env=_env(server))
            assert out.returncode == 0, out.stderr
            [request] = server.model_requests
        heads.append(_head(request.body))
        body = request.json or {}
        assert body["messages"][0] == {"role": "system", "content": BASE_PROMPT}
        users.append(body["messages"][1:])
    assert heads[0] == heads[1]
    for project, user, rule in ((one, users[0], "Use tabs."), (two, users[1], "Use spaces.")):
        [message] = user
        content = message["content"]
        assert message["role"] == "user"
        assert content.startswith(f"<context>\n<env>\nWorking directory: {project}\n")
        assert f"Git repository: {project}\n</env>" in content
        assert content.endswith(
            f'<instructions source="{project / "AGENTS.md"}">\n{rule}\n</instructions>\n'
            "</context>\n\nhello"
        )


def test_the_context_is_journaled_and_a_resumed_session_sends_it_as_it_was(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path / "p", "Rule one.")
    replies = [Reply(Message("assistant", (Text(t),))) for t in ("first", "second")]
    with OpenAIChatServer(replies) as server:
        out = keel("-p", "one", "--model", MODEL, cwd=project, env=_env(server))
        assert out.returncode == 0, out.stderr
        (project / "AGENTS.md").write_text("Rule two.", encoding="utf-8")
        out = keel("-p", "-c", "two", "--model", MODEL, cwd=project, env=_env(server))
        assert out.returncode == 2  # the resume gate names the change
        assert f"instruction file {project / 'AGENTS.md'} changed" in out.stderr
        out = keel("-p", "-c", "--force", "two", "--model", MODEL, cwd=project, env=_env(server))
        assert out.returncode == 0, out.stderr
        first, second = (r.json or {} for r in server.model_requests)
    # The resumed request repeats the first one's messages byte for byte: the context the model
    # was given, not a new one.
    assert second["messages"][:3] == [*first["messages"][:2], second["messages"][2]]
    assert "Rule one." in first["messages"][1]["content"]
    assert second["messages"][3:] == [{"role": "user", "content": "two"}]
    [path] = session_files(Path(os.environ["KEEL_HOME"]))
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    opening = next(r for r in records if r.get("type") == "user")
    texts = [b["text"] for b in opening["message"]["content"]]
    assert texts[0].startswith("<context>\n<env>\n")
    assert texts[1] == "one"


# -- compaction ------------------------------------------------------------------------------------


class Window:
    """A model with a small window on keel's side of the wire: a request whose estimated size
    (characters / 4, over everything sent) exceeds `limit` is refused as a server refuses it;
    any other gets the next reply. Records every request."""

    name = "scripted"

    def __init__(self, limit: int, replies: list[Message]) -> None:
        self.limit = limit
        self.replies = replies
        self.requests: list[Request] = []

    @staticmethod
    def size(request: Request) -> int:
        chars = len(request.system) + sum(
            len(b.text if isinstance(b, Text | ToolResult) else json.dumps(b.input))
            for m in request.messages
            for b in m.blocks
            if isinstance(b, Text | ToolResult | ToolUse)
        )
        return chars // 4

    async def stream(self, request: Request) -> Any:
        self.requests.append(request)
        if self.size(request) > self.limit:
            raise ContextOverflow(f"request ({self.size(request)} tokens) exceeds the window")
        message = self.replies.pop(0)
        event: StreamEvent = Done(message, Usage(self.size(request), 10), "end_turn")
        yield event

    async def aclose(self) -> None:
        pass


def _big_conversation(agent: Agent, rounds: int, size: int) -> None:
    """`rounds` tool rounds whose results are `size` characters each, as a resumed session has."""
    from keel.llm.messages import Conversation

    messages = [Message("user", (Text("look at the logs"),))]
    for i in range(rounds):
        call = ToolUse(f"call_{i}", "read", {"path": f"log{i}.txt"})
        messages.append(Message("assistant", (Text(f"reading log {i}"), call)))
        result = ToolResult(f"call_{i}", (Text(f"log {i}: " + "x" * size),))
        messages.append(Message("user", (result,)))
    agent.conversation = Conversation(messages)


def _summary() -> Message:
    return Message("assistant", (Text("<summary>the logs were read</summary>"),))


async def test_a_summary_that_does_not_fit_is_asked_of_a_trimmed_transcript(tmp_path: Path) -> None:
    provider = Window(6_000, [_summary(), Message("assistant", (Text("done"),))])
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=builtin_tools(),
        cwd=tmp_path,
        info=ModelInfo(window=8_000, max_output=2_000),
    )
    _big_conversation(agent, rounds=6, size=12_000)  # ~18k tokens: far over the window
    events: list[Any] = []
    result = await agent.run("go on", events.append)
    assert result.stop_reason == "end_turn"
    assert result.text == "done"
    summaries = [r for r in provider.requests if COMPACT_PROMPT in r.messages[-1].text]
    full, *trims = summaries
    # The whole conversation was asked first.
    assert "x" * 12_000 in full.messages[2].tool_results[0].text
    fitting = trims[-1]
    assert provider.size(fitting) <= provider.limit
    assert TRIMMED_NOTE in fitting.messages[-1].text
    assert fitting.messages[0].text == "look at the logs"  # the first prompt is kept
    stubs = [b.text for m in fitting.messages for b in m.tool_results]
    assert "[12007 characters left out of the summary request]" in stubs
    warnings = [e.text for e in events if isinstance(e, Notice) and e.level == "warning"]
    assert any("summarizing a trimmed transcript" in w for w in warnings)
    # The conversation is now the summary (the context first, then what the summary says).
    [opening] = agent.messages[:1]
    assert opening.text.startswith("<context>\n<env>\n")
    assert "the logs were read" in opening.text


async def test_when_nothing_fits_the_error_names_what_helps(tmp_path: Path) -> None:
    provider = Window(50, [])
    agent = Agent(
        provider=provider,
        model="scripted",
        tools=[],
        cwd=tmp_path,
        system="short",
        info=ModelInfo(window=400, max_output=100),
    )
    _big_conversation(agent, rounds=3, size=3_000)
    with pytest.raises(RunError) as caught:
        await agent.compact()
    assert "cannot be summarized within the model's context window" in str(caught.value)
    assert "ctx-size" in caught.value.hint
    assert "num_ctx" in caught.value.hint


# -- continuing after a failure --------------------------------------------------------------------


def test_continue_after_a_failed_prompt_sends_the_new_prompt(tmp_path: Path) -> None:
    """`-c "new"` after a prompt that failed: the new prompt is sent (with the unanswered one,
    in one request) and journaled, not dropped behind a second failure."""
    from keel.testing.script import Fault

    project = _project(tmp_path / "p", "Be brief.")
    script: list[Reply | Fault] = [
        Fault("status", status=400),
        Reply(Message("assistant", (Text("both done"),))),
    ]
    with OpenAIChatServer(script) as server:
        failed = keel("-p", "first task", "--model", MODEL, cwd=project, env=_env(server))
        assert failed.returncode == 1
        out = keel("-p", "-c", "second task", "--model", MODEL, cwd=project, env=_env(server))
        assert out.returncode == 0, out.stderr
        assert out.stdout == "both done\n"
        first, second = (r.json or {} for r in server.model_requests)
    assert second["messages"][:1] == first["messages"][:1]
    [user] = second["messages"][1:]
    assert user["content"] == first["messages"][1]["content"] + "\n\nsecond task"
    [path] = session_files(Path(os.environ["KEEL_HOME"]))
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    prompts = [
        b["text"] for r in records if r.get("type") == "user" for b in r["message"]["content"]
    ]
    assert prompts[1:] == ["first task", "second task"]


def test_an_overflow_the_server_finds_is_recovered_by_a_trimmed_summary(tmp_path: Path) -> None:
    """Issue 28 item 2 against a llama.cpp-like server: a tool result fills the 4k window; the
    server refuses the next request (400 exceed_context_size_error) and the summary request of
    the whole conversation too; keel summarizes a trimmed transcript and goes on."""
    from keel.testing.llamacpp_server import LlamaCppServer

    project = _project(tmp_path / "p", "Be brief.")
    (project / "big.txt").write_text("".join(f"line {i}: {'y' * 50}\n" for i in range(300)))
    call = ToolUse("call_1", "read", {"path": "big.txt"})
    script = [
        Reply(Message("assistant", (call,))),
        Reply(Message("assistant", (Text("<summary>big.txt has 300 lines</summary>"),))),
        Reply(Message("assistant", (Text("It has 300 lines."),))),
    ]
    with LlamaCppServer(script, n_ctx=4096) as server:
        env = {**os.environ, "OPENAI_COMPATIBLE_BASE_URL": f"{server.url}/v1"}
        argv = ["-p", "how long is big.txt?", "--model", MODEL, "--output-format", "json"]
        out = keel(*argv, cwd=project, env=env)
        sizes = list(server.prompts)
        bodies = [r.json or {} for r in server.model_requests]
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"] == "It has 300 lines."
    assert "summarizing a trimmed transcript" in out.stderr
    # The request after the tool ran, and the whole-conversation summary, did not fit; the
    # trimmed summary and the request after it did.
    refused = [prompt for prompt, _ in sizes if prompt > 4096]
    assert len(refused) >= 1
    summaries = [b for b in bodies if COMPACT_PROMPT[:60] in json.dumps(b["messages"][-1])]
    trimmed_summary = summaries[-1]
    assert TRIMMED_NOTE in trimmed_summary["messages"][-1]["content"]
    assert "characters left out of the summary request" in json.dumps(trimmed_summary)
    last = bodies[-1]["messages"]
    assert last[1]["content"].startswith("<context>\n<env>\n")
    assert "big.txt has 300 lines" in last[1]["content"]


def test_a_new_session_in_another_project_reuses_the_servers_cache(tmp_path: Path) -> None:
    """The second measure of issue 28 item 9: against a llama.cpp-like server with a slot cache,
    the first request of a session in a second project finds the system prompt and every tool
    definition already processed (cached_tokens), and is charged only for its own context."""
    from keel.testing.llamacpp_server import LlamaCppServer, count_tokens, render_prompt

    one = _project(tmp_path / "one", "Use tabs.")
    two = _project(tmp_path / "two", "Use spaces.")
    replies = [Reply(Message("assistant", (Text(t),))) for t in ("a", "b")]
    with LlamaCppServer(replies, n_ctx=32_768) as server:
        env = {**os.environ, "OPENAI_COMPATIBLE_BASE_URL": f"{server.url}/v1"}
        for project in (one, two):
            out = keel("-p", "hello", "--model", MODEL, cwd=project, env=env)
            assert out.returncode == 0, out.stderr
        first, second = (r.json or {} for r in server.model_requests)
        prompts = list(server.prompts)
    # What both share: the rendered system prompt and tools, up to the first user message.
    shared = render_prompt({**first, "messages": first["messages"][:1]})
    assert render_prompt({**second, "messages": second["messages"][:1]}) == shared
    (_, cold), (total, cached) = prompts
    assert cold == 0
    assert cached >= count_tokens(shared) - 1  # the prefix, less a boundary token or so
    assert total - cached <= count_tokens(second["messages"][1]["content"]) + 16
