"""`keel trace stats`: numbers about a run, computed from its trace records (docs/traces.md).

This module owns reading a trace folder's `events.jsonl` into records, rebuilding each agent's
delta-encoded message lists (trace format v1), and the statistics: requests by purpose, time to
first token, output speed, cache-read share, harness overhead per turn, cost by model, agent and
tool, retries and errors. It only reads; it never writes into a trace, and it imports nothing
heavier than the model catalog (the CLI loads it only for `keel trace stats`).

Cost attribution by tool is an estimate: a tool result's tokens are its characters over the
characters-per-token of the request that first carried it (the request's whole prompt over the
input tokens the provider reported; 4 when it reported none), and it costs those tokens once at
the model's input price, then at its cache-read price for every later request of the same agent
that still carried it (until a compaction or /clear dropped it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from keel.frozen import mutable
from keel.llm.catalog import ModelInfo, lookup

__all__ = [
    "Stats",
    "Tree",
    "compute",
    "load_records",
    "percentile",
    "render",
    "to_json",
]

#: Characters per token when a request reported no input tokens to calibrate with.
DEFAULT_CHARS_PER_TOKEN = 4.0
MAIN = "main"


def load_records(trace_dir: Path) -> list[dict[str, Any]]:
    """The records of `trace_dir/events.jsonl` in order (`keel.trace.read`: a torn last line is
    left out). A missing file, or a complete line that is not a JSON object, raises ValueError."""
    from keel.trace import read

    if not (trace_dir / "events.jsonl").is_file():
        raise ValueError(f"{trace_dir} has no events.jsonl")
    try:
        records = read(trace_dir)
    except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
        raise ValueError(f"events.jsonl holds a line that is not JSON ({exc})") from exc
    if not all(isinstance(r, dict) for r in records):
        raise ValueError("events.jsonl holds a line that is not a JSON object")
    return records


def agent_of(record: Mapping[str, Any]) -> str:
    """The agent label a record belongs to (`main` for the main agent). Two subagents may share
    a label (two `explore` agents side by side); `agent_key` tells them apart."""
    return str(record.get("agent") or MAIN)


def agent_key(record: Mapping[str, Any]) -> tuple[str, str]:
    """Which agent a record belongs to: (label, the `task` call that started it)."""
    return agent_of(record), str(record.get("parent") or "")


def data_of(record: Mapping[str, Any]) -> dict[str, Any]:
    data = record.get("data")
    return data if isinstance(data, dict) else {}


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# -- rebuilding requests -----------------------------------------------------------------------


@mutable
class Rebuilt:
    """One request as sent, rebuilt from the delta records."""

    req: int
    agent: str
    model: str
    purpose: str
    t: float
    system: str
    tools: list[Any]
    messages: list[dict[str, Any]]
    #: `len(json.dumps(messages))`, kept up incrementally (a long session stays linear).
    messages_chars: int = 2
    #: tool_use_id → result text of every tool result the messages carry.
    results: dict[str, str] = field(default_factory=dict)

    @property
    def prompt_chars(self) -> int:
        """The prompt's size in characters: system + tools JSON + messages JSON."""
        return len(self.system) + len(json.dumps(self.tools)) + self.messages_chars


class Tree:
    """Rebuilds the full message list of every request from trace v1's delta encoding."""

    def __init__(self) -> None:
        Key = tuple[str, str]
        self._lists: dict[Key, list[dict[str, Any]]] = {}
        self._chars: dict[Key, int] = {}  # the sum of len(json.dumps(m)) of each list
        self._results: dict[Key, dict[str, str]] = {}
        self._systems: dict[str, str] = {}
        self._tools: dict[str, list[Any]] = {}

    def learn(self, record: Mapping[str, Any]) -> None:
        """Take the system prompt and tool list texts of a request record (of any agent: two
        subagents of one type share them, and only the first carries the text)."""
        data = data_of(record)
        if isinstance(data.get("system"), str):
            self._systems[str(data.get("system_hash"))] = data["system"]
        if isinstance(data.get("tools"), list):
            self._tools[str(data.get("tools_hash"))] = data["tools"]

    def add(self, record: Mapping[str, Any]) -> Rebuilt:
        data = data_of(record)
        agent = agent_key(record)
        self.learn(record)
        new = [m for m in data.get("messages") or () if isinstance(m, dict)]
        if data.get("reset") or agent not in self._lists:
            self._lists[agent], self._chars[agent], self._results[agent] = [], 0, {}
        messages = self._lists[agent] = self._lists[agent] + new
        self._chars[agent] += sum(len(json.dumps(m)) for m in new)
        self._results[agent].update(tool_results(new))
        return Rebuilt(
            req=int(record.get("req") or 0),
            agent=agent[0],
            model=str(data.get("model") or ""),
            purpose=str(data.get("purpose") or "turn"),
            t=float(record.get("t") or 0.0),
            system=self._systems.get(str(data.get("system_hash")), ""),
            tools=self._tools.get(str(data.get("tools_hash")), []),
            messages=messages,
            # "[" + the messages joined by ", " + "]"
            messages_chars=2 + self._chars[agent] + 2 * max(len(messages) - 1, 0),
            results=dict(self._results[agent]),
        )


