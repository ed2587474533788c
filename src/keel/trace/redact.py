"""Credential redaction for traces: header values and URL query parameters that carry a key.

Owns the list of what counts as a credential in an HTTP exchange (trace_format.md, "Redaction").
Bodies are not redacted: keel's providers never put a key in a body (tests check it for every
provider). This module must never log or keep the values it removes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"

#: Header names (lowercase) whose value is a credential.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
    }
)
#: URL query parameters (lowercase) whose value is a credential.
SECRET_PARAMS = frozenset({"key", "api_key", "apikey", "token", "access_token", "sig"})
#: Authorization schemes kept in front of the redacted value (`Bearer [redacted]`).
_SCHEMES = ("bearer", "basic", "token")


def _secret_header(name: str) -> bool:
    low = name.lower()
    # Any `…-api-key`, `…-auth-token` spelling a gateway may use counts too.
    return low in SECRET_HEADERS or low.endswith(("-api-key", "-auth-token", "-access-token"))


def redact_header(name: str, value: str) -> str:
    if not _secret_header(name):
        return value
    scheme, _, rest = value.partition(" ")
    if rest and scheme.lower() in _SCHEMES:
        return f"{scheme} {REDACTED}"
    return REDACTED


def redact_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers with credential values replaced (names lowercased; a repeated header's
    values joined with `, `, as HTTP allows)."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in items:
        low = name.lower()
        clean = redact_header(low, value)
        out[low] = f"{out[low]}, {clean}" if low in out else clean
    return out


def redact_url(url: str) -> str:
    """`url` with credential query parameters and any user:password part replaced."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in SECRET_PARAMS for k, _ in pairs):
            query = urlencode(
                [(k, REDACTED if k.lower() in SECRET_PARAMS else v) for k, v in pairs],
                safe="[]",
            )
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


__all__ = [
    "REDACTED",
    "SECRET_HEADERS",
    "SECRET_PARAMS",
    "redact_header",
    "redact_headers",
    "redact_url",
]
