"""Every provider a user brings, against loopback servers speaking its wire API: the presets and
custom providers, LM Studio's window, text tool-call salvage, fallbacks, effort per adapter, a
model switch mid-session with thinking present, and one scripted coding task through the real
agent loop on every provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from keel.agent.loop import Agent
from keel.cli.main import main
from keel.config.settings import Settings, load_settings
from keel.errors import UserError
from keel.llm.catalog import ModelInfo, ModelRef, parse_model
from keel.llm.errors import APIError, ContextOverflow
from keel.llm.events import Done, Notice, TextDelta
from keel.llm.fallback import Cooldowns
from keel.llm.messages import (
    Message,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    assistant,
    tool_result,
    user,
)
from keel.llm.presets import PRESETS
from keel.llm.provider import Provider, RetryPolicy, make_provider, model_info
from keel.llm.request import Request, Sampling, ToolSpec
from keel.permissions import AllowAll
from keel.testing.anthropic_server import AnthropicServer
from keel.testing.gemini_server import SKIP_SIGNATURE, GeminiServer
from keel.testing.ollama_server import OllamaServer
from keel.testing.openai_server import OpenAIChatServer, OpenAIResponsesServer
from keel.testing.script import Fault, Reply, Step
from keel.testing.server import RecordedRequest, ResponseWriter, ScriptedHTTPServer
from keel.tools.builtin import builtin_tools
from tests.helpers import body, collect, free_port

KEY = "test-key"
READ = ToolSpec(
    "read",
    "Read a file.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
FAST = RetryPolicy(attempts=2, base=0.01, jitter=0)
HOSTED = {
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": ("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "deepseek": ("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
    "xai": ("https://api.x.ai/v1", "XAI_API_KEY"),
    "mistral": ("https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
    "together": ("https://api.together.xyz/v1", "TOGETHER_API_KEY"),
}


def request(*messages: Message, model: str, **options: Any) -> Request:
    options.setdefault("tools", (READ,))
    options.setdefault("max_tokens", 32_000)
    return Request(model=model, system="You are keel.", messages=messages, **options)


async def run_one(provider: Provider, req: Request) -> list[Any]:
    try:
        return await collect(provider, req)
    finally:
        await provider.aclose()


# ---------------------------------------------------------------------------------------------
# The provider table


def test_every_preset_has_its_url_and_key_variables() -> None:
    table = {
        p.name: (p.wire, p.base_url, p.url_envs, p.key_envs, p.key_required, p.local)
        for p in PRESETS.values()
    }
    hosted = {
        name: ("openai-chat", url, (f"{name.upper()}_BASE_URL",), (key,), True, False)
        for name, (url, key) in HOSTED.items()
    }
    assert table == {
        "anthropic": (
            "anthropic",
            "https://api.anthropic.com",
            ("ANTHROPIC_BASE_URL",),
            ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
            True,
            False,
        ),
        "openai": (
            "openai-responses",
            "https://api.openai.com/v1",
            ("OPENAI_BASE_URL",),
            ("OPENAI_API_KEY",),
            True,
            False,
        ),
        "gemini": (
            "gemini",
            "https://generativelanguage.googleapis.com",
            ("GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"),
            ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
            True,
            False,
        ),
        "openai-compatible": (
            "openai-chat",
            "",
            ("OPENAI_COMPATIBLE_BASE_URL",),
            ("OPENAI_COMPATIBLE_API_KEY",),
            False,
            True,
        ),
        "ollama": (
            "ollama",
            "http://localhost:11434",
            ("OLLAMA_HOST",),
            ("OLLAMA_API_KEY",),
            False,
            True,
        ),
        "lmstudio": (
            "openai-chat",
            "http://localhost:1234/v1",
            ("LMSTUDIO_BASE_URL",),
            ("LMSTUDIO_API_KEY",),
            False,
            True,
        ),
        "vllm": (
            "openai-chat",
            "http://localhost:8000/v1",
            ("VLLM_BASE_URL",),
            ("VLLM_API_KEY",),
            False,
            True,
        ),
        **hosted,
    }


@pytest.mark.parametrize("name", sorted(HOSTED))
async def test_hosted_preset_speaks_chat_completions_with_its_key(name: str) -> None:
    key_var = HOSTED[name][1]
    with OpenAIChatServer([Reply(assistant("Hi."))], api_key=KEY) as server:
        env = {key_var: KEY, f"{name.upper()}_BASE_URL": server.url + "/v1"}
        events = await run_one(
            make_provider(parse_model(f"{name}/vendor/model-x"), env=env),
            request(user("hi"), model="vendor/model-x"),
        )
    [sent] = server.model_requests
    assert (sent.path, sent.headers["authorization"]) == ("/v1/chat/completions", f"Bearer {KEY}")
    assert body(sent)["model"] == "vendor/model-x"
    assert events[-1] == Done(
        Message("assistant", (Text("Hi."),), name, "vendor/model-x"), Usage(100, 20), "end_turn"
    )


@pytest.mark.parametrize("name", sorted(HOSTED))
def test_hosted_preset_without_its_key_is_one_line(name: str) -> None:
    key_var = HOSTED[name][1]
    with pytest.raises(UserError) as info:
        make_provider(parse_model(f"{name}/m"), env={})
    assert info.value.one_line() == (
        f"{key_var} is not set; {name} needs an API key (hint: export {key_var}=… , or try keel "
        "offline with --model scripted:demo)"
    )


class LMStudioServer(OpenAIChatServer):
    """LM Studio: Chat Completions at /v1, and its own REST API's model information."""

    def __init__(self, script: list[Step] | None = None, *, loaded: int | None = 32_768) -> None:
        super().__init__(script or ())
        self.loaded = loaded

    async def handle_other(self, request: RecordedRequest, response: ResponseWriter) -> None:
        if request.method == "GET" and request.path == "/api/v0/models":
            models = []
            for model in ("qwen/qwen3-coder-30b", "coder-model", "other"):
                info: dict[str, Any] = {
                    "id": model,
                    "object": "model",
                    "type": "llm",
                    "arch": "qwen3",
                    "state": "loaded" if self.loaded else "not-loaded",
                    "max_context_length": 262_144,
                }
                if self.loaded:
                    info["loaded_context_length"] = self.loaded
                models.append(info)
            await response.send_json(200, {"object": "list", "data": models})
            return
        await super().handle_other(request, response)


