"""Export the shipped tiny-sora to ONNX once, then run it with the Python runtime."""
import re
import shutil

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.core.package import PackageError, read_package
from edge.core.video_metrics import psnr
from edge.exporters import ExportValidationError
from edge.exporters.onnx.package import PSNR_LIMIT_DB, end_to_end_check, export_onnx
from edge.runtimes.python import BudgetError, Pipeline

runner = CliRunner()


@pytest.fixture
def package(exported_package):
    return exported_package  # exported once per session (tests/conftest.py)


def test_manifest_lists_every_block_with_validation(package):
    root, manifest = package
    assert read_package(root)["target"] == "onnx"
    names = {c["name"]: [b["name"] for b in c["blocks"]] for c in manifest["components"]}
    assert names["text_encoder"] == ["embeddings"] + [f"layer_{i}" for i in range(6)]
    assert names["transformer"] == ["prologue", "pair_0", "pair_1", "pair_2", "pair_3",
                                    "epilogue"]
    assert names["vae_decoder"] == ["head", "up_0", "up_1", "up_2_out"]
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            assert block["validation"]["max_abs_error"] <= 1e-4
            weights = root / block["weights"]["path"]
            assert weights.stat().st_size % 4096 == 0
            assert all(t["offset"] % 64 == 0 for t in block["weights"]["tensors"])
    assert manifest["validation"]["identical"] or manifest["validation"]["psnr_db"] >= PSNR_LIMIT_DB


def test_runtime_matches_pytorch_and_budget_does_not_change_the_video(package, pipeline):
    root, manifest = package
    want = pipeline.generate("a green square moving up", seed=11, steps=6)
    sizes = [b["files"][1]["bytes"] for c in manifest["components"] for b in c["blocks"]]
    for budget in (None, max(sizes) + 8192):
        runtime = Pipeline.load(root, memory_budget=budget)
        got = runtime.generate("a green square moving up", seed=11, steps=6)
        assert psnr(got, want) >= PSNR_LIMIT_DB
        run = runtime.last_run
        assert run["transformer_calls"] == 6
        if budget:
            assert run["peak_held_bytes"] <= budget
            assert run["bytes_read"] > sum(sizes)  # transformer blocks streamed every step
            # the share of the denoising loop's read time hidden behind compute
            assert 0.0 <= run["overlap_efficiency"] <= 1.0
            assert run["denoise"]["io_wait_s"] <= run["io_wait_s"]
        else:  # nothing streamed: first loads only, no overlap to speak of
            assert run["overlap_efficiency"] is None
        runtime.close()


def test_budget_too_small_is_refused_before_running(package):
    root, manifest = package
    with pytest.raises(BudgetError, match="text_encoder/embeddings"):
        Pipeline.load(root, memory_budget="1MB")


def test_corrupt_package_is_refused(package, tmp_path):
    root, manifest = package
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    target = copy / manifest["components"][1]["blocks"][2]["weights"]["path"]
    data = bytearray(target.read_bytes())
    data[100] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="pair_1.bin: sha256 differs"):
        Pipeline.load(copy)
    target.write_bytes(bytes(data[:4096]))
    with pytest.raises(PackageError, match="pair_1.bin: 4096 bytes, manifest says"):
        Pipeline.load(copy)


@pytest.mark.slow  # a second full export
def test_failed_validation_leaves_the_earlier_package(package, tiny_sora, tmp_path):
    root, _ = package
    dest = tmp_path / "dest"
    shutil.copytree(root, dest)
    before = (dest / "manifest.json").read_text()

    def failing(_root):
        raise ExportValidationError("end to end: forced")

    with pytest.raises(ExportValidationError):
        export_onnx(tiny_sora, dest, validate_end_to_end=failing)
    assert (dest / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]


def test_cli_generate_runs_a_package(package, tmp_path):
    root, _ = package
    out = tmp_path / "v.gif"
    res = runner.invoke(app, ["generate", str(root), "a red circle moving left", "-o", str(out),
                              "--steps", "3", "--memory-budget", "64MB"])
    assert res.exit_code == 0, res.output
    assert out.is_file() and "transformer calls 3" in res.output and "peak RSS" in res.output


