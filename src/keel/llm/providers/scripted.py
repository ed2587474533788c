"""`ScriptedProvider`: plays a scripted conversation through the real loop, with no network.

Used by tests (`keel.testing`) and by `--model scripted:PATH`, which reads a YAML or JSON script so
a newcomer can watch keel work on a machine with no API key. `scripted:NAME` plays one of the
scripts packaged with keel (`src/keel/demo/NAME.yaml`: `demo`, `demo-subagents`), from any
directory; anything else after `scripted:` is a file path. It fails loudly when the run diverges
from its script: a request past the end, a scripted call to a tool the run did not offer, or an
`expect` that does not hold.

A script file may also give subagents their own conversations (`agents:`, keyed by text that only
the prompt of that `task` call holds), since a child's requests go to its parent's provider.

Turns are picked by how many assistant messages the conversation holds, so a resumed session (a
new process) continues where its transcript left off. A script whose run compacts its context
(which drops those messages) says `by_history: false`: its turns are played in request order.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Mapping
from pathlib import Path
from typing import Any

from keel.errors import UserError
from keel.llm.errors import APIError, ContextOverflow, StallError
from keel.llm.events import Done, StreamEvent, TextDelta, ThinkingDelta, ToolUseDelta, ToolUseStart
from keel.llm.messages import Block, Message, Text, Thinking, ToolUse, Usage
from keel.llm.request import Request
from keel.llm.script import Fault, Reply, ScriptDivergence, Step, next_tool_id

CHUNK = 24  # characters per streamed delta, so front ends see real streaming
#: Where the scripts packaged with keel live (package data: `scripted:NAME` plays NAME.yaml).
PACKAGED_DIR = Path(__file__).resolve().parents[2] / "demo"


def _chunks(text: str) -> list[str]:
    return [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]


class ScriptedProvider:
    """A provider that answers each request with the next step of a script."""

    name = "scripted"

    def __init__(
        self,
        steps: Iterable[Step],
        *,
        model: str = "scripted",
        delay: float = 0.0,
        check_tools: bool = True,
        by_history: bool = False,
        agents: Mapping[str, ScriptedProvider] | None = None,
    ) -> None:
        self.steps: deque[Step] = deque(steps)
        #: Subagents' conversations: a request whose first user message holds a key is answered
        #: by that key's provider; the others by this script.
        self.agents = dict(agents or {})
        self.check_tools = check_tools
        #: Pick the step by the number of assistant messages already in the conversation instead
        #: of by request count, so a resumed session (a new process) continues the script where
        #: its transcript left off.
        self.by_history = by_history
        self._all = list(self.steps)
        self.total = len(self.steps)
        self.model = model
        self.delay = delay
        self.requests: list[Request] = []

    async def aclose(self) -> None:
        return None

    def assert_finished(self) -> None:
        if self.steps:
            raise ScriptDivergence(
                f"the run stopped after {len(self.requests)} model requests but the script has "
                f"{len(self.steps)} more step(s)"
            )

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        if (agent := self._agent_for(request)) is not None:
            async for event in agent.stream(request):
                yield event
            return
        self.requests.append(request)
        number = len(self.requests)
        if self.by_history:
            number = 1 + sum(1 for m in request.messages if m.role == "assistant")
            self.steps = deque(self._all[number - 1 :])
        if not self.steps:
            last = (
                request.messages[-1].blocks[-1]
                if request.messages and request.messages[-1].blocks
                else None
            )
            raise ScriptDivergence(
                f"the run made model request #{number} but the script has only {self.total} "
                f"step(s); the last thing sent was {_describe(last)}",
                hint="add a reply to the script or check why the run continued",
            )
        step = self.steps.popleft()
        if self.delay:
            await asyncio.sleep(self.delay)
        if isinstance(step, Reply) and step.delay:
            await asyncio.sleep(step.delay)  # think time, as the loopback servers do
        if isinstance(step, Fault):
            async for event in self._fault(step, request):
                yield event
            return
        self._check(step, request, number)
        async for event in self._play(step, request):
            yield event

    def _agent_for(self, request: Request) -> ScriptedProvider | None:
        if not self.agents:
            return None
        first = next((m.text for m in request.messages if m.role == "user"), "")
        keys = [key for key in self.agents if key in first]
        if len(keys) > 1:
            raise ScriptDivergence(
                f"several agent scripts ({', '.join(keys)}) match a conversation starting "
                f"{first[:120]!r}",
                hint="key each agent script by text that only its task prompt holds",
            )
        return self.agents[keys[0]] if keys else None

    def _check(self, step: Reply, request: Request, number: int) -> None:
        offered = {t.name for t in request.tools}
        for call in step.message.tool_uses:
            if self.check_tools and call.name not in offered:
                raise ScriptDivergence(
                    f"script step #{number} calls tool {call.name!r} but the run offers only: "
                    f"{', '.join(sorted(offered)) or 'no tools'}"
                )
        if step.expect is not None:
            try:
                step.expect(request)
            except AssertionError as exc:
                raise ScriptDivergence(f"script step #{number}: expectation failed: {exc}") from exc

    async def _play(self, step: Reply, request: Request) -> AsyncGenerator[StreamEvent, None]:
        blocks: list[Block] = []
        for block in step.message.blocks:
            if isinstance(block, Thinking):
                for piece in _chunks(block.text):
                    yield ThinkingDelta(piece)
                blocks.append(block)
            elif isinstance(block, Text):
                for piece in _chunks(block.text):
                    yield TextDelta(piece)
                blocks.append(block)
            elif isinstance(block, ToolUse):
                call = block if block.id else ToolUse(next_tool_id(), block.name, block.input)
                yield ToolUseStart(call.id, call.name)
                raw = json.dumps(call.input)
                if step.truncate_tool_json and block is step.message.blocks[-1]:
                    raw = raw[: len(raw) // 2]
                    call = ToolUse(call.id, call.name, None, raw)
                yield ToolUseDelta(call.id, raw)
                blocks.append(call)
            else:
                blocks.append(block)
        message = Message("assistant", tuple(blocks), self.name, self.model)
        yield Done(message, step.usage, step.final_stop_reason)

    async def _fault(self, fault: Fault, request: Request) -> AsyncGenerator[StreamEvent, None]:
        if fault.kind == "status":
            raise APIError(
                fault.message or f"scripted error {fault.status}",
                status=fault.status,
                retryable=fault.status in (408, 409, 429) or fault.status >= 500,
                retry_after=fault.retry_after,
                provider=self.name,
            )
        if fault.kind == "overflow":
            raise ContextOverflow(fault.message or "prompt is too long", provider=self.name)
        if fault.reply is not None:
            count = 0
            async for event in self._play(fault.reply, request):
                if count == fault.after_events or isinstance(event, Done):
                    break
                yield event
                count += 1
        if fault.kind == "stall":
            raise StallError(fault.seconds or 300.0, provider=self.name)
        raise APIError("scripted disconnect", status=0, retryable=True, provider=self.name)


def _describe(block: object) -> str:
    if isinstance(block, Text):
        return f"text {block.text[:80]!r}"
    if block is None:
        return "nothing"
    return type(block).__name__


# -- script files (YAML or JSON) ------------------------------------------------------------------


def _reply_from(entry: dict[str, Any], where: str) -> Reply:
    known = {"text", "thinking", "tool_calls", "usage", "stop_reason", "expect"}
    unknown = set(entry) - known - {"fault"}
    if unknown:
        raise UserError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
            hint=f"a turn may have: {', '.join(sorted(known | {'fault'}))}",
        )
    blocks: list[Block] = []
    if entry.get("thinking"):
        blocks.append(Thinking(str(entry["thinking"]), "scripted", source="scripted"))
    if entry.get("text"):
        blocks.append(Text(str(entry["text"])))
    for i, call in enumerate(entry.get("tool_calls") or []):
        if not isinstance(call, dict) or "name" not in call:
            raise UserError(f"{where}: tool_calls[{i}] needs a name and an input")
        args = call.get("input", {})
        if not isinstance(args, dict):
            raise UserError(f"{where}: tool_calls[{i}].input must be a mapping")
        # An explicit `id` keeps a call's id the same in every process that loads the script.
        call_id = str(call.get("id") or next_tool_id("toolu_scripted_"))
        blocks.append(ToolUse(call_id, str(call["name"]), args))
    usage = entry.get("usage") or {}
    reply = Reply(
        Message("assistant", tuple(blocks)),
        Usage(
            int(usage.get("input", 400)),
            int(usage.get("output", 60)),
            int(usage.get("cache_read", 0)),
            int(usage.get("cache_write", 0)),
        ),
    )
    if entry.get("stop_reason"):
        reply.stop_reason = entry["stop_reason"]
    expect = entry.get("expect")
    if expect:
        needle = str(expect.get("last_user_contains", ""))

        def check(request: Request) -> None:
            last = request.messages[-1]
            seen = last.text + "".join(r.text for r in last.tool_results)
            assert needle in seen, f"expected the last user message to contain {needle!r}"

        reply.expect = check
    return reply


def load_script(path: Path) -> tuple[str, list[Step]]:
    """Parse a script file into (model name, steps). Errors name the file and the turn."""
    model, steps, _agents, _by_history = _load(path)
    return model, steps


def _load(path: Path) -> tuple[str, list[Step], dict[str, list[Step]], bool]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"cannot read script {path}: {exc.strerror}",
            hint=f"--model scripted:demo plays keel's packaged demo ({_packaged_names()})",
        ) from exc
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UserError(f"{path} is not valid JSON: {exc}") from exc
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UserError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise UserError(
            f"{path}: a script is a mapping with a `turns` list",
            hint=f"see {PACKAGED_DIR / 'demo.yaml'}",
        )
    agents = data.get("agents") or {}
    if not isinstance(agents, dict) or not all(
        isinstance(k, str) and k and isinstance(v, list) for k, v in agents.items()
    ):
        raise UserError(
            f"{path}: `agents` maps text that a subagent's task prompt holds to its `turns` list"
        )
    steps = _steps(data["turns"], f"{path} turn")
    by_agent = {key: _steps(turns, f"{path} agent {key!r} turn") for key, turns in agents.items()}
    by_history = data.get("by_history", True)
    if not isinstance(by_history, bool):
        raise UserError(f"{path}: `by_history` is true or false")
    return str(data.get("model", path.stem)), steps, by_agent, by_history


def _steps(turns: list[Any], where_prefix: str) -> list[Step]:
    steps: list[Step] = []
    for i, entry in enumerate(turns, start=1):
        where = f"{where_prefix} {i}"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: each turn is a mapping")
        if "fault" in entry:
            f = entry["fault"]
            steps.append(
                Fault(
                    f.get("kind", "status"),
                    status=int(f.get("status", 500)),
                    retry_after=f.get("retry_after"),
                    message=f.get("message", ""),
                )
            )
        else:
            steps.append(_reply_from(entry, where))
    return steps


def _packaged_names() -> str:
    return ", ".join(sorted(p.stem for p in PACKAGED_DIR.glob("*.yaml")))


def script_path(spec: str) -> Path:
    """The file `scripted:SPEC` plays: a packaged script's name (`demo`), else a path."""
    if spec and "/" not in spec and "." not in spec:
        packaged = PACKAGED_DIR / f"{spec}.yaml"
        if packaged.is_file():
            return packaged
    return Path(spec).expanduser()


def load_script_provider(spec: str) -> ScriptedProvider:
    model, steps, agents, by_history = _load(script_path(spec))
    children = {
        key: ScriptedProvider(turns, model=model, by_history=by_history)
        for key, turns in agents.items()
    }
    return ScriptedProvider(steps, model=model, by_history=by_history, agents=children)
