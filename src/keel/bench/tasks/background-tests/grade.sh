set -e
test "$(python3 greeting.py)" = "Hello, world!" || { echo "greeting.py prints: $(python3 greeting.py)"; exit 1; }
test "$(cat test-summary.txt)" = "suite finished: 3 checks, 0 failures" || { echo "test-summary.txt: $(cat test-summary.txt)"; exit 1; }
python3 -I - <<'PY'
import json, os
calls = [json.loads(l) for l in open(os.environ["KEEL_BENCH_CALLS"], encoding="utf-8")]
bg = [c for c in calls if c["name"] == "bash" and c["input"].get("run_in_background") and "run_tests" in c["input"].get("command", "")]
assert bg, "the suite was not started in the background"
first_bg = calls.index(bg[0])
edits = [i for i, c in enumerate(calls) if c["name"] in ("edit", "write", "multi_edit") and "greeting" in json.dumps(c["input"])]
assert edits and edits[0] > first_bg, "greeting.py was not fixed while the suite ran"
PY
