"""The neutral model's JSON form, the catalog and model addressing, retries, and settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel.config.settings import load_settings
from keel.errors import UserError
from keel.llm.catalog import ModelInfo, ModelRef, lookup, parse_model
from keel.llm.errors import APIError, ContextOverflow
from keel.llm.events import Done, Notice, TextDelta
from keel.llm.messages import (
    Conversation,
    Image,
    Message,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    Usage,
    message_from_json,
    message_to_json,
    user,
)
from keel.llm.provider import ProviderConfig, RetryingProvider, RetryPolicy
from keel.llm.providers.scripted import ScriptedProvider
from keel.llm.request import Request
from keel.llm.script import Fault, reply
from tests.helpers import Sleeps

# -- messages ----------------------------------------------------------------------------------


def test_every_block_round_trips_through_json_byte_for_byte() -> None:
    odd_signature = 'EqQBCkYIBxgCKkD+/==\x00\u2028 quote" back\\slash'
    message = Message(
        "assistant",
        (
            Thinking("step one\n", odd_signature, source="anthropic"),
            Thinking("", "cmVkYWN0ZWQ=", redacted=True, source="anthropic"),
            Thinking("summary", "gAAAAB-encrypted", source="openai", item_id="rs_123"),
            Text("héllo ✓"),
            ToolUse("toolu_1", "read", {"path": "a.py", "nested": {"x": [1, 2.5, None, True]}}),
            ToolUse("toolu_2", "bash", None, raw_input='{"command": "ls'),
            ToolUse("fc_1", "edit", {}, signature="gemini-thought-sig"),
        ),
        "anthropic",
        "claude-sonnet-4-5",
    )
    wire = json.dumps(message_to_json(message))
    back = message_from_json(json.loads(wire))
    assert back == message
    assert back.blocks[0].signature == odd_signature  # type: ignore[union-attr]
    results = user(
        ToolResult("toolu_1", (Text("out"), Image("image/png", "iVBORw0K")), is_error=True)
    )
    assert message_from_json(json.loads(json.dumps(message_to_json(results)))) == results


def test_message_json_shape_is_versioned() -> None:
    assert message_to_json(Message("user", (Text("hi"),))) == {
        "v": 1,
        "role": "user",
        "content": [{"type": "text", "text": "hi"}],
    }


def test_version_0_messages_migrate_and_newer_versions_are_refused() -> None:
    old = {"role": "assistant", "blocks": [{"type": "text", "text": "legacy"}], "model": "m"}
    assert message_from_json(old) == Message("assistant", (Text("legacy"),), "", "m")
    with pytest.raises(UserError, match="message format version 7 is newer"):
        message_from_json({"v": 7, "role": "user", "content": []})


def test_conversation_merges_consecutive_user_messages() -> None:
    c = Conversation()
    c.append(user("a"))
    c.append(Message("assistant", (Text("b"),)))
    c.append(user("c"))
    c.append(user("d"))
    assert c.messages == [
        user("a"),
        Message("assistant", (Text("b"),)),
        Message("user", (Text("c"), Text("d"))),
    ]


def test_usage_sums_four_tiers() -> None:
    u = Usage(10, 5, 100, 7) + Usage(1, 1, 1, 1)
    assert u == Usage(11, 6, 101, 8)
    assert u.total == 126
    assert Usage.from_json(u.to_json()) == u


# -- catalog -----------------------------------------------------------------------------------


def test_catalog_lookup_and_cost() -> None:
    sonnet = lookup("claude-sonnet-4-5-20250929")
    assert (sonnet.window, sonnet.max_output, sonnet.request_max_tokens) == (
        200_000,
        64_000,
        64_000,
    )
    assert lookup("anthropic/claude-sonnet-4-5") == sonnet
    assert sonnet.cost(Usage(1_000_000, 100_000, 1_000_000, 100_000)) == pytest.approx(
        3 + 1.5 + 0.3 + 0.375
    )
    assert lookup("claude-opus-5").request_max_tokens == 64_000  # capped below its 128k output
    unknown = lookup("my-local-model")
    assert (unknown.window, unknown.max_output, unknown.known, unknown.priced) == (
        128_000,
        16_000,
        False,
        False,
    )
    assert unknown.cost(Usage(1000, 1000)) == 0.0
    custom = ModelInfo(32_768, 4_096, 0.5, 1.5)
    assert lookup("my-local-model", {"my-local-model": custom}) is custom


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("anthropic/claude-sonnet-4-5", ModelRef("anthropic", "claude-sonnet-4-5")),
        ("openai/gpt-5", ModelRef("openai", "gpt-5")),
        ("openai-compatible/org/model-7b", ModelRef("openai-compatible", "org/model-7b")),
        ("claude-haiku-4-5", ModelRef("anthropic", "claude-haiku-4-5")),
        ("gpt-4.1", ModelRef("openai", "gpt-4.1")),
        ("o3", ModelRef("openai", "o3")),
        ("o4-mini", ModelRef("openai", "o4-mini")),
        ("scripted:examples/demo.yaml", ModelRef("scripted", "examples/demo.yaml")),
    ],
)
def test_model_addressing(spec: str, expected: ModelRef) -> None:
    assert parse_model(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "no model given"),
        ("llama3", "unknown model 'llama3'"),
        # Whether `acme` exists is make_provider's question (settings may define it).
        ("Acme Corp/x", "'Acme Corp' in model 'Acme Corp/x' is not a provider name"),
        ("anthropic/", "names no model"),
        ("scripted:", "scripted: needs a script"),
    ],
)
def test_bad_model_specs(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_model(spec)


# -- retries -----------------------------------------------------------------------------------


def request() -> Request:
    return Request(model="m", system="s", messages=(user("hi"),))


async def collect(provider: Any) -> list[Any]:
    return [e async for e in provider.stream(request())]


async def test_retry_honours_retry_after_then_backs_off_exponentially() -> None:
    sleeps = Sleeps()
    inner = ScriptedProvider(
        [
            Fault("status", status=429, retry_after=3, message="slow"),
            Fault("status", status=503, message="busy"),
            reply("ok"),
        ]
    )
    events = await collect(RetryingProvider(inner, RetryPolicy(jitter=0), sleeps))
    assert sleeps.waits == [3, 2.0]
    assert events[:2] == [
        Notice("slow; retrying in 3.0 s (attempt 2 of 4)", "warning"),
        Notice("busy; retrying in 2.0 s (attempt 3 of 4)", "warning"),
    ]
    assert isinstance(events[-1], Done)


async def test_retry_gives_up_after_the_attempts_and_on_long_retry_after() -> None:
    sleeps = Sleeps()
    inner = ScriptedProvider([Fault("status", status=500, message=f"e{i}") for i in range(4)])
    with pytest.raises(APIError, match="e3"):
        await collect(RetryingProvider(inner, RetryPolicy(jitter=0), sleeps))
    assert sleeps.waits == [1.0, 2.0, 4.0]
    inner = ScriptedProvider(
        [Fault("status", status=429, retry_after=120, message="come back later")]
    )
    with pytest.raises(APIError, match="come back later"):
        await collect(RetryingProvider(inner, RetryPolicy(), Sleeps()))


@pytest.mark.parametrize(
    "fault", [Fault("status", status=400), Fault("status", status=401), Fault("overflow")]
)
async def test_non_retryable_errors_are_not_retried(fault: Fault) -> None:
    sleeps = Sleeps()
    inner = ScriptedProvider([fault, reply("never")])
    with pytest.raises(APIError) as info:
        await collect(RetryingProvider(inner, RetryPolicy(), sleeps))
    assert sleeps.waits == []
    assert isinstance(info.value, ContextOverflow) == (fault.kind == "overflow")


async def test_no_retry_once_output_was_shown() -> None:
    cut = Fault(
        "disconnect", after_events=1, reply=reply("partial text that is long enough to stream")
    )
    inner = ScriptedProvider([cut, reply("second")])
    events: list[Any] = []

    async def consume() -> None:
        async for event in RetryingProvider(inner, RetryPolicy(), Sleeps()).stream(request()):
            events.append(event)

    with pytest.raises(APIError, match="scripted disconnect"):
        await consume()
    assert events == [TextDelta("partial text that is lon")]  # the first 24-character delta


async def test_disconnect_before_output_is_retried() -> None:
    inner = ScriptedProvider(
        [Fault("disconnect", after_events=0, reply=reply("x")), reply("second")]
    )
    events = await collect(RetryingProvider(inner, RetryPolicy(jitter=0), Sleeps()))
    assert events[-1].message.text == "second"


# -- settings ----------------------------------------------------------------------------------


def test_settings_precedence_and_warnings(tmp_path: Path, isolated_env: Path) -> None:
    user_dir = isolated_env / "config"
    user_dir.mkdir()
    (user_dir / "settings.json").write_text(
        json.dumps(
            {
                "model": "anthropic/claude-haiku-4-5",
                "max_turns": 50,
                "providers": {
                    "anthropic": {"base_url": "https://gw.example", "api_key_env": "GW_KEY"}
                },
                "colour": "blue",
            }
        ),
        encoding="utf-8",
    )
    project = tmp_path / "p"
    (project / ".keel").mkdir(parents=True)
    (project / ".keel" / "settings.json").write_text(
        json.dumps(
            {
                "model": "openai/gpt-5",
                "budget": {"usd": 2, "tokens": "lots"},
                "models": {"mine": {"window": 32768, "max_output": 4096, "input_price": 1}},
            }
        ),
        encoding="utf-8",
    )
    (project / ".keel" / "settings.local.json").write_text(
        '{"effort": "high", "max_turns": 20}', encoding="utf-8"
    )
    s = load_settings(project)
    assert s.model == "openai/gpt-5"
    assert s.max_turns == 20
    assert s.effort == "high"
    assert s.budget_usd == 2.0
    assert s.budget_tokens is None
    assert s.provider("anthropic") == ProviderConfig(
        base_url="https://gw.example", api_key_env="GW_KEY"
    )
    # Prices from the shared project file wait for an approval (they count a USD budget).
    assert s.models["mine"] == ModelInfo(32768, 4096, None, None, None, None)
    shared = project / ".keel" / "settings.json"
    assert s.warnings == [
        f"{user_dir / 'settings.json'}: unknown key 'colour' skipped (known: auto_compact, auto_mode, budget, checkpoints, compaction, debug, effort, enabledPlugins, extraKnownMarketplaces, fallbacks, hooks, hooks_model, knowledge, lsp, max_turns, mcp_sampling, mcp_servers, memory, model, models, otel, outputStyle, permissions, providers, remote_tools, sandbox, statusLine, subagents, tool_call_text, tools, trace_retention_days, unsafe_to_repeat, web_search)",
        f"{shared}: not applied until you approve them: models.mine prices (this file came "
        "with the project; `keel trust list` shows why each needs approval, `keel trust "
        "approve` applies them)",
        f"{shared}: budget.tokens must be a number more than 0 and at most 1e+12; ignored",
    ]
