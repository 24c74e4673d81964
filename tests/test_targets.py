"""The targets know no family: every exporter takes a family's model through the same
interface, and `edge export` reaches each through one registry (edge.exporters.TARGETS)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from edge.exporters import TARGETS, ExportOptionError, ExportOptions, target

REPO = Path(__file__).resolve().parents[1]
# a family's modules and folders (edge/families/<family>/)
FAMILY_MODULES = {p.stem for p in (REPO / "edge" / "families").glob("*.py")} - {"__init__"} | {
    p.parent.name for p in (REPO / "edge" / "families").glob("*/__init__.py")}


def family_imports(path: Path) -> list[str]:
    """Imports in `path` of a family module or a model definition (edge.models)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names
                  if n.startswith("edge.models") or
                  any(n == f"edge.families.{f}" or n.startswith(f"edge.families.{f}.")
                      for f in FAMILY_MODULES)]
    return found


def test_no_exporter_or_runtime_imports_a_family():
    sources = sorted((REPO / "exporters").rglob("*.py")) + sorted((REPO / "runtimes").rglob(
        "*.py"))
    assert len(sources) > 10
    offenders = {str(p.relative_to(REPO)): family_imports(p) for p in sources}
    assert {p: names for p, names in offenders.items() if names} == {}


def test_the_import_check_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from edge.families import wan\nimport edge.models.tiny_sora\n"
                   "from edge.families.tiny_sora import cut_pipeline\n"
                   "from edge.families import FamilyModel, Shapes\n")
    assert family_imports(bad) == ["edge.families.wan", "edge.models.tiny_sora",
                                   "edge.families.tiny_sora",
                                   "edge.families.tiny_sora.cut_pipeline"]


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_target_answers_the_same_questions(name):
    module = target(name)
    for attr in ("check", "folder_name", "prepare", "export", "summary"):
        assert callable(getattr(module, attr)), f"target {name} lacks {attr}"
    assert module.NAME == name
    module.check(ExportOptions())  # the defaults are always accepted
    assert module.folder_name("m", ExportOptions()).startswith("m-")


@pytest.mark.parametrize("name, options, message", [
    ("onnx", ExportOptions(quantize="4"), "--quantize applies to --target iphone and web, "
     "not onnx"),
    ("web", ExportOptions(memory_budget=1 << 20), "--memory-budget: a web package takes its "
     "budget where the page loads it"),
    ("iphone", ExportOptions(quantize="3"), "--quantize '3' not understood"),
    ("web", ExportOptions(quantize="6"), "--quantize .6.: the web target stores weights as "
     "fp32, fp16, 8, 4"),
    ("iphone", ExportOptions(ort_url="https://x/"), "--ort-url applies to --target web, not "
     "iphone"),
    ("onnx", ExportOptions(unguided_variants=True), "--unguided-variants applies to --target "
     "iphone --min-ios 18 or 27 and web, not onnx"),
    ("web", ExportOptions(execute="all"), "--execute applies to --target onnx and iphone "
     "--min-ios 27, not web"),
    ("onnx", ExportOptions(web_paths="wasm"), "--web-paths applies to --target web, not onnx"),
    ("web", ExportOptions(web_paths="webgpu"), "--web-paths 'webgpu': a package without the "
     "wasm path is not built"),
    ("web", ExportOptions(web_paths="wasm,gpu"), "--web-paths 'wasm,gpu': give webgpu,wasm"),
    ("iphone", ExportOptions(unguided_variants=True, min_ios=17), "--unguided-variants with "
     "--min-ios 17: that layout stores each variant as a program with its own copy of the "
     "weights; use --min-ios 18"),
])
def test_targets_refuse_options_they_do_not_take(name, options, message):
    with pytest.raises(ExportOptionError, match=message):
        target(name).check(options)


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(ExportOptionError, match="unknown --target 'gpu'; available: onnx, "
                       "iphone, web"):
        target("gpu")


@pytest.mark.parametrize("name", list(TARGETS))
def test_each_target_cuts_at_the_shapes_its_family_gives(name, tiny_sora):
    """tiny-sora's presets: the desktop traces its dynamic batch at 2 prompts; a device and
    the web encode one prompt; the web decodes 4 frames per call, the device all 16."""
    prepared = target(name).prepare(tiny_sora, ExportOptions())
    text = prepared.components["text_encoder"][0].example[0]
    frames = prepared.components["vae_decoder"][0].example[0]
    want = {"onnx": (2, 2), "iphone": (1, tiny_sora.latent_shape[1]), "web": (1, 4)}[name]
    assert (text.shape[0], frames.shape[0]) == want
    assert prepared.block_count == sum(len(b) for b in prepared.components.values()) > 10
    assert prepared.plan_lines[0].startswith("block") and "total" in prepared.plan_lines[-1]


def test_one_export_validation_error_for_every_exporter():
    from edge.exporters import ExportValidationError

    for module in ("edge.exporters.onnx.package", "edge.exporters.iphone.coreml.package",
                   "edge.exporters.iphone.coreai.package",
                   "edge.exporters.web.package",
                   "edge.exporters.shared.weights_in_place"):
        assert importlib.import_module(module).ExportValidationError is ExportValidationError
