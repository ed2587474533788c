# reverse_words passes the hidden tests, test_textutil.py tests it, and the visible tests pass
# (all on copies in $GRADE_DIR, so nothing else the agent left is on the path).
grep -q 'reverse_words' test_textutil.py || { echo "test_textutil.py does not test reverse_words"; exit 1; }
cp textutil.py test_textutil.py "$TASK_DIR/hidden/test_hidden.py" "$GRADE_DIR/" || exit 1
cd "$GRADE_DIR" || exit 1
python3 -E -s -m unittest -q test_textutil test_hidden 2>&1 | tail -3
test "${PIPESTATUS[0]}" = 0
