set -e
test -x backup.sh || { echo "backup.sh is not executable"; exit 1; }
fresh="$GRADE_DIR/fresh"
cp -r "$TASK_DIR/tree" "$fresh"
cp backup.sh "$fresh/"
cd "$fresh"
out="$(./backup.sh)"
test "$out" = "backed up 2 files" || { echo "printed: $out"; exit 1; }
test "$(ls backup | sort | tr '\n' '|')" = "log level.conf.bak|web.conf.bak|" || { ls backup; exit 1; }
cmp "backup/log level.conf.bak" "etc/log level.conf"
printf 'more=1\n' > etc/extra.conf
test "$(./backup.sh)" = "backed up 3 files"