@pytest.mark.parametrize(("loaded", "window"), [(32_768, 32_768), (None, 262_144)])
async def test_lmstudio_window_comes_from_its_model_info(loaded: int | None, window: int) -> None:
    model = "qwen/qwen3-coder-30b"
    with LMStudioServer([Reply(assistant("a")), Reply(assistant("b"))], loaded=loaded) as server:
        provider = make_provider(
            parse_model(f"lmstudio/{model}"), env={"LMSTUDIO_BASE_URL": server.url + "/v1"}
        )
        try:
            first = await collect(provider, request(user("hi"), model=model))
            second = await collect(provider, request(user("hi"), model=model))
        finally:
            await provider.aclose()
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/api/v0/models"),  # asked once
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
    ]
    assert (first[-1].window, second[-1].window) == (window, window)
    assert first[-1].message.provider == "lmstudio"


async def test_a_server_without_model_info_leaves_the_catalog_window() -> None:
    with OpenAIChatServer([Reply(assistant("ok"))]) as server:
        events = await run_one(
            make_provider(parse_model("lmstudio/m"), env={"LMSTUDIO_BASE_URL": server.url + "/v1"}),
            request(user("hi"), model="m"),
        )
    assert events[-1].window == 0
    assert events[-1].message.text == "ok"


# ---------------------------------------------------------------------------------------------
# Custom providers from settings


def user_settings(project: Path) -> Path:
    """The user's own settings file (custom providers are the user's: in a project file their
    URL and key variable wait for approval)."""
    return Path(os.environ["KEEL_CONFIG_DIR"]) / "settings.json"


def write_settings(project: Path, data: dict[str, Any]) -> Settings:
    path = user_settings(project)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    settings = load_settings(project, env=os.environ)
    assert settings.warnings == []
    return settings


async def test_custom_providers_on_each_wire(project: Path) -> None:
    with (
        OpenAIChatServer([Reply(assistant("chat"))], api_key=KEY) as chat,
        OpenAIResponsesServer([Reply(assistant("responses"))]) as responses,
        AnthropicServer([Reply(assistant("anthropic"))], api_key=KEY) as anthropic,
    ):
        settings = write_settings(
            project,
            {
                "providers": {
                    "gateway": {
                        "base_url": chat.url + "/v1",
                        "api_key_env": "GATEWAY_KEY",
                        "wire": "openai-chat",
                    },
                    "office": {"base_url": responses.url + "/v1", "wire": "openai-responses"},
                    "claude-proxy": {
                        "base_url": anthropic.url,
                        "api_key_env": "PROXY_KEY",
                        "wire": "anthropic",
                    },
                }
            },
        )
        env = {"GATEWAY_KEY": KEY, "PROXY_KEY": KEY}
        answers = []
        for spec in ("gateway/llama-70b", "office/gpt-5", "claude-proxy/claude-sonnet-4-5"):
            ref = parse_model(spec)
            provider = make_provider(ref, settings=settings, env=env)
            [*_, done] = await run_one(provider, request(user("hi"), model=ref.model))
            answers.append((done.message.provider, done.message.model, done.message.text))
    assert answers == [
        ("gateway", "llama-70b", "chat"),
        ("office", "gpt-5", "responses"),
        ("claude-proxy", "claude-sonnet-4-5", "anthropic"),
    ]
    assert chat.model_requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert "authorization" not in responses.model_requests[0].headers
    assert anthropic.model_requests[0].headers["x-api-key"] == KEY


