set -e
# The hidden tests run on a copy of users.py alone, so nothing else the agent left in the work
# directory (a stand-in unittest.py, say) is on the path.
cp "$TASK_DIR/hidden/test_users.py" users.py "$GRADE_DIR/"
cd "$GRADE_DIR"
python3 -E -s -m unittest -q test_users
