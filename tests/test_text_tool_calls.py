"""Tool calls a local model writes as text, and replies that end a turn without an answer, against
the loopback Chat Completions and Ollama servers: each common form of a text call runs (the file
it writes is there, the next request holds the call and its result); an example in prose is not
run; a call keel did not run is never a silent exit 0 (`tool_call_text`: one nudge, then
`unrun_tool_call`; or `stop`; or `ignore`); an empty reply ends `empty_response`; a reply cut by
the context window ends `context_full`. Then the parser itself, form by form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel.agent.events import Event, TurnFinished
from keel.agent.loop import EMPTY_NUDGE, Agent, RunResult
from keel.config.settings import load_settings
from keel.llm.catalog import parse_model
from keel.llm.events import Notice
from keel.llm.messages import Message, Text, ToolUse, Usage, assistant
from keel.llm.provider import make_provider
from keel.llm.request import ToolSpec
from keel.llm.salvage import MarkupFilter, salvage
from keel.llm.script import Reply
from keel.permissions import AllowAll
from keel.testing.llamacpp_server import LlamaCppServer
from keel.testing.ollama_server import OllamaServer
from keel.testing.openai_server import OpenAIChatServer
from keel.testing.server import RecordedRequest
from keel.tools.base import spec as spec_of
from keel.tools.builtin import builtin_tools
from tests.helpers import unsandboxed_line_dropped
from tests.test_cli import keel

SYSTEM = "You are keel."
RUNNING = "the model wrote {n} tool call(s) as text ({names}); running them"
NUDGE = (
    "That was not run: {what}. To use a tool, call it with the tool-calling format, not as text "
    "in your reply; if you have finished, answer in plain words. The tools you can call: {tools} "
    "(run commands with bash)."
)


def offered(request: RecordedRequest) -> str:
    """The names of the tools a Chat Completions request offered, as the nudge lists them."""
    return ", ".join(sorted(t["function"]["name"] for t in request.json["tools"]))


UNKNOWN = "JSON call: get_weather is not one of the offered tools"
UNKNOWN_CALL = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'


def write_call(path: str, content: str) -> str:
    return json.dumps({"name": "write", "arguments": {"path": path, "content": content}})


def said(stderr: str) -> list[str]:
    """What keel said on stderr, less the lines these tests are not about (the sandbox, and the
    catalog's note on an unknown model)."""
    lines = unsandboxed_line_dropped(stderr).splitlines()
    return [line for line in lines if not line.startswith("keel: qwen is not in keel's catalog")]


def chat_provider(server: OpenAIChatServer) -> Any:
    env = {"OPENAI_COMPATIBLE_BASE_URL": server.url + "/v1"}
    return make_provider(parse_model("openai-compatible/qwen"), env=env)


async def run(
    provider: Any, project: Path, model: str = "qwen", **attributes: Any
) -> tuple[RunResult, list[Event], Agent]:
    agent = Agent(
        provider=provider,
        model=model,
        cwd=project,
        system=SYSTEM,
        tools=builtin_tools(),
        gate=AllowAll(),
    )
    for name, value in attributes.items():
        setattr(agent, name, value)
    events: list[Event] = []
    try:
        result = await agent.run("go", events.append)
    finally:
        await agent.aclose()
    return result, events, agent


def story(events: list[Event]) -> list[tuple[str, ...]]:
    """What a run did, in order: notices, tools run (with their input) and how it ended."""
    out: list[tuple[str, ...]] = []
    for e in events:
        match e:
            case Notice(text, level):
                out.append(("notice", level, text))
            case TurnFinished(stop_reason=stop):
                out.append(("finished", stop))
            case _ if type(e).__name__ == "ToolStarted":
                call = e.call  # type: ignore[union-attr]
                out.append(("tool", call.name, json.dumps(call.input, sort_keys=True)))
    return out


def sent_messages(request: RecordedRequest) -> list[dict[str, Any]]:
    """A Chat Completions request's messages after the system prompt."""
    messages: list[dict[str, Any]] = request.json["messages"]
    assert messages[0] == {"role": "system", "content": SYSTEM}
    return messages[1:]


def tool_calls_sent(calls: list[ToolUse]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.input, separators=(",", ":"))},
        }
        for c in calls
    ]


