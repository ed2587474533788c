"""Benchmark: the trace viewer on long real traces (the tracer's own records of a session that
reads one file per turn against the loopback Anthropic server, as in bench_trace.py).

- `write_html`: seconds and page bytes at 100 and 300 turns (request bodies go in as what they
  add to the one before, as the trace stores them, so the page grows linearly);
- in chromium (when it starts): seconds to load the page and draw everything, a search over all
  records, opening the last request in the inspector (its prompt rebuilt from the deltas and
  diffed), and one zoom step.

Run: `python bench/bench_trace_viewer.py [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_trace import session, size
from keel.trace.viewer import read_records, write_html


def browser_timings(page_path: Path, records: list[dict[str, Any]]) -> dict[str, float]:
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(
                executable_path=shutil.which("chromium"), args=["--no-sandbox"]
            )
        except Error as err:
            print(f"chromium cannot start: {str(err).splitlines()[0]}")
            return {}
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        start = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_selector(f"#ledger tr[data-seq='{records[-1]['seq']}']")
        page.wait_for_selector("#lanes .item.req")
        load = time.perf_counter() - start
        start = time.perf_counter()
        page.fill("#search", "file7.txt")
        page.eval_on_selector_all("#ledger tbody tr:not([hidden])", "rs => rs.length")
        search = time.perf_counter() - start
        page.fill("#search", "")
        last = [r for r in records if r["kind"] == "request"][-1]
        start = time.perf_counter()
        page.click(f"#ledger tr[data-seq='{last['seq']}']")
        page.wait_for_selector("#inspector details.earlier")
        inspect = time.perf_counter() - start
        start = time.perf_counter()
        page.click("#zoom-in")
        zoom = time.perf_counter() - start
        browser.close()
    return {"load_s": load, "search_s": search, "inspect_last_s": inspect, "zoom_s": zoom}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        for i in range(10):
            (project / f"file{i}.txt").write_text(
                "".join(f"line {n} of file {i}\n" for n in range(40)), encoding="utf-8"
            )
        for turns in (100, 300):
            folder = Path(tmp) / f"s{turns}.trace"
            asyncio.run(session(project, turns, folder))
            records = read_records(folder)
            out = Path(tmp) / f"s{turns}.html"
            start = time.perf_counter()
            write_html(folder, out)
            results[f"records_{turns}"] = len(records)
            results[f"trace_bytes_{turns}"] = size(folder)
            results[f"write_html_s_{turns}"] = round(time.perf_counter() - start, 3)
            results[f"page_bytes_{turns}"] = out.stat().st_size
            for key, value in browser_timings(out, records).items():
                results[f"{key}_{turns}"] = round(value, 3)
    for key, value in results.items():
        print(f"{key:<24} {value:>12,}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