def test_custom_provider_mistakes_are_one_line(project: Path) -> None:
    settings = write_settings(
        project,
        {
            "providers": {
                "gateway": {
                    "base_url": "http://127.0.0.1:9/v1",
                    "api_key_env": "GW_KEY",
                    "wire": "openai-chat",
                }
            }
        },
    )
    with pytest.raises(UserError) as missing:
        make_provider(parse_model("gateway/m"), settings=settings, env={})
    with pytest.raises(UserError) as unknown:
        make_provider(parse_model("elsewhere/m"), settings=settings, env={})
    assert missing.value.one_line() == (
        "GW_KEY is not set; gateway needs an API key (hint: export GW_KEY=… , or try keel "
        "offline with --model scripted:demo)"
    )
    assert unknown.value.one_line().startswith(
        "unknown provider 'elsewhere' in model 'elsewhere/m' (hint: known providers: anthropic, "
    )
    user_settings(project).write_text(
        json.dumps({"providers": {"gw": {"base_url": "http://x/v1", "wire": "grpc"}}}),
        encoding="utf-8",
    )
    bad = load_settings(project, env=os.environ)
    assert bad.warnings == [
        f"{user_settings(project)}: providers.gw.wire must be one of "
        "anthropic, openai-responses, openai-chat, gemini, ollama; ignored"
    ]


async def test_settings_for_ollama_sampling_and_fallbacks(project: Path) -> None:
    settings = write_settings(
        project,
        {
            "providers": {"ollama": {"num_ctx": 16_384}},
            "models": {"ollama/qwen3:8b": {"temperature": 0.6, "top_p": 0.95}},
            "fallbacks": {"ollama/qwen3:8b": "openai/gpt-5"},
        },
    )
    assert (settings.providers["ollama"].num_ctx, settings.fallbacks, settings.sampling) == (
        16_384,
        {"ollama/qwen3:8b": ("openai/gpt-5",)},
        {"ollama/qwen3:8b": Sampling(0.6, 0.95)},
    )
    with OllamaServer([Reply(assistant("ok"))]) as server:
        env = {"OLLAMA_HOST": server.url, "OPENAI_API_KEY": KEY}
        provider = make_provider(parse_model("ollama/qwen3:8b"), settings=settings, env=env)
        [*_, done] = await run_one(provider, request(user("hi"), model="qwen3:8b", tools=()))
    assert body(server.model_requests[0])["options"] == {
        "num_ctx": 16_384,
        "num_predict": 32_000,
        "temperature": 0.6,
        "top_p": 0.95,
    }
    assert done.window == 16_384

    user_settings(project).write_text(
        json.dumps({"providers": {"ollama": {"num_ctx": "big"}}, "fallbacks": {"a/b": [1]}}),
        encoding="utf-8",
    )
    bad = load_settings(project, env=os.environ)
    where = user_settings(project)
    assert bad.warnings == [
        f"{where}: providers.ollama.num_ctx must be a positive number of tokens; ignored",
        f"{where}: fallbacks.a/b must be a list of strings; ignored",
    ]


# ---------------------------------------------------------------------------------------------
# Text tool-call salvage


SALVAGE_TEXT = (
    'Let me look.<tool_call>{"name": "read", "arguments": {"path": "app.py"}}</tool_call>'
    '<function_call>{"name": "delete_everything", "arguments": {}}</function_call>'
    "<tool_call><function=read><parameter=path>\nutil.py\n</parameter></function></tool_call>"
)


async def test_salvaged_calls_on_chat_completions() -> None:
    with OpenAIChatServer([Reply(assistant(SALVAGE_TEXT))]) as server:
        events = await run_one(
            make_provider(
                parse_model("openai-compatible/qwen"),
                env={"OPENAI_COMPATIBLE_BASE_URL": server.url + "/v1"},
            ),
            request(user("look"), model="qwen"),
        )
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    # Markup of offered tools never reaches the screen; the unoffered call stays as written.
    assert shown == (
        'Let me look.<function_call>{"name": "delete_everything", "arguments": {}}</function_call>'
    )
    *_, notice, unrun, done = events
    calls = done.message.tool_uses
    assert notice == Notice("the model wrote 2 tool call(s) as text (read, read); running them")
    why = "<function_call>: delete_everything is not one of the offered tools"
    assert unrun == Notice(f"a tool call written as text was not run ({why})", "warning")
    assert done == Done(
        Message(
            "assistant",
            (
                Text(
                    'Let me look.<function_call>{"name": "delete_everything", "arguments": {}}'
                    "</function_call>"
                ),
                ToolUse(calls[0].id, "read", {"path": "app.py"}),
                ToolUse(calls[1].id, "read", {"path": "util.py"}),
            ),
            "openai-compatible",
            "qwen",
        ),
        Usage(100, 20),
        "tool_use",
        unrun_calls=(why,),
    )


async def test_salvage_on_ollama_and_only_for_offered_tools() -> None:
    text = '<function_call>{"name": "read", "arguments": {"path": "a.py"}}</function_call>'
    with OllamaServer([Reply(assistant(text)), Reply(assistant(text))]) as server:
        provider = make_provider(parse_model("ollama/qwen3:8b"), env={"OLLAMA_HOST": server.url})
        try:
            offered = await collect(provider, request(user("go"), model="qwen3:8b"))
            not_offered = await collect(provider, request(user("go"), model="qwen3:8b", tools=()))
        finally:
            await provider.aclose()
    assert [e for e in offered if isinstance(e, TextDelta)] == []
    assert offered[-2] == Notice("the model wrote 1 tool call(s) as text (read); running them")
    assert [(c.name, c.input) for c in offered[-1].message.tool_uses] == [
        ("read", {"path": "a.py"})
    ]
    assert offered[-1].stop_reason == "tool_use"
    assert not_offered[-1].message.blocks == (Text(text),)
    assert not_offered[-1].stop_reason == "end_turn"


