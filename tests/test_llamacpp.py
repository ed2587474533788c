"""keel against a server that behaves as llama.cpp's (and vLLM's) does: the window and tool
support read before the first request, `max_tokens` sized to what the window leaves, the 400 for
a prompt that does not fit, a reply cut where the context fills, the prefix cache, and a
connection the server closes after every streamed response (issue 28, items 3 and 4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import keel.llm.h1 as h1
from keel.agent.compaction import COMPACT_PROMPT, PREAMBLE, estimate_tokens
from keel.agent.events import Event, UsageUpdated
from keel.agent.limits import MIN_OUTPUT_TOKENS, output_budget
from keel.agent.loop import Agent
from keel.llm.catalog import UNKNOWN_MAX_OUTPUT, UNKNOWN_WINDOW, ModelRef
from keel.llm.errors import APIError, ContextOverflow
from keel.llm.events import Done, Notice
from keel.llm.http import HTTPSettings
from keel.llm.messages import Message, Text, ToolUse, Usage
from keel.llm.provider import (
    ModelFacts,
    Provider,
    ProviderConfig,
    RetryPolicy,
    make_provider,
    model_facts,
)
from keel.llm.providers.openai_chat import OpenAIChatProvider
from keel.llm.request import Request
from keel.permissions.gate import AllowAll
from keel.testing.llamacpp_server import LlamaCppServer, count_tokens, render_prompt
from keel.testing.ollama_server import FakeModel, OllamaServer
from keel.testing.openai_server import CREATED, OpenAIChatServer
from keel.testing.script import Reply, reply
from keel.testing.server import RecordedRequest, ResponseWriter
from tests.test_cli import keel
from tests.test_providers import LMStudioServer

SYSTEM = "You are terse."
MODEL = "local-model"
NO_TOOLS_WARNING = (
    "the server's chat template for local-model has no tool support: llama.cpp drops the tools "
    "and the model cannot call any (start llama-server with --jinja, or give it a chat "
    "template that has tools)"
)


def provider_for(url: str, preset: str = "openai-compatible", *, attempts: int = 4) -> Provider:
    config = ProviderConfig(base_url=f"{url}/v1")
    return make_provider(
        ModelRef(preset, MODEL), config=config, env={}, retry=RetryPolicy(attempts=attempts)
    )


def agent_for(provider: Provider, project: Path) -> Agent:
    return Agent(
        provider=provider, model=MODEL, tools=[], cwd=project, system=SYSTEM, gate=AllowAll()
    )


def paths(requests: list[RecordedRequest]) -> list[str]:
    return [f"{r.method} {r.path}" for r in requests]


def chat_body(agent: Agent, messages: list[dict[str, Any]], window: int) -> dict[str, Any]:
    """The whole body keel sends for a first request of `agent`'s context: `max_tokens` is what
    `window` leaves after the system prompt, the (empty) tool list and the first message."""
    context = (len(SYSTEM) + len("[]")) // 4 + estimate_tokens(agent.messages[:1])
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, *messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": output_budget(window, context, UNKNOWN_MAX_OUTPUT),
    }


def windows(events: list[Event]) -> list[int]:
    return [e.window for e in events if isinstance(e, UsageUpdated)]


# -- the window and tool support -----------------------------------------------------------------


async def test_n_ctx_is_read_before_the_first_request(project: Path) -> None:
    with LlamaCppServer([reply("four")], n_ctx=4096) as server:
        provider = provider_for(server.url)
        events: list[Event] = []
        async with agent_for(provider, project) as agent:
            result = await agent.run("2+2?", events.append)
    assert result.stop_reason == "end_turn"
    assert paths(server.requests) == ["GET /props", "POST /v1/chat/completions"]
    user = agent.messages[0].text
    expected = chat_body(agent, [{"role": "user", "content": user}], 4096)
    assert server.model_requests[0].json == expected
    assert expected["max_tokens"] < 4096 < UNKNOWN_MAX_OUTPUT
    assert windows(events) == [4096]
    assert agent.info.window == 4096
    assert not [e for e in events if isinstance(e, Notice) and e.level == "warning"]


class VLLMServer(OpenAIChatServer):
    """vLLM's `/v1/models` (with `max_model_len`); no `/props`."""

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if request.path == "/v1/models":
            entry = {
                "id": MODEL,
                "object": "model",
                "created": CREATED,
                "owned_by": "vllm",
                "root": MODEL,
                "parent": None,
                "max_model_len": 8192,
                "permission": [],
            }
            await response.send_json(200, {"object": "list", "data": [entry]})
            return
        await super().handle_other(request, response)


