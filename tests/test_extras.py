"""Installs: the base install is the Python runtime without torch, each target and command
beyond it names the extra it needs in one line, and nothing installs outside `edge`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from edge import DISTRIBUTION
from edge.commands.extras import EXTRA_OF_MODULE

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# "error: edge export needs torch, onnx, apache-tvm, which the [web] extra installs: pip
# install "edge-video[web]" (...)[; or <a lighter choice>, which needs [export] alone]"
ONE_LINE = re.compile(r'^error: edge [a-z -]+ needs (.+), which the \[(\w+)\] extra installs: '
                      r'pip install "edge-video\[\w+\]".*$')


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_extras_table_names_what_pyproject_installs():
    extras = PYPROJECT["project"]["optional-dependencies"]
    base = requirement_names(PYPROJECT["project"]["dependencies"])
    assert not base & {"torch", "diffusers", "transformers", "apache-tvm", "coremltools"}
    assert {"numpy", "onnxruntime"} <= base
    for module, (distribution, extra) in EXTRA_OF_MODULE.items():
        assert distribution in requirement_names(extras[extra]), (module, extra)
    # the test extra installs every other one
    for extra in ("export", "iphone", "web", "ray"):
        assert any(r.startswith(f"{DISTRIBUTION}[") and extra in r for r in extras["test"]), extra


def test_the_distribution_is_named_as_the_one_line_answers_name_it():
    """pyproject installs what the answers tell users to install (`edge` on the package index
    is another project: edge/__init__.py); the import name stays edge."""
    assert PYPROJECT["project"]["name"] == DISTRIBUTION != "edge"
    assert PYPROJECT["project"]["scripts"] == {"edge": "edge.commands:main"}


def run_without(blocked: tuple[str, ...], args: list[str],
                cwd: Path) -> subprocess.CompletedProcess:
    """`edge ARGS` in a process where the `blocked` modules cannot be imported, as in an
    install without their extra."""
    code = ("import sys\n"
            f"for m in {blocked!r}:\n"
            "    sys.modules[m] = None\n"
            "from edge.commands import main\n"
            f"sys.argv = ['edge', *{args!r}]\n"
            "main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("blocked, args, extra", [
    (("tvm",), ["export", "--target", "web", "--dry-run"], "web"),
    (("coremltools",), ["export", "--target", "iphone", "--dry-run"], "iphone"),
    (("coreai",), ["export", "--target", "iphone", "--min-ios", "27", "--dry-run"], "iphone"),
    (("coreai_opt",), ["export", "--target", "iphone", "--min-ios", "27", "--quantize", "8",
                       "--dry-run"], "iphone"),
    (("torch",), ["export", "--dry-run"], "export"),
    (("torch",), ["generate", "a red circle moving left", "-o", "x.gif"], "export"),
    (("torch", "diffusers"), ["scale-model", "m"], "export"),
    # a base install: everything a web export needs, in one step
    (("torch", "onnx", "tvm"), ["export", "--target", "web", "--dry-run"], "web"),
    (("torch", "onnx", "coremltools"), ["export", "--target", "iphone", "--dry-run"], "iphone"),
])
def test_a_missing_extra_is_one_line_naming_it(tmp_path, blocked, args, extra):
    done = run_without(blocked, args, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    match = ONE_LINE.match(lines[-1])
    assert match and match[2] == extra, lines[-1]
    assert not (tmp_path / "x.gif").exists() and not (tmp_path / "m").exists()


def test_the_web_target_without_tvm_names_the_wasm_path_that_needs_none(tmp_path):
    """The one line names all a web export lacks, in one install, and the package an install
    without TVM can make: --web-paths wasm (export: [export] alone)."""
    done = run_without(("torch", "onnx", "tvm"), ["export", "--target", "web", "--dry-run"],
                       tmp_path)
    line = done.stderr.strip().splitlines()[-1]
    assert ('needs torch, onnx, apache-tvm, which the [web] extra installs: pip install '
            '"edge-video[web]"') in line, line
    assert line.endswith("; or --web-paths wasm, which needs [export] alone"), line
    done = run_without(("torch", "onnx", "tvm"), ["export", "--target", "web", "--web-paths",
                                                  "wasm", "--dry-run"], tmp_path)
    line = done.stderr.strip().splitlines()[-1]
    assert 'pip install "edge-video[export]"' in line and "tvm" not in line, line


def test_the_extras_inside_others_are_pyprojects():
    from edge.commands.extras import EXTRAS_INSIDE

    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, inside in EXTRAS_INSIDE.items():
        assert {f"{DISTRIBUTION}[{e}]" for e in inside} <= set(extras[extra]), extra
    for extra, requirements in extras.items():
        if extra != "test":
            assert not {r for r in requirements if r.startswith(f"{DISTRIBUTION}[")} - {
                f"{DISTRIBUTION}[{e}]" for e in EXTRAS_INSIDE.get(extra, ())}, extra


def test_a_wasm_only_web_package_needs_no_tvm(tmp_path):
    """`--web-paths wasm` compiles nothing with TVM, so an install without it plans (and
    exports: tests/test_web_wasm_only.py) such a package; both paths still ask for it
    (above)."""
    done = run_without(("tvm",), ["export", "--target", "web", "--web-paths", "wasm",
                                  "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "for the wasm path (--web-paths)" in done.stdout, done.stdout[-2000:]


def test_a_missing_module_no_extra_brings_keeps_its_traceback(monkeypatch):
    """Only the modules an extra installs are answered with an extra: a missing module of
    edge's own is a bug, and says where."""
    from edge.commands.extras import one_line_for_missing_extras

    def broken():
        import edge.no_such_module  # noqa: F401

    with pytest.raises(ModuleNotFoundError, match="edge.no_such_module"):
        one_line_for_missing_extras("generate", broken)()


