set -e
grep -q 'self.assertEqual(page(list(range(10)), 1, 3), \[0, 1, 2\])' test_pager.py
python3 -m unittest -q test_pager
# The hidden tests run on a copy of the module alone, so nothing else the agent left in the work
# directory (a stand-in unittest.py, say) is on the path.
cp "$TASK_DIR/hidden/test_hidden.py" pager.py "$GRADE_DIR/"
cd "$GRADE_DIR"
python3 -E -s -m unittest -q test_hidden
