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
records = [json.loads(line) for line in open(session, encoding="utf-8")] if session else []
compactions = [r for r in records if r.get("type") == "compaction"]
assert compactions, "the context was never compacted, so the task proved nothing"
facts = set(want["facts"].values())
for c in compactions:
    # Every pinned fact is in the conversation that followed, and keel checked each one.
    text = " ".join(c["summary"].split()).casefold()
    absent = [k for k, f in want["facts"].items() if " ".join(f.split()).casefold() not in text]
    assert not absent, f"pinned facts lost in the compaction: {', '.join(absent)}"
    checked = set(c.get("kept", [])) | set(c.get("missing_first", []))
    assert facts <= checked, f"pinned facts not checked: {sorted(facts - checked)}"
PY