# ---------------------------------------------------------------------------------------------
# Fallbacks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


FALLBACKS = Settings(
    fallbacks={"anthropic/claude-sonnet-4-5": ("openai/gpt-5", "gemini/gemini-3-pro-preview")}
)


def fallback_servers() -> tuple[AnthropicServer, OpenAIResponsesServer, GeminiServer]:
    return (
        AnthropicServer(api_key=KEY).start(),
        OpenAIResponsesServer(api_key=KEY).start(),
        GeminiServer(api_key=KEY).start(),
    )


def fallback_env(anthropic: Any, openai: Any, gemini: Any) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": anthropic.url,
        "OPENAI_API_KEY": KEY,
        "OPENAI_BASE_URL": openai.url + "/v1",
        "GEMINI_API_KEY": KEY,
        "GEMINI_BASE_URL": gemini.url,
    }


@pytest.fixture
def chain() -> Iterator[tuple[AnthropicServer, OpenAIResponsesServer, GeminiServer]]:
    servers = fallback_servers()
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


async def test_fallback_after_429_then_500_with_cooldowns(
    chain: tuple[AnthropicServer, OpenAIResponsesServer, GeminiServer],
) -> None:
    anthropic, openai, gemini = chain
    clock = Clock()
    cooldowns = Cooldowns(clock)
    provider = make_provider(
        parse_model("anthropic/claude-sonnet-4-5"),
        settings=FALLBACKS,
        env=fallback_env(*chain),
        retry=FAST,
        cooldowns=cooldowns,
    )
    anthropic.add(Fault("status", status=429), Fault("status", status=500))
    openai.add(Reply(assistant("From gpt-5.")), Reply(assistant("Still gpt-5.")))
    anthropic.add(Reply(assistant("Claude is back.")))
    req = request(user("hi"), model="claude-sonnet-4-5", max_tokens=100_000)
    try:
        first = await collect(provider, req)
        cooling = await collect(provider, req)
        clock.now += 61
        back = await collect(provider, req)
    finally:
        await provider.aclose()

    assert [e for e in first if isinstance(e, Notice)] == [
        Notice(
            "anthropic returned 429: scripted error 429; retrying in 0.0 s (attempt 2 of 2)",
            "warning",
        ),
        Notice(
            "anthropic/claude-sonnet-4-5 failed (anthropic returned 500: scripted error 500); "
            "falling back to openai/gpt-5",
            "warning",
        ),
    ]
    assert first[-1].message == Message("assistant", (Text("From gpt-5."),), "openai", "gpt-5")
    # The fallback gets its own model id and no more output than it can give.
    assert [(body(r)["model"], body(r)["max_output_tokens"]) for r in openai.model_requests] == [
        ("gpt-5", 64_000),
        ("gpt-5", 64_000),
    ]
    assert cooling[0] == Notice(
        "anthropic/claude-sonnet-4-5 is cooling down (60 s left); trying openai/gpt-5"
    )
    assert cooling[-1].message.text == "Still gpt-5."
    assert back[-1].message == Message(
        "assistant", (Text("Claude is back."),), "anthropic", "claude-sonnet-4-5"
    )
    assert len(anthropic.model_requests) == 3  # two attempts, none while cooling, one after
    assert gemini.model_requests == []


async def test_a_bad_key_cools_down_for_ten_minutes(
    chain: tuple[AnthropicServer, OpenAIResponsesServer, GeminiServer],
) -> None:
    anthropic, openai, gemini = chain
    cooldowns = Cooldowns(Clock())
    env = fallback_env(*chain) | {"ANTHROPIC_API_KEY": "wrong", "OPENAI_API_KEY": "wrong"}
    provider = make_provider(
        parse_model("anthropic/claude-sonnet-4-5"),
        settings=FALLBACKS,
        env=env,
        retry=FAST,
        cooldowns=cooldowns,
    )
    gemini.add(Reply(assistant("Gemini answers.")))
    events = await run_one(provider, request(user("hi"), model="claude-sonnet-4-5"))
    assert events[-1].message.provider == "gemini"
    assert len(anthropic.model_requests) == len(openai.model_requests) == 1  # 401: no retry
    assert cooldowns.remaining("anthropic/claude-sonnet-4-5") == 600
    assert cooldowns.remaining("openai/gpt-5") == 600


async def test_a_fallbacks_tokens_are_priced_as_its_own(
    chain: tuple[AnthropicServer, OpenAIResponsesServer, GeminiServer], project: Path
) -> None:
    anthropic, openai, _ = chain
    env = fallback_env(*chain) | {"ANTHROPIC_API_KEY": "wrong"}
    agent = Agent(
        provider=make_provider(
            parse_model("anthropic/claude-sonnet-4-5"),
            settings=FALLBACKS,
            env=env,
            cooldowns=Cooldowns(Clock()),
        ),
        model="claude-sonnet-4-5",
        tools=[],
        cwd=project,
        system="You are keel.",
        gate=AllowAll(),
    )
    openai.add(Reply(assistant("From gpt-5."), usage=Usage(input=1_000, output=100)))
    try:
        result = await agent.run("hi")
    finally:
        await agent.aclose()
    assert (result.text, len(anthropic.model_requests)) == ("From gpt-5.", 1)
    # gpt-5: $1.25 / $10 per million (Claude Sonnet 4.5 would be $3 / $15).
    assert result.cost == pytest.approx((1_000 * 1.25 + 100 * 10.0) / 1e6)


