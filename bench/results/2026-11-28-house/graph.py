import sys, importlib.util
from pathlib import Path
root = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location("tl", root / "tests/test_layering.py"); tl = importlib.util.module_from_spec(spec)
sys.path.insert(0, str(root)); spec.loader.exec_module(tl)
g = tl.import_graph(root)
edges = sum(len(v) for v in g.values())
print(f"{root}: modules {len(g)}, import arrows {edges}, upward (per its own layer map) {len(tl.upward_imports(g))}, cycles {len(tl.cycles(g))}")
# conceptual upward: anything in train/ or evals/ importing orchestration-type modules
orch = ("train.sweep","train.pipeline","train.launch","train.ray_cluster","orchestration")
bad = sorted(f"{m} -> {d}" for m,deps in g.items() for d in deps if d.startswith(orch) and not m.startswith(orch) and not m.startswith(("bench","tests")) and not m.endswith("__main__"))
print("train/evals/analysis modules importing orchestration (sweep/pipeline/launch/ray_cluster):", len(bad)); [print("  ", b) for b in bad]
print("TRAIN_USED_ABOVE:", tl.TRAIN_USED_ABOVE)
