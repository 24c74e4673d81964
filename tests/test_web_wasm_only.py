"""A web package with the wasm path alone (`edge export --target web --web-paths wasm`): the
blocks' ONNX graphs for onnxruntime-web and no launch plans, exported without TVM. The page's
choice of path for such a package: tests/test_web_browser.py; a page generating from one:
tests/test_wan22.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from edge.commands import app

# a wasm-only export in a process where TVM cannot be imported, as in an install without it
EXPORT_WITHOUT_TVM = """
import json, sys
from pathlib import Path
sys.modules["tvm"] = None   # an `import tvm` anywhere now fails
import torch
torch.set_num_threads(int(sys.argv[2]))
from edge.exporters.web.package import export_web
from edge.families.tiny_sora.family import TinySoraModel
from edge.models.tiny_sora import TinySora
export_web(TinySoraModel(TinySora.load()), Path(sys.argv[1]), variants=False, unguided=True,
           paths=("wasm",))
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("tvm", "edge.exporters.tvm")))))
"""


def records(manifest: dict):
    """(where, record) of every block and variant."""
    for c in manifest["components"]:
        for b in c["blocks"]:
            yield f"{c['name']}/{b['name']}", b
            for name, v in b.get("variants", {}).items():
                yield f"{c['name']}/{b['name']} variant {name}", v


@pytest.mark.slow  # tiny-sora's wasm graphs, in a process of its own (~20 s)
def test_a_wasm_only_package_is_exported_without_tvm(tmp_path):
    """No plans/ folder and no `gpu` record; each block's (and variant's) `graph` is its wasm
    graph, whose check is its `validation`, within BLOCK_TOLERANCE; the manifest says
    `web.paths: ["wasm"]` and passes every check of read_package. The export ran where TVM
    cannot be imported and imported nothing of it."""
    from edge.core.package import read_package
    from edge.exporters.shared.validation import relative_error
    from edge.exporters.web.package import BLOCK_TOLERANCE

    root = tmp_path / "pkg"
    done = subprocess.run([sys.executable, "-c", EXPORT_WITHOUT_TVM, str(root),
                           str(torch.get_num_threads())], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["tvm"]  # the guard alone

    manifest = read_package(root)  # the schema, and every file's size and sha256
    assert manifest["web"]["paths"] == ["wasm"]
    assert not (root / "plans").exists()
    seen = list(records(manifest))
    assert any("variant unguided" in where for where, _ in seen)
    for where, r in seen:
        assert "gpu" not in r, where
        assert r["graph"] == r["wasm"]["graph"] and r["graph"].endswith(".onnx"), where
        assert r["validation"] == r["wasm"]["validation"], where
        assert relative_error(r["wasm"]["validation"]) <= BLOCK_TOLERANCE, where
        assert not any(f["path"].startswith("plans/") for f in r["files"]), where


@pytest.mark.parametrize("args, message", [
    (["--target", "web", "--web-paths", "gpu"],
     "--web-paths 'gpu': give webgpu,wasm (both paths, the default) or wasm"),
    (["--target", "web", "--web-paths", "webgpu"],
     "--web-paths 'webgpu': a package without the wasm path is not built"),
    (["--target", "onnx", "--web-paths", "wasm"],
     "--web-paths applies to --target web, not onnx"),
])
def test_cli_refuses_a_bad_web_paths_before_any_work(tmp_path, args, message):
    dest = tmp_path / "pkg"
    result = CliRunner().invoke(app, ["export", *args, "-o", str(dest)])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not dest.exists()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["web"].update(paths=["wasm"]), "is not its wasm graph, but web.paths has no "
                                                "\"webgpu\""),
    (lambda m: m["web"].update(paths=["gpu"]), "paths \\['gpu'\\] must name each of webgpu, "
                                               "wasm at most once"),
    (lambda m: m["web"].update(paths=[]), "at least one"),
    (lambda m: m["components"][0]["blocks"][0].pop("wasm"), "text_encoder/embeddings: no wasm "
                                                            "graph, but web.paths has \"wasm\""),
])
def test_the_manifest_says_which_paths_its_records_hold(tiny_sora_web, edit, message):
    """`web.paths` agrees with the records, as a runtime reading either kind relies on: a
    package with plans cannot claim the wasm path alone, a record of a package with the wasm
    path has its graph, and only known paths are named."""
    import copy

    from edge.core.manifest_schema import DIGEST_FIELD, check_manifest, manifest_digest
    from edge.core.package import PackageError

    manifest = copy.deepcopy(tiny_sora_web[1])
    check_manifest(manifest)  # as written
    edit(manifest)
    manifest[DIGEST_FIELD] = manifest_digest(manifest)  # an edit made consistently
    with pytest.raises(PackageError, match=message):
        check_manifest(manifest)
