"""`keel acp`: serve keel to an editor over the Agent Client Protocol (stdio JSON-RPC).

Parses the command line only; the protocol lives in `keel.acp` (imported here, never by
`keel --version` or `keel -p`).
"""

from __future__ import annotations

import argparse

from keel.cli.main import _Parser, add_rule_flags


def acp_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="keel acp",
        description="Run keel as an Agent Client Protocol agent on stdin/stdout, for editors "
        "such as Zed (docs/acp.md). Every session the editor opens uses these settings; the "
        "editor picks the permission mode per session.",
    )
    p.add_argument("-m", "--model", help="provider/model for new sessions (default: settings)")
    p.add_argument(
        "--mode",
        choices=("default", "accept-edits", "plan", "bypass", "auto"),
        help="permission mode new sessions start in (default: the settings', else default)",
    )
    p.add_argument("--effort", choices=("low", "medium", "high", "max"), help="reasoning effort")
    add_rule_flags(p)
    p.add_argument("--debug", action="store_true", help="log the protocol's work to stderr")
    p.add_argument(
        "--force",
        action="store_true",
        help="load sessions whose configuration changed since they ran (instruction files, "
        "tools, keel's version); the refusal names what changed",
    )
    return p


def acp(argv: list[str]) -> int:
    args = acp_parser().parse_args(argv)
    from keel.acp.agent import Defaults
    from keel.acp.stdio import run

    return run(
        Defaults(
            model=args.model,
            mode=args.mode,
            effort=args.effort,
            allowed_tools=list(args.allowed_tools),
            disallowed_tools=list(args.disallowed_tools),
            debug=args.debug,
            force=args.force,
        )
    )