# -- each form runs ---------------------------------------------------------------------------------

A, B = write_call("a.txt", "A\n"), write_call("b.txt", "B\n")
FORMS = {
    "fenced": (f"I'll write it.\n```json\n{A}\n```", "I'll write it.", ["a.txt"]),
    "bare": (A, "", ["a.txt"]),
    "several fences": (
        f"First:\n```json\n{A}\n```\nThen:\n```\n{B}\n```\n",
        "First:\n\nThen:",
        ["a.txt", "b.txt"],
    ),
    "bare, one per line": (f"{A}\n{B}", "", ["a.txt", "b.txt"]),
    "a JSON array": (f"[{A}, {B}]", "", ["a.txt", "b.txt"]),
    "<tools> wrapper": (f"<tools>\n{A}\n{B}\n</tools>", "", ["a.txt", "b.txt"]),
    "<tool_call> holding two": (f"<tool_call>\n{A}\n{B}\n</tool_call>", "", ["a.txt", "b.txt"]),
    "XML <function><name>": (
        '<function><name>write</name><arguments>{"path": "a.txt", "content": "A\\n"}'
        "</arguments></function>",
        "",
        ["a.txt"],
    ),
    "<function=NAME>{json}": (
        '<function=write>{"path": "a.txt", "content": "A\\n"}</function>',
        "",
        ["a.txt"],
    ),
}


@pytest.mark.parametrize("form", FORMS)
async def test_each_text_form_of_a_call_runs(project: Path, form: str) -> None:
    text, prose, files = FORMS[form]
    with OpenAIChatServer([Reply(assistant(text)), Reply(assistant("Written."))]) as server:
        result, events, agent = await run(chat_provider(server), project)
        requests = server.model_requests
    assert {f: (project / f).read_text(encoding="utf-8") for f in files} == {
        f: f"{f[0].upper()}\n" for f in files
    }
    inputs = [{"content": f"{f[0].upper()}\n", "path": f} for f in files]
    assert story(events) == [
        ("notice", "info", RUNNING.format(n=len(files), names=", ".join(["write"] * len(files)))),
        *[("tool", "write", json.dumps(i, sort_keys=True)) for i in inputs],
        ("finished", "end_turn"),
    ]
    assert result.text == "Written."
    # The call is a real one in the conversation, and the next request holds it and its result.
    reply = agent.messages[1]
    calls = list(reply.tool_uses)
    assert reply.blocks == ((Text(prose),) if prose else ()) + tuple(
        ToolUse(c.id, "write", i) for c, i in zip(calls, inputs, strict=True)
    )
    results = [f"Created {f} (1 lines)." for f in files]
    assert sent_messages(requests[1]) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": prose or None, "tool_calls": tool_calls_sent(calls)}
        if prose
        else {"role": "assistant", "content": None, "tool_calls": tool_calls_sent(calls)},
        *[
            {"role": "tool", "tool_call_id": c.id, "content": r}
            for c, r in zip(calls, results, strict=True)
        ],
    ]
    assert len(requests) == 2


async def test_a_bare_call_runs_on_ollama(project: Path) -> None:
    with OllamaServer([Reply(assistant(A)), Reply(assistant("Written."))]) as server:
        provider = make_provider(parse_model("ollama/qwen3:8b"), env={"OLLAMA_HOST": server.url})
        result, events, _ = await run(provider, project, "qwen3:8b")
        second = server.model_requests[1].json
    assert (project / "a.txt").read_text(encoding="utf-8") == "A\n"
    assert story(events) == [
        ("notice", "info", RUNNING.format(n=1, names="write")),
        ("tool", "write", json.dumps({"content": "A\n", "path": "a.txt"}, sort_keys=True)),
        ("finished", "end_turn"),
    ]
    assert second["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "write", "arguments": {"path": "a.txt", "content": "A\n"}}}
            ],
        },
        {"role": "tool", "content": "Created a.txt (1 lines).", "tool_name": "write"},
    ]
    assert result.stop_reason == "end_turn"