def source_tree(dest: Path) -> Path:
    """The repository's files (what git tracks or would, no build outputs) copied to `dest`,
    so building a wheel leaves the checkout as it was."""
    anywhere = shutil.ignore_patterns(".git", ".venv*", "*.egg-info", "__pycache__",
                                      ".pytest_cache", ".ruff_cache", ".build")
    at_top = {"dist", "build", "models", "runs"}  # outputs; edge/models is the code's

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = at_top if Path(folder) == REPO else set()
        return set(anywhere(folder, names)) | (top & set(names))

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


@pytest.mark.slow
def test_the_base_install_generates_from_a_package_without_torch(tmp_path, exported_package):
    """A fresh virtual environment with `pip install edge-video` alone (no extra): everything it
    installs is under edge/, torch cannot be imported, `edge generate` makes a video from an
    exported package, and `edge export` says which extra it needs."""
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(wheels), str(source_tree(tmp_path / "src"))],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("edge_video-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"edge", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("edge/runtimes/python/pipeline.py", "edge/exporters/onnx/package.py",
                    "edge/runtimes/web/pipeline.js", "edge/web_demo/index.html",
                    "edge/weights/tiny-sora/transformer.safetensors", "edge/commands/__init__.py"):
        assert shipped in names, shipped

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py, edge = venv / "bin" / "python", venv / "bin" / "edge"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=1200, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    no_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True,
                              env=env, cwd=tmp_path)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr

    out = tmp_path / "out.gif"
    generated = subprocess.run([str(edge), "generate", str(exported_package[0]),
                                "a red circle moving left", "--steps", "3", "-o", str(out)],
                               capture_output=True, text=True, env=env, cwd=tmp_path,
                               timeout=600)
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert out.stat().st_size > 0 and f"wrote {out}" in generated.stdout
    exported = subprocess.run([str(edge), "export", "--dry-run"], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
    assert exported.returncode == 2 and "Traceback" not in exported.stderr
    assert ONE_LINE.match(exported.stderr.strip().splitlines()[-1])
