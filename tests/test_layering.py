"""The folder tree is the data flow: math_grader < infra < data_prep < train components < train loops <
evals < analysis < orchestration (sweeps, pipelines, jobs, ranks, the Ray bootstrap) < bench; a
`__main__` module is an entry point above them all, imported by nothing. No module imports one of a
higher layer, no import cycle (function-level imports count too), the algorithms import nothing from
train but each other, only infra/checkpoint/ spells the checkpoint layout, and the evals and the analysis
take shared infrastructure (judge client, tracking, checkpoint layout, model resolution, grading) from
infra/ and math_grader/, never from train/: they import from train only what TRAIN_USED_ABOVE names.

`python -m tests.test_layering [ROOT]` prints the cycles and upward imports of another checkout (the
figures of the issue-13 note were taken so on main before the change).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("math_grader", "infra", "data_prep", "train", "evals", "analysis", "orchestration", "bench")
LAYERS = {
    "math_grader": 0,
    "infra": 1,  # judge client, tracking conventions, checkpoint layout, model resolution, redaction
    "data_prep": 2,
    "train": 3,  # components: rollout, rewards, algorithms, policy, checkpoint writer, config, ...
    **{
        f"train.{m}": 4  # the loops and what starts them
        for m in ("loop", "stages", "help", "trainer", "run_setup")
    },
    "evals": 5,
    "analysis": 6,
    "orchestration": 7,  # what starts and watches runs: imports train/ and evals/, imported by neither
    "bench": 8,
}
ENTRY_POINT_LAYER = 9  # `python -m X` runs X/__main__.py: it may delegate upward (train -> orchestration)
# What the evals and the analysis may import from train: training's own parts they run or read, never
# infrastructure both sides use (that lives in infra/ or math_grader/).
TRAIN_USED_ABOVE = {
    "evals": (
        "train.rollout",  # the rollout engine generates the eval samples (one vLLM engine wrapper)
        "train.diversity.partition",  # the novelty eval measures with the training reward's partitioner
        "train.env",  # evals.math --tools answers with the training rollout's tools and agent loop
        "train.config",  # ... and checks its env.* with the training schema (one validation, issue 51)
    ),
    "analysis": (
        "train.config",  # the arms of a sweep are read from their experiment file
        "train.env.tool_format",  # the viewer tells a trajectory's turns apart with the agent loop's parser
    ),
}
LAYOUT_LITERALS = ("meta.json", "trainer_state.pt")


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        return [prefix] + [f"{prefix}.{a.name}" for a in node.names]
    return []


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file (a package: its __init__)."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            for name in _imported(node, module, path.name == "__init__.py"):
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    deps.add(name)
        graph[module] = deps
    return graph


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "__main__":
        return ENTRY_POINT_LAYER
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise KeyError(module)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, d) for m, deps in graph.items() for d in deps if layer(d) > layer(m))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), ignoring package __init__
    edges to their own submodules (a package re-exporting its parts is not a cycle)."""
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_import_from_a_lower_layer_to_a_higher_one():
    assert upward_imports(import_graph()) == []


def test_nothing_imports_an_entry_point():
    graph = import_graph()
    importers = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if d.endswith("__main__"))
    assert not importers, importers


def test_train_and_evals_never_import_orchestration():
    """The layer above the algorithm: sweeps, pipelines, jobs and executors' callers live there, never below."""
    graph = import_graph()
    below = [f"{m} -> {d}" for m, deps in graph.items() if layer(m) < LAYERS["orchestration"]
             for d in deps if d.split(".")[0] == "orchestration"]  # fmt: skip
    assert not below, below
    assert any(
        d.startswith("train") for d in graph["orchestration.sweep"]
    )  # the scan sees the layer's imports


def test_algorithms_are_pure_functions_importing_no_other_part_of_train():
    graph = import_graph()
    for module, deps in graph.items():
        if module.startswith("train.algorithms"):
            outside = {d for d in deps if d.startswith("train") and not d.startswith("train.algorithms")}
            assert not outside, f"{module} imports {outside}"


def train_imports_above(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> train module` for each import of train by the evals or the analysis that
    TRAIN_USED_ABOVE does not name."""
    out = []
    for module, deps in sorted(graph.items()):
        allowed = TRAIN_USED_ABOVE.get(module.split(".")[0])
        if allowed is None:
            continue
        for d in sorted(deps):
            if d.split(".")[0] == "train" and not any(d == a or d.startswith(a + ".") for a in allowed):
                out.append(f"{module} -> {d}")
    return out


def test_evals_and_analysis_take_shared_infrastructure_from_infra_not_train():
    wrong = train_imports_above(import_graph())
    assert not wrong, (
        "shared infrastructure imported from train/ (judge client, tracking and checkpoint layout live in "
        "infra/, pass@k and the format x answer classes in math_grader/; or name the module in "
        "TRAIN_USED_ABOVE with why):\n  " + "\n  ".join(wrong)
    )


def test_only_infra_checkpoint_spells_the_checkpoint_layout():
    """The format has one owner, infra/checkpoint/ (its layout module names it, its package says it)."""
    offenders = []
    for module, path in modules(ROOT).items():
        if module in ("infra.checkpoint.layout", "infra.checkpoint"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if text == "hf" or any(lit in text for lit in LAYOUT_LITERALS) or "step_{" in text:
                    offenders.append(f"{module}:{node.lineno}: {text[:60]!r}")
            if isinstance(node, ast.JoinedStr):  # f"step_{step:06d}"
                head = [v.value for v in node.values if isinstance(v, ast.Constant)]
                if any(str(h).endswith("step_") for h in head):
                    offenders.append(f"{module}:{node.lineno}: an f-string naming a step folder")
    assert not offenders, "\n".join(offenders)


def test_the_analysis_sees_a_cycle_and_an_upward_import():
    """The checks can fail: a made-up graph with both defects."""
    graph = {"data_prep.a": {"train.b"}, "train.b": {"data_prep.a"}, "train.loop": set()}
    assert cycles(graph) == [["data_prep.a", "train.b"]]
    assert upward_imports(graph) == [("data_prep.a", "train.b")]
    assert upward_imports({"infra.a": {"data_prep.b"}}) == [("infra.a", "data_prep.b")]


def test_the_analysis_sees_an_eval_reaching_into_train_for_infrastructure():
    graph = {"evals.x": {"train.tracking", "train.rollout.vllm_engine"}, "analysis.y": {"train.config"}}
    assert train_imports_above(graph) == ["evals.x -> train.tracking"]


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    g = import_graph(where)
    print(f"{where}: {len(g)} modules")
    print(f"cycles ({len(cycles(g))}):", *cycles(g), sep="\n  ")
    ups = upward_imports(g)
    print(f"upward imports ({len(ups)}):", *(f"{a} -> {b}" for a, b in ups), sep="\n  ")
    above = train_imports_above(g)
    print(f"train imports of evals/analysis outside TRAIN_USED_ABOVE ({len(above)}):", *above, sep="\n  ")
