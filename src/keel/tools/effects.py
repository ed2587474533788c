"""Effect classes: which tool calls are not safe to repeat after a crash.

The seeds' contract is that a crash repeats at most the calls in flight. For most calls that is
harmless (a build, a test run, an edit that writes the same text again); for some it is not (a
`git push`, a deploy, a payment). A tool declares the second kind:

- `repeat_safe=False` on the tool (`@tool(repeat_safe=False)`, or the attribute on any `Tool`);
- `repeat_risk(ctx, args)` on the tool, when it depends on the call: the `bash` tool names the
  commands matching `ToolContext.unsafe_to_repeat` (settings key `unsafe_to_repeat`, patterns in
  the form of permission rules, `git push *`; the defaults below are always included);
- MCP tools whose server annotates them `destructiveHint: true` or `idempotentHint: false`;
- any tool whose metadata (keel.tools.base `tool_meta`) says destructive and not idempotent.

For such a call the journal records, durably, that it started before it runs; a resume that
finds it without a result does not run it again blindly (docs/sessions.md "Unknown outcomes").
This module decides; it neither journals nor runs anything.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.tools.base import Tool, ToolContext

#: Commands not safe to run twice (settings `unsafe_to_repeat` adds to them).
DEFAULT_UNSAFE_TO_REPEAT: tuple[str, ...] = (
    "git push *",
    "npm publish *",
    "yarn publish *",
    "pnpm publish *",
    "cargo publish *",
    "twine upload *",
    "kubectl apply *",
    "kubectl delete *",
    "helm install *",
    "helm upgrade *",
    "terraform apply *",
    "terraform destroy *",
    "docker push *",
    "gh release create *",
    "gh pr create *",
    "gh pr merge *",
)


def repeat_risk(tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> str | None:
    """Why a call of `tool` with `args` must not be repeated blindly; None when repeating it is
    what the seeds' contract allows."""
    check = getattr(tool, "repeat_risk", None)
    if check is not None:
        reason = check(ctx, args)
        if reason:
            return str(reason)
    if getattr(tool, "repeat_safe", True) is False:
        return f"{tool.name} is declared not safe to repeat"
    from keel.tools.base import tool_meta  # base imports this module

    meta = tool_meta(tool)
    if meta.destructive and not meta.idempotent:
        return f"{tool.name} is declared destructive and not idempotent"
    return None


def command_repeat_risk(ctx: ToolContext, args: dict[str, Any]) -> str | None:
    """For the bash tool: the first command of the line (wherever it is nested) that matches one
    of the unsafe-to-repeat patterns."""
    from keel.permissions.shell import rule_denies

    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return None
    hit = rule_denies(ctx.unsafe_to_repeat, command)
    if hit is None:
        return None
    return f"`{hit}` matches the unsafe_to_repeat commands"


def call_summary(tool: str, args: dict[str, Any] | None, width: int = 300) -> str:
    """What a call does, in one line, for the question a resume asks."""
    if args is None:
        text = ""
    elif isinstance(args.get("command"), str):
        text = str(args["command"])
    else:
        text = json.dumps(args, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["DEFAULT_UNSAFE_TO_REPEAT", "call_summary", "command_repeat_risk", "repeat_risk"]
