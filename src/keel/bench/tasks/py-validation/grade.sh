set -e
cp "$TASK_DIR/hidden/test_users.py" "$GRADE_DIR/"
PYTHONPATH="$PWD:$GRADE_DIR" python3 -m unittest -q test_users