def block_text(block: Mapping[str, Any]) -> str:
    """The text a content block carries (a tool result's text parts joined)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text") or "")
    if kind == "tool_result":
        parts = block.get("content") or ()
        return "".join(block_text(p) for p in parts if isinstance(p, dict))
    return ""


def tool_results(messages: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """tool_use_id → result text of every tool result in `messages`."""
    out: dict[str, str] = {}
    for message in messages:
        for block in message.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out[str(block.get("tool_use_id"))] = block_text(block)
    return out


# -- the statistics ----------------------------------------------------------------------------


@mutable
class ToolCost:
    calls: int = 0
    result_tokens: int = 0
    carried: int = 0  # request-carries summed over its results
    cost: float = 0.0


@mutable
class Stats:
    session_id: str = ""
    requests: int = 0
    requests_by_purpose: dict[str, int] = field(default_factory=dict)
    requests_by_agent: dict[str, int] = field(default_factory=dict)
    ttft_ms: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    generating_ms: float = 0.0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    turns: list[dict[str, float]] = field(default_factory=list)
    cost: float = 0.0
    cost_by_model: dict[str, float] = field(default_factory=dict)
    cost_by_agent: dict[str, float] = field(default_factory=dict)
    tools: dict[str, ToolCost] = field(default_factory=dict)
    retries: int = 0
    http_errors: int = 0
    tool_errors: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def cache_read_share(self) -> float | None:
        total = self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
        return self.cache_read_tokens / total if total else None

    @property
    def overall_tokens_per_s(self) -> float | None:
        return self.output_tokens / (self.generating_ms / 1000) if self.generating_ms > 0 else None


def _union_seconds(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """The length of the union of `intervals`, clipped to [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, end = 0.0, lo
    for a, b in clipped:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _prices(model: str, overrides: Mapping[str, ModelInfo] | None) -> tuple[float, float]:
    """USD per token for fresh input and for a cache read (the input price when no discount)."""
    info = lookup(model, overrides)
    inp = (info.input_price or 0.0) / 1_000_000
    read = info.cache_read_price
    return inp, (inp if read is None else read / 1_000_000)


def compute(
    records: Sequence[Mapping[str, Any]], *, overrides: Mapping[str, ModelInfo] | None = None
) -> Stats:
    """The statistics of a trace's records (see the module docstring for the estimates)."""
    s = Stats()
    tree = Tree()
    rebuilt: dict[int, Rebuilt] = {}
    busy: list[tuple[float, float]] = []  # requests, tools and permission waits (wall clock)
    turn_start: float | None = None
    tool_names: dict[str, str] = {}
    # per agent: tool_use_id → (tool name, tokens, carries so far)
    live: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for record in records:
        kind = record.get("kind")
        data = data_of(record)
        agent = agent_of(record)
        t = float(record.get("t") or 0.0)
        if kind == "session" and not s.session_id:
            s.session_id = str(data.get("session_id") or "")
        elif kind == "turn_start" and agent == MAIN:
            turn_start = t
        elif kind == "turn_end" and agent == MAIN and turn_start is not None:
            _turn_end(s, data, busy, turn_start, t)
            turn_start = None
        elif kind == "request":
            r = tree.add(record)
            rebuilt[r.req] = r
            s.requests += 1
            s.requests_by_purpose[r.purpose] = s.requests_by_purpose.get(r.purpose, 0) + 1
            s.requests_by_agent[agent] = s.requests_by_agent.get(agent, 0) + 1
        elif kind == "response":
            _response(s, record, data, rebuilt, live, tool_names, busy, overrides)
        elif kind == "tool_start":
            tool_names[str(data.get("id"))] = str(data.get("name") or "?")
        elif kind == "tool_end":
            name = str(data.get("name") or tool_names.get(str(data.get("id")), "?"))
            tool_names[str(data.get("id"))] = name  # a call refused before it ran had no start
            s.tools.setdefault(name, ToolCost()).calls += 1
            start = float(data.get("started_at") or t - float(data.get("seconds") or 0))
            busy.append((start, start + float(data.get("seconds") or 0.0)))
            if data.get("is_error"):
                s.tool_errors += 1
        elif kind == "permission":
            waited = float(data.get("waited_ms") or 0.0) / 1000
            busy.append((t - waited, t))
        elif kind == "http":
            status = data.get("status")
            if data.get("error") or (isinstance(status, int) and status >= 400):
                s.http_errors += 1
        elif kind == "error":
            s.errors.append(str(data.get("message") or "error"))
    return s


def _turn_end(
    s: Stats, data: Mapping[str, Any], busy: list[tuple[float, float]], start: float, end: float
) -> None:
    """A turn's wall time, the time requests, tools and permission waits covered, and the
    rest: the harness's own overhead."""
    wall = max(end - start, 0.0)
    spent = _union_seconds(busy, start, end)
    s.turns.append({"wall_s": wall, "busy_s": spent, "overhead_s": max(wall - spent, 0.0)})
    if data.get("error"):
        s.errors.append(f"turn: {data['error']}")


def _response(
    s: Stats,
    record: Mapping[str, Any],
    data: Mapping[str, Any],
    rebuilt: Mapping[int, Rebuilt],
    live: dict[tuple[str, str], dict[str, list[Any]]],
    tool_names: Mapping[str, str],
    busy: list[tuple[float, float]],
    overrides: Mapping[str, ModelInfo] | None,
) -> None:
    agent = agent_of(record)
    req = rebuilt.get(int(record.get("req") or 0))
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    inp, out = int(usage.get("input") or 0), int(usage.get("output") or 0)
    read, write = int(usage.get("cache_read") or 0), int(usage.get("cache_write") or 0)
    s.input_tokens += inp
    s.cache_read_tokens += read
    s.cache_write_tokens += write
    s.output_tokens += out
    cost = float(data.get("cost") or 0.0)
    message = data.get("message") if isinstance(data.get("message"), dict) else {}
    assert isinstance(message, dict)
    model = str((req.model if req else "") or message.get("model") or "?")
    s.cost += cost
    s.cost_by_model[model] = s.cost_by_model.get(model, 0.0) + cost
    s.cost_by_agent[agent] = s.cost_by_agent.get(agent, 0.0) + cost
    s.retries += max(int(data.get("attempts") or 1) - 1, 0)
    if isinstance(data.get("ttft_ms"), int | float):
        s.ttft_ms.append(float(data["ttft_ms"]))
    if isinstance(data.get("output_tokens_per_s"), int | float):
        s.tokens_per_s.append(float(data["output_tokens_per_s"]))
    if isinstance(data.get("generating_ms"), int | float):
        s.generating_ms += float(data["generating_ms"])
    t = float(record.get("t") or 0.0)
    duration = float(data.get("duration_ms") or 0.0) / 1000
    busy.append(((req.t if req else t - duration), t))
    if req is None:
        return
    # Cost attribution: which tool results this request carried, and at what price.
    prompt_tokens = inp + read + write
    chars_per_token = req.prompt_chars / prompt_tokens if prompt_tokens else DEFAULT_CHARS_PER_TOKEN
    price_in, price_read = _prices(req.model, overrides)
    carried = req.results
    mine = live.setdefault(agent_key(record), {})
    for gone in set(mine) - set(carried):
        del mine[gone]  # compaction or /clear dropped it
    for use_id, text in carried.items():
        entry = mine.get(use_id)
        if entry is None:
            name = tool_names.get(use_id, "?")
            tokens = math.ceil(len(text) / chars_per_token) if text else 0
            entry = mine[use_id] = [name, tokens, 0]
            s.tools.setdefault(name, ToolCost()).result_tokens += tokens
        name, tokens, seen = entry
        price = price_in if seen == 0 or read == 0 else price_read
        tool = s.tools.setdefault(name, ToolCost())
        tool.carried += 1
        tool.cost += tokens * price
        entry[2] = seen + 1


# -- output ------------------------------------------------------------------------------------


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def to_json(s: Stats) -> dict[str, Any]:
    overhead = [t["overhead_s"] for t in s.turns]
    return {
        "session_id": s.session_id,
        "requests": {
            "total": s.requests,
            "by_purpose": dict(sorted(s.requests_by_purpose.items())),
            "by_agent": dict(sorted(s.requests_by_agent.items())),
        },
        "ttft_ms": {
            "p50": _round(percentile(s.ttft_ms, 50), 1),
            "p95": _round(percentile(s.ttft_ms, 95), 1),
        },
        "output_tokens_per_s": {
            "overall": _round(s.overall_tokens_per_s, 1),
            "p50": _round(percentile(s.tokens_per_s, 50), 1),
        },
        "tokens": {
            "input": s.input_tokens,
            "output": s.output_tokens,
            "cache_read": s.cache_read_tokens,
            "cache_write": s.cache_write_tokens,
            "cache_read_share": _round(s.cache_read_share, 4),
        },
        "turns": [{k: round(v, 3) for k, v in t.items()} for t in s.turns],
        "harness_overhead_s": {
            "per_turn_mean": _round(sum(overhead) / len(overhead), 3) if overhead else None,
            "per_turn_p50": _round(percentile(overhead, 50), 3),
            "total": round(sum(overhead), 3),
        },
        "cost_usd": {
            "total": round(s.cost, 6),
            "by_model": {k: round(v, 6) for k, v in sorted(s.cost_by_model.items())},
            "by_agent": {k: round(v, 6) for k, v in sorted(s.cost_by_agent.items())},
        },
        "tools": {
            name: {
                "calls": t.calls,
                "result_tokens": t.result_tokens,
                "carried": t.carried,
                "attributed_cost_usd": round(t.cost, 6),
            }
            for name, t in sorted(s.tools.items(), key=lambda kv: (-kv[1].cost, kv[0]))
        },
        "retries": s.retries,
        "http_errors": s.http_errors,
        "tool_errors": s.tool_errors,
        "errors": list(s.errors),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _usd(value: float) -> str:
    return f"${value:.4f}"


def render(s: Stats) -> str:
    """The statistics as aligned plain text for a terminal."""
    j = to_json(s)
    lines: list[str] = []

    def row(label: str, value: str) -> None:
        lines.append(f"{label:<25} {value}")

    lines.append(f"session {s.session_id}" if s.session_id else "session")
    purposes = ", ".join(f"{k} {v}" for k, v in j["requests"]["by_purpose"].items())
    row("requests", f"{s.requests}" + (f" ({purposes})" if purposes else ""))
    if len(s.requests_by_agent) > 1:
        row("  by agent", ", ".join(f"{k} {v}" for k, v in j["requests"]["by_agent"].items()))
    row("time to first token", f"p50 {_ms(j['ttft_ms']['p50'])}, p95 {_ms(j['ttft_ms']['p95'])}")
    speed = j["output_tokens_per_s"]["overall"]
    row("output speed", "-" if speed is None else f"{speed:,.1f} tokens/s")
    tokens = j["tokens"]
    share = tokens["cache_read_share"]
    row(
        "tokens",
        f"input {tokens['input']:,}, output {tokens['output']:,}, cache read "
        f"{tokens['cache_read']:,}, cache write {tokens['cache_write']:,}",
    )
    row("cache-read share", "-" if share is None else f"{share:.1%}")
    over = j["harness_overhead_s"]
    row(
        "harness overhead",
        "-"
        if over["per_turn_mean"] is None
        else f"{over['per_turn_mean'] * 1000:,.0f} ms per turn (mean of {len(s.turns)}), "
        f"p50 {over['per_turn_p50'] * 1000:,.0f} ms",
    )
    row("cost", _usd(s.cost))
    for model, cost in j["cost_usd"]["by_model"].items():
        row(f"  {model}", _usd(cost))
    if len(s.cost_by_agent) > 1:
        lines.append("cost by agent")
        for agent, cost in j["cost_usd"]["by_agent"].items():
            row(f"  {agent}", _usd(cost))
    if j["tools"]:
        lines.append(f"{'tool':<18}{'calls':>6}{'result tokens':>15}{'carried':>9}{'cost':>12}")
        for name, t in j["tools"].items():
            lines.append(
                f"{name[:17]:<18}{t['calls']:>6}{t['result_tokens']:>15,}{t['carried']:>9}"
                f"{_usd(t['attributed_cost_usd']):>12}"
            )
    row("retries", str(s.retries))
    row("errors", f"{len(s.errors)} (tool errors {s.tool_errors}, http errors {s.http_errors})")
    for e in s.errors[:10]:
        lines.append(f"  {e[:100]}")
    return "\n".join(lines) + "\n"
