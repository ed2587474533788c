set -e
cp "$TASK_DIR/hidden/test_hidden.py" "$GRADE_DIR/"
grep -q 'self.assertEqual(page(list(range(10)), 1, 3), \[0, 1, 2\])' test_pager.py
python3 -m unittest -q test_pager
PYTHONPATH="$PWD:$GRADE_DIR" python3 -m unittest -q test_hidden