async def test_vllm_max_model_len_is_read(project: Path) -> None:
    with VLLMServer([reply("ok")], models=(MODEL,)) as server:
        events: list[Event] = []
        async with agent_for(provider_for(server.url, "vllm"), project) as agent:
            await agent.run("hi", events.append)
    assert paths(server.requests) == [
        "GET /props",
        "GET /v1/models",
        "POST /v1/chat/completions",
    ]
    user = agent.messages[0].text
    assert server.model_requests[0].json == chat_body(
        agent, [{"role": "user", "content": user}], 8192
    )
    assert windows(events) == [8192]


async def test_a_server_that_says_nothing_leaves_the_catalog_window(project: Path) -> None:
    # /props is a 404, /v1/models lists the model without a window: nothing is known.
    with OpenAIChatServer([reply("ok"), reply("again")], models=(MODEL,)) as server:
        events: list[Event] = []
        async with agent_for(provider_for(server.url), project) as agent:
            await agent.run("hi", events.append)
            await agent.run("more", events.append)
    assert paths(server.requests) == [
        "GET /props",
        "GET /v1/models",
        "POST /v1/chat/completions",
        "POST /v1/chat/completions",
    ]
    assert windows(events) == [UNKNOWN_WINDOW, UNKNOWN_WINDOW]
    assert server.model_requests[0].json["max_tokens"] == UNKNOWN_MAX_OUTPUT


async def test_a_hosted_provider_is_not_asked(project: Path) -> None:
    with OpenAIChatServer([reply("ok")], models=(MODEL,)) as server:
        adapter = OpenAIChatProvider(
            base_url=f"{server.url}/v1", api_key="", settings=HTTPSettings()
        )
        assert await model_facts(adapter, MODEL) == ModelFacts()
        await adapter.aclose()
    assert server.requests == []


async def test_a_template_without_tools_is_warned_about_once(project: Path) -> None:
    with LlamaCppServer([reply("a"), reply("b")], supports_tools=False) as server:
        events: list[Event] = []
        async with agent_for(provider_for(server.url), project) as agent:
            await agent.run("one", events.append)
            await agent.run("two", events.append)
    warnings = [e.text for e in events if isinstance(e, Notice) and e.level == "warning"]
    assert warnings == [NO_TOOLS_WARNING]
    assert paths(server.requests).count("GET /props") == 1


# -- what the server does with a request ---------------------------------------------------------


def one_request(text: str, max_tokens: int = 100, model: str = MODEL) -> Request:
    return Request(model, SYSTEM, (Message("user", (Text(text),)),), max_tokens=max_tokens)


async def finish(provider: Provider, request: Request) -> Done:
    done = None
    async for event in provider.stream(request):
        if isinstance(event, Done):
            done = event
    assert done is not None
    return done


async def test_the_overflow_400_is_a_context_overflow() -> None:
    with LlamaCppServer(n_ctx=64) as server:
        provider = provider_for(server.url)
        text = "x" * 400
        with pytest.raises(ContextOverflow) as caught:
            await finish(provider, one_request(text))
        await provider.aclose()
    prompt = count_tokens(render_prompt(server.model_requests[0].json))
    assert caught.value.message == (
        f"openai-compatible: request ({prompt} tokens) exceeds the available context size "
        "(64 tokens), try increasing it"
    )
    assert server.prompts == [(prompt, 0)]


async def test_a_reply_that_fills_the_context_stops_with_length() -> None:
    with LlamaCppServer([reply("y" * 400)], n_ctx=64) as server:
        provider = provider_for(server.url)
        done = await finish(provider, one_request("hi", max_tokens=1000))
        await provider.aclose()
    prompt = server.prompts[0][0]
    assert done.stop_reason == "max_tokens"
    assert done.usage == Usage(input=prompt, output=64 - prompt)
    assert done.message.text == "y" * 4 * (64 - prompt)
    assert done.window == 64


