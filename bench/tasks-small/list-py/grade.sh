# py_files.txt names exactly the .py files of the top directory, sorted (a "./" prefix and
# trailing spaces are tolerated).
test -f py_files.txt || { echo "no py_files.txt"; exit 1; }
got=$(sed -e 's#^\./##' -e 's/[[:space:]]*$//' py_files.txt | grep -v '^$')
want=$(printf 'app.py\ntest_app.py\nutil.py')
test "$got" = "$want" || { echo "py_files.txt: $(printf '%s' "$got" | tr '\n' ' ')"; exit 1; }
