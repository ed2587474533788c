"""`keel trace --atif`: the trace as an ATIF-v1.6 trajectory, validated against Harbor's schema.

The schema below is Harbor's (harbor-framework/harbor, `src/harbor/models/trajectories/`, ATIF
v1.6 as vendored byte for byte in NVIDIA NeMo Agent Toolkit's `nat.data_models.atif` and by
harbor 0.22.0; RFC `rfcs/0001-trajectory-format.md`), rewritten here as Pydantic models with the
same required fields, the same `extra="forbid"` on every object and the same validators
(ISO 8601 timestamps, agent-only fields, step ids sequential from 1, observation results that
name a tool call of their own step).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keel.trace.atif import to_atif
from tests.trace_records import READ_OUTPUT, SID, TOOLS, records


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Agent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class ToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]


class SubagentTrajectoryRef(_Strict):
    session_id: str
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Strict):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None


class Step(_Strict):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str | list[dict[str, Any]]
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    is_copied_context: bool | None = None
    extra: dict[str, Any] | None = None

    @field_validator("timestamp")
    @classmethod
    def iso(cls, v: str | None) -> str | None:
        if v is not None:
            datetime.fromisoformat(v.replace("Z", "+00:00"))
        return v

    @model_validator(mode="after")
    def agent_only(self) -> Step:
        if self.source != "agent":
            for name in ("model_name", "reasoning_effort", "reasoning_content", "tool_calls"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only applicable when source is 'agent'")
            if self.metrics is not None:
                raise ValueError("metrics is only applicable when source is 'agent'")
        return self


class Trajectory(_Strict):
    schema_version: Literal[
        "ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4", "ATIF-v1.5", "ATIF-v1.6"
    ]
    session_id: str
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def sequential(self) -> Trajectory:
        for i, step in enumerate(self.steps):
            if step.step_id != i + 1:
                raise ValueError(f"steps[{i}].step_id: expected {i + 1}, got {step.step_id}")
        return self

    @model_validator(mode="after")
    def references(self) -> Trajectory:
        for step in self.steps:
            ids = {c.tool_call_id for c in step.tool_calls or ()}
            for r in step.observation.results if step.observation else ():
                if r.source_call_id is not None and r.source_call_id not in ids:
                    raise ValueError(f"step {step.step_id}: unknown {r.source_call_id}")
        return self


def test_the_validator_can_fail() -> None:
    good = to_atif(records())
    Trajectory.model_validate(good)
    bad_cases = [
        {**good, "steps": [{**good["steps"][1], "model_name": "x"}]},  # user step with a model
        {**good, "surprise": 1},  # a field outside v1.6
        {**good, "steps": [{**good["steps"][0], "step_id": 2}]},
        {**good, "schema_version": "ATIF-v9"},
        {k: v for k, v in good.items() if k != "agent"},
    ]
    for bad in bad_cases:
        with pytest.raises(ValidationError):
            Trajectory.model_validate(bad)


def _definitions(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": s["name"],
                "description": s["description"],
                "parameters": s["input_schema"],
            },
        }
        for s in specs
    ]


def test_main_trajectory_whole() -> None:
    trajectory = to_atif(records())
    Trajectory.model_validate(trajectory)
    sonnet = "claude-sonnet-4-5-20250929"
    assert trajectory == {
        "schema_version": "ATIF-v1.6",
        "session_id": SID,
        "agent": {
            "name": "keel",
            "version": "0.1.0",
            "model_name": "anthropic/claude-sonnet-4-5",
            "tool_definitions": _definitions(TOOLS),
        },
        "steps": [
            {
                "step_id": 1,
                "timestamp": "2025-12-01T11:53:20.100Z",
                "source": "system",
                "message": "You are keel.",
            },
            {
                "step_id": 2,
                "timestamp": "2025-12-01T11:53:20.100Z",
                "source": "user",
                "message": "Fix the bug",
                "extra": {"prompt_as_typed": "/fix"},
            },
            {
                "step_id": 3,
                "timestamp": "2025-12-01T11:53:22.200Z",
                "source": "agent",
                "model_name": sonnet,
                "message": "Reading.",
                "reasoning_effort": "high",
                "reasoning_content": "Look first.",
                "tool_calls": [
                    {
                        "tool_call_id": "t1",
                        "function_name": "read",
                        "arguments": {"path": "app.py"},
                    },
                    {
                        "tool_call_id": "t2",
                        "function_name": "task",
                        "arguments": {"prompt": "explore the repo"},
                    },
                ],
                "observation": {
                    "results": [
                        {"source_call_id": "t1", "content": READ_OUTPUT},
                        {
                            "source_call_id": "t2",
                            "content": "Found app.py.",
                            "subagent_trajectory_ref": [
                                {"session_id": f"{SID}:explore-1", "extra": {"agent": "explore-1"}}
                            ],
                        },
                    ]
                },
                "metrics": {
                    "prompt_tokens": 3000,
                    "completion_tokens": 50,
                    "cached_tokens": 0,
                    "cost_usd": 0.01125,
                    "extra": {
                        "cache_creation_input_tokens": 2000,
                        "ttft_ms": 400.0,
                        "thinking_ms": 400.0,
                        "duration_ms": 2000.0,
                        "attempts": 2,
                    },
                },
                "extra": {"req": 1, "stop_reason": "tool_use"},
            },
            {
                "step_id": 4,
                "timestamp": "2025-12-01T11:53:24.700Z",
                "source": "agent",
                "model_name": sonnet,
                "message": "",
                "reasoning_effort": "high",
                "tool_calls": [
                    {
                        "tool_call_id": "t3",
                        "function_name": "bash",
                        "arguments": {"command": "rm -rf /"},
                    }
                ],
                "observation": {
                    "results": [{"source_call_id": "t3", "content": "denied by the user"}]
                },
                "metrics": {
                    "prompt_tokens": 3500,
                    "completion_tokens": 30,
                    "cached_tokens": 3000,
                    "cost_usd": 0.00315,
                    "extra": {
                        "cache_creation_input_tokens": 400,
                        "ttft_ms": 300.0,
                        "thinking_ms": 300.0,
                        "duration_ms": 1000.0,
                        "attempts": 1,
                    },
                },
                "extra": {"req": 3, "stop_reason": "tool_use"},
            },
            {
                "step_id": 5,
                "timestamp": "2025-12-01T11:53:28.000Z",
                "source": "agent",
                "model_name": sonnet,
                "message": "I will not run that. Fixed.",
                "reasoning_effort": "high",
                "metrics": {
                    "prompt_tokens": 3550,
                    "completion_tokens": 10,
                    "cached_tokens": 3400,
                    "cost_usd": 0.001695,
                    "extra": {
                        "cache_creation_input_tokens": 100,
                        "ttft_ms": 250.0,
                        "thinking_ms": 250.0,
                        "duration_ms": 1000.0,
                        "attempts": 1,
                    },
                },
                "extra": {"req": 4, "stop_reason": "end_turn"},
            },
            {
                "step_id": 6,
                "timestamp": "2025-12-01T11:53:30.000Z",
                "source": "user",
                "message": "and tests",
            },
            {
                "step_id": 7,
                "timestamp": "2025-12-01T11:53:31.200Z",
                "source": "system",
                "message": "context compacted (auto): 4000 -> 120 tokens",
                "extra": {
                    "compaction": {"trigger": "auto", "tokens_before": 4000, "tokens_after": 120}
                },
            },
            {
                "step_id": 8,
                "timestamp": "2025-12-01T11:53:32.300Z",
                "source": "agent",
                "model_name": sonnet,
                "message": "Tests pass.",
                "reasoning_effort": "high",
                "metrics": {
                    "prompt_tokens": 120,
                    "completion_tokens": 5,
                    "cached_tokens": 0,
                    "cost_usd": 0.000435,
                    "extra": {
                        "cache_creation_input_tokens": 0,
                        "ttft_ms": 300.0,
                        "thinking_ms": 300.0,
                        "duration_ms": 1000.0,
                        "attempts": 1,
                    },
                },
                "extra": {"req": 6, "stop_reason": "end_turn"},
            },
            {
                "step_id": 9,
                "timestamp": "2025-12-01T11:53:32.400Z",
                "source": "system",
                "message": "error: hook ./audit.sh timed out",
                "extra": {"error": {"message": "hook ./audit.sh timed out"}},
            },
        ],
        "final_metrics": {
            "total_prompt_tokens": 10170,
            "total_completion_tokens": 95,
            "total_cached_tokens": 6400,
            # the subagent's $0.0006 and the compaction's $0.0135 included
            "total_cost_usd": 0.03063,
            "total_steps": 9,
            "extra": {"total_cache_creation_input_tokens": 2500, "own_cost_usd": 0.01653},
        },
        "extra": {"keel_trace_format": 1, "cwd": "/work/p"},
    }


def test_subagent_trajectory_whole() -> None:
    trajectory = to_atif(records(), subagent="t2")
    Trajectory.model_validate(trajectory)
    assert trajectory == {
        "schema_version": "ATIF-v1.6",
        "session_id": f"{SID}:explore-1",
        "agent": {
            "name": "keel",
            "version": "0.1.0",
            "model_name": "claude-haiku-4-5-20251001",
            "tool_definitions": _definitions(TOOLS[1:2]),
        },
        "steps": [
            {
                "step_id": 1,
                "timestamp": "2025-12-01T11:53:22.500Z",
                "source": "system",
                "message": "You explore.",
            },
            {
                "step_id": 2,
                "timestamp": "2025-12-01T11:53:22.500Z",
                "source": "user",
                "message": "explore the repo",
            },
            {
                "step_id": 3,
                "timestamp": "2025-12-01T11:53:23.500Z",
                "source": "agent",
                "model_name": "claude-haiku-4-5-20251001",
                "message": "Found app.py.",
                "reasoning_effort": "high",
                "metrics": {
                    "prompt_tokens": 500,
                    "completion_tokens": 20,
                    "cached_tokens": 0,
                    "cost_usd": 0.0006,
                    "extra": {
                        "cache_creation_input_tokens": 0,
                        "ttft_ms": 200.0,
                        "thinking_ms": 200.0,
                        "duration_ms": 1000.0,
                        "attempts": 1,
                    },
                },
                "extra": {"req": 2, "stop_reason": "end_turn"},
            },
        ],
        "final_metrics": {
            "total_prompt_tokens": 500,
            "total_completion_tokens": 20,
            "total_cached_tokens": 0,
            "total_cost_usd": 0.0006,
            "total_steps": 3,
            "extra": {"total_cache_creation_input_tokens": 0, "own_cost_usd": 0.0006},
        },
        "extra": {
            "keel_trace_format": 1,
            "cwd": "/work/p",
            "subagent": "explore-1",
            "parent_tool_call_id": "t2",
        },
    }


def test_subagent_paths_go_into_the_reference() -> None:
    trajectory = to_atif(records(), subagent_paths={"t2": "out.explore-1.json"})
    Trajectory.model_validate(trajectory)
    task_result = trajectory["steps"][2]["observation"]["results"][1]
    assert task_result["subagent_trajectory_ref"] == [
        {
            "session_id": f"{SID}:explore-1",
            "trajectory_path": "out.explore-1.json",
            "extra": {"agent": "explore-1"},
        }
    ]