async def test_the_prefix_cache_is_reported_as_cached_tokens() -> None:
    with LlamaCppServer([reply("first"), reply("second")]) as server:
        provider = provider_for(server.url)
        first = await finish(provider, one_request("the same question"))
        second = await finish(provider, one_request("the same question, longer"))
        await provider.aclose()
    (_, c1), (n2, c2) = server.prompts
    assert c1 == 0 < c2 < n2
    assert first.usage.cache_read == 0
    assert second.usage == Usage(input=n2 - c2, output=count_tokens("second"), cache_read=c2)


# -- item 4: a connection the server closed after a streamed response ---------------------------


@pytest.fixture
def stale_reuse_unfixed(monkeypatch: pytest.MonkeyPatch) -> None:
    """keel as it was: a request that finds its pooled connection closed fails."""
    monkeypatch.setattr(h1, "STALE_ATTEMPTS", 0)


async def compact_then_prompt(server: LlamaCppServer, project: Path) -> list[str]:
    """A prompt, a compaction, a prompt: each request right after a streamed response, on the
    connection the server is about to close; retries off."""
    stops: list[str] = []
    async with agent_for(provider_for(server.url, attempts=1), project) as agent:
        stops.append((await agent.run("one")).stop_reason)
        await agent.compact()
        stops.append((await agent.run("two")).stop_reason)
    return stops


async def test_the_request_after_a_compaction_succeeds_with_retries_off(project: Path) -> None:
    script = [reply("1"), reply("<summary>talked</summary>"), reply("2")]
    with LlamaCppServer(script, close_delay=0.3) as server:
        stops = await compact_then_prompt(server, project)
    assert stops == ["end_turn", "end_turn"]
    first, summary, after = (json.loads(r.body)["messages"] for r in server.model_requests)
    assert first[-1]["content"].endswith("one")
    assert summary[-1]["content"].startswith("The conversation so far is about to be replaced")
    assert after[-1]["content"].endswith("two")


async def test_without_the_fix_that_request_fails(project: Path, stale_reuse_unfixed: None) -> None:
    script = [reply("1"), reply("<summary>talked</summary>"), reply("2")]
    lost = pytest.raises(APIError, match="connection to openai-compatible lost")
    with LlamaCppServer(script, close_delay=0.3) as server, lost:
        await compact_then_prompt(server, project)


def bash_call(call_id: str, command: str) -> Reply:
    return Reply(Message("assistant", (ToolUse(call_id, "bash", {"command": command}),)))


def test_keel_p_survives_an_automatic_compaction_with_retries_off(project: Path) -> None:
    """Issue 28 item 4 as it happened: llama-server closes the connection after each streamed
    response; after a tool run keel notices, but the request right after a compaction went out
    on the dead connection and, with --max-retries 0, ended the run."""
    script = [
        bash_call("call_1", "echo hi"),
        bash_call("call_2", "python3 -c \"print('x' * 14000)\""),  # fills the 6k window
        reply("<summary>ran two commands</summary>"),
        reply("done"),
    ]
    with LlamaCppServer(script, n_ctx=6000, close_delay=0.1) as server:
        env = {"OPENAI_COMPATIBLE_BASE_URL": f"{server.url}/v1"}
        argv = ["-p", "run both", "--model", f"openai-compatible/{MODEL}", "--max-retries", "0"]
        argv += ["--allowed-tools", "Bash"]  # the same without a sandbox (CI's tools-hidden run)
        out = keel(*argv, "--output-format", "json", cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stop_reason"] == "end_turn"
    assert "compacted: ~5k tokens" in out.stderr
    assert paths(server.requests) == ["GET /props"] + ["POST /v1/chat/completions"] * 4
    summary, after = (r.json["messages"] for r in server.model_requests[2:])
    assert summary[-1]["content"].startswith(COMPACT_PROMPT[:60])
    assert PREAMBLE in after[-1]["content"]
    assert server.errors == []


# -- output_budget -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "context", "max_output", "expected"),
    [
        (128_000, 5_000, 16_000, 16_000),  # a large window changes nothing
        (4_096, 3_000, 16_000, 796),  # what a 4k window leaves after 3k and 10%
        (8_192, 1_600, 16_000, 2_048),  # a small window: a quarter of it for one reply
        (16_384, 1_000, 16_000, 4_096),  # still small
        (32_768, 1_000, 16_000, 16_000),  # not small: what the model may write
        (4_096, 3_900, 16_000, MIN_OUTPUT_TOKENS),  # never below the floor
        (4_096, 100, 300, 300),  # nor above what the model may write
        (4_096, 4_000, 300, 300),  # a floor above that is that
    ],
)
def test_output_budget(window: int, context: int, max_output: int, expected: int) -> None:
    assert output_budget(window, context, max_output) == expected


