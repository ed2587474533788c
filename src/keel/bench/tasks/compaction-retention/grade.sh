set -e
python3 -I - "$TASK_DIR/answers.json" <<'PY'
import json, sys, os
want = json.load(open(sys.argv[1], encoding="utf-8"))
got_errors = json.load(open("errors.json", encoding="utf-8"))
assert got_errors == want["errors"], f"errors.json: {got_errors} != {want['errors']}"
got = json.load(open("facts.json", encoding="utf-8"))
wrong = [k for k in want["facts"] if got.get(k) != want["facts"][k]]
assert not wrong and set(got) == set(want["facts"]), f"facts wrong or missing: {wrong or sorted(got)}"
session = os.environ.get("KEEL_BENCH_SESSION", "")
types = [json.loads(line).get("type") for line in open(session, encoding="utf-8")] if session else []
assert "compaction" in types, "the context was never compacted, so the task proved nothing"
PY
