"""The structure a reader sees is the one the code keeps: the layers of docs/layout.md are
folders, no import runs upward and none in a circle, and the torch-free parts are free of
torch.

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

# The layers are folders: a module's layer is the first folder it lies in under edge/ (the
# repository's exporters/ and runtimes/ are edge.exporters and edge.runtimes); edge/__init__.py
# is the core's face. What each layer may import besides itself, lowest first:
MAY_IMPORT = {
    # package format, manifest, sampler and schedulers, options, noise, budget, tokenizer,
    # files, video, serving: plain NumPy, no torch
    "core": set(),
    # blocks and their chunking, the FamilyModel contract, traced attention and feed-forwards
    "graph": {"core"},
    # the dry run's plan: partition, residency, activation memory, compute cost
    "planning": {"core", "graph"},
    # PyTorch networks tiny-sora is built of (the families' own live in their folders)
    "models": {"core", "graph"},
    # the families that read a folder and cut its networks into blocks
    "families": {"core", "graph", "models"},
    # the runtimes know packages only; the exporters check what they write by running it
    "runtimes": {"core"},
    "exporters": {"core", "graph", "planning", "runtimes"},
    # evaluation runs packages (runtimes) and the reference (models)
    "eval": {"core", "models", "runtimes"},
    # training fits the models, the attribute classifier of eval among them
    "train": {"core", "models", "eval"},
    "commands": {"core", "graph", "planning", "models", "families", "runtimes", "exporters",
                 "eval", "train"},
}


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
    """The layer folder `module` lies in; a module loose in edge/ has none."""
    if module == "edge":
        return "core"
    folder = module.split(".")[1]
    if folder not in MAY_IMPORT:
        raise AssertionError(f"{module} lies in no layer folder: move it into one of edge/"
                             f"{{{','.join(MAY_IMPORT)}}}/ (tests/test_layers.py MAY_IMPORT)")
    return folder


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
    core = {m for m in module_files() if layer_of(m) == "core"}
    modules = sorted(core | {"edge.runtimes.python", "edge.runtimes.python.bench",
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


def test_pyproject_installs_every_folder_of_the_namespace():
    """A folder of modules that pyproject's package list leaves out imports from a checkout
    but is missing from an install: every folder holding a module is listed."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    folders = {name if path.name == "__init__.py" else name.rpartition(".")[0]
               for name, path in module_files().items()}
    assert not folders - listed, (f"{sorted(folders - listed)}: add them to pyproject.toml's "
                                  "[tool.setuptools] packages")


def test_a_target_folder_imports_no_other_target(graph):
    """exporters/: each target's folder (onnx/, iphone/, web/) builds on shared/ and the
    registry (exporters/__init__.py), never on another target's modules, and shared/ on no
    target: what two targets both need lives in shared/."""
    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["edge", "exporters"] else None

    crossing = []
    for module, imports in graph.items():
        mine = folder(module)
        for target in imports:
            theirs = folder(target)
            if mine and theirs and theirs != mine and theirs != "shared":
                crossing.append(f"{module} imports {target}")
    assert not crossing, "exporters importing across target folders:\n" + "\n".join(crossing)


def test_every_target_writes_its_package_through_the_one_writer(graph):
    """The package folder, its manifest and the component/block loop are written by
    exporters/shared/package_writer.py alone: a target hands it its blocks (PackageParts)
    and opens no package folder of its own, so every target's packages are made alike."""
    writer = "edge.exporters.shared.package_writer"
    opening = sorted(name for name, path in module_files().items()
                     if name.startswith("edge.exporters.") and name != writer
                     and ("atomic_directory(" in path.read_text()
                          or "write_manifest(" in path.read_text()))
    assert not opening, f"targets writing a package themselves: {opening}"
    packaging = {"edge.exporters.onnx.package", "edge.exporters.iphone.coreml.package",
                 "edge.exporters.iphone.coreai.layout", "edge.exporters.web.package"}
    assert all(writer in graph[name] for name in packaging)