@pytest.mark.parametrize(
    "fault",
    [
        Fault("overflow"),
        Fault("status", status=400),
        Fault("disconnect", after_events=4, reply=Reply(assistant("Hello there, partial"))),
    ],
    ids=["context-overflow", "bad-request", "after-output"],
)
async def test_no_fallback_for_overflow_bad_request_or_after_output(
    chain: tuple[AnthropicServer, OpenAIResponsesServer, GeminiServer], fault: Fault
) -> None:
    anthropic, openai, gemini = chain
    cooldowns = Cooldowns(Clock())
    provider = make_provider(
        parse_model("anthropic/claude-sonnet-4-5"),
        settings=FALLBACKS,
        env=fallback_env(*chain),
        retry=RetryPolicy(attempts=1),
        cooldowns=cooldowns,
    )
    anthropic.add(fault)
    events: list[Any] = []
    try:
        with pytest.raises(APIError) as info:
            await collect(provider, request(user("hi"), model="claude-sonnet-4-5"), events)
    finally:
        await provider.aclose()
    if fault.kind == "overflow":
        assert isinstance(info.value, ContextOverflow)
    assert not any(isinstance(e, Notice) for e in events)
    assert openai.model_requests == gemini.model_requests == []
    assert cooldowns.remaining("anthropic/claude-sonnet-4-5") == 0


# ---------------------------------------------------------------------------------------------
# Effort, per adapter


@pytest.mark.parametrize(
    ("spec", "effort", "fields"),
    [
        (
            "anthropic/claude-sonnet-4-5",
            "high",
            {"thinking": {"type": "enabled", "budget_tokens": 24_000}},
        ),
        (
            "anthropic/claude-opus-4-6",
            "max",
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}},
        ),
        (
            "anthropic/claude-sonnet-5",
            "max",
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
        ),
        ("anthropic/claude-sonnet-4-5", None, {}),
        ("openai/gpt-5", "low", {"reasoning": {"effort": "low", "summary": "auto"}}),
        ("openai/gpt-5", "max", {"reasoning": {"effort": "high", "summary": "auto"}}),
        (
            "gemini/gemini-3-pro-preview",
            "low",
            {
                "generationConfig": {
                    "maxOutputTokens": 32_000,
                    "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "LOW"},
                }
            },
        ),
        ("ollama/qwen3:8b", "medium", {"think": True}),
    ],
)
async def test_effort_in_each_request_body(spec: str, effort: Any, fields: dict[str, Any]) -> None:
    ref = parse_model(spec)
    servers: dict[str, ScriptedHTTPServer] = {
        "anthropic": AnthropicServer(api_key=KEY),
        "openai": OpenAIResponsesServer(api_key=KEY),
        "gemini": GeminiServer(api_key=KEY),
        "ollama": OllamaServer(),
    }
    server = servers[ref.provider]
    with server:
        server.add(Reply(assistant("ok")))
        env = provider_env(ref.provider, server)
        await run_one(
            make_provider(ref, env=env), request(user("hi"), model=ref.model, effort=effort)
        )
    sent = body(server.model_requests[0])
    assert {k: sent[k] for k in fields} == fields
    assert all(
        k not in sent for k in ("thinking", "output_config", "reasoning", "think") - fields.keys()
    )


async def test_no_anthropic_thinking_in_a_turn_another_provider_began() -> None:
    """After a fallback mid-turn, the turn's assistant messages have no Anthropic thinking, which
    the API requires with thinking on: those requests go without it, the next prompt has it."""
    openai_call = assistant(
        ToolUse("call_1", "read", {"path": "a.py"}), provider="openai", model="gpt-5"
    )
    mid_turn = (user("Read a.py."), openai_call, user(tool_result("call_1", "A")))
    next_prompt = (*mid_turn, assistant("It says A.", provider="openai"), user("Thanks."))
    with AnthropicServer([Reply(assistant("ok")), Reply(assistant("ok"))], api_key=KEY) as server:
        provider = make_provider(
            parse_model("anthropic/claude-sonnet-4-5"), env=provider_env("anthropic", server)
        )
        try:
            for messages in (mid_turn, next_prompt):
                await collect(
                    provider, request(*messages, model="claude-sonnet-4-5", effort="high")
                )
        finally:
            await provider.aclose()
    bodies = [body(r) for r in server.model_requests]
    assert [b.get("thinking") for b in bodies] == [
        None,
        {"type": "enabled", "budget_tokens": 24_000},
    ]


