"""The structure a reader sees is the one the code keeps: the layers of docs/design.md, with
no import running upward and none in a circle, and the torch-free parts free of torch.

Imports are read from the source (every `import`, also those inside functions: a lazy import
is still a dependency), over the installed namespace: exporters/ is edge.exporters,
runtimes/ is edge.runtimes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# where each part of the edge namespace lives in the repository (pyproject's package-dir)
ROOTS = {"edge": REPO / "edge", "edge.exporters": REPO / "exporters",
         "edge.runtimes": REPO / "runtimes"}

# The layers, lowest first; a module may import its own layer and those below it.
# core: package format, manifest, sampler and schedulers, options, presets, noise, budget,
# tokenizer, files, video, serving: plain NumPy, no torch.
CORE = {"edge", "edge.budget", "edge.bundle", "edge.console", "edge.files",
        "edge.manifest_schema", "edge.noise", "edge.options", "edge.package", "edge.pieces",
        "edge.presets",
        "edge.sampler", "edge.schedulers", "edge.serve", "edge.tiles", "edge.tokenizer",
        "edge.video", "edge.video_metrics"}
LAYERS = [
    ("core", lambda m: m in CORE),
    # PyTorch models, their blocks and the families that cut them; the export planner
    ("models", lambda m: m.startswith(("edge.models", "edge.families"))
     or m in {"edge.attention", "edge.feed_forward", "edge.token_chunks", "edge.blocks",
              "edge.family_model", "edge.lazy_weights", "edge.reference_device",
              "edge.shapes_only", "edge.activation_memory", "edge.compute_cost",
              "edge.partition", "edge.plan", "edge.data"}),
    # the runtimes know packages only; the exporters check what they write by running it
    ("runtimes", lambda m: m.startswith("edge.runtimes")),
    ("exporters", lambda m: m.startswith("edge.exporters")),
    # evaluation runs packages (runtimes) and the reference (models)
    ("eval", lambda m: m.startswith("edge.eval")),
    # training fits the models, the attribute classifier of eval among them
    ("train", lambda m: m.startswith("edge.train")),
    ("commands", lambda m: m.startswith("edge.commands")),
]
# what each layer may import besides itself
MAY_IMPORT = {"core": set(), "models": {"core"}, "runtimes": {"core"},
              "exporters": {"core", "models", "runtimes"},
              "eval": {"core", "models", "runtimes"}, "train": {"core", "models", "eval"},
              "commands": {"core", "models", "runtimes", "exporters", "eval", "train"}}


def module_files() -> dict[str, Path]:
    """Every module of the edge namespace -> its file."""
    out = {}
    for prefix, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([prefix, *parts])
            if prefix == "edge" and name.startswith(("edge.exporters", "edge.runtimes")):
                continue  # no such folders under edge/, but stay exact
            out[name] = path
    return out


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The edge modules `name` imports anywhere in its file."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # `from edge.commands import common` names a module; `from edge.x import f` not
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # import edge.a.b -> the module edge.a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> str:
    for layer, holds in LAYERS:
        if holds(module):
            return layer
    raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py's LAYERS")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_no_import_runs_upward(graph):
    upward = []
    for module, imports in graph.items():
        mine = layer_of(module)
        for target in imports:
            theirs = layer_of(target)
            if theirs != mine and theirs not in MAY_IMPORT[mine] and target != "edge":
                upward.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not upward, "imports across layers the design forbids:\n" + "\n".join(upward)


def test_no_import_cycle(graph):
    """No two modules import each other, directly or around a loop (a package importing its
    own modules from its __init__ is how it hands names on, not a loop)."""
    def edges(module):
        return {t for t in graph[module] if not (module.startswith(t + ".") or
                                                 t.startswith(module + "."))}

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "modules importing each other in a circle: " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_exporters_and_runtimes_know_no_family(graph):
    for module, imports in graph.items():
        if layer_of(module) in ("runtimes", "exporters"):
            named = sorted(t for t in imports if t.startswith(("edge.families", "edge.models")))
            assert not named, f"{module} imports {named}: the manifest and FamilyModel carry " \
                              "what a target or runtime needs"


def test_the_core_the_runtime_and_the_commands_import_without_torch():
    """With torch (and diffusers, TVM, coremltools) made unimportable, the core, the Python
    runtime and the command line still import: the base install runs packages."""
    modules = sorted(CORE | {"edge.runtimes.python", "edge.runtimes.python.bench",
                             "edge.commands"})
    code = ("import sys\n"
            "for blocked in ('torch', 'diffusers', 'transformers', 'tvm', 'coremltools'):\n"
            "    sys.modules[blocked] = None\n"
            f"for m in {modules!r}:\n"
            "    __import__(m)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