# -- prose is not run -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f"To write a file, a call looks like this:\n```json\n{A}\n```\nThat writes a.txt.",
        "x" * 501 + f"\n```json\n{A}\n```",
        f"Write it with {A} and you are done.",
    ],
    ids=["talk after the example", "a long lead-in", "inside a sentence"],
)
async def test_an_example_call_in_prose_is_not_run(project: Path, text: str) -> None:
    with OpenAIChatServer([Reply(assistant(text))]) as server:
        result, events, agent = await run(chat_provider(server), project)
        assert len(server.model_requests) == 1
    assert not (project / "a.txt").exists()
    assert story(events) == [("finished", "end_turn")]
    assert agent.messages[1].blocks == (Text(text),)
    assert result.text == text


# -- calls that were not run ------------------------------------------------------------------------


async def test_an_unrun_call_is_nudged_once_and_the_model_goes_on(project: Path) -> None:
    script = [Reply(assistant(UNKNOWN_CALL)), Reply(assistant(A)), Reply(assistant("Written."))]
    with OpenAIChatServer(script) as server:
        result, events, _ = await run(chat_provider(server), project)
        requests = server.model_requests
    nudge = NUDGE.format(what=UNKNOWN, tools=offered(requests[0]))
    assert story(events) == [
        ("notice", "warning", f"a tool call written as text was not run ({UNKNOWN})"),
        ("notice", "info", f"asking the model again: {nudge}"),
        ("notice", "info", RUNNING.format(n=1, names="write")),
        ("tool", "write", json.dumps({"content": "A\n", "path": "a.txt"}, sort_keys=True)),
        ("finished", "end_turn"),
    ]
    assert sent_messages(requests[1]) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": UNKNOWN_CALL},
        {"role": "user", "content": nudge},
    ]
    assert result.text == "Written."
    assert (project / "a.txt").exists()


def test_headless_an_unrun_call_after_the_nudge_ends_unrun_tool_call(project: Path) -> None:
    with OpenAIChatServer([Reply(assistant(UNKNOWN_CALL)), Reply(assistant(UNKNOWN_CALL))]) as s:
        out = keel(
            "-p",
            "what is the weather",
            "--model",
            "openai-compatible/qwen",
            "--output-format",
            "json",
            cwd=project,
            env={"OPENAI_COMPATIBLE_BASE_URL": s.url + "/v1"},
        )
        requests = s.model_requests
    assert out.returncode == 4, out.stderr
    result = json.loads(out.stdout)
    assert (result["stop_reason"], result["result"], result["turns"]) == (
        "unrun_tool_call",
        UNKNOWN_CALL,
        2,
    )
    assert len(requests) == 2
    nudge = NUDGE.format(what=UNKNOWN, tools=offered(requests[0]))
    assert requests[1].json["messages"][-1] == {"role": "user", "content": nudge}
    warning = f"keel: warning: a tool call written as text was not run ({UNKNOWN})"
    assert said(out.stderr) == [
        warning,
        f"keel: asking the model again: {nudge}",
        warning,
        "keel: warning: the model wrote a tool call as text again after it was asked to use the "
        "tool-calling format",
    ]


def test_tool_call_text_stop_ends_the_turn_at_once(project: Path, isolated_env: Path) -> None:
    (isolated_env / "config").mkdir(exist_ok=True)
    (isolated_env / "config" / "settings.json").write_text(
        '{"tool_call_text": "stop"}', encoding="utf-8"
    )
    with OpenAIChatServer([Reply(assistant(UNKNOWN_CALL))]) as s:
        out = keel(
            "-p",
            "go",
            "--model",
            "openai-compatible/qwen",
            cwd=project,
            env={"OPENAI_COMPATIBLE_BASE_URL": s.url + "/v1"},
        )
        assert len(s.model_requests) == 1
    assert out.returncode == 4, out.stderr
    assert out.stdout == UNKNOWN_CALL + "\n"
    assert said(out.stderr) == [
        f"keel: warning: a tool call written as text was not run ({UNKNOWN})",
        "keel: stopped: unrun_tool_call",
    ]


