# test_count.txt holds 4, and the tests were really run (a bash call that ran unittest or pytest).
test -f test_count.txt || { echo "no test_count.txt"; exit 1; }
test "$(tr -d ' \t\r\n' < test_count.txt)" = "4" || { echo "test_count.txt is not 4: $(head -c 80 test_count.txt)"; exit 1; }
if [ -n "${KEEL_BENCH_CALLS:-}" ]; then
  grep -q 'unittest\|pytest' "$KEEL_BENCH_CALLS" || { echo "the tests were never run"; exit 1; }
fi