def provider_env(provider: str, server: ScriptedHTTPServer) -> dict[str, str]:
    """The environment that points `provider` at `server`."""
    url = server.url
    match provider:
        case "anthropic":
            return {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": url}
        case "openai":
            return {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": url + "/v1"}
        case "gemini":
            return {"GEMINI_API_KEY": KEY, "GEMINI_BASE_URL": url}
        case "ollama":
            return {"OLLAMA_HOST": url}
        case "openai-compatible":
            return {"OPENAI_COMPATIBLE_BASE_URL": url + "/v1"}
        case "lmstudio" | "vllm":
            return {f"{provider.upper()}_BASE_URL": url + "/v1"}
    key_var = HOSTED[provider][1]
    return {key_var: KEY, f"{provider.upper()}_BASE_URL": url + "/v1"}


def test_effort_flag_reaches_the_gemini_request(project: Path) -> None:
    with GeminiServer([Reply(assistant("Hi."))], api_key=KEY) as server:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "keel",
                "-p",
                "hi",
                "--model",
                "gemini/gemini-3-flash-preview",
                "--effort",
                "medium",
            ],
            cwd=project,
            input="",
            capture_output=True,
            text=True,
            env={**os.environ, **provider_env("gemini", server)},
            timeout=60,
        )
    assert (out.returncode, out.stdout) == (0, "Hi.\n"), out.stderr
    config = body(server.model_requests[0])["generationConfig"]
    assert config["thinkingConfig"] == {"includeThoughts": True, "thinkingLevel": "MEDIUM"}


# ---------------------------------------------------------------------------------------------
# Switching model mid-session


async def test_switch_anthropic_openai_gemini_ollama_with_thinking_present() -> None:
    """One conversation, each turn on the next provider. Every request carries only the
    reasoning its own provider can read; another provider's is dropped, and Gemini gets its
    documented skip signature on calls it did not make."""
    gemini_sig = "Z2VtaW5pLXNpZ25hdHVyZQ=="
    with (
        AnthropicServer(api_key=KEY) as anthropic,
        OpenAIResponsesServer(api_key=KEY) as openai,
        GeminiServer(api_key=KEY) as gemini,
        OllamaServer() as ollama,
    ):
        anthropic.add(
            Reply(
                assistant(
                    Thinking("Read it first.", "ant-sig", source="anthropic"),
                    ToolUse("toolu_1", "read", {"path": "a.py"}),
                )
            ),
            Reply(assistant("Back on Claude.")),
        )
        openai.add(
            Reply(
                assistant(
                    Thinking("Now b.py.", "encrypted-1", source="openai"),
                    ToolUse("call_oa", "read", {"path": "b.py"}),
                )
            )
        )
        gemini.add(
            Reply(
                assistant(
                    Thinking("And c.py.", gemini_sig, source="gemini"),
                    ToolUse("ignored", "read", {"path": "c.py"}),
                )
            )
        )
        ollama.add(Reply(assistant(Thinking("All read.", source="ollama"), "Three files.")))

        turns = [
            ("anthropic/claude-sonnet-4-5", anthropic),
            ("openai/gpt-5", openai),
            ("gemini/gemini-3-pro-preview", gemini),
            ("ollama/qwen3:8b", ollama),
            ("anthropic/claude-sonnet-4-5", anthropic),
        ]
        messages: list[Message] = [user("Read a.py, b.py and c.py.")]
        for spec, server in turns:
            ref = parse_model(spec)
            provider = make_provider(ref, env=provider_env(ref.provider, server))
            [*_, done] = await run_one(provider, request(*messages, model=ref.model))
            messages.append(done.message)
            if done.message.tool_uses:
                [call] = done.message.tool_uses
                messages.append(user(tool_result(call.id, f"contents of {call.input['path']}")))

    stamps = [(m.provider, m.model) for m in messages if m.role == "assistant"]
    assert stamps == [
        ("anthropic", "claude-sonnet-4-5"),
        ("openai", "gpt-5"),
        ("gemini", "gemini-3-pro-preview"),
        ("ollama", "qwen3:8b"),
        ("anthropic", "claude-sonnet-4-5"),
    ]
    gemini_call = messages[5].tool_uses[0]

    def result(call_id: str, path: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": call_id, "output": f"contents of {path}"}

    assert body(openai.model_requests[0])["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Read a.py, b.py and c.py."}],
        },
        # Anthropic's signed thinking: not for OpenAI.
        {
            "type": "function_call",
            "call_id": "toolu_1",
            "name": "read",
            "arguments": '{"path":"a.py"}',
        },
        result("toolu_1", "a.py"),
    ]
    assert body(gemini.model_requests[0])["contents"] == [
        {"role": "user", "parts": [{"text": "Read a.py, b.py and c.py."}]},
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "read", "args": {"path": "a.py"}},
                    "thoughtSignature": SKIP_SIGNATURE,
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "read",
                        "response": {"output": "contents of a.py"},
                    }
                }
            ],
        },
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "read", "args": {"path": "b.py"}},
                    "thoughtSignature": SKIP_SIGNATURE,
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "read",
                        "response": {"output": "contents of b.py"},
                    }
                }
            ],
        },
    ]
    assert body(ollama.model_requests[0])["messages"] == [
        {"role": "system", "content": "You are keel."},
        {"role": "user", "content": "Read a.py, b.py and c.py."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "read", "arguments": {"path": "a.py"}}}],
        },
        {"role": "tool", "content": "contents of a.py", "tool_name": "read"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "read", "arguments": {"path": "b.py"}}}],
        },
        {"role": "tool", "content": "contents of b.py", "tool_name": "read"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "read", "arguments": {"path": "c.py"}}}],
        },
        {"role": "tool", "content": "contents of c.py", "tool_name": "read"},
    ]

    def tool_turn(call_id: str, path: str, *thinking: dict[str, Any]) -> list[dict[str, Any]]:
        call = {"type": "tool_use", "id": call_id, "name": "read", "input": {"path": path}}
        answer = {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": [{"type": "text", "text": f"contents of {path}"}],
        }
        return [
            {"role": "assistant", "content": [*thinking, call]},
            {"role": "user", "content": [answer]},
        ]

    back = body(anthropic.model_requests[1])["messages"]
    # Cache breakpoints are Anthropic's business (test_anthropic.py); here only the content.
    for message in back:
        for block in message["content"]:
            block.pop("cache_control", None)
    assert back == [
        {"role": "user", "content": [{"type": "text", "text": "Read a.py, b.py and c.py."}]},
        *tool_turn(
            "toolu_1",
            "a.py",
            {"type": "thinking", "thinking": "Read it first.", "signature": "ant-sig"},
        ),
        *tool_turn("call_oa", "b.py"),
        *tool_turn(gemini_call.id, "c.py"),
        {"role": "assistant", "content": [{"type": "text", "text": "Three files."}]},
    ]


