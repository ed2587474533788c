"""Language servers (LSP) for diagnostics after edits: the client (`client`), which servers
there are (`servers`), the session's servers and the blocks the model reads (`manager`), and the
`diagnostics` tool (`tool`)."""

from __future__ import annotations

from keel.lsp.client import Diagnostic, LspClient, LspError
from keel.lsp.manager import LspManager
from keel.lsp.servers import BUILT_IN, ServerSpec, load_specs

__all__ = [
    "BUILT_IN",
    "Diagnostic",
    "LspClient",
    "LspError",
    "LspManager",
    "ServerSpec",
    "load_specs",
]