async def test_tool_call_text_ignore_only_says_so(project: Path) -> None:
    with OpenAIChatServer([Reply(assistant(UNKNOWN_CALL))]) as server:
        result, events, _ = await run(chat_provider(server), project, tool_call_text="ignore")
    assert story(events) == [
        ("notice", "warning", f"a tool call written as text was not run ({UNKNOWN})"),
        ("finished", "end_turn"),
    ]
    assert result.stop_reason == "end_turn"


def test_tool_call_text_setting_is_read_and_checked(project: Path, isolated_env: Path) -> None:
    config = isolated_env / "config"
    config.mkdir(exist_ok=True)
    (config / "settings.json").write_text('{"tool_call_text": "ignore"}', encoding="utf-8")
    assert load_settings(project).tool_call_text == "ignore"
    (config / "settings.json").write_text('{"tool_call_text": "loud"}', encoding="utf-8")
    settings = load_settings(project)
    assert settings.tool_call_text == "nudge"
    assert settings.warnings == [
        f"{config / 'settings.json'}: tool_call_text must be nudge, stop or ignore; ignored"
    ]


# -- empty replies and full windows -----------------------------------------------------------------


def test_headless_an_empty_reply_ends_empty_response(project: Path) -> None:
    with OpenAIChatServer([Reply(assistant(""))]) as s:
        out = keel(
            "-p",
            "go",
            "--model",
            "openai-compatible/qwen",
            cwd=project,
            env={"OPENAI_COMPATIBLE_BASE_URL": s.url + "/v1"},
        )
    assert out.returncode == 4, out.stderr
    assert out.stdout == "(empty response)\n"
    assert said(out.stderr) == [
        "keel: warning: the model ended its turn with no text and no call",
        "keel: stopped: empty_response",
    ]


async def test_an_empty_reply_after_tool_results_is_nudged_once(project: Path) -> None:
    script = [Reply(assistant(A)), Reply(assistant("")), Reply(assistant(""))]
    with OpenAIChatServer(script) as server:
        result, events, agent = await run(chat_provider(server), project)
        requests = server.model_requests
    assert story(events) == [
        ("notice", "info", RUNNING.format(n=1, names="write")),
        ("tool", "write", json.dumps({"content": "A\n", "path": "a.txt"}, sort_keys=True)),
        ("notice", "info", f"asking the model again: {EMPTY_NUDGE}"),
        ("notice", "warning", "the model ended its turn with no text and no call"),
        ("finished", "empty_response"),
    ]
    assert len(requests) == 3
    assert sent_messages(requests[2])[-2:] == [
        {"role": "assistant", "content": "(empty response)"},
        {"role": "user", "content": EMPTY_NUDGE},
    ]
    assert agent.messages[-1] == Message(
        "assistant", (Text("(empty response)"),), "openai-compatible", "qwen"
    )
    assert result.stop_reason == "empty_response"


CUT = "the reply was cut: the prompt and the reply filled the model's {size} context window"
CUT_HINT = (
    " (compact the conversation with /compact or keel compact, or load the model with a larger "
    "window: llama-server -c, Ollama's num_ctx)"
)


def test_headless_a_cut_short_of_max_tokens_is_context_full(project: Path) -> None:
    cut = Reply(assistant("The answer is"), usage=Usage(4000, 96), stop_reason="max_tokens")
    with OpenAIChatServer([cut]) as s:
        out = keel(
            "-p",
            "go",
            "--model",
            "openai-compatible/qwen",
            cwd=project,
            env={"OPENAI_COMPATIBLE_BASE_URL": s.url + "/v1"},
        )
        asked = s.model_requests[0].json["max_tokens"]
    assert asked > 96
    assert out.returncode == 4, out.stderr
    assert said(out.stderr) == [
        "keel: warning: " + CUT.format(size="~4,096-token") + CUT_HINT,
        "keel: stopped: context_full",
    ]