# ---------------------------------------------------------------------------------------------
# The same coding task through the agent loop, on every provider


TASK = "Make app.py greet the world, then run it."


def task_script() -> list[Step]:
    return [
        Reply(assistant("I'll read it first.", ToolUse("t1", "read", {"path": "app.py"}))),
        Reply(
            assistant(
                ToolUse(
                    "t2",
                    "edit",
                    {
                        "path": "app.py",
                        "old_string": "print('hello')",
                        "new_string": "print('hello, world')",
                    },
                )
            )
        ),
        Reply(assistant(ToolUse("t3", "bash", {"command": "python3 app.py"}))),
        Reply(assistant("app.py now prints hello, world.")),
    ]


def task_server(provider: str) -> tuple[AbstractContextManager[ScriptedHTTPServer], str]:
    models = {
        "anthropic": "claude-sonnet-4-5",
        "openai": "gpt-5",
        "gemini": "gemini-3-pro-preview",
        "ollama": "qwen3:8b",
    }
    servers: dict[str, ScriptedHTTPServer] = {
        "anthropic": AnthropicServer(task_script(), api_key=KEY),
        "openai": OpenAIResponsesServer(task_script(), api_key=KEY),
        "gemini": GeminiServer(task_script(), api_key=KEY),
        "ollama": OllamaServer(task_script()),
        "lmstudio": LMStudioServer(task_script()),
    }
    key = None if provider in ("openai-compatible", "vllm") else KEY
    server = servers.get(provider) or OpenAIChatServer(task_script(), api_key=key or "")
    return server, models.get(provider, "coder-model")


def normalised(messages: list[Message]) -> list[Message]:
    """The transcript with call ids and signatures (each provider's own) made comparable."""
    ids: dict[str, str] = {}

    def same(block: Any) -> Any:
        if isinstance(block, ToolUse):
            ids[block.id] = f"call-{len(ids) + 1}"
            return ToolUse(ids[block.id], block.name, block.input)
        if isinstance(block, ToolResult):
            return ToolResult(ids[block.tool_use_id], block.content, block.is_error)
        return block

    return [Message(m.role, tuple(map(same, m.blocks))) for m in messages]


PROVIDERS = [
    "anthropic",
    "openai",
    "gemini",
    "ollama",
    "lmstudio",
    "openai-compatible",
    "vllm",
    *sorted(HOSTED),
]


@pytest.mark.parametrize("name", PROVIDERS)
async def test_the_coding_task_on_every_provider(name: str, project: Path) -> None:
    server_cm, model = task_server(name)
    with server_cm as server:
        env = provider_env(name, server)
        ref = ModelRef(name, model)
        tools = [t for t in builtin_tools() if t.name in ("read", "edit", "bash")]
        agent = Agent(
            provider=make_provider(ref, env=env),
            model=model,
            tools=tools,
            cwd=project,
            system="You are keel.",
            env={**os.environ, **env},
            gate=AllowAll(),
        )
        try:
            result = await agent.run(TASK)
        finally:
            await agent.aclose()
        requests = server.model_requests
        errors = list(server.errors)

    assert errors == []
    assert (result.stop_reason, result.text, result.turns) == (
        "end_turn",
        "app.py now prints hello, world.",
        4,
    )
    assert len(requests) == 4
    assert (project / "app.py").read_text(encoding="utf-8") == (
        "def main():\n    print('hello, world')\n\n\nmain()\n"
    )
    assert {(m.provider, m.model) for m in agent.messages if m.role == "assistant"} == {
        (name, model)
    }
    assert normalised(agent.messages) == [
        user(TASK),
        assistant("I'll read it first.", ToolUse("call-1", "read", {"path": "app.py"})),
        user(
            tool_result(
                "call-1",
                "     1\tdef main():\n     2\t    print('hello')\n     3\t\n     4\t\n"
                "     5\tmain()",
            )
        ),
        assistant(
            ToolUse(
                "call-2",
                "edit",
                {
                    "path": "app.py",
                    "old_string": "print('hello')",
                    "new_string": "print('hello, world')",
                },
            )
        ),
        user(tool_result("call-2", "Edited app.py: 1 replacement.")),
        assistant(ToolUse("call-3", "bash", {"command": "python3 app.py"})),
        user(tool_result("call-3", "hello, world\n[exit code 0]")),
        assistant("app.py now prints hello, world."),
    ]
    if name in ("ollama", "lmstudio"):
        assert agent.info.window == 32_768  # what the local server loaded, not a guess


