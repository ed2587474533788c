# answer.txt holds the number 7 (surrounding whitespace allowed), and config.py is unchanged.
test -f answer.txt || { echo "no answer.txt"; exit 1; }
test "$(tr -d ' \t\r\n' < answer.txt)" = "7" || { echo "answer.txt is not 7: $(head -c 80 answer.txt)"; exit 1; }
cmp -s config.py "$TASK_DIR/tree/config.py" || { echo "config.py was changed"; exit 1; }