async def test_a_cut_where_keel_asked_is_max_tokens(project: Path) -> None:
    def at_the_limit(request: RecordedRequest) -> Reply:
        usage = Usage(100, request.json["max_tokens"])
        return Reply(assistant("The answer is"), usage=usage, stop_reason="max_tokens")

    with OpenAIChatServer(responder=at_the_limit) as server:
        result, events, _ = await run(chat_provider(server), project)
    assert story(events) == [
        ("notice", "warning", "the response hit the output token limit"),
        ("finished", "max_tokens"),
    ]
    assert result.stop_reason == "max_tokens"


# -- against a server that behaves as llama.cpp's does --------------------------------------------


def test_fenced_bare_and_wrapped_calls_run_against_llama_cpp(project: Path) -> None:
    """What Qwen2.5-Coder writes, through `keel -p` on a llama.cpp-like server: each call runs
    (keel reads the window the server publishes, and the template's tool support)."""
    c = write_call("c.txt", "C\n")
    script = [
        Reply(assistant(f"Writing a.txt.\n```json\n{A}\n```")),
        Reply(assistant(B)),
        Reply(assistant(f"<tools>\n{c}\n</tools>")),
        Reply(assistant("Wrote a.txt, b.txt and c.txt.")),
    ]
    with LlamaCppServer(script, n_ctx=32768) as server:
        out = keel(
            "-p",
            "write the three files",
            "--model",
            "openai-compatible/local-model",
            "--mode",
            "accept-edits",
            cwd=project,
            env={"OPENAI_COMPATIBLE_BASE_URL": server.url + "/v1"},
        )
        last = server.model_requests[-1].json["messages"]
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Wrote a.txt, b.txt and c.txt.\n"
    assert [(project / f).read_text(encoding="utf-8") for f in ("a.txt", "b.txt", "c.txt")] == [
        "A\n",
        "B\n",
        "C\n",
    ]
    assert [m["content"] for m in last if m["role"] == "tool"] == [
        "Created a.txt (1 lines).",
        "Created b.txt (1 lines).",
        "Created c.txt (1 lines).",
    ]
    assert [m["tool_calls"][0]["function"]["name"] for m in last if m.get("tool_calls")] == [
        "write"
    ] * 3


async def test_a_reply_cut_by_llama_cpps_full_context_is_context_full(project: Path) -> None:
    with LlamaCppServer([Reply(assistant("word " * 20_000))], n_ctx=8192) as server:
        result, events, agent = await run(chat_provider(server), project, "local-model")
        (prompt, _cached), asked = server.prompts[0], server.model_requests[0].json["max_tokens"]
    # keel asked for what the window leaves (less a margin), below the model's own limit, and
    # the server cut there: the window, not the output limit, ended the reply.
    assert agent.info.window == 8192
    assert result.usage.output == asked <= 8192 - prompt < agent.info.request_max_tokens
    assert story(events) == [
        ("notice", "warning", CUT.format(size="8,192-token") + CUT_HINT),
        ("finished", "context_full"),
    ]


# -- the parser -------------------------------------------------------------------------------------