# ---------------------------------------------------------------------------------------------
# `keel models` and what models cost


def test_models_lists_a_providers_catalog_with_settings_laid_over(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_settings(
        project,
        {
            "models": {
                "deepseek-chat": {
                    "window": 65_536,
                    "max_output": 8_192,
                    "input_price": 0.1,
                    "output_price": 0.2,
                },
                "deepseek/deepseek-v4": {"window": 1_000_000, "max_output": 32_768},
            }
        },
    )
    monkeypatch.chdir(project)
    assert main(["models", "deepseek"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == [
        "MODEL                          WINDOW  MAX OUT  INPUT  OUTPUT  CACHE R  CACHE W",
        "deepseek/deepseek-chat *       65,536    8,192   0.10    0.20        -        -",
        "deepseek/deepseek-reasoner    131,072   65,536   0.28    0.42    0.028     0.00",
        "deepseek/deepseek-v4 *      1,000,000   32,768      -       -        -        -",
    ]
    assert "* from your settings" in out

    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {row["model"].split("/")[0] for row in listed} == {
        "anthropic",
        "openai",
        "gemini",
        "deepseek",
        "xai",
        "groq",
        "mistral",
        "together",
    }
    assert [row for row in listed if row["model"] == "openai/gpt-5"] == [
        {
            "model": "openai/gpt-5",
            "window": 400_000,
            "max_output": 128_000,
            "input_price": 1.25,
            "output_price": 10.0,
            "cache_read_price": 0.125,
            "cache_write_price": 0.0,
            "source": "catalog",
        }
    ]
    # Every hosted provider's models are priced.
    assert [row["model"] for row in listed if row["input_price"] is None] == [
        "deepseek/deepseek-v4"
    ]


def test_models_for_a_provider_keel_cannot_list(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project)
    assert main(["models", "lmstudio"]) == 2
    assert capsys.readouterr().err == (
        "keel: error: no known models for provider 'lmstudio' (hint: a local server lists its own "
        "models (keel models ollama; LM Studio's list))\n"
    )


def test_models_of_the_local_ollama_server(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project)
    with OllamaServer() as server:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        assert main(["models", "ollama"]) == 0
        table = capsys.readouterr().out
        assert main(["models", "ollama", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
    assert table == (
        "MODEL             PARAMS  QUANT   SIZE\n"
        "ollama/llama3:8b  8.0B    Q4_K_M  4.7 GB\n"
        "ollama/qwen3:8b   8.2B    Q4_K_M  5.2 GB\n"
        f"\n2 model(s) at {server.url}; they cost nothing. keel asks for a 32,768-token window "
        "(providers.ollama.num_ctx), or less if the model has less.\n"
    )
    assert listed[1] == {
        "model": "ollama/qwen3:8b",
        "parameter_size": "8.2B",
        "quantization": "Q4_K_M",
        "family": "qwen3",
        "size_bytes": 5_225_387_923,
        "source": server.url,
    }
    port = free_port()
    monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{port}")
    assert main(["models", "ollama"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"keel: error: cannot list ollama's models at http://127.0.0.1:{port}: ")
    assert err.endswith(
        '(hint: check the ollama server is running and providers."ollama".base_url '
        "(or OLLAMA_HOST) points at it)\n"
    )


def test_local_models_cost_nothing_but_user_prices_win() -> None:
    # The window is a guess until the server reports its own (test_ollama.py).
    free = ModelInfo(128_000, 16_000, 0.0, 0.0, 0.0, 0.0, known=False)
    assert model_info(ModelRef("ollama", "qwen3:8b")) == free
    # A local copy of a model a host sells is still free to run.
    groq = model_info(ModelRef("groq", "qwen/qwen3-32b"))
    local = model_info(ModelRef("lmstudio", "qwen/qwen3-32b"))
    assert (groq.input_price, local.input_price, local.window) == (0.29, 0.0, groq.window)
    assert local.cost(Usage(1_000_000, 1_000_000)) == 0.0
    mine = ModelInfo(8_192, 4_096, 0.5, 1.0)
    assert model_info(ModelRef("ollama", "big"), {"ollama/big": mine}) == mine
    assert model_info(ModelRef("ollama", "big"), {"big": mine}) == mine


async def test_agent_from_model_on_a_local_server(project: Path) -> None:
    with OllamaServer([Reply(assistant("Hi."), usage=Usage(input=5_000, output=300))]) as server:
        agent = Agent.from_model(
            "ollama/qwen3:8b",
            env={"OLLAMA_HOST": server.url},
            tools=[],
            cwd=project,
            gate=AllowAll(),
        )
        try:
            result = await agent.run("hi")
        finally:
            await agent.aclose()
    assert (result.text, result.cost, result.usage) == ("Hi.", 0.0, Usage(5_000, 300))
    assert (agent.info.window, agent.info.input_price) == (32_768, 0.0)
