"""`exit_plan_mode`: the model presents its plan; the permission prompt is the approval.

The gate always asks about this call, in every mode (bypass too). An approval switches the
session to the mode the user picks and the result tells the model to go ahead; a refusal keeps
plan mode and the model sees the user's feedback as the error result.
"""

from __future__ import annotations

from keel.tools.base import ToolContext, ToolError, tool


@tool(read_only=True, kind="builtin")
async def exit_plan_mode(ctx: ToolContext, plan: str) -> str:
    """Present your plan to the user and ask to leave plan mode. Call this in plan mode once you
    have researched enough to know what to change: the user approves (and picks how to continue)
    or answers with feedback to plan further.

    Args:
        plan: The plan in Markdown: what you will change, where, and how you will check it.
    """
    if not plan.strip():
        raise ToolError("the plan is empty; write out the steps you will take")
    return "The user approved the plan. Carry it out now, step by step."