async def test_a_server_still_loading_is_asked_again() -> None:
    with LlamaCppServer(n_ctx=2048) as server:
        provider = provider_for(server.url)
        server.loading = True
        assert await model_facts(provider, MODEL) == ModelFacts()
        server.loading = False
        assert await model_facts(provider, MODEL) == ModelFacts(2048, True, "")
        assert await model_facts(provider, MODEL) == ModelFacts(2048, True, "")
        await provider.aclose()
    assert paths(server.requests) == ["GET /props", "GET /v1/models", "GET /props"]


# -- the other local servers say the same before the first request -------------------------------


async def test_ollama_and_lm_studio_windows_are_known_before_the_first_request() -> None:
    with OllamaServer(
        [reply("ok")], models=(FakeModel("qwen3:8b", context_length=8192),)
    ) as ollama:
        provider = make_provider(ModelRef("ollama", "qwen3:8b"), env={"OLLAMA_HOST": ollama.url})
        assert await model_facts(provider, "qwen3:8b") == ModelFacts(8192, True, "")
        assert (await finish(provider, one_request("hi", model="qwen3:8b"))).window == 8192
        await provider.aclose()
    assert paths(ollama.requests) == ["POST /api/show", "POST /api/chat"]

    with LMStudioServer(loaded=16_384) as lmstudio:
        env = {"LMSTUDIO_BASE_URL": f"{lmstudio.url}/v1"}
        provider = make_provider(ModelRef("lmstudio", "coder-model"), env=env)
        assert await model_facts(provider, "coder-model") == ModelFacts(16_384)
        await provider.aclose()
    assert paths(lmstudio.requests) == ["GET /api/v0/models"]


async def test_an_ollama_server_that_cannot_say_leaves_nothing_known() -> None:
    with OllamaServer() as ollama:  # no such model: /api/show answers 404
        provider = make_provider(ModelRef("ollama", "nope"), env={"OLLAMA_HOST": ollama.url})
        assert await model_facts(provider, "nope") == ModelFacts()
        await provider.aclose()


# -- keel models NAME asks the server -------------------------------------------------------------


def test_keel_models_shows_what_a_local_server_serves(project: Path) -> None:
    with LlamaCppServer(n_ctx=4096, supports_tools=False) as server:
        env = {"OPENAI_COMPATIBLE_BASE_URL": f"{server.url}/v1"}
        table = keel("models", "openai-compatible", cwd=project, env=env)
        listed = keel("models", "openai-compatible", "--json", cwd=project, env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout == (
        "MODEL                          WINDOW  TOOLS\n"
        "openai-compatible/local-model  4,096   no (template)\n"
        f"\n1 model(s) at {server.url}/v1; they cost nothing. WINDOW is what the server serves "
        "each with (one slot's context on llama.cpp); ? where it does not say.\n"
    )
    assert table.stderr == f"keel: warning: {NO_TOOLS_WARNING}\n"
    assert json.loads(listed.stdout) == [
        {
            "model": "openai-compatible/local-model",
            "window": 4096,
            "tools": False,
            "source": f"{server.url}/v1",
        }
    ]
    assert paths(server.requests) == ["GET /v1/models", "GET /props"] * 2


def test_keel_models_names_a_server_that_does_not_answer(project: Path) -> None:
    out = keel("models", "vllm", cwd=project, env={"VLLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "keel: error: cannot list vllm's models at http://127.0.0.1:9/v1 (hint: check the vllm "
        'server is running and providers."vllm".base_url (or VLLM_BASE_URL) points at it)\n'
    )
