"""The trace viewer as a user sees it: the static page and the live server, in a real headless
chromium (Debian's, driven by playwright), over a recorded trace of a scripted session with two
subagents, a compaction, a denied permission and a retried request (tests/trace_fixture.py).

Also, without a browser: the static page is valid HTML, references nothing outside itself and
embeds content inertly (`</script>`, `<!--`); the live server answers only on 127.0.0.1, only with
its token, only to its own Host name, never caches, serves only body files by their exact names,
and stops on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.llm.messages import Text
from keel.trace.viewer import write_html
from tests import trace_fixture
from tests.browser_helpers import browser_fixture  # noqa: F401 (fixture)
from tests.trace_fixture import HOSTILE, SYSTEM, SYSTEM_DIRTY

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "docs" / "images" / "trace-viewer.png"

VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


class StrictHTML(HTMLParser):
    """Fails on what a browser would silently repair: an end tag that closes nothing open, an
    element left open, a self-closed non-void element, a second doctype; collects scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.doctypes = 0
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.refs: list[str] = []
        self._script: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_decl(self, decl: str) -> None:
        self.doctypes += decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "action", "srcset")]
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "script":
            self._script, self._text = dict(attrs), []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.errors.append(f"self-closed <{tag}/>")
        self.refs += [v or "" for k, v in attrs if k in ("src", "href")]

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._text.append(data)

    def handle_comment(self, data: str) -> None:
        self.errors.append(f"a comment <!--{data[:30]}-->")


def check_html(text: str) -> StrictHTML:
    parser = StrictHTML()
    parser.feed(text)
    parser.close()
    assert parser.errors == []
    assert parser.stack == []
    assert parser.doctypes == 1
    return parser


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("session") / "s1.trace"
    trace_fixture.write_trace(directory)
    return directory