BASH = ToolSpec(
    "bash",
    "Run a command.",
    {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
)
READ = ToolSpec(
    "read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}
)
TOOLS = {"bash": BASH, "read": READ}
LS = ("bash", {"command": "ls"})
CMD = '{"command": "ls"}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Tags, wherever they are.
        (f'Look: <tool_call>{{"name": "bash", "arguments": {CMD}}}</tool_call>', ("Look: ", [LS])),
        (f'<tool_calls>[{{"name": "bash", "arguments": {CMD}}}]</tool_calls>', ("", [LS])),
        (
            '<tools>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tools>',
            ("", [LS]),
        ),
        (f"<function><name>bash</name><parameters>{CMD}</parameters></function>", ("", [LS])),
        (
            "<function><name>bash</name><arguments><command>ls</command><timeout>5</timeout>"
            "</arguments></function>",
            ("", [("bash", {"command": "ls", "timeout": 5})]),
        ),
        (f'<function>{{"name": "bash", "arguments": {CMD}}}</function>', ("", [LS])),
        (f"<tool_call>\n<function>bash</function>\n{CMD}\n</tool_call>", ("", [LS])),
        (
            "<tool_call><function=bash><parameter=command>\nls\n</parameter>"
            "<parameter=timeout>3</parameter></function></tool_call>",
            ("", [("bash", {"command": "ls", "timeout": 3})]),
        ),
        ('<tool_call>\n```json\n{"name": "read"}\n```\n</tool_call>', ("", [("read", {})])),
        # A tag left open at the end (or closed with a misspelt tag) is read as if closed.
        (f'<tools> {{"name": "bash", "arguments": {CMD}}} </tool', ("", [LS])),
        # JSON outside tags: Llama's form, with its python tag.
        (
            f'<|python_tag|>{{"type": "function", "name": "bash", "parameters": {CMD}}}',
            ("", [LS]),
        ),
        (
            f'{{"name": "bash", "input": {CMD}}};{{"name": "read", "input": {{}}}}',
            ("", [LS, ("read", {})]),
        ),
        (
            f'```json\n{{"name": "bash", "arguments": {CMD}}}\n```<|im_end|>',
            ("", [LS]),
        ),
        # Not calls: plain JSON, a tool's definition echoed back.
        ('```json\n{"a": 1}\n```', ('```json\n{"a": 1}\n```', [])),
        (
            '{"name": "bash", "description": "Run", "parameters": '
            '{"type": "object", "properties": {"command": {}}}}',
            (
                '{"name": "bash", "description": "Run", "parameters": '
                '{"type": "object", "properties": {"command": {}}}}',
                [],
            ),
        ),
    ],
)
def test_salvaged_forms(text: str, expected: tuple[str, list[Any]]) -> None:
    clean, calls, problems = salvage(text, TOOLS)
    assert (clean, calls, problems) == (*expected, [])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
            "<tool_call>: rm_rf is not one of the offered tools",
        ),
        (
            "<tool_call>not json</tool_call>",
            "<tool_call>: it is not JSON naming a tool and its arguments",
        ),
        (
            '<function=bash>{"command": </function>',
            "<function>: the arguments of bash are not valid JSON",
        ),
        (
            '{"name": "bash", "arguments": "ls"}',
            "JSON call: the arguments of bash are not valid JSON",
        ),
        (
            '{"name": "bash", "arguments": ["ls"]}',
            "JSON call: the arguments of bash are not a JSON object",
        ),
        (
            '{"name": "bash", "arguments": {"cmd": "ls"}}',
            "JSON call: bash lacks its required argument(s) command",
        ),
        (
            f'<tools>\n{{"name": "bash", "arguments": {CMD}}}\n{{"name": "nope", "arguments": {{}}}}\n</tools>',
            "<tools>: nope is not one of the offered tools",
        ),
        (  # what the real 0.5B model wrote: a doubled brace
            '{{"name": "bash", "arguments": {"command": "ls"}}}',
            "JSON call to bash with a doubled brace",
        ),
        (  # and quotes left unescaped inside a command
            'Let me look.\n{"name": "bash", "arguments": {"command": "find . -name "*.py""}}',
            "JSON call to bash that is not valid JSON",
        ),
    ],
)
def test_markup_that_looks_like_a_call_but_is_not_run_is_named(text: str, problem: str) -> None:
    # The whole piece stays in the text (nothing of it runs), and why is said.
    assert salvage(text, TOOLS) == (text, [], [problem])


@pytest.mark.parametrize(
    "text",
    [
        "Write `<tool_call>{...}</tool_call>` to call a tool.",
        'The template reads:\n```xml\n<function=get_weather>{"city": "Paris"}</function>\n```\nDone.',
    ],
    ids=["in backticks", "in a fenced block"],
)
def test_markup_quoted_as_code_that_is_not_a_call_is_not_reported(text: str) -> None:
    assert salvage(text, TOOLS) == (text, [], [])


