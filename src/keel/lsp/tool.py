"""The `diagnostics` tool: what the language servers report for a file, or for every file they
have open in this session. Read-only (it runs in plan mode too); offered only where a language
server can run (`keel.app.assembly.add_lsp`)."""

from __future__ import annotations

from keel.tools.base import ToolContext, ToolError, ToolOutput, tool

#: The most lines one answer holds.
MAX_LINES = 60


@tool(read_only=True, kind="builtin")
async def diagnostics(ctx: ToolContext, path: str | None = None) -> ToolOutput:
    """Errors and warnings a language server reports (type errors, unknown names, syntax
    errors), as `path:line:col: severity: message [source code]`. With `path`: that file, checked
    now. Without: every file the language servers have open in this session (the files changed
    so far and the files importing them).

    Args:
        path: The file to check, relative to the working directory or absolute; leave it out
            for every open file.
    """
    lsp = ctx.lsp
    if lsp is None:
        raise ToolError("no language server runs here; run the project's checker with bash")
    if path:
        target = ctx.resolve(path).resolve()
        if not target.is_file():
            raise ToolError(f"{path} is not a file; check the path with glob")
        denied = ctx.content_denied(target) if ctx.content_denied is not None else None
        if denied:
            raise ToolError(denied)
        if lsp.spec_for(target) is None:
            raise ToolError(
                f"no language server handles {target.suffix or 'files without an extension'} "
                "files here; run the project's checker with bash"
            )
        from keel.lsp.client import LspError

        try:
            lines = await lsp.file_report(target)
        except LspError as exc:
            raise ToolError(f"{exc}; run the project's checker with bash") from None
        return ToolOutput(lines or f"{path}: no errors or warnings")
    out: list[str] = []
    files = lsp.open_files()
    for file, found in files:
        out += [lsp.line(file, d, label=True) for d in found if d.severity <= 2]
    if not files:
        return ToolOutput(
            "no file is open in a language server yet (they open the files you change); "
            "give a path to check one"
        )
    if not out:
        return ToolOutput(f"no errors or warnings in the {len(files)} open file(s)")
    if len(out) > MAX_LINES:
        out = [*out[:MAX_LINES], f"... and {len(out) - MAX_LINES} more"]
    return ToolOutput("\n".join(out))


__all__ = ["diagnostics"]
