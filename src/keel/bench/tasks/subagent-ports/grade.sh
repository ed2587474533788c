set -e
python3 -I - <<'PY'
import json, os
got = json.load(open("ports.json", encoding="utf-8"))
want = {"auth": 7001, "billing": 7002, "catalog": 7110, "search": 7200, "mailer": 7301, "gateway": 8080}
assert got == want, f"ports.json: {got}"
calls = [json.loads(l) for l in open(os.environ["KEEL_BENCH_CALLS"], encoding="utf-8")]
assert any(c["name"] == "task" and not c["agent"] for c in calls), "no subagent was started"
assert any(c["agent"] for c in calls), "the subagent made no tool calls"
PY