def test_streamed_markup_is_hidden_whatever_the_pieces() -> None:
    text = (
        'Sure. <tools>{"name": "bash", "arguments": {"command": "ls"}}</tools> and '
        '<function=read>{"path": "a.py"}</function> done <tool'
    )
    found = MarkupFilter(TOOLS)
    shown = "".join(found.feed(ch) for ch in text) + found.flush()
    assert shown == "Sure.  and  done <tool"
    assert found.calls == [LS, ("read", {"path": "a.py"})]
    assert found.problems == []


# -- a reply stuck on one line ----------------------------------------------------------------------


async def test_a_line_written_again_and_again_is_cut_and_its_call_runs_once(project: Path) -> None:
    """What the real 0.5B model did: the same bare JSON call, one per line, until max_tokens.
    keel stops reading after the fifth copy, keeps the first, and runs it once."""
    looping = "\n".join([A] * 40) + "\n"
    with OpenAIChatServer([Reply(assistant(looping)), Reply(assistant("Written."))]) as server:
        result, events, agent = await run(chat_provider(server), project)
        requests = server.model_requests
    assert (project / "a.txt").read_text(encoding="utf-8") == "A\n"
    assert story(events) == [
        (
            "notice",
            "warning",
            f"the model wrote the same line 5 times in a row ({A[:60]}…); its reply was cut "
            "after the first",
        ),
        ("notice", "info", RUNNING.format(n=1, names="write")),
        ("tool", "write", json.dumps({"content": "A\n", "path": "a.txt"}, sort_keys=True)),
        ("finished", "end_turn"),
    ]
    assert result.text == "Written."
    [call] = agent.messages[1].tool_uses
    assert agent.messages[1].blocks == (call,)
    assert len(requests) == 2


def test_short_or_varied_repeated_lines_are_not_a_loop() -> None:
    from keel.llm.salvage import LineLoop

    code = "\n".join(["    assert add(1, 2) == 3"] * 8) + "\n"  # short lines: kept whole
    varied = "".join(f"{'x' * 50} {i}\n" for i in range(20))  # long but each different
    four = "\n".join(["y" * 60] * 4) + "\nthe end\n"  # four copies are not five
    for text in (code, varied, four):
        watch = LineLoop()
        assert {watch.feed(piece) for piece in text.splitlines(keepends=True)} == {None}
    # The control: a fifth copy, streamed in pieces that cut lines anywhere, is the loop.
    watch = LineLoop()
    text = "Let me look.\n" + "\n".join(["y" * 60] * 5) + "\n"
    kept = [watch.feed(text[i : i + 7]) for i in range(0, len(text), 7)]
    assert [k for k in kept if k is not None] == ["Let me look.\n" + "y" * 60]


def test_the_same_call_twice_in_one_reply_runs_once() -> None:
    from keel.llm.events import Done
    from keel.llm.salvage import salvaged_done

    spec = {t.name: spec_of(t) for t in builtin_tools() if t.name == "write"}
    text = f"```json\n{A}\n```\n```json\n{B}\n```\n```json\n{A}\n```"
    done, notices = salvaged_done(Done(assistant(text), Usage(), "end_turn"), spec)
    assert [(c.name, c.input) for c in done.message.tool_uses] == [
        ("write", {"path": "a.txt", "content": "A\n"}),
        ("write", {"path": "b.txt", "content": "B\n"}),
    ]
    assert done.stop_reason == "tool_use"
    assert [(n.text, n.level) for n in notices] == [
        (RUNNING.format(n=2, names="write, write"), "info"),
        (
            "the model wrote the same tool call more than once in one reply; each runs once "
            "(1 left out)",
            "warning",
        ),
    ]


def test_a_raw_tab_or_newline_inside_a_json_string_is_read() -> None:
    """Strict JSON refuses control characters in strings; small models write them (a file's
    content with its TABs), and the call is still the call they meant."""
    tools = {t.name: spec_of(t) for t in builtin_tools() if t.name == "write"}
    text = '{"name": "write", "arguments": {"path": "t.py", "content": "def f():\n\treturn 1\n"}}'
    assert salvage(text, tools) == (
        "",
        [("write", {"path": "t.py", "content": "def f():\n\treturn 1\n"})],
        [],
    )
