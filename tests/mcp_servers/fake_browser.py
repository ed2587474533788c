"""A stand-in for the user's browser in keel's OAuth tests (`BROWSER="python fake_browser.py"`):
it opens the URL, follows the redirects back to keel's loopback listener, and exits. Only ever
given 127.0.0.1 URLs."""

from __future__ import annotations

import sys

import httpx

url = sys.argv[1]
assert url.startswith("http://127.0.0.1:"), url
answer = httpx.get(url, follow_redirects=True, timeout=30)
sys.exit(0 if "Signed in" in answer.text else 1)
