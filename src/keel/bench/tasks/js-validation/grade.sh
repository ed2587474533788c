node "$TASK_DIR/hidden-test.js"
