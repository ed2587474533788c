# The test file is unchanged, and the visible and hidden tests pass on a copy of calc.py.
cmp -s test_calc.py "$TASK_DIR/tree/test_calc.py" || { echo "test_calc.py was changed"; exit 1; }
cp calc.py test_calc.py "$TASK_DIR/hidden/test_hidden.py" "$GRADE_DIR/" || exit 1
cd "$GRADE_DIR" || exit 1
python3 -E -s -m unittest -q test_calc test_hidden 2>&1 | tail -3
test "${PIPESTATUS[0]}" = 0