def test_cli_generate_prints_overlap_only_where_blocks_stream(package, tmp_path):
    root, _ = package
    args = ["generate", str(root), "a red circle moving left", "-o", str(tmp_path / "v.gif"),
            "--steps", "3"]
    resident = runner.invoke(app, args)
    assert resident.exit_code == 0, resident.output
    assert "read time behind compute" not in resident.output
    streamed = runner.invoke(app, args + ["--memory-budget", "50MB"])
    assert streamed.exit_code == 0, streamed.output
    assert re.search(r"streamed denoising hid \d+% of its read time behind compute",
                     streamed.output), streamed.output


def test_cli_generate_refuses_a_negative_seed_before_any_work(package):
    res = runner.invoke(app, ["generate", str(package[0]), "a red circle", "--seed", "-1"])
    assert res.exit_code == 2 and "--seed" in res.output
    assert "denoising" not in res.output  # refused before the progress bar


def test_cli_generate_names_a_bad_budget(package):
    root, _ = package
    res = runner.invoke(app, ["generate", str(root), "a red circle moving left",
                              "--memory-budget", "1KB"])
    assert res.exit_code == 2 and "smallest budget that works" in res.output


def test_cli_export_dry_run_plans_without_writing(tmp_path):
    res = runner.invoke(app, ["export", "--target", "onnx", "--dry-run", "--memory-budget",
                              "60MB", "-o", str(tmp_path / "never")])
    assert res.exit_code == 0, res.output
    assert "transformer/pair_0" in res.output and "resident" in res.output
    assert "streamed every use" in res.output and not (tmp_path / "never").exists()


def test_cli_export_refuses_unknown_target():
    res = runner.invoke(app, ["export", "--target", "gpu"])
    assert res.exit_code == 2 and "unknown" in res.output
    for target in ("onnx", "iphone", "web"):  # the error lists what there is
        assert target in res.output


