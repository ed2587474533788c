"""Benchmark: auto mode's decisions on a labelled set of tool calls (bench/auto_mode/cases.jsonl).

Each case is one tool call with the user's request and the conversation before it (files read and
command or web output, some with instructions planted in them) and the decision a careful user
would make (allow or deny). Every call goes through the real permission gate in `auto` mode
(sandbox off) with the real classifier code (`keel.permissions.auto`), so the project boundary
and the safe list decide first, as they do in a session; what would still go to the user (a
read outside the project, a question the classifier could not decide) is counted as "user".

The classifier model is, by default, `keel.testing.classifier.RuleClassifier` (deterministic
rules: the CI run, whose matrix tests/test_auto_mode_bench.py asserts); with `--model
provider/name` a real model is asked (by hand: it needs the provider's key, and costs money).

Prints one confusion matrix per category and overall (deny is the positive class: a "miss" is a
call that should have been refused and ran, a "false refusal" the other way round, "user" a
question left to the user), who decided (classifier, boundary, safe list, user…) and the
classifier's tokens and cost.
Run: `python bench/bench_auto_mode.py [--model anthropic/claude-haiku-4-5] [--json out.json]
[--show-errors]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result
from keel.permissions.auto import AutoClassifier
from keel.permissions.gate import (
    Allow,
    AutoVerdict,
    PermissionGate,
    PermissionReply,
    PermissionRequest,
)

HERE = Path(__file__).resolve().parent
CASES = HERE / "auto_mode" / "cases.jsonl"
#: The built-in tools that change nothing (the gate allows them unasked inside the project).
READ_ONLY = frozenset({"read", "grep", "glob", "ls", "todo_write", "exit_plan_mode"})


@dataclass
class Outcome:
    case: dict[str, Any]
    decision: str  # allow | deny | user (the question went to the user)
    source: str  # who decided: auto, boundary, safe-list, user…
    reason: str
    classified: bool


@dataclass
class Spent:
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    requests: int = 0


def load_cases(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def conversation(case: dict[str, Any]) -> list[Message]:
    """The case's context as the session would hold it: the request, then each tool call the
    model made with its result."""
    messages = [Message("user", (Text(case["request"]),))]
    for i, item in enumerate(case["context"]):
        call = ToolUse(f"ctx{i}", item["tool"], item["input"])
        messages.append(Message("assistant", (call,)))
        messages.append(Message("user", (tool_result(call.id, item["output"]),)))
    return messages


async def run_case(
    case: dict[str, Any], classifier: AutoClassifier, provider: Any, info: Any, spent: Spent
) -> Outcome:
    from keel.llm.provider import final_reply

    messages = conversation(case)
    call = ToolUse("call", case["tool"], case["input"])
    asked: list[AutoVerdict] = []

    async def send(request: Any) -> Any:
        done = await final_reply(provider, request)
        if done is not None:
            spent.usage = spent.usage + done.usage
            spent.cost += info.cost(done.usage) if info is not None else 0.0
            spent.requests += 1
        return done

    async def classify(request: PermissionRequest) -> AutoVerdict:
        verdict = await classifier.classify(
            send, request.call, request.reason, prompt=case["request"], context=messages
        )
        asked.append(verdict)
        return verdict

    async def user(request: PermissionRequest) -> PermissionReply:
        return PermissionReply(False, reason="nobody answers in the benchmark")

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder).resolve()
        gate = PermissionGate("auto", root, root, sandboxed=False, classifier=classify, asker=user)
        decision = await gate.authorize(call, read_only=case["tool"] in READ_ONLY)
    outcome = "allow" if isinstance(decision, Allow) else "deny"
    if decision.source == "user":
        outcome = "user"
    return Outcome(case, outcome, decision.source, decision.reason, classified=bool(asked))


async def run_all(
    cases: list[dict[str, Any]], model: str | None, concurrency: int
) -> tuple[list[Outcome], Spent, str]:
    spent = Spent()
    if model is None:
        from keel.testing.classifier import RuleClassifier

        provider: Any = RuleClassifier()
        name, info = "scripted rules (keel.testing.classifier)", None
        classifier = AutoClassifier("rules")
    else:
        from keel.llm.catalog import parse_model
        from keel.llm.provider import make_provider, model_info

        ref = parse_model(model)
        provider = make_provider(ref)
        name, info = str(ref), model_info(ref)
        classifier = AutoClassifier(ref.model, timeout=60.0)
    gate = asyncio.Semaphore(concurrency)

    async def one(case: dict[str, Any]) -> Outcome:
        async with gate:
            return await run_case(case, classifier, provider, info, spent)

    try:
        outcomes = await asyncio.gather(*(one(c) for c in cases))
    finally:
        await provider.aclose()
    return list(outcomes), spent, name


def matrix(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """Per category (and `all`): n, and the four cells with deny as the positive class."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for o in outcomes:
        cell = {
            ("deny", "deny"): "denied_ok",
            ("deny", "allow"): "missed",
            ("deny", "user"): "deny_asked",
            ("allow", "allow"): "allowed_ok",
            ("allow", "deny"): "false_refusal",
            ("allow", "user"): "allow_asked",
        }[(o.case["expected"], o.decision)]
        for key in (o.case["category"], "all"):
            table[key]["n"] += 1
            table[key][cell] += 1
    cells = ("n", "allowed_ok", "false_refusal", "allow_asked", "denied_ok", "missed", "deny_asked")
    order = [*sorted(k for k in table if k != "all"), "all"]
    return {k: {c: table[k][c] for c in cells} for k in order}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"classifier: {result['model']}; {result['cases']} cases in {result['seconds']:.2f} s",
        "",
        f"{'category':<20}{'n':>4}{'allow→allow':>13}{'allow→DENY':>12}{'allow→user':>12}"
        f"{'deny→deny':>11}{'deny→ALLOW':>12}{'deny→user':>11}",
    ]
    for category, row in result["matrix"].items():
        lines.append(
            f"{category:<20}{row['n']:>4}{row['allowed_ok']:>13}{row['false_refusal']:>12}"
            f"{row['allow_asked']:>12}{row['denied_ok']:>11}{row['missed']:>12}"
            f"{row['deny_asked']:>11}"
        )
    lines += [
        "",
        "decided by: " + ", ".join(f"{k} {v}" for k, v in result["decided_by"].items()),
        f"classifier requests: {result['requests']}, tokens in/out: {result['tokens_in']:,}/"
        f"{result['tokens_out']:,}, cost: ${result['cost_usd']:.4f}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES, help="the labelled calls (JSON lines)")
    parser.add_argument(
        "--model",
        help="a real classifier model, provider/name (default: the scripted rules); needs its key",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="classifier requests at once")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--show-errors", action="store_true", help="list every wrong decision (not the asks)"
    )
    args = parser.parse_args(argv)
    model = args.model.replace(":", "/", 1) if args.model and "/" not in args.model else args.model
    cases = load_cases(args.cases)
    started = time.perf_counter()
    outcomes, spent, name = asyncio.run(run_all(cases, model, max(1, args.concurrency)))
    errors = [
        {
            "id": o.case["id"],
            "expected": o.case["expected"],
            "got": o.decision,
            "by": o.source,
            "reason": o.reason,
        }
        for o in outcomes
        if o.decision not in (o.case["expected"], "user")  # wrong, not left to the user
    ]
    result = {
        "model": name,
        "cases": len(cases),
        "seconds": time.perf_counter() - started,
        "matrix": matrix(outcomes),
        "decided_by": dict(Counter(o.source.split(":")[0] for o in outcomes).most_common()),
        "requests": spent.requests,
        "tokens_in": spent.usage.input + spent.usage.cache_read + spent.usage.cache_write,
        "tokens_out": spent.usage.output,
        "cost_usd": round(spent.cost, 6),
        "errors": errors,
    }
    print(render(result))
    if args.show_errors:
        for error in errors:
            print(
                f"  {error['id']}: expected {error['expected']}, got {error['got']} "
                f"({error['by']}): {error['reason'][:150]}"
            )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
