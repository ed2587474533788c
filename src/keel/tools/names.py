"""Tool names in Claude Code's spelling and keel's: the one table every compatibility layer uses
(permission rules, hook payloads and matchers, agent `tools:` lists, command frontmatter).

keel's own tools that Claude Code lacks keep keel's names (`raw_output`, `task_wait`…); Claude
Code's tools that keel lacks map to None (callers warn about them, naming the file). Imports
nothing from keel.
"""

from __future__ import annotations

from typing import Final

#: keel's name → Claude Code's name, for the tools both have.
KEEL_TO_CLAUDE: Final[dict[str, str]] = {
    "bash": "Bash",
    "bash_output": "BashOutput",
    "bash_kill": "KillShell",
    "read": "Read",
    "write": "Write",
    "edit": "Edit",
    "multi_edit": "MultiEdit",
    "glob": "Glob",
    "grep": "Grep",
    "ls": "LS",
    "web_fetch": "WebFetch",
    "web_search": "WebSearch",
    "todo_write": "TodoWrite",
    "task": "Task",
    "exit_plan_mode": "ExitPlanMode",
    "skill": "Skill",
}

#: Claude Code's names that mean a keel tool, old spellings included.
CLAUDE_TO_KEEL: Final[dict[str, str]] = {
    **{claude: keel for keel, claude in KEEL_TO_CLAUDE.items()},
    "KillBash": "bash_kill",
    "Agent": "task",
    "TaskStop": "task_stop",  # stops a background task, as keel's task_stop does
}

#: Claude Code tools keel does not have (a rule or list naming one is reported, never dropped
#: silently).
CLAUDE_ONLY: Final[frozenset[str]] = frozenset(
    {"NotebookEdit", "NotebookRead", "SlashCommand", "AskUserQuestion", "ListMcpResourcesTool"}
    # The rest of Claude Code's tools reference (code.claude.com/docs/en/tools-reference).
    | {"CronCreate", "CronDelete", "CronList", "EnterPlanMode", "EnterWorktree", "ExitWorktree"}
    | {"LSP", "Monitor", "PowerShell", "ReadMcpResourceTool", "SendMessage", "TodoRead"}
    | {"TaskCreate", "TaskGet", "TaskList", "TaskUpdate", "TaskOutput"}
)


def to_claude(name: str) -> str:
    """The name Claude Code gives keel's tool `name` (keel's own name when it has none)."""
    return KEEL_TO_CLAUDE.get(name, name)


def from_claude(name: str) -> str | None:
    """keel's tool for `name` in either spelling (`Bash`, `bash`, `KillBash`); MCP names
    (`mcp__server__tool`) as they are; None for a Claude Code tool keel does not have."""
    if name in CLAUDE_TO_KEEL:
        return CLAUDE_TO_KEEL[name]
    if name in CLAUDE_ONLY:
        return None
    return name


__all__ = ["CLAUDE_ONLY", "CLAUDE_TO_KEEL", "KEEL_TO_CLAUDE", "from_claude", "to_claude"]
