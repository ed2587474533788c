set -e
test "$(cat UNDOCUMENTED.txt)" = squeeze || { echo "UNDOCUMENTED.txt does not name squeeze"; exit 1; }
python3 -I - "$TASK_DIR/original.py" <<'PY'
import ast, sys
def shape(path, strip):
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = {}
    for f in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        doc = ast.get_docstring(f)
        body = f.body[1:] if doc is not None and strip else f.body
        out[f.name] = (doc, ast.dump(ast.Module(body=body, type_ignores=[])))
    return out
before, after = shape(sys.argv[1], True), shape("textkit.py", True)
assert before.keys() == after.keys(), f"functions changed: {sorted(after)}"
for name, (doc, code) in after.items():
    assert doc and len(doc.split()) >= 3, f"{name} has no real docstring"
    assert code == before[name][1], f"the code of {name} changed"
    if name != "squeeze":
        assert doc == before[name][0], f"the docstring of {name} changed"
PY