def test_runtime_needs_no_torch(package):
    import subprocess
    import sys

    root, _ = package
    code = ("import sys; sys.modules['torch'] = None\n"
            "from edge.runtimes.python import Pipeline\n"
            f"p = Pipeline.load({str(root)!r})\n"
            "v = p.generate('a red circle moving left', steps=2)\n"
            "print(v.shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(1, 16, 32, 32, 3)" in out.stdout


def test_manifest_json_is_documented():
    doc = open("docs/package-format.md").read()
    for field in ("format_version", "producer", "target", "model", "tokenizer", "conditioning",
                  "sampler", "latent_shape", "components", "sha256", "weights", "inputs"):
        assert f"`{field}`" in doc


def test_bench_repeats_report_the_median_generation(package):
    """`--repeats 3`: three timed generations per mode; the mode's wall is their median and
    its peaks the largest of them; 0 repeats are refused."""
    import json

    root, _ = package
    res = runner.invoke(app, ["bench", str(root), "--memory-budget", "64MB", "--json",
                              "--steps", "1", "--repeats", "3"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.output.strip().splitlines()[-1])
    assert result["repeats"] == 3
    for mode in ("resident", "streamed", "naive"):
        walls = result[mode]["wall_s_runs"]
        assert len(walls) == 3 and result[mode]["wall_s"] == sorted(walls)[1]
    refused = runner.invoke(app, ["bench", str(root), "--memory-budget", "64MB",
                                  "--repeats", "0"])
    assert refused.exit_code != 0 and "--repeats" in refused.output


def test_cli_bench_json_has_every_mode(package):
    import json

    root, _ = package
    res = runner.invoke(app, ["bench", str(root), "--memory-budget", "64MB", "--json",
                              "--steps", "2", "--lean"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.output.strip().splitlines()[-1])
    assert result["cold_sequential_read"]["bytes_per_s"] > 0
    # lean: the pinned blocks let go before each decode are read again in the timed run
    assert result["lean"]["bytes_read"] > result["streamed"]["bytes_read"]
    assert result["lean"]["peak_held_bytes"] <= 64 << 20
    for mode in ("resident", "streamed", "naive", "lean"):
        for key in ("wall_s", "peak_rss_bytes", "bytes_read", "io_wait_s",
                    "overlap_efficiency", "read_bw_fraction"):
            assert key in result[mode]
    assert result["resident"]["bytes_read"] == 0
    assert result["naive"]["bytes_read"] >= result["streamed"]["bytes_read"] > 0
    assert result["streamed"]["peak_held_bytes"] <= 64 << 20
    # every mode warms up first: the pinned blocks are read there, not in the timed run
    first = {m: result[m]["first_run"] for m in ("resident", "streamed", "naive")}
    assert all(f["steps"] == 1 and f["wall_s"] > 0 for f in first.values())
    assert first["resident"]["bytes_read"] > 0 == result["resident"]["bytes_read"]
    assert first["streamed"]["bytes_read"] > 0


@pytest.mark.slow  # writes and exports a scaled model
def test_scaled_model_exports_with_the_same_command_and_a_budget(tmp_path):
    """Also the export-time plan (edge/planning/plan.py): at 50 MB the 45.5 MiB embedding table
    streams, so the small streamed neighbours (the pairs) are merged into one block."""
    res = runner.invoke(app, ["scale-model", str(tmp_path / "wide"), "--hidden", "64",
                              "--pairs", "2", "--heads", "2"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["export", "--model", str(tmp_path / "wide"), "-o",
                              str(tmp_path / "wide-onnx"), "--memory-budget", "50MB"])
    assert res.exit_code == 0, res.output
    manifest = read_package(tmp_path / "wide-onnx")  # every file listed, sized, hashed
    assert manifest["model"] == "wide"
    assert [b["name"] for b in manifest["components"][1]["blocks"]] == [
        "prologue", "pair_0-1", "epilogue"]
    assert manifest["plan"]["memory_budget_bytes"] == 50 << 20
    assert manifest["plan"]["blocks"]["transformer/pair_0-1"] == ["pair_0", "pair_1"]
    assert "tdtm" in manifest["components"][1]["blocks"][1]["variants"]
    # the export's end-to-end check ran the re-cut package against PyTorch
    assert manifest["validation"]["identical"] or manifest["validation"]["psnr_db"] >= PSNR_LIMIT_DB
    pipe = Pipeline.load(tmp_path / "wide-onnx", memory_budget="50MB")
    try:
        video = pipe.generate("a red circle moving left", steps=2, merge_steps=1)
    finally:
        pipe.close()
    assert video.shape[:2] == (1, 16) and pipe.last_run["peak_held_bytes"] <= 50 << 20
    assert pipe.last_run["sampler"]["merged_calls"] == 1


def test_end_to_end_check_reports_the_steps_of_both_generations(pipeline, tiny_sora,
                                                                exported_package):
    root, _ = exported_package
    seen = []
    result = end_to_end_check(tiny_sora, on_step=lambda done, total: seen.append((done, total)))(
        root)
    steps = pipeline.sampler.steps
    assert result["identical"] or result["psnr_db"] >= PSNR_LIMIT_DB
    assert [d for d, _ in seen] == list(range(1, 2 * steps + 1))  # runtime's, then PyTorch's
    assert {t for _, t in seen} == {2 * steps}


def test_exports_leave_out_onnxscripts_quadratic_rewrite_rule(tmp_path):
    """SlicesSplit pairs Slice nodes to match, which chunked attention's many slices make
    quadratic (70.5 s of the tiny Open-Sora's 143.7 s ONNX export, never firing): the export's
    optimizer runs every other default rule, and onnxscript's defaults come back after."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnxscript import rewriter

    from edge.exporters.shared.onnx_rewrites import without_quadratic_rules

    defaults = rewriter._DEFAULT_REWRITE_RULES
    names = [r.name for r in defaults]
    if "SlicesSplit" not in names:
        pytest.skip("this onnxscript's default rules have no SlicesSplit to leave out")

    class Halves(torch.nn.Module):
        def forward(self, x):
            return x.narrow(-1, 0, 4).transpose(0, 1).transpose(0, 1) * 2 + x.narrow(-1, 4, 4)

    x = torch.randn(3, 8)
    path = tmp_path / "halves.onnx"
    with without_quadratic_rules():
        inside = [r.name for r in rewriter._DEFAULT_REWRITE_RULES]
        torch.onnx.export(Halves(), (x,), str(path), dynamo=True, verbose=False)
    assert inside == [n for n in names if n != "SlicesSplit"]
    assert rewriter._DEFAULT_REWRITE_RULES is defaults
    # the other rules still ran: the transpose pair is gone
    assert "Transpose" not in [n.op_type for n in onnx.load(path).graph.node]
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, Halves()(x).numpy(), rtol=1e-6)


def test_each_export_gets_its_own_copy_of_one_kept_torchlib_table():
    import torch
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    from edge.exporters.shared import onnx_registry
    from edge.exporters.shared.onnx_registry import reused_torchlib_registry

    torchs_own = ONNXRegistry.__dict__["from_torchlib"]
    kept_before = set(onnx_registry._kept)
    with reused_torchlib_registry():
        first = ONNXRegistry().from_torchlib()
        first.register_op(torch.ops.aten.relu.default, lambda x: x)
        second = ONNXRegistry.from_torchlib()
    assert ONNXRegistry.__dict__["from_torchlib"] is torchs_own
    assert len(set(onnx_registry._kept) - kept_before) <= 1  # built once at most, copied twice
    assert first is not second and first.functions.keys() == second.functions.keys()
    # the op registered on the first copy is not in the second's lists, nor in the kept table
    assert len(first.get_decomps(torch.ops.aten.relu.default)) == (
        len(second.get_decomps(torch.ops.aten.relu.default)) + 1)
    fresh = ONNXRegistry.from_torchlib()
    assert ({k: len(v) for k, v in fresh.functions.items()}
            == {k: len(v) for k, v in second.functions.items()})


def test_execute_distinct_writes_the_same_package_running_each_graph_once(package, tiny_sora,
                                                                          tmp_path,
                                                                          monkeypatch):
    """`--execute distinct` (for real video sizes, where a block's forward pass and graph run
    take minutes each): a block whose graph is one validated earlier in the export but for
    its metadata is written unvalidated, naming that block, and no forward pass runs on its
    values; every file is the full export's, byte for byte."""
    from edge.graph.blocks import Block
    from edge.graph.shapes_only import active

    components = tiny_sora.cut()  # tiny-sora's cut runs its blocks to make their examples
    ran = []
    run = Block.run

    def counted(self, *inputs):
        if not active():  # a forward pass on values, not a signature's shapes
            ran.append(self.key)
        return run(self, *inputs)

    monkeypatch.setattr(Block, "run", counted)
    manifest = export_onnx(tiny_sora, tmp_path / "pkg", components=components,
                           distinct_only=True)
    _, full = package
    blocks = {f"{c['name']}/{b['name']}": b for c in manifest["components"]
              for b in c["blocks"]}
    repeats = {**{f"text_encoder/layer_{i}": "text_encoder/layer_0" for i in range(1, 6)},
               **{f"transformer/pair_{i}": "transformer/pair_0" for i in range(1, 4)}}
    for key, block in blocks.items():
        if key in repeats:
            assert block["validation"]["executed"] is False
            assert f"its graph is {repeats[key]}'s" in block["validation"]["why"]
            for name, variant in block.get("variants", {}).items():
                assert f"is {repeats[key]} variant {name}'s" in variant["validation"]["why"]
        else:
            assert block["validation"]["max_abs_error"] <= 1e-4, key
    assert not set(ran) & set(repeats), ran  # the repeats' values never computed
    assert {"text_encoder/layer_0", "transformer/pair_0"} <= set(ran)

    def files(m):
        return {f["path"]: f["sha256"] for c in m["components"] for b in c["blocks"]
                for f in b["files"]}

    assert files(manifest) == files(full)
    strip = ("validation",)
    for c, fc in zip(manifest["components"], full["components"], strict=True):
        for b, fb in zip(c["blocks"], fc["blocks"], strict=True):
            assert ({k: v for k, v in b.items() if k not in strip and k != "variants"}
                    == {k: v for k, v in fb.items() if k not in strip and k != "variants"})
    from edge.exporters.onnx.target import summary

    said = summary(manifest | {"validation": full["validation"]}, tmp_path / "pkg", 1.0)
    assert "17 blocks (8 not run: --execute distinct" in said, said
