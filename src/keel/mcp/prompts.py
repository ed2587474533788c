"""MCP prompts as slash commands and MCP resources as `@server:uri` mentions, Claude Code's way.

A prompt `/mcp__<server>__<prompt> args…` (names sanitised as tool names are) is replaced by the
text of the server's prompt: the words of `args` go to the prompt's arguments in order, or by
name as `name=value` (quotes group words, as for custom commands). A missing required argument,
an unknown argument name or a failing server is a `UserError` naming what to type. A mention
`@<server>:<uri>` of a connected server that offers resources attaches the resource's text after
the prompt in an `<mcp-resource>` block (the prompt text is kept as typed); a mention that names
no such server stays plain text (an email address, `@user:pass`), one whose read fails is
attached as the one-line reason.

This module must never import the `mcp` SDK (it talks through `McpManager` only) and never run
anything but the manager's requests.
"""

from __future__ import annotations

import re

from keel.errors import UserError
from keel.mcp.client import McpCallError, McpManager, RemotePrompt
from keel.mcp.tools import resource_servers, resource_text, sanitise
from keel.skills.skills import parse_slash, split_arguments

#: `@server:uri` at the start of the prompt or after whitespace; the uri runs to whitespace.
_MENTION = re.compile(r"(?:(?<=\s)|^)@([A-Za-z0-9_.-]+):(\S+)")
_TRAILING = ".,;!?)]}'\""


def command_name(server: str, prompt: str) -> str:
    return f"mcp__{sanitise(server)}__{sanitise(prompt)}"


class McpPrompts:
    """What a prompt becomes with the servers of one manager: `expand` is called by the loop
    for every prompt; None means the prompt is neither an MCP prompt command nor mentions a
    resource."""

    def __init__(self, manager: McpManager) -> None:
        self.manager = manager

    def commands(self) -> dict[str, tuple[str, RemotePrompt]]:
        """`mcp__server__prompt` -> (server, prompt), for every connected server's prompts."""
        found: dict[str, tuple[str, RemotePrompt]] = {}
        for status in self.manager.status():
            if status.state == "connected":
                for prompt in status.prompts:
                    found.setdefault(command_name(status.name, prompt.name), (status.name, prompt))
        return found

    async def expand(self, text: str) -> str | None:
        expanded = await self._command(text)
        body = text if expanded is None else expanded
        attached = await self._attach(body)
        if attached is None:
            return expanded
        return attached

    async def _command(self, text: str) -> str | None:
        parsed = parse_slash(text) if text.startswith("/mcp__") else None
        if parsed is None:
            return None
        name, arguments = parsed
        found = self.commands().get(name)
        if found is None:
            known = ", ".join(f"/{n}" for n in sorted(self.commands())) or "none"
            raise UserError(
                f"/{name}: no connected MCP server offers this prompt",
                hint=f"MCP prompts here: {known}",
            )
        server, prompt = found
        args = prompt_arguments(prompt, split_arguments(arguments), f"/{name}")
        try:
            messages = await self.manager.get_prompt(server, prompt.name, args)
        except McpCallError as exc:
            raise UserError(f"/{name}: {exc}") from None
        return "\n\n".join(messages)

    async def _attach(self, text: str) -> str | None:
        servers = set(resource_servers(self.manager))
        blocks: list[str] = []
        seen: set[tuple[str, str]] = set()
        for m in _MENTION.finditer(text):
            server, uri = m.group(1), m.group(2).rstrip(_TRAILING)
            if server not in servers or (server, uri) in seen:
                continue
            seen.add((server, uri))
            try:
                body = await resource_text(self.manager, server, uri)
            except McpCallError as exc:
                body = f"[not attached: {exc}]"
            blocks.append(f'<mcp-resource server="{server}" uri="{uri}">\n{body}\n</mcp-resource>')
        if not blocks:
            return None
        return text + "\n\n" + "\n\n".join(blocks)


def prompt_arguments(prompt: RemotePrompt, words: list[str], label: str) -> dict[str, str]:
    """`words` as the prompt's arguments: `name=value` by name, the rest in order."""
    names = [a.name for a in prompt.arguments]
    args: dict[str, str] = {}
    positional: list[str] = []
    for word in words:
        key, eq, value = word.partition("=")
        if eq and key in names:
            args[key] = value
        else:
            positional.append(word)
    free = [n for n in names if n not in args]
    if len(positional) > len(free):
        usage = " ".join(f"<{n}>" for n in names) or "(no arguments)"
        raise UserError(
            f"{label}: too many arguments ({len(words)} given)", hint=f"usage: {label} {usage}"
        )
    args.update(zip(free, positional, strict=False))
    missing = [a.name for a in prompt.arguments if a.required and a.name not in args]
    if missing:
        usage = " ".join(f"<{n}>" for n in names)
        raise UserError(
            f"{label}: missing required argument(s) {', '.join(missing)}",
            hint=f"usage: {label} {usage} (or name=value)",
        )
    return args


__all__ = ["McpPrompts", "command_name", "prompt_arguments"]
