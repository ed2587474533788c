"""`keel trace --atif`: a session's trace as an ATIF trajectory.

ATIF (Agent Trajectory Interchange Format) is Harbor's JSON format for comparing agent harnesses
(harbor-framework/harbor, `rfcs/0001-trajectory-format.md`; its Pydantic models live in
`src/harbor/models/trajectories/`). keel writes schema **ATIF-v1.6**, which every Harbor
validator from 0.22 on accepts (v1.7 only adds optional fields): a root object with
`schema_version`, `session_id`, `agent` (`name`, `version`, `model_name`, `tool_definitions` in
OpenAI's function-calling shape), `steps` numbered from 1, and `final_metrics`.

Mapping: the first system prompt (and any later change of it) is a `system` step; each prompt
(`turn_start`, as sent after expansion; as typed in `extra` when different) a `user` step; each
model response of the agent an `agent` step (text → `message`, thinking → `reasoning_content`,
tool calls → `tool_calls`, the tools' outputs → `observation.results` by `source_call_id`,
usage → `metrics` with `prompt_tokens` counting cached tokens too as ATIF requires, cache writes
in `metrics.extra`); compactions and errors are `system` steps. A `task` call that started a
subagent carries a `subagent_trajectory_ref` to that subagent's own trajectory
(`to_atif(records, subagent=CALL_ID)`; a subagent is its label and the call that started it, so
two `explore` agents side by side are `explore-1` and `explore-2`). Every object keeps to the
v1.6 field set (Harbor forbids others). Tool outputs are the trace's (the first 64 kB).

It only reads records; it never touches the session or the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from keel.frozen import frozen
from keel.llm.messages import without_context
from keel.trace.stats import MAIN, Tree, agent_key, agent_of, block_text, data_of

SCHEMA_VERSION = "ATIF-v1.6"
AGENT_NAME = "keel"

__all__ = ["AGENT_NAME", "SCHEMA_VERSION", "Subagent", "subagents", "to_atif"]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _tool_definition(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.get("name", ""),
            "description": spec.get("description", ""),
            "parameters": spec.get("input_schema") or {"type": "object", "properties": {}},
        },
    }


@frozen
class Subagent:
    """A subagent of the trace: its label, the `task` call that started it, and a name unique
    in the trace (the label, numbered when two subagents share it)."""

    label: str
    call_id: str
    name: str


def subagents(records: Sequence[Mapping[str, Any]]) -> list[Subagent]:
    """The subagents whose records the trace holds, in order of appearance."""
    keys: list[tuple[str, str]] = []
    for record in records:
        key = agent_key(record)
        if key[0] != MAIN and key not in keys:
            keys.append(key)
    labels = [label for label, _ in keys]
    out = []
    for label, call_id in keys:
        name = label
        if labels.count(label) > 1:
            name = f"{label}-{[k for k in keys if k[0] == label].index((label, call_id)) + 1}"
        out.append(Subagent(label, call_id, name))
    return out


def to_atif(
    records: Sequence[Mapping[str, Any]],
    *,
    subagent: str | None = None,
    subagent_paths: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ATIF trajectory of the main agent of a trace, or of the subagent that the `task`
    call `subagent` (its tool-use id) started. `subagent_paths` maps such call ids to the files
    the subagents' trajectories are written to, for the references' `trajectory_path`."""
    session_id = ""
    version = ""
    default_model = ""
    cwd = ""
    for record in records:
        if record.get("kind") == "session":
            d = data_of(record)
            session_id = session_id or str(d.get("session_id") or "")
            version = version or str(d.get("keel_version") or "")
            default_model = default_model or str(d.get("model") or "")
            cwd = cwd or str(d.get("cwd") or "")
    children = {s.call_id: s for s in subagents(records)}
    me = None if subagent is None else children.get(subagent)
    if subagent is not None and me is None:
        raise ValueError(f"no subagent was started by the call {subagent!r}")
    if me is None:
        mine = [r for r in records if agent_of(r) == MAIN]
    else:
        mine = [r for r in records if agent_key(r) == (me.label, me.call_id)]
    builder = _Builder(records, mine, session_id, children, subagent_paths or {})
    steps = builder.steps()
    if not steps:
        raise ValueError("the trace holds no prompt or model request yet (ATIF needs a step)")
    models = [s["model_name"] for s in steps if s.get("model_name")]
    model = default_model if me is None else (models[0] if models else default_model)
    trajectory: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id if me is None else subagent_session_id(session_id, me.name),
        "agent": {"name": AGENT_NAME, "version": version or "unknown"},
        "steps": steps,
        "final_metrics": builder.final_metrics(len(steps), everyone=me is None),
    }
    if model:
        trajectory["agent"]["model_name"] = model
    if builder.tool_definitions:
        trajectory["agent"]["tool_definitions"] = builder.tool_definitions
    extra: dict[str, Any] = {"keel_trace_format": 1}
    if cwd:
        extra["cwd"] = cwd
    if me is not None:
        extra["subagent"] = me.label
        extra["parent_tool_call_id"] = me.call_id
    trajectory["extra"] = extra
    return trajectory


