"""Function lengths over the project's packages (def line to last line)."""
import ast, sys
from pathlib import Path
root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
pk = ("math_grader","infra","data_prep","train","evals","analysis","bench","orchestration","tests")
rows = []
for p in pk:
    for f in sorted((root/p).rglob("*.py")) if (root/p).exists() else []:
        if p == "tests" and "--tests" not in sys.argv: continue
        t = ast.parse(f.read_text())
        for n in ast.walk(t):
            if isinstance(n,(ast.FunctionDef,ast.AsyncFunctionDef)):
                rows.append((n.end_lineno-n.lineno+1, f"{f.relative_to(root)}:{n.lineno} {n.name}"))
rows.sort(reverse=True)
print("functions", len(rows), ">40", sum(r[0]>40 for r in rows), ">80", sum(r[0]>80 for r in rows))
for r in rows[:int(sys.argv[2]) if len(sys.argv)>2 else 30]: print(*r)
