set -e
cmp -s test.js "$TASK_DIR/tree/test.js" || { echo "test.js was changed"; exit 1; }
node "$TASK_DIR/hidden-test.js"