def subagent_session_id(session_id: str, name: str) -> str:
    return f"{session_id}:{name}"


class _Builder:
    def __init__(
        self,
        everything: Sequence[Mapping[str, Any]],
        records: Sequence[Mapping[str, Any]],
        session_id: str,
        children: Mapping[str, Subagent],
        subagent_paths: Mapping[str, str],
    ) -> None:
        self.everything = everything
        self.records = records
        self.session_id = session_id
        self.subagent_paths = subagent_paths
        self.children = children
        self.tool_definitions: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.cost = 0.0
        self.cache_write_tokens = 0

    def steps(self) -> list[dict[str, Any]]:
        self._steps: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []  # a prompt, held until its first request
        self._tree = Tree()
        self._requests: dict[int, dict[str, Any]] = {}
        self._system: str | None = None
        self._prompted = False
        for record in self.everything:
            if record.get("kind") == "request":
                self._tree.learn(record)
        self._outputs = {
            str(data_of(r).get("id")): data_of(r)
            for r in self.records
            if r.get("kind") == "tool_end"
        }
        for record in self.records:
            handler = getattr(self, f"_on_{record.get('kind')}", None)
            if handler is not None:
                handler(record, data_of(record), _iso(float(record.get("t") or 0.0)))
        self._flush()
        return self._steps

    def _flush(self) -> None:
        while self._pending:
            self._steps.append({"step_id": len(self._steps) + 1, **self._pending.pop(0)})

    def _add(self, step: dict[str, Any]) -> None:
        self._flush()
        self._steps.append({"step_id": len(self._steps) + 1, **step})

    def _on_request(self, record: Mapping[str, Any], data: dict[str, Any], when: str) -> None:
        rebuilt = self._tree.add(record)
        self._requests[rebuilt.req] = data
        if rebuilt.tools and not self.tool_definitions:
            self.tool_definitions = [
                _tool_definition(s) for s in rebuilt.tools if isinstance(s, dict)
            ]
        if rebuilt.purpose != "turn":
            return
        if rebuilt.system and rebuilt.system != self._system:
            self._system = rebuilt.system
            # The system prompt goes before the prompt it was first sent with.
            held, self._pending = self._pending, []
            at = held[0]["timestamp"] if held else when
            self._add({"timestamp": at, "source": "system", "message": rebuilt.system})
            self._pending = held
        if not self._prompted:
            # A subagent has no turn_start: its prompt is its first user message.
            first = next((m for m in rebuilt.messages if m.get("role") == "user"), None)
            if first is not None:
                text = "".join(block_text(b) for b in first.get("content") or ())
                text = without_context(text)  # its context is the model's, as a system prompt is
                self._add({"timestamp": when, "source": "user", "message": text})
        self._prompted = True

    def _on_turn_start(self, record: Mapping[str, Any], data: dict[str, Any], when: str) -> None:
        self._prompted = True
        sent = str(data.get("sent") or data.get("prompt") or "")
        step: dict[str, Any] = {"timestamp": when, "source": "user", "message": sent}
        extra: dict[str, Any] = {}
        if data.get("prompt") is not None and data.get("prompt") != sent:
            extra["prompt_as_typed"] = data.get("prompt")
        if data.get("resumed"):
            extra["resumed"] = True
        if extra:
            step["extra"] = extra
        self._flush()
        self._pending.append(step)

    def _on_response(self, record: Mapping[str, Any], data: dict[str, Any], when: str) -> None:
        request = self._requests.get(int(record.get("req") or 0), {})
        if request.get("purpose", "turn") == "turn":  # a compaction summary is not a step
            self._add(self._agent_step(record, data, request, self._outputs))

    def _on_compaction(self, record: Mapping[str, Any], data: dict[str, Any], when: str) -> None:
        message = (
            f"context compacted ({data.get('trigger', 'auto')}): "
            f"{data.get('tokens_before')} -> {data.get('tokens_after')} tokens"
        )
        self._add(
            {
                "timestamp": when,
                "source": "system",
                "message": message,
                "extra": {"compaction": dict(data)},
            }
        )

    def _on_error(self, record: Mapping[str, Any], data: dict[str, Any], when: str) -> None:
        self._add(
            {
                "timestamp": when,
                "source": "system",
                "message": f"error: {data.get('message', '')}",
                "extra": {"error": dict(data)},
            }
        )

    def _agent_step(
        self,
        record: Mapping[str, Any],
        data: Mapping[str, Any],
        request: Mapping[str, Any],
        outputs: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Any]:
        message = data.get("message") if isinstance(data.get("message"), dict) else {}
        assert isinstance(message, dict)
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in message.get("content") or ():
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text") or ""))
            elif block.get("type") == "thinking" and block.get("text"):
                thoughts.append(str(block["text"]))
            elif block.get("type") == "tool_use":
                arguments = block.get("input")
                calls.append(
                    {
                        "tool_call_id": str(block.get("id")),
                        "function_name": str(block.get("name")),
                        "arguments": arguments if isinstance(arguments, dict) else {},
                    }
                )
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        inp, out = int(usage.get("input") or 0), int(usage.get("output") or 0)
        read, write = int(usage.get("cache_read") or 0), int(usage.get("cache_write") or 0)
        cost = float(data.get("cost") or 0.0)
        self.prompt_tokens += inp + read + write
        self.completion_tokens += out
        self.cached_tokens += read
        self.cache_write_tokens += write
        self.cost += cost
        metrics_extra: dict[str, Any] = {"cache_creation_input_tokens": write}
        for key in ("ttft_ms", "thinking_ms", "duration_ms", "attempts"):
            if data.get(key) is not None:
                metrics_extra[key] = data[key]
        step: dict[str, Any] = {
            "timestamp": _iso(float(record.get("t") or 0.0)),
            "source": "agent",
            "model_name": str(message.get("model") or request.get("model") or ""),
            "message": "".join(texts),
        }
        if not step["model_name"]:
            del step["model_name"]
        if request.get("effort"):
            step["reasoning_effort"] = request["effort"]
        if thoughts:
            step["reasoning_content"] = "\n\n".join(thoughts)
        if calls:
            step["tool_calls"] = calls
            results = [self._result(c["tool_call_id"], outputs) for c in calls]
            step["observation"] = {"results": results}
        step["metrics"] = {
            "prompt_tokens": inp + read + write,
            "completion_tokens": out,
            "cached_tokens": read,
            "cost_usd": cost,
            "extra": metrics_extra,
        }
        step_extra: dict[str, Any] = {"req": record.get("req")}
        if data.get("stop_reason"):
            step_extra["stop_reason"] = data["stop_reason"]
        step["extra"] = step_extra
        return step

    def _result(self, call_id: str, outputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {"source_call_id": call_id}
        output = outputs.get(call_id)
        if output is not None:
            result["content"] = str(output.get("output") or "")
        child = self.children.get(call_id)
        if child is not None:
            ref: dict[str, Any] = {
                "session_id": subagent_session_id(self.session_id, child.name),
                "extra": {"agent": child.label},
            }
            if call_id in self.subagent_paths:
                ref["trajectory_path"] = self.subagent_paths[call_id]
            result["subagent_trajectory_ref"] = [ref]
        return result

    def final_metrics(self, steps: int, *, everyone: bool) -> dict[str, Any]:
        """Token totals are this agent's steps'; the main trajectory's cost includes its
        subagents' (ATIF: "including cost for subagents")."""
        total_cost = (
            sum(
                float(data_of(r).get("cost") or 0.0)
                for r in self.everything
                if r.get("kind") == "response"
            )
            if everyone
            else self.cost
        )
        return {
            "total_prompt_tokens": self.prompt_tokens,
            "total_completion_tokens": self.completion_tokens,
            "total_cached_tokens": self.cached_tokens,
            "total_cost_usd": round(total_cost, 6),
            "total_steps": steps,
            "extra": {
                "total_cache_creation_input_tokens": self.cache_write_tokens,
                "own_cost_usd": round(self.cost, 6),
            },
        }