@pytest.fixture(scope="module")
def records(trace_dir: Path) -> list[dict[str, Any]]:
    lines = (trace_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def static_page(trace_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html") / "trace.html"
    write_html(trace_dir, out)
    return out


# ------------------------------------------------------------------ the static page, no browser


def test_static_page_is_valid_html_with_the_trace_embedded_inertly(
    static_page: Path, trace_dir: Path, records: list[dict[str, Any]]
) -> None:
    text = static_page.read_text(encoding="utf-8")
    parser = check_html(text)
    # Content carrying `</script>` and `<!--` (a grep output) must not end the data script early
    # or open a comment: the whole trace comes back out of it, byte for byte.
    assert HOSTILE in json.dumps(records, ensure_ascii=False)
    assert "</script><script>document.title" not in text
    assert "<!--" not in text
    data_scripts = [body for attrs, body in parser.scripts if attrs.get("id") == "trace-data"]
    assert len(data_scripts) == 1
    embedded = json.loads(data_scripts[0])
    assert embedded["records"] == records
    numbers = [r["data"]["n"] for r in records if r["kind"] == "http"]
    assert list(embedded["bodies"]) == [
        f"{side}/{n}" for n in numbers for side in ("request", "response")
    ]
    for n in numbers:
        for side, suffix in (("request", "request.json"), ("response", "response.txt")):
            raw = (trace_dir / "http" / f"{n:04d}-{suffix}").read_bytes()
            assert embedded["bodies"][f"{side}/{n}"] == {
                "text": raw.decode(),
                "size": len(raw),
                "truncated": False,
            }
    # One inline script runs: the viewer. Nothing is loaded from anywhere.
    assert [attrs for attrs, _ in parser.scripts] == [
        {"type": "application/json", "id": "trace-data"},
        {},
    ]
    assert parser.refs == ["data:,"]  # the favicon: none, so the browser asks for none
    # Only the page's own script and style may run (by hash): no 'unsafe-inline', no source.
    import base64
    import hashlib

    def digest(body: str) -> str:
        return "sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()

    viewer = next(body for attrs, body in parser.scripts if not attrs)
    style = text.split("<style>", 1)[1].split("</style>", 1)[0]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text)
    assert csp is not None
    assert csp[1] == (
        f"default-src 'none'; script-src '{digest(viewer)}'; style-src '{digest(style)}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def test_static_page_is_as_private_as_the_trace(trace_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    out.write_text("old", encoding="utf-8")
    out.chmod(0o644)
    write_html(trace_dir, out)
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_static_page_caps_each_body_and_says_so(trace_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "capped.html"
    write_html(trace_dir, out, body_cap=100)
    parser = check_html(out.read_text(encoding="utf-8"))
    embedded = json.loads(next(b for a, b in parser.scripts if a.get("id") == "trace-data"))
    raw = (trace_dir / "http" / "0001-request.json").read_bytes()
    assert len(raw) > 100
    assert embedded["bodies"]["request/1"] == {
        "text": raw[:100].decode(),
        "size": len(raw),
        "truncated": True,
    }
    assert all(len(b["text"].encode()) <= 100 for b in embedded["bodies"].values())


def test_static_page_inlines_no_file_outside_the_trace(tmp_path: Path) -> None:
    """A record naming `http/../../secret` or a symlinked body must not pull that file in."""
    trace = tmp_path / "t.trace"
    (trace / "http").mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET", encoding="utf-8")
    (trace / "http" / "0002-request.json").symlink_to(secret)
    (trace / "http" / "0003-request.json").write_text('{"ok": 1}', encoding="utf-8")
    recs = [
        {
            "seq": 1,
            "t": 1.0,
            "kind": "http",
            "req": 1,
            "data": {
                "n": 1,
                "request_file": "http/../../secret.txt",
                "response_file": "http/0002-request.json",
            },
        },
        {
            "seq": 2,
            "t": 2.0,
            "kind": "http",
            "req": 1,
            "data": {
                "n": 3,
                "request_file": "http/0003-request.json",
                "response_file": "/etc/passwd",
            },
        },
    ]
    (trace / "events.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8"
    )
    out = tmp_path / "page.html"
    write_html(trace, out)
    text = out.read_text(encoding="utf-8")
    assert "TOP-SECRET" not in text
    assert "root:" not in text
    parser = check_html(text)
    embedded = json.loads(next(b for a, b in parser.scripts if a.get("id") == "trace-data"))
    assert embedded["bodies"] == {"request/3": {"text": '{"ok": 1}', "size": 9, "truncated": False}}


def test_static_page_of_a_torn_trace_leaves_the_torn_line_out(tmp_path: Path) -> None:
    trace = tmp_path / "t.trace"
    trace.mkdir()
    (trace / "events.jsonl").write_text(
        '{"seq":1,"t":1.0,"kind":"notice","data":{"message":"a","level":"info"}}\n{"seq":2,"t":2',
        encoding="utf-8",
    )
    out = tmp_path / "p.html"
    write_html(trace, out)
    parser = check_html(out.read_text(encoding="utf-8"))
    embedded = json.loads(next(b for a, b in parser.scripts if a.get("id") == "trace-data"))
    assert [r["seq"] for r in embedded["records"]] == [1]


# ------------------------------------------------------------------ the live server, no browser


def test_the_tail_reads_only_whole_new_lines_and_finds_records_after_a_number(
    tmp_path: Path,
) -> None:
    from keel.trace.viewer import _Tail

    events = tmp_path / "events.jsonl"
    line = lambda seq: json.dumps({"seq": seq, "t": 1.0, "kind": "notice", "data": {}}) + "\n"  # noqa: E731
    events.write_text(line(1) + line(2) + line(3)[:9], encoding="utf-8")
    tail = _Tail(events)
    assert [r["seq"] for r in tail.after(0)] == [1, 2]
    with events.open("a", encoding="utf-8") as f:
        f.write(line(3)[9:] + "not json\n" + line(4))
    assert [r["seq"] for r in tail.after(1)] == [2, 3, 4]
    assert tail.after(4) == []
    with events.open("a", encoding="utf-8") as f:
        f.write(line(2))  # numbers that go backwards (a damaged trace): still every record above
    assert [r["seq"] for r in tail.after(2)] == [3, 4]
    assert [r["seq"] for r in tail.after(1)] == [2, 3, 4, 2]


class Server:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url
        match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/([A-Za-z0-9_-]+)/", url)
        assert match, url
        self.port = int(match[1])
        self.token = match[2]


@pytest.fixture
def live(trace_dir: Path, tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    """A `serve` process over a copy of the fixture trace that the test can append to."""
    directory = tmp_path / "live.trace"
    shutil.copytree(trace_dir, directory)
    code = "import sys; from pathlib import Path; from keel.trace.viewer import serve; serve(Path(sys.argv[1]), open_browser=False)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BROWSER": "false"},
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    assert ready, "the viewer printed no URL within 20 s"
    line = proc.stdout.readline()
    match = re.search(r"(http://\S+)", line)
    assert match, line
    server = Server(proc, match[1])
    try:
        yield server, directory
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()


def get(server: Server, path: str, *, host: str | None = None) -> httpx.Response:
    headers = {"host": host} if host is not None else {}
    return httpx.get(f"http://127.0.0.1:{server.port}{path}", headers=headers, timeout=10)


def test_live_server_refuses_requests_without_its_token(live: tuple[Server, Path]) -> None:
    server, _ = live
    for path in (
        "/",
        "/events?after=0",
        "/http/0001-request.json",
        "/viewer.js",
        f"/{server.token[:-1]}/",
        f"/{server.token}x/",
        f"/x{server.token}/events",
        f"/{server.token}",
    ):
        response = get(server, path)
        assert (path, response.status_code) == (path, 403)
        assert response.headers["cache-control"] == "no-store"
        assert "keel trace" not in response.text
    ok = get(server, f"/{server.token}/")
    assert ok.status_code == 200
    assert ok.headers["cache-control"] == "no-store"
    assert "<title>keel trace</title>" in ok.text


def test_live_server_refuses_a_foreign_host_header(live: tuple[Server, Path]) -> None:
    """DNS rebinding: a page on evil.example that resolves its name to 127.0.0.1 reaches this
    port with its own name in Host (and even with the token, it must get nothing)."""
    server, _ = live
    path = f"/{server.token}/events?after=0"
    for host in (
        f"evil.example:{server.port}",
        "evil.example",
        "127.0.0.1",
        f"127.0.0.1:{server.port + 1}",
        f"localhost.evil.example:{server.port}",
        f"0.0.0.0:{server.port}",
        "",
    ):
        response = get(server, path, host=host)
        assert (host, response.status_code) == (host, 403)
        assert response.headers["cache-control"] == "no-store"
        assert "records" not in response.text
    for host in (
        f"127.0.0.1:{server.port}",
        f"localhost:{server.port}",
        f"LOCALHOST:{server.port}",
    ):
        assert get(server, path, host=host).status_code == 200


def test_live_server_listens_on_127_0_0_1_only(live: tuple[Server, Path]) -> None:
    server, _ = live
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.2", server.port)) != 0  # bound to 0.0.0.0 would accept
    assert get(server, f"/{server.token}/").status_code == 200


def test_live_server_serves_records_incrementally_and_bodies_by_exact_name(
    live: tuple[Server, Path], records: list[dict[str, Any]]
) -> None:
    server, directory = live
    base = f"/{server.token}"
    everything = get(server, f"{base}/events?after=0")
    assert everything.status_code == 200
    assert everything.headers["cache-control"] == "no-store"
    assert everything.json() == {"records": records}
    assert get(server, f"{base}/events?after={records[-3]['seq']}").json() == {
        "records": records[-2:]
    }
    assert get(server, f"{base}/events?after=x").status_code == 400
    body = get(server, f"{base}/http/0001-request.json")
    assert (body.status_code, body.content) == (
        200,
        (directory / "http" / "0001-request.json").read_bytes(),
    )
    (directory / "secret.txt").write_text("TOP-SECRET", encoding="utf-8")
    (directory / "http" / "0099-request.json").symlink_to(directory / "secret.txt")
    for name in (
        "..%2Fevents.jsonl",
        "..%2Fsecret.txt",
        "0001-request.json%00",
        "0001-request.jsonx",
        "1-request.json",
        "0099-request.json",
        "%2E%2E%2Fsecret.txt",
        "events.jsonl",
    ):
        response = get(server, f"{base}/http/{name}")
        assert (name, response.status_code) == (name, 404)
        assert "TOP-SECRET" not in response.text
    # A whole body by exchange number; one whose record names a file it may not is not served.
    assert (
        get(server, f"{base}/request/1").content
        == (directory / "http" / "0001-request.json").read_bytes()
    )
    assert (
        get(server, f"{base}/response/2").content
        == (directory / "http" / "0002-response.txt").read_bytes()
    )
    for path in (f"{base}/request/999", f"{base}/events/1", f"{base}/request/-1"):
        assert (path, get(server, path).status_code) == (path, 404)
    with (directory / "events.jsonl").open("a", encoding="utf-8") as f:
        bad = {
            "n": 500,
            "request_file": "http/../secret.txt",
            "response_file": "http/0099-request.json",
        }
        f.write(json.dumps({"seq": 999, "t": 1.0, "kind": "http", "data": bad}) + "\n")
    for path in (f"{base}/request/500", f"{base}/response/500"):
        response = get(server, path)
        assert (path, response.status_code) == (path, 404)
        assert "TOP-SECRET" not in response.text
    for path in (f"{base}/../secret.txt", f"{base}/http/../../secret.txt", f"{base}/secret.txt"):
        assert "TOP-SECRET" not in get(server, path).text
    assert get(server, f"{base}/viewer.js").headers["content-type"].startswith("text/javascript")


def test_live_server_stops_cleanly_on_ctrl_c(live: tuple[Server, Path]) -> None:
    server, _ = live
    assert get(server, f"/{server.token}/").status_code == 200
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(10) == 0
    assert server.proc.stderr is not None
    assert "Traceback" not in server.proc.stderr.read()


# ------------------------------------------------------------------ in the browser


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.problems = []
    pg.external = []
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" else None)
    pg.on(
        "request",
        lambda r: (
            None
            if r.url.startswith(("file://", "data:", "http://127.0.0.1"))
            else pg.external.append(r.url)
        ),
    )
    yield pg
    context.close()


def open_static(page: Any, static_page: Path) -> None:
    page.goto(static_page.as_uri())
    page.wait_for_selector("#ledger tbody tr")


def visible_seqs(page: Any) -> list[int]:
    return [
        int(s)
        for s in page.eval_on_selector_all(
            "#ledger tbody tr:not([hidden])", "rs => rs.map(r => r.dataset.seq)"
        )
    ]


def expected_search(records: list[dict[str, Any]], query: str) -> list[int]:
    """What the page's search must find: records where every word of `query` occurs in the kind,
    the agent label or any string in `data` (prompts, inputs, outputs, messages), case-insensitive."""

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)

    out = []
    for rec in records:
        text = "\n".join([rec["kind"], rec.get("agent") or "main", *strings(rec["data"])]).lower()
        if all(word in text for word in query.lower().split()):
            out.append(rec["seq"])
    return out


@pytest.mark.needs("chromium")
def test_lanes_nest_each_subagent_under_the_agent_whose_task_call_started_it(
    page: Any, static_page: Path
) -> None:
    open_static(page, static_page)
    lanes = page.eval_on_selector_all(
        "#lane-names .lane-name",
        "ls => ls.map(l => [l.textContent, l.dataset.label, Number(l.dataset.depth), l.dataset.parentAgent ?? null, l.dataset.parentTool])",
    )
    names = [lane[0].lstrip("▾▸") for lane in lanes]
    assert names == ["main", "explore: find sleeping tests", "explore: read CI history"]
    assert [lane[1:] for lane in lanes] == [
        ["", 0, None, ""],
        ["explore", 1, "", "toolu_task1"],
        ["explore", 1, "", "toolu_task2"],
    ]

    # Each subagent's requests are drawn in its own lane; collapsing main folds them into it.
    def reqs_by_lane() -> Any:
        return page.evaluate(
            """() => { const out = {}; document.querySelectorAll('#lanes .item.req').forEach(el => {
                 const lane = Math.round((parseFloat(el.style.top) - 4) / 30);
                 (out[lane] = out[lane] || []).push(Number(el.dataset.req)); }); return out; }"""
        )

    assert reqs_by_lane() == {"0": [1, 6, 7, 8, 9, 10], "1": [2, 4], "2": [3, 5]}
    page.click("#lane-names .lane-name[data-agent=''] button.tw")
    assert page.eval_on_selector_all("#lane-names .lane-name", "ls => ls.length") == 1
    assert reqs_by_lane() == {"0": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
    assert page.problems == []
    assert page.external == []


@pytest.mark.needs("chromium")
def test_ledger_lists_every_record_in_order_and_filters(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    rows = page.eval_on_selector_all(
        "#ledger tbody tr",
        "rs => rs.map(r => [Number(r.dataset.seq), r.dataset.kind, r.children[2].textContent])",
    )
    labels = {
        "": "main",
        "toolu_task1": "explore: find sleeping tests",
        "toolu_task2": "explore: read CI history",
    }
    assert rows == [[r["seq"], r["kind"], labels[r.get("parent", "")]] for r in records]
    assert page.text_content("#ledger-count") == f"{len(records)} of {len(records)}"
    page.select_option("#filter-kind", "permission")
    assert visible_seqs(page) == [r["seq"] for r in records if r["kind"] == "permission"]
    page.select_option("#filter-kind", "")
    page.select_option("#filter-agent", label="explore: read CI history")
    assert visible_seqs(page) == [r["seq"] for r in records if r.get("parent") == "toolu_task2"]
    page.select_option("#filter-agent", "")
    page.check("#filter-breaks")
    assert visible_seqs(page) == [
        r["seq"] for r in records if r["kind"] == "request" and r["req"] in (9, 10)
    ]
    page.uncheck("#filter-breaks")
    assert visible_seqs(page) == [r["seq"] for r in records]
    assert page.problems == []


@pytest.mark.needs("chromium")
def test_search_finds_prompts_tool_inputs_and_outputs(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    for query in (
        "time.sleep",
        "flaky tests",
        "FAIL TEST_NET",
        "seq 20",
        "not bold",
        "polls the port",
    ):
        page.fill("#search", query)
        found = visible_seqs(page)
        assert (query, found) == (query, expected_search(records, query))
        assert found
    kinds = {r["seq"]: r["kind"] for r in records}
    page.fill("#search", "time.sleep")
    assert {"tool_start", "tool_end", "request"} <= {kinds[s] for s in visible_seqs(page)}
    page.fill("#search", "no such words anywhere")
    assert visible_seqs(page) == []
    page.press("#search", "Escape")
    assert len(visible_seqs(page)) == len(records)


@pytest.mark.needs("chromium")
def test_keyboard_moves_through_the_visible_rows(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    page.focus("#ledger-scroll")
    for key in ("j", "j", "ArrowDown"):
        page.keyboard.press(key)
    selected = lambda: int(page.get_attribute("#ledger tr.sel", "data-seq"))  # noqa: E731
    assert selected() == 3
    page.keyboard.press("k")
    assert selected() == 2
    assert page.text_content("#inspector h2") == "turn_start #2 · main"
    page.keyboard.press("/")
    page.keyboard.type("bash")
    page.keyboard.press("Enter")
    assert selected() == expected_search(records, "bash")[0]
    page.keyboard.press("j")
    assert selected() == expected_search(records, "bash")[1]
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "inspector"
    page.keyboard.press("b")
    assert page.text_content("#inspector h2") == "Request #9 · main"


@pytest.mark.needs("chromium")
def test_prompt_diff_and_cache_break_of_a_changed_system_prompt(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    r10 = next(r for r in records if r["kind"] == "request" and r["req"] == 10)
    page.click(f"#ledger tr[data-seq='{r10['seq']}']")
    assert page.text_content("#inspector h2") == "Request #10 · main"
    diff = page.eval_on_selector_all(
        ".system-diff .diff > div", "ds => ds.map(d => [d.className, d.textContent])"
    )
    assert [d for d in diff if d[0] in ("add", "del")] == [
        ["del", "- Status: clean"],
        ["add", "+ Status: 2 files modified"],
    ]
    assert ["skip", "… 5 unchanged lines …"] in diff
    index = next(i for i, (a, b) in enumerate(zip(SYSTEM, SYSTEM_DIRTY, strict=False)) if a != b)
    line = SYSTEM[:index].count("\n") + 1
    box = page.text_content(".cbreak")
    assert "expected" not in box
    assert page.eval_on_selector_all(".cbreak .brk-reason", "ls => ls.map(l => l.textContent)") == [
        f"system prompt differs at character {index} (line {line})"
    ]
    assert "2,150 cache-write tokens that should have been reads" in box
    # New messages are highlighted, the earlier ones folded.
    assert page.eval_on_selector_all(".msg.new", "ms => ms.map(m => m.dataset.index)") == ["1", "2"]
    assert (
        page.text_content("details.earlier > summary") == "1 earlier message (sent before, folded)"
    )
    assert page.problems == []


@pytest.mark.needs("chromium")
def test_cache_breaks_are_marked_everywhere_and_the_compaction_one_expected(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    """Request 8 is the compaction call (a cache of its own: no break); 9 is the turn after it,
    whose earlier messages were dropped (expected); 10's system prompt changed (unexpected)."""
    open_static(page, static_page)
    req_seq = {r["req"]: r["seq"] for r in records if r["kind"] == "request"}
    assert page.eval_on_selector_all(
        "#ledger tr.cache-break", "rs => rs.map(r => Number(r.dataset.seq))"
    ) == [req_seq[9], req_seq[10]]
    assert page.eval_on_selector_all(
        "#ledger tr.cache-break .badge", "bs => bs.map(b => b.textContent)"
    ) == ["cache break (expected)", "cache break"]
    assert page.eval_on_selector_all(
        "#lanes .item.req.cache-break", "bs => bs.map(b => Number(b.dataset.req))"
    ) == [9, 10]
    page.click("#tabs button[data-tab=breaks]")
    rows = page.eval_on_selector_all(
        "#breaks tr.break-row", "rs => rs.map(r => [...r.children].map(c => c.textContent))"
    )
    assert rows == [
        [
            "#9",
            "main",
            "messages at message 1 of the 5 sent before (reset)",
            "1,900",
            "$0.0098",
            "expected: after a compaction",
        ],
        [
            "#10",
            "main",
            f"system prompt at character {SYSTEM.index('clean')} (line 8)",
            "2,150",
            "$0.0087",
            "",
        ],
    ]
    assert "1 unexpected cache break" in page.text_content("#summary")


@pytest.mark.needs("chromium")
def test_retried_request_shows_both_exchanges_and_their_bodies(
    page: Any, static_page: Path, trace_dir: Path
) -> None:
    open_static(page, static_page)
    page.click("#ledger tr[data-kind=request]")
    assert page.text_content("#inspector h2") == "Request #1 · main"
    heads = page.eval_on_selector_all(
        "#inspector .http > div:first-child b", "bs => bs.map(b => b.textContent)"
    )
    assert heads == ["attempt 1: POST 529", "attempt 2: POST 200"]
    overview = page.text_content("#inspector table.kv")
    assert "attempts2" in overview.replace(" ", "")
    assert "anthropic: overloaded (529), retried once" in overview
    page.click("#inspector .http >> nth=0 >> text=show response body")
    assert page.text_content("#inspector .http >> nth=0 >> .body >> nth=1 >> pre") == (
        trace_dir / "http" / "0001-response.txt"
    ).read_text(encoding="utf-8")
    page.click("#inspector .http >> nth=1 >> text=show request body")
    shown = json.loads(page.text_content("#inspector .http >> nth=1 >> .body >> nth=0 >> pre"))
    assert shown == json.loads(
        (trace_dir / "http" / "0002-request.json").read_text(encoding="utf-8")
    )
    # A tool call in the response links to its tool record.
    page.click("#inspector .response a.link >> nth=0")
    assert page.text_content("#inspector h2") == "Tool task · main"


@pytest.mark.needs("chromium")
def test_denied_permission_and_hook_on_the_tool(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    bash = next(r for r in records if r["kind"] == "tool_start" and r["data"]["name"] == "bash")
    page.click(f"#ledger tr[data-seq='{bash['seq']}']")
    text = page.text_content("#inspector table.kv")
    assert "denied by headless (once), waited 0 ms" in text
    assert "PreToolUse (exit 0)" in text
    assert page.text_content("#inspector .tool-output").startswith(
        "permission denied: bash needs approval"
    )
    assert page.eval_on_selector_all("#ledger tr .badge.deny", "bs => bs.length") == 1
    perm = next(r for r in records if r["kind"] == "permission")
    assert page.eval_on_selector_all(
        "#lanes .item.perm", "es => es.map(e => Number(e.dataset.seq))"
    ) == [perm["seq"]]
    hook = next(r for r in records if r["kind"] == "hook" and r["data"]["event"] == "PreToolUse")
    page.click(f"#ledger tr[data-seq='{hook['seq']}']")
    assert page.text_content("#inspector h2") == "Hook · PreToolUse"
    assert "targetbash" in page.text_content("#inspector table.kv").replace(" ", "")


@pytest.mark.needs("chromium")
def test_content_is_shown_as_text_never_run_as_markup(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    grep_end = next(r for r in records if r["kind"] == "tool_end" and r["data"]["name"] == "grep")
    page.click(f"#ledger tr[data-seq='{grep_end['seq']}']")
    assert HOSTILE in page.text_content("#inspector .tool-output")
    assert page.title() == "keel trace"
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert (
        page.evaluate("[...document.querySelectorAll('b')].some(b => b.textContent === 'not bold')")
        is False
    )
    assert page.problems == []
    assert page.external == []


@pytest.mark.needs("chromium")
def test_cost_attribution_by_agent_tool_and_hook(
    page: Any, static_page: Path, records: list[dict[str, Any]]
) -> None:
    open_static(page, static_page)
    page.click("#tabs button[data-tab=costs]")
    agents = page.eval_on_selector_all(
        "#cost-agents tr[data-agent]", "rs => rs.map(r => [...r.children].map(c => c.textContent))"
    )

    def cost(parent: str) -> str:
        return f"${sum(r['data']['cost'] for r in records if r['kind'] == 'response' and r.get('parent', '') == parent):.4f}"

    assert [a[0] for a in agents] == [
        "main",
        "explore: find sleeping tests",
        "explore: read CI history",
    ]
    assert [a[1] for a in agents] == ["6", "2", "2"]
    assert [a[-1] for a in agents] == [cost(""), cost("toolu_task1"), cost("toolu_task2")]
    tools = page.eval_on_selector_all(
        "#cost-tools tr[data-tool]",
        "rs => rs.map(r => [r.dataset.tool, r.children[1].textContent, r.children[2].textContent])",
    )
    assert sorted(tools) == [
        ["bash", "1", "1"],
        ["grep", "1", "0"],
        ["read", "1", "0"],
        ["task", "2", "0"],
    ]
    # the results that were re-sent most cost most: the CI history (read) and the task reports
    tokens = page.eval_on_selector_all(
        "#cost-tools tr[data-tool]",
        "rs => rs.map(r => Number(r.children[5].textContent.replace(/,/g, '')))",
    )
    assert all(t > 0 for t in tokens)
    hooks = page.eval_on_selector_all(
        "#cost-hooks tr:not(:first-child)",
        "rs => rs.map(r => [...r.children].map(c => c.textContent))",
    )
    assert hooks == [
        ["UserPromptSubmit", "./.keel/hooks/log-prompt.sh", "1", "14 ms", "0", "0", "0"],
        ["PreToolUse", "./.keel/hooks/guard.sh", "1", "31 ms", "0", "0", "0"],
    ]


@pytest.mark.needs("chromium")
def test_timeline_zooms_and_collapses_idle_time(page: Any, static_page: Path) -> None:
    open_static(page, static_page)
    width = lambda: page.evaluate("document.getElementById('lanes').offsetWidth")  # noqa: E731
    fit = width()
    assert page.eval_on_selector_all("#lanes .gap", "gs => gs.map(g => g.textContent)") == [
        "120s",
        "30s",
    ]
    page.click("#zoom-in")
    assert width() > fit * 1.4
    page.click("#zoom-fit")
    assert width() == fit
    page.uncheck("#collapse-idle")
    assert page.eval_on_selector_all("#lanes .gap", "gs => gs.length") == 0
    marks = page.eval_on_selector_all("#lanes .mark", "ms => ms.map(m => m.className)")
    assert sorted(set(marks)) == ["mark compaction", "mark notice", "mark turn"]
    # Waiting (sent -> first token) and generating are two parts of each request bar.
    w, total = page.evaluate(
        "(() => { const b = document.querySelector('#lanes .item.req[data-req=\"1\"]'); return [b.querySelector('.w').offsetWidth, b.offsetWidth]; })()"
    )
    assert 0.4 < w / total < 0.5  # ttft 2050 ms of 4560 ms


@pytest.mark.needs("chromium")
def test_screenshot_for_the_docs(
    page: Any, static_page: Path, records: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The picture in docs/traces.md; KEEL_UPDATE_SCREENSHOT=1 writes it there."""
    page.set_viewport_size({"width": 1200, "height": 720})
    open_static(page, static_page)
    r10 = next(r for r in records if r["kind"] == "request" and r["req"] == 10)
    page.click(f"#ledger tr[data-seq='{r10['seq']}']")
    page.eval_on_selector("#inspector .cbreak", "e => e.scrollIntoView()")
    out = SCREENSHOT if os.environ.get("KEEL_UPDATE_SCREENSHOT") else tmp_path / "shot.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size < 250_000
    assert SCREENSHOT.stat().st_size < 250_000


@pytest.mark.needs("chromium")
def test_live_page_follows_records_appended_while_it_is_open(
    page: Any, live: tuple[Server, Path], records: list[dict[str, Any]]
) -> None:
    server, directory = live
    page.goto(server.url)
    page.wait_for_selector(f"#ledger tr[data-seq='{records[-1]['seq']}']")
    assert "live" in page.text_content("#live-state")
    seq = records[-1]["seq"] + 1
    torn = json.dumps(
        {
            "seq": seq,
            "t": records[-1]["t"] + 1,
            "kind": "notice",
            "data": {"message": "appended while watching", "level": "info"},
        }
    )
    with (directory / "events.jsonl").open("a", encoding="utf-8") as f:
        f.write(torn[:20])  # a line still being written is not shown half
        f.flush()
        time.sleep(1.5)
        assert page.eval_on_selector_all("#ledger tbody tr", "rs => rs.length") == len(records)
        f.write(torn[20:] + "\n")
    page.wait_for_selector(f"#ledger tr[data-seq='{seq}']", timeout=10_000)
    assert (
        page.text_content(f"#ledger tr[data-seq='{seq}'] td.sum").strip()
        == "info appended while watching"
    )
    assert page.eval_on_selector_all("#ledger tbody tr", "rs => rs.length") == len(records) + 1
    # the bodies come from the server
    page.click("#ledger tr[data-kind=request]")
    page.click("#inspector .http >> nth=0 >> text=show response body")
    page.wait_for_selector("#inspector .http >> nth=0 >> .body >> nth=1 >> pre")
    assert page.text_content("#inspector .http >> nth=0 >> .body >> nth=1 >> pre") == (
        directory / "http" / "0001-response.txt"
    ).read_text(encoding="utf-8")
    # A request still streaming: open in the timeline and the inspector, then its response.
    last = records[-1]
    request = {
        "seq": seq + 1,
        "t": last["t"] + 2,
        "kind": "request",
        "req": 11,
        "data": {
            "model": "m",
            "purpose": "turn",
            "turn": 4,
            "max_tokens": 100,
            "system_hash": trace_fixture.sha(SYSTEM_DIRTY),
            "tools_hash": trace_fixture.sha(trace_fixture.TOOLS),
            "messages_total": 5,
            "reset": False,
            "messages": [trace_fixture.assistant(), trace_fixture.user("and push it")],
        },
    }
    with (directory / "events.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(request) + "\n")
    page.wait_for_selector(f"#ledger tr[data-seq='{seq + 1}']", timeout=10_000)
    assert page.eval_on_selector_all(
        "#lanes .item.req.open", "bs => bs.map(b => Number(b.dataset.req))"
    ) == [11]
    page.click(f"#ledger tr[data-seq='{seq + 1}']")
    assert "time to first tokenwaiting…" in page.text_content("#inspector table.kv").replace(
        "  ", ""
    )
    response = {
        "seq": seq + 2,
        "t": last["t"] + 3,
        "kind": "response",
        "req": 11,
        "data": {
            "message": trace_fixture.assistant(Text("Pushed.")),
            "usage": {"input": 1, "output": 2, "cache_read": 3, "cache_write": 0},
            "cost": 0.0001,
            "stop_reason": "end_turn",
            "ttft_ms": 400.0,
            "duration_ms": 900.0,
            "attempts": 1,
            "notices": [],
        },
    }
    with (directory / "events.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(response) + "\n")
    page.wait_for_selector("#inspector .response >> text=Pushed.", timeout=10_000)
    assert page.eval_on_selector_all("#lanes .item.req.open", "bs => bs.length") == 0
    assert page.problems == []
    assert page.external == []


# ------------------------------------------------------------------ a real recorded session


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trace_fixture.record_session(tmp_path_factory.mktemp("real"))


@pytest.fixture(scope="module")
def real_page(real_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real-html") / "trace.html"
    write_html(real_trace, out)
    return out


def read_records(directory: Path) -> list[dict[str, Any]]:
    lines = (directory / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.needs("chromium")
def test_a_real_session_lanes_ledger_and_search(
    page: Any, real_page: Path, real_trace: Path
) -> None:
    """The tracer's own records of `keel -p --debug` (two subagents, one label): nested lanes,
    every record in the ledger, each request in its agent's lane, search."""
    records = read_records(real_trace)
    check_html(real_page.read_text(encoding="utf-8"))
    open_static(page, real_page)
    tasks = [r for r in records if r["kind"] == "tool_start" and r["data"]["name"] == "task"]
    assert [r["data"]["input"]["description"] for r in tasks] == [
        "find sleeping tests",
        "count test files",
    ]
    lanes = page.eval_on_selector_all(
        "#lane-names .lane-name",
        "ls => ls.map(l => [l.textContent.replace(/^[▾▸]/, ''), l.dataset.label, Number(l.dataset.depth), l.dataset.parentTool])",
    )
    assert lanes == [
        ["main", "", 0, ""],
        ["explore: find sleeping tests", "explore", 1, tasks[0]["data"]["id"]],
        ["explore: count test files", "explore", 1, tasks[1]["data"]["id"]],
    ]
    lane_of = {"": 0, tasks[0]["data"]["id"]: 1, tasks[1]["data"]["id"]: 2}
    expected: dict[str, list[int]] = {}
    for r in records:
        if r["kind"] == "request":
            expected.setdefault(str(lane_of[r.get("parent", "")]), []).append(r["req"])
    drawn = page.evaluate(
        """() => { const out = {}; document.querySelectorAll('#lanes .item.req').forEach(el => {
             const lane = Math.round((parseFloat(el.style.top) - 4) / 30);
             (out[lane] = out[lane] || []).push(Number(el.dataset.req)); }); return out; }"""
    )
    assert drawn == expected
    assert len(expected["1"]) == len(expected["2"]) == 1
    rows = page.eval_on_selector_all(
        "#ledger tbody tr", "rs => rs.map(r => [Number(r.dataset.seq), r.dataset.kind])"
    )
    assert rows == [[r["seq"], r["kind"]] for r in records]
    for query in ("time.sleep", "readiness poll", "non-interactively"):
        page.fill("#search", query)
        assert (query, visible_seqs(page)) == (query, expected_search(records, query))
        assert visible_seqs(page)
    assert page.problems == []
    assert page.external == []


@pytest.mark.needs("chromium")
def test_a_real_session_retry_denial_and_cache_break(
    page: Any, real_page: Path, real_trace: Path
) -> None:

    records = read_records(real_trace)
    open_static(page, real_page)
    # The request retried after a 529: one request, two exchanges.
    page.click("#ledger tr[data-kind=request]")
    assert page.text_content("#inspector h2") == "Request #1 · main"
    heads = page.eval_on_selector_all(
        "#inspector .http > div:first-child b", "bs => bs.map(b => b.textContent)"
    )
    assert heads == ["attempt 1: POST 529", "attempt 2: POST 200"]
    # The write the headless run refused, with the hook that saw it first.
    end = next(r for r in records if r["kind"] == "tool_end" and r["data"]["name"] == "write")
    page.click(f"#ledger tr[data-seq='{end['seq']}']")
    text = page.text_content("#inspector table.kv")
    assert "denied by headless (once), waited 0 ms" in text
    assert "(it never started)" in text
    assert json.loads(page.text_content("#inspector .tool-input")) == {
        "path": "tests/test_net.py",
        "content": "def test_x():\n    wait_for_port()\n",
    }
    assert page.eval_on_selector_all("#ledger tr .badge.deny", "bs => bs.length") == 1
    # The one cache break: the compaction dropped the earlier messages (the resumed request
    # opens with the summary). The system prompt is the same across it: AGENTS.md changed, but
    # instruction files are in the context, which the compacted transcript carries. The
    # compaction call itself breaks nothing, nor does the reopened trace's reset.
    requests = {r["req"]: r for r in records if r["kind"] == "request"}
    assert requests[7]["data"]["system_hash"] == requests[5]["data"]["system_hash"]
    assert requests[7]["data"]["reset"]
    assert requests[6]["data"]["purpose"] == "compaction"
    assert page.eval_on_selector_all(
        "#ledger tr.cache-break", "rs => rs.map(r => Number(r.dataset.seq))"
    ) == [requests[7]["seq"]]
    page.click(f"#ledger tr[data-seq='{requests[7]['seq']}']")
    assert page.eval_on_selector_all(".cbreak .brk-reason", "ls => ls.map(l => l.textContent)") == [
        "messages differ at message 1 of the 5 sent before (reset)",
    ]
    write = next(r for r in records if r["kind"] == "response" and r["req"] == 7)["data"]["usage"][
        "cache_write"
    ]
    assert f"{write:,} cache-write tokens that should have been reads" in page.text_content(
        ".cbreak"
    )
    assert page.eval_on_selector_all(".system-diff", "ds => ds.length") == 0
    # A subagent's report carrying </script> and <!-- is text in the page.
    report = next(
        r
        for r in records
        if r["kind"] == "tool_end"
        and r["data"]["name"] == "task"
        and HOSTILE in r["data"]["output"]
    )
    page.click(f"#ledger tr[data-seq='{report['seq']}']")
    assert HOSTILE in page.text_content("#inspector .tool-output")
    assert page.title() == "keel trace"
    assert page.problems == []


def test_bodies_stored_as_tails_are_put_together(real_trace: Path, tmp_path: Path) -> None:
    """The tracer stores a request body that repeats the one before it as its tail
    (`request_delta`); the page gets each whole body, equal to keel's own reassembly (which a
    trace test compares with what the server received)."""
    import keel.trace

    records = read_records(real_trace)
    assert any("request_delta" in r["data"] for r in records if r["kind"] == "http")
    out = tmp_path / "p.html"
    write_html(real_trace, out)
    parser = check_html(out.read_text(encoding="utf-8"))
    embedded = json.loads(next(b for a, b in parser.scripts if a.get("id") == "trace-data"))
    bodies = embedded["bodies"]

    def page_body(name: str) -> str:
        """What the page does: a tail entry is its base's first `keep` UTF-16 units + `tail`."""
        b = bodies[name]
        if "text" in b:
            return str(b["text"])
        base = page_body(f"request/{b['base']}").encode("utf-16-le")[: 2 * b["keep"]]
        return base.decode("utf-16-le") + str(b["tail"])

    whole = keel.trace.http_bodies(real_trace, records)
    assert {n: page_body(f"request/{n}").encode() for n in whole} == whole
    tails = [name for name, b in bodies.items() if "tail" in b]
    assert tails  # stored as what they add, as in the trace
    assert (
        sum(len(bodies[t]["tail"]) for t in tails)
        < sum(len(whole[int(t.split("/")[1])]) for t in tails) / 2
    )


@pytest.mark.needs("chromium")
def test_a_body_stored_as_a_tail_is_shown_whole(
    page: Any, real_page: Path, real_trace: Path
) -> None:
    import keel.trace

    records = read_records(real_trace)
    whole = keel.trace.http_bodies(real_trace, records)
    http = next(r for r in records if r["kind"] == "http" and "request_delta" in r["data"])
    open_static(page, real_page)
    page.click(f"#ledger tr[data-seq='{http['seq']}']")
    exchanges = [r for r in records if r["kind"] == "http" and r.get("req") == http["req"]]
    index = exchanges.index(http)
    page.click(f"#inspector .http >> nth={index} >> text=show request body")
    shown = page.text_content(f"#inspector .http >> nth={index} >> .body >> nth=0 >> pre")
    assert json.loads(shown) == json.loads(whole[http["data"]["n"]])


@pytest.mark.needs("chromium")
def test_a_subagent_of_a_subagent_nests_two_deep(page: Any, tmp_path: Path) -> None:
    """main → task → explore, whose own task call starts a general agent: three lanes, each
    under the lane whose task call started it; folding explore folds the grandchild into it."""
    tr = trace_fixture.Trace(tmp_path / "n.trace")
    tr.directory.mkdir()
    tr.add("turn_start", {"prompt": "go", "sent": "go", "resumed": False})
    r1 = tr.request([trace_fixture.user("go")])
    tr.response(
        r1,
        trace_fixture.assistant(),
        usage=(1, 1, 0, 0),
        cost=0.0,
        ttft_ms=100.0,
        duration_ms=200.0,
    )
    tr.add(
        "tool_start",
        {"id": "toolu_a", "name": "task", "input": {"description": "outer", "prompt": "p"}},
    )
    tr.request([trace_fixture.user("p")], agent="explore", parent="toolu_a")
    tr.add(
        "tool_start",
        {"id": "toolu_b", "name": "task", "input": {"description": "inner", "prompt": "q"}},
        agent="explore",
        parent="toolu_a",
    )
    tr.request([trace_fixture.user("q")], agent="general", parent="toolu_b")
    with (tr.directory / "events.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in tr.records)
    out = tmp_path / "n.html"
    write_html(tr.directory, out)
    open_static(page, out)
    lanes = lambda: page.eval_on_selector_all(  # noqa: E731
        "#lane-names .lane-name",
        "ls => ls.map(l => [l.textContent.replace(/^[▾▸]/, ''), Number(l.dataset.depth), l.dataset.parentAgent ?? null])",
    )
    outer = "explore\u2009@toolu_a"
    assert lanes() == [["main", 0, None], ["explore: outer", 1, ""], ["general: inner", 2, outer]]
    page.click("#lane-names .lane-name[data-depth='1'] button.tw")
    assert lanes() == [["main", 0, None], ["explore: outer", 1, ""]]
    assert page.eval_on_selector_all(
        "#lanes .item.req", "bs => bs.map(b => parseFloat(b.style.top))"
    ) == [4, 34, 34]
    assert page.problems == []


def test_the_browser_is_opened_only_when_asked_and_on_the_printed_url(
    trace_dir: Path, tmp_path: Path
) -> None:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf %s "$1" >> {opened}\n', encoding="utf-8")
    browser.chmod(0o755)
    for open_browser in (False, True):
        code = (
            "import sys; from pathlib import Path; from keel.trace.viewer import serve; "
            f"serve(Path(sys.argv[1]), open_browser={open_browser}, port=0)"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(trace_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "BROWSER": str(browser)},
        )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready
        url = re.search(r"(http://\S+)", proc.stdout.readline())
        assert url is not None
        deadline = time.monotonic() + 10
        while open_browser and not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()
        assert (open_browser, opened.read_text(encoding="utf-8") if opened.exists() else None) == (
            open_browser,
            url[1] if open_browser else None,
        )
