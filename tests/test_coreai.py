"""The iphone target's Core AI layout (`--min-ios 27`): every program executed through Core
AI's runtime (on Linux its reference interpreter) at export and held to PyTorch, the whole
package generated through Core AI by the Python runtime against tiny-sora's reference, and
what it refuses."""

from __future__ import annotations

import stat
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("coreai_torch", reason="Core AI's converter (coreai-torch, the [iphone] "
                    "extra) is not installed")

from conftest import WAN_TILING, coreai_export  # noqa: E402  (after the skip)

from edge.core.files import EdgeNotice  # noqa: E402
from edge.core.video_metrics import psnr, snr  # noqa: E402
from edge.exporters import ExportValidationError  # noqa: E402
from edge.graph.blocks import Block  # noqa: E402

PROMPT = "a red circle moving left"




def _records(manifest: dict):
    for comp in manifest["components"]:
        for block in comp["blocks"]:
            key = f"{comp['name']}/{block['name']}"
            yield key, block
            for name, variant in block.get("variants", {}).items():
                yield f"{key}#{name}", variant


@pytest.mark.slow
def test_every_program_was_executed_within_float32_rounding(coreai_package):
    root, manifest = coreai_package
    assert manifest["coreml"]["layout"] == "coreai"
    assert manifest["coreml"]["minimum_deployment_target"] == "iOS27"
    records = dict(_records(manifest))
    # tiny-sora's blocks, the pairs' TDTM functions, and the transformer's caption-half ones
    # (prologue, 4 pairs and epilogue `unguided`, the pairs' `tdtm_unguided`)
    assert len(records) == 17 + 4 + 6 + 4
    for key, record in records.items():
        check = record["validation"]
        assert check["executed"].startswith("Core AI runtime"), key
        assert 0 <= check["relative_error"] <= 1e-5, (key, check)
        assert (root / record["model"] / "main.mlirb").is_file(), key
    # a variant is a function of its block's model, not a model of its own
    pair = next(b for k, b in records.items() if k == "transformer/pair_0")
    assert pair["variants"]["tdtm"]["model"] == pair["model"]
    assert (pair["function"], pair["variants"]["tdtm"]["function"]) == ("main", "tdtm")


@pytest.mark.slow
def test_a_blocks_functions_share_its_weights(coreai_package, tiny_sora):
    """Two graphs over the same tensors store them once: the pair's model is about its fp32
    parameters, not twice them."""
    root, manifest = coreai_package
    blocks = {b["name"]: b for c in manifest["components"] for b in c["blocks"]}
    pair = blocks["pair_0"]
    params = pair["reference_weight_bytes"]
    assert params <= pair["weight_bytes"] < 1.2 * params


@pytest.mark.slow
def test_the_package_generates_through_coreai_as_the_reference(coreai_package, tiny_sora):
    """The export's own check, and the Python runtime on another seed: the video through
    Core AI against tiny-sora's PyTorch pipeline, closer than another seed's video is."""
    from edge.runtimes.python import Pipeline

    root, manifest = coreai_package
    check = manifest["validation"]
    assert check["identical"] or (check["psnr_db"] >= 35 and check["snr_db"] >= 20), check
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", EdgeNotice)
        pipe = Pipeline.load(root)
    try:
        got = pipe.generate(PROMPT, seed=5, steps=8)
        # the programs map their own weights: the loader read none of them
        assert (pipe.loader.stats.reads, pipe.loader.stats.bytes_read) == (0, 0)
    finally:
        pipe.close()
    if sys.platform != "darwin":  # the Linux runtime says what it is
        assert any("reference interpreter" in str(w.message) for w in said)
    want = tiny_sora.generate(PROMPT, seed=5, steps=8)
    other = tiny_sora.generate(PROMPT, seed=6, steps=8)
    assert psnr(got, want) >= 35 and snr(got, want) >= 20
    assert psnr(got, want) > psnr(other, want) + 10   # the check can tell a wrong video


@pytest.mark.slow
def test_unguided_calls_run_the_caption_half_functions(coreai_package, exported_package):
    """After a guidance cutoff (with TDTM on the first calls) the Python runtime runs the
    package's `unguided` and `tdtm_unguided` functions through Core AI, a batch of one: the
    ONNX package's video of the same settings, which the cutoff changes."""
    from edge.runtimes.python import Pipeline

    settings = {"seed": 5, "steps": 6, "guidance_steps": 2, "merge_steps": 3}
    pipe = Pipeline.load(coreai_package[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # no "runs the null half too" warning
            got = pipe.generate(PROMPT, **settings)
        assert pipe.last_run["unguided_batch"] == 1
    finally:
        pipe.close()
    onnx = Pipeline.load(exported_package[0])
    try:
        want = onnx.generate(PROMPT, **settings)
        guided = onnx.generate(PROMPT, seed=5, steps=6, merge_steps=3)
    finally:
        onnx.close()
    assert psnr(guided, want) < 40, "the cutoff changes nothing here"
    assert psnr(got, want) >= 40 and snr(got, want) >= 25, (psnr(got, want), snr(got, want))


@pytest.mark.slow
def test_edge_generate_runs_a_coreai_package(coreai_package, tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    root, _ = coreai_package
    out = tmp_path / "v.gif"
    result = CliRunner().invoke(app, ["generate", str(root), PROMPT, "-o", str(out),
                                      "--steps", "2", "--scale", "1"])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0


def _block(module: nn.Module, name: str, *example: torch.Tensor) -> Block:
    out = module(*example)
    outputs = ["y"] if isinstance(out, torch.Tensor) else [f"y{i}" for i in range(len(out))]
    return Block("test", name, module.eval(), [f"x{i}" for i in range(len(example))],
                 outputs, example)


def test_fp16_programs_execute_within_half_precision_at_half_the_bytes(tmp_path, tiny_sora):
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_block
    from edge.exporters.iphone.coreml.package import cut_for_device

    blocks = {b.key: b for bs in cut_for_device(tiny_sora).values() for b in bs}
    block = blocks["text_encoder/layer_0"]
    half = export_block(block, tmp_path / "half", PRECISIONS["fp16"])
    full = export_block(block, tmp_path / "full", PRECISIONS["fp32"])
    assert half["validation"]["relative_error"] <= PRECISIONS["fp16"].tolerance
    # half precision is seen: the executed error is that of float16, not float32's
    assert half["validation"]["relative_error"] > 100 * full["validation"]["relative_error"]
    assert 0.45 < half["weight_bytes"] / full["weight_bytes"] < 0.55


def test_execute_distinct_converts_every_block_and_executes_one_of_each_shape(tmp_path,
                                                                              tiny_sora):
    """`--execute distinct`: every block written as a Core AI model; a block that repeats an
    earlier one's shapes (a text encoder's layer_1.., a transformer's pair_1..) is not
    executed and says so, every other is executed and held to PyTorch; the summary counts
    both."""
    from edge.exporters.iphone.coreai.layout import summary
    from edge.exporters.iphone.coreai.package import (
        NOT_EXECUTED,
        PRECISIONS,
        export_blocks,
        repeats,
    )
    from edge.exporters.iphone.coreml.package import cut_for_device

    cut = cut_for_device(tiny_sora)
    blocks = cut["text_encoder"]
    assert [b.name for b, r in zip(blocks, repeats(blocks), strict=True) if r] == [
        b.name for b in blocks if b.name.startswith("layer_") and b.name != "layer_0"]
    assert sum(repeats(cut["transformer"])) == len(cut["transformer"]) - 3  # pair_0 runs
    assert not any(repeats(cut["vae_decoder"]))   # its stages differ in shape
    records = export_blocks(blocks, tmp_path, PRECISIONS["fp32"], distinct_only=True)
    for block, record, repeat in zip(blocks, records, repeats(blocks), strict=True):
        check = record["validation"]
        if repeat:
            assert check["executed"] is False and check["why"] == NOT_EXECUTED, block.key
            assert "relative_error" not in check
        else:
            assert check["executed"].startswith("Core AI runtime"), block.key
            assert check["relative_error"] <= 1e-5, block.key
        # converted all the same: each model written, with its signature
        assert (tmp_path / record["model"] / "main.mlirb").stat().st_size > 0, block.key
        assert [i["name"] for i in record["inputs"]] == list(block.inputs)
    manifest = {"components": [{"name": "text_encoder", "blocks": records}],
                "coreml": {"compression": {"setting": "fp32"}},
                "validation": {"skipped": "not run"}}
    said, skipped = summary(manifest, tmp_path, 1.0), sum(repeats(blocks))
    assert (f"executed through Core AI here: {len(blocks) - skipped} of {len(blocks)} "
            f"programs (--execute distinct), {skipped} blocks repeating") in said, said
    # an fp16 package's generation is not run at export: its note says what was executed
    from edge.exporters import Progress
    from edge.exporters.iphone.coreai.layout import end_to_end

    note = end_to_end(tiny_sora, tmp_path, PRECISIONS["fp16"], Progress(), "distinct")
    assert "one block of each repeated shape (--execute distinct) was executed" in (
        note["skipped"])


@pytest.mark.parametrize("args, message", [
    (["--execute", "some"], "--execute 'some': one of all, distinct"),
])
def test_execute_takes_all_or_distinct(tmp_path, args, message):
    result = _cli(*args, "-o", str(tmp_path / "pkg"))
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("target, message", [
    (["--target", "iphone", "--min-ios", "18"], "--execute applies to --min-ios 27: Core ML "
                                                "programs do not run here"),
    (["--target", "web"], "--execute applies to --target onnx and iphone --min-ios 27, not "
                          "web"),
])
def test_execute_is_refused_where_programs_do_not_run_here(tmp_path, target, message):
    from typer.testing import CliRunner

    from edge.commands import app

    result = CliRunner().invoke(app, ["export", *target, "--execute", "distinct", "-o",
                                      str(tmp_path / "pkg")])
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "pkg").exists()


def test_int8_programs_store_a_byte_a_weight_and_execute_near_the_block(tmp_path, tiny_sora):
    """--quantize 8: coreai-opt stores every weight matrix in int8 (a float16 scale per output
    channel) behind float16 compute; the executed program stays within the setting's
    tolerance, its error is quantization's (above float16's alone), at about a quarter of the
    float32 bytes."""
    from edge.exporters.iphone.coreai.layout import stored_bytes
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_block
    from edge.exporters.iphone.coreml.package import cut_for_device

    blocks = {b.key: b for bs in cut_for_device(tiny_sora).values() for b in bs}
    block = blocks["transformer/pair_0"]   # its tdtm function shares the quantized weights
    full = export_block(block, tmp_path / "full", PRECISIONS["fp32"])
    int8 = export_block(block, tmp_path / "int8", PRECISIONS["8"])
    for name, record in [("main", int8), ("tdtm", int8["variants"]["tdtm"])]:
        error = record["validation"]["relative_error"]
        assert 1e-3 < error <= PRECISIONS["8"].tolerance, (name, error)
        # against the block with coreai-opt's int8 weights simulated: float16 compute alone
        simulated = record["validation"]["simulated"]
        assert simulated["weights"] == 16 and simulated["relative_error"] < 1e-2, simulated
    assert 0.24 < int8["weight_bytes"] / full["weight_bytes"] < 0.32
    # the dry run's figure is the weights' (what coreai-opt compresses at 8 bits, the rest
    # at 16): the program adds its ops (~60 KB here; 0.2% of a Wan 1.3B block)
    assert 0.8 < stored_bytes(block, PRECISIONS["8"]) / int8["weight_bytes"] <= 1
    program = (tmp_path / "int8" / int8["graph"]).read_bytes()
    assert b"blockwise_shift_scale" in program   # the dequantizing op before each weight


def test_int4_programs_store_half_a_byte_a_weight_and_execute_near_the_block(tmp_path,
                                                                           tiny_sora):
    """A block stored as int4 with a scale per 32 inputs (Wan's `4` stores its transformer
    so): coreai-opt's blocks dequantized before each weight's use, every function within the
    4-bit guard and further off than int8 (the 4 bits are seen), about 4.5/32 of the fp32
    bytes."""
    from edge.exporters.iphone.compression import STORAGES, Compression
    from edge.exporters.iphone.coreai.layout import stored_bytes
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_block, stored_precision
    from edge.exporters.iphone.coreml.package import cut_for_device

    blocks = {b.key: b for bs in cut_for_device(tiny_sora).values() for b in bs}
    block = blocks["transformer/pair_0"]
    int4 = stored_precision(Compression("int4", (("*", STORAGES["int4-b32"]),), 0.0),
                            tiny_sora)
    record = export_block(block, tmp_path / "int4", int4)
    assert int4.stored_form(block.key).tolerance > PRECISIONS["8"].tolerance
    for name, entry in [("main", record), ("tdtm", record["variants"]["tdtm"])]:
        check = entry["validation"]
        # int8 puts this block 4.6e-3 off (docs/package-format.md)
        assert 1e-2 < check["relative_error"] <= check["tolerance"], (name, check)
        # the 4 bits are the simulated quantization's: what is left is float16's (3.7e-3)
        simulated = check["simulated"]
        assert simulated["relative_error"] < check["relative_error"] / 5, (name, check)
    assert 0.14 < record["weight_bytes"] / record["reference_weight_bytes"] < 0.2
    assert 0.8 < stored_bytes(block, int4) / record["weight_bytes"] <= 1
    assert b"blockwise_shift_scale" in (tmp_path / "int4" / record["graph"]).read_bytes()


@pytest.mark.parametrize("dtype, block_size, axes", [("int8", None, (0, 1)),
                                                      ("int4", 32, (0, 1)),
                                                      ("int4", 32, (1, 0))])
def test_the_simulated_quantization_is_coreai_opts_bit_for_bit(dtype, block_size, axes):
    """exporters/iphone/coreai/simulated.py's weights are those coreai-opt stores: its own
    parameters (a private function of the pinned coreai-opt 0.4.0) dequantized as the
    program does, q * scale in float16, equal to the last bit, per output channel and per
    block of 32 inputs along either axis."""
    pytest.importorskip("coreai_opt", reason="coreai-opt (the [iphone] extra) is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from coreai_opt.coreai_utils._coreai_imports import compression_types
        from coreai_opt.coreai_utils._utils.quantize_utils import _compute_qparams_by_dtype
        from coreai_opt.coreai_utils.common import QScheme

    from edge.exporters.iphone.coreai.simulated import quantized

    w = (np.random.default_rng(3).standard_normal((64, 96)) * 0.05).astype(np.float16)
    w[5] = 0   # an all-zero channel: the formula's epsilon keeps its scale finite
    sizes = [0, 0]
    sizes[axes[0]], sizes[axes[1]] = 1, block_size or 0
    levels, scale, _ = _compute_qparams_by_dtype(w, getattr(compression_types, dtype),
                                                 QScheme.SYMMETRIC, sizes)
    per = np.ones(2, dtype=int)
    per[axes[1]] = block_size or w.shape[axes[1]]
    expand = np.asarray(scale, np.float16).reshape(
        [w.shape[a] // per[a] if sizes[a] else 1 for a in range(2)])
    want = levels.astype(np.float16) * np.kron(expand, np.ones(per, np.float16))
    got = quantized(w, axes, dtype, block_size)
    assert got.dtype == np.float16 and np.array_equal(got, want.astype(np.float16))
    assert np.abs(got - w).max() > 0   # the weights did change


def test_a_program_off_the_simulated_weights_is_refused(tmp_path, tiny_sora, monkeypatch):
    """The embedding table's block at int4: coreai-opt compresses the word table, not the
    position table (its gather at fixed positions folds into a constant), and the program
    matches that simulation to float16; simulated otherwise (three levels), the same program
    is refused, naming the block: the check sees the weights' layout, not only the size."""
    from edge.exporters import ExportValidationError
    from edge.exporters.iphone.compression import STORAGES, Compression
    from edge.exporters.iphone.coreai import simulated as coreai_simulated
    from edge.exporters.iphone.coreai.package import export_block, stored_precision
    from edge.exporters.iphone.coreml.package import cut_for_device

    blocks = {b.key: b for bs in cut_for_device(tiny_sora).values() for b in bs}
    block = blocks["text_encoder/embeddings"]
    int4 = stored_precision(Compression("int4", (("*", STORAGES["int4-b32"]),), 0.0),
                            tiny_sora)
    check = export_block(block, tmp_path / "ok", int4)["validation"]
    assert check["simulated"]["weights"] == 1
    # the table's 4 bits (5.8e-2 off float32) are the simulation's: 1.1e-3 is float16's
    assert check["simulated"]["relative_error"] < check["relative_error"] / 10, check
    monkeypatch.setitem(coreai_simulated.QRANGE, "int4", 1)
    with pytest.raises(ExportValidationError, match=r"block text_encoder/embeddings: .*int4 "
                       r"weights simulated by .* the program does not compute with"):
        export_block(block, tmp_path / "off", int4)


def test_a_family_rule_core_ai_cannot_store_is_refused_naming_the_form(tiny_sora):
    """tiny-sora's `4` keeps its embedding table as 4-bit lookup tables, which coreai-opt's
    k-means does not store faithfully; a rule that stores some tensors of a block otherwise
    (Open-Sora's cross-attention) cannot be said to Core AI's whole-program passes. Both are
    refused by name before any work."""
    from types import SimpleNamespace

    from edge.exporters.iphone.coreai.package import stored_precision
    from edge.graph.family_model import StorageRule

    with pytest.raises(ValueError, match="tiny-sora's rule stores text_encoder/embeddings as "
                       "4-bit lookup tables"):
        stored_precision("4", tiny_sora)
    mixed = SimpleNamespace(family="mixed", device_storage={"4": StorageRule(
        (("*", "int4-b32"),), psnr_floor_db=35.0, note="",
        tensors=(("transformer/*", "*cross_attn*", "int8"),))})
    with pytest.raises(ValueError, match="stores some tensors of a block in another form "
                       r"\(\*cross_attn\* of transformer/\*\)"):
        stored_precision("4", mixed)


def test_a_program_that_computes_nan_fails_its_check():
    """A NaN in an executed output is an error of its own (not dropped by max(): a palettized
    program computed NaN where the check had read 0)."""
    from types import SimpleNamespace

    from edge.exporters.iphone.coreai.package import PRECISIONS, executed_error

    block = SimpleNamespace(key="c/b", outputs=("y", "z"))
    want = (torch.ones(2, 3), torch.ones(2))
    got = {"y": np.full((2, 3), np.nan, np.float32), "z": np.ones(2, np.float32)}
    check = executed_error(got, block, want, PRECISIONS["fp16"], 0.0)
    assert np.isnan(check["relative_error"]) and not check["relative_error"] <= 1.0


class _Sorts(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


def test_a_block_core_ai_cannot_convert_is_named_with_its_operator(tmp_path):
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_block

    block = _block(_Sorts(), "sorter", torch.randn(2, 8))
    with pytest.raises(ExportValidationError, match=r"block test/sorter: Core AI cannot "
                       r"convert it: .*aten\.sort"):
        export_block(block, tmp_path, PRECISIONS["fp32"])


class _KeepsAFloat32Table(nn.Module):
    """A plain float32 tensor (not a buffer: .half() leaves it) mixed into a half graph."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 3)
        self.table = torch.ones(8)

    def forward(self, x):
        return self.conv(x * self.table)


def test_a_graph_torch_cannot_capture_is_named_without_a_traceback(tmp_path):
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_block

    block = _block(_KeepsAFloat32Table(), "mixed", torch.randn(1, 2, 8))
    with pytest.raises(ExportValidationError, match=r"block test/mixed: torch.export cannot "
                       r"capture its fp16 graph for Core AI: RuntimeError: .*type"):
        export_block(block, tmp_path, PRECISIONS["fp16"])


def test_open_soras_fp16_programs_keep_the_timestep_in_float32(tmp_path, opensora_model):
    """At fp16 the timestep input stays float32 into its sinusoid (a float16 t*1000 is 0.5
    apart near 1000: the prologue executed 3.45e-2 from PyTorch, over the tolerance); the
    temporal decoder's scale and shift follow its input's dtype."""
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_blocks
    from edge.exporters.iphone.coreml.package import cut_for_device

    blocks = {b.key: b for bs in cut_for_device(opensora_model).values() for b in bs}
    chosen = [blocks["transformer/prologue"], blocks["vae_decoder/temporal"]]
    records = export_blocks(chosen, tmp_path, PRECISIONS["fp16"])
    errors = {b.key: r["validation"]["relative_error"]
              for b, r in zip(chosen, records, strict=True)}
    assert errors["transformer/prologue"] < 5e-3, errors
    assert errors["vae_decoder/temporal"] < 5e-3, errors


def test_a_crash_in_core_ai_names_the_block_and_writes_nothing(tmp_path, monkeypatch,
                                                              tiny_sora):
    """A converter that ends by a signal (as beta native code can) is an error naming the
    block; the package is not written."""
    import edge.exporters.iphone.coreai.pool as pool

    crash = tmp_path / "crash.py"
    crash.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {crash}\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(pool, "WORKER_PYTHON", str(python))
    dest = tmp_path / "pkg"
    with pytest.raises(ExportValidationError, match="block text_encoder/embeddings: Core AI's "
                       "converter or runtime ended by SIGABRT"):
        coreai_export(tiny_sora, dest)
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pkg")]


def _cli(*args: str):
    from typer.testing import CliRunner

    from edge.commands import app

    return CliRunner().invoke(app, ["export", "--target", "iphone", "--min-ios", "27", *args])


@pytest.mark.parametrize("args, message", [
    (["--quantize", "6"], "--quantize '6' with --min-ios 27: Core AI packages take fp32, "
                          "fp16, 8, 4"),
    (["--quantize", "4"], "tiny-sora's rule stores text_encoder/embeddings as 4-bit lookup "
                          "tables"),
])
def test_options_the_core_ai_layout_does_not_take_are_refused(tmp_path, args, message):
    result = _cli(*args, "-o", str(tmp_path / "pkg"))
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "pkg").exists()


def test_the_dry_run_prints_the_blocks_at_the_stored_precision(tmp_path):
    result = _cli("--dry-run", "-o", str(tmp_path / "pkg"))
    assert result.exit_code == 0, result.output
    assert "fp16 MiB" in result.output and "transformer/pair_0" in result.output
    assert "(+tdtm function)" in result.output
    assert not (tmp_path / "pkg").exists()


def test_the_dry_run_plans_the_budget_in_the_stored_bytes(tmp_path):
    """--memory-budget re-cuts the device blocks as the Core ML layouts do, counting what each
    Core AI program stores at the setting: 24 MB merges pairs at fp16 and cannot hold the fp32
    embedding table; nothing is written."""
    result = _cli("--dry-run", "--memory-budget", "24MB", "-o", str(tmp_path / "pkg"))
    assert result.exit_code == 0, result.output
    assert "residency on the device at 24.0 MiB (stored fp16 bytes" in result.output
    assert "<- pair_0, pair_1, pair_2" in result.output
    result = _cli("--dry-run", "--memory-budget", "24MB", "--quantize", "fp32",
                  "-o", str(tmp_path / "pkg"))
    assert result.exit_code != 0
    assert "smaller than block text_encoder/embeddings (45.5 MiB)" in result.output
    assert not (tmp_path / "pkg").exists()


@pytest.mark.slow  # an export of its own (~90 s)
def test_a_package_for_a_budget_is_recut_and_runs_under_it(coreai_package, tiny_sora, tmp_path):
    """At 48 MB of fp32 programs the device cut merges pairs 0-2 (their TDTM functions with
    them) and the first decoder stages; each merged program is executed at export, the
    manifest records the plan, and the Python runtime generates under the budget what the
    package cut as usual generates."""
    from edge.runtimes.python import BudgetError, Pipeline

    budget = 48 << 20
    root = tmp_path / "budgeted"
    manifest = coreai_export(tiny_sora, root, memory_budget=budget)
    assert manifest["plan"]["memory_budget_bytes"] == budget
    assert manifest["plan"]["blocks"]["transformer/pair_0-2"] == ["pair_0", "pair_1", "pair_2"]
    merged = next(b for c in manifest["components"] for b in c["blocks"]
                  if b["name"] == "pair_0-2")
    assert "tdtm" in merged["variants"]
    assert merged["validation"]["relative_error"] <= merged["validation"]["tolerance"]

    def video(package, **load):  # the frames and the loader's figures
        runtime = Pipeline.load(package, **load)
        try:
            frames = runtime.generate("a red circle moving left", seed=3, steps=3)
            return np.asarray(frames, dtype=np.float32), runtime.loader.stats
        finally:
            runtime.close()

    with pytest.warns(EdgeNotice, match="does not bound what they hold"):
        got, stats = video(root, memory_budget=budget)
    want, _ = video(coreai_package[0])
    assert (stats.reads, stats.peak_held_bytes) == (0, 0)   # the programs hold the weights
    assert psnr(got, want) >= 60 and snr(got, want) >= 40
    # still planned with the programs' bytes: a budget under the largest is refused up front
    with pytest.raises(BudgetError, match="smaller than block text_encoder/embeddings"):
        Pipeline.load(root, memory_budget=8 << 20)


@pytest.mark.slow
def test_a_core_ai_record_must_name_an_aimodel(coreai_package, tmp_path):
    import shutil

    from manifest_edits import rewrite

    from edge.core.package import PackageError, read_package

    root, _ = coreai_package
    bad = tmp_path / "pkg"
    shutil.copytree(root, bad)
    rewrite(bad, lambda m: m["components"][0]["blocks"][0].update(
        model="models/text_encoder/embeddings.mlpackage"))
    with pytest.raises(PackageError, match="is not an .aimodel"):
        read_package(bad)


def _truncated_program(root, tmp_path, keep: int, hash_too: bool):
    """A copy of the package whose transformer pair_0 program keeps `keep` bytes of its
    bytecode (negative: drops that many), the manifest's digests rewritten to match the cut
    file (and Core AI's own main.hash too where `hash_too`), as a faulty copy tool or a
    careless hand would leave it: every size and sha256 check passes."""
    import hashlib
    import shutil

    from manifest_edits import block_record, rewrite

    bad = tmp_path / f"cut{keep}{'h' if hash_too else ''}"
    shutil.copytree(root, bad)
    program = bad / "models" / "transformer" / "pair_0.aimodel"
    data = (program / "main.mlirb").read_bytes()
    data = data[:keep]
    (program / "main.mlirb").write_bytes(data)
    if hash_too:
        (program / "main.hash").write_bytes(hashlib.sha256(data).digest())

    def redigest(m):
        record = block_record(m, "transformer", "pair_0")
        for f in record["files"]:
            body = (bad / f["path"]).read_bytes()
            f.update(bytes=len(body), sha256=hashlib.sha256(body).hexdigest())
        record["weight_bytes"] = len(data)

    rewrite(bad, redigest)
    return bad


GENERATE_ONE_STEP = ("import sys; from edge.runtimes.python import Pipeline; "
                     "Pipeline.load(sys.argv[1]).generate('a cat', steps=1)")


def test_a_truncated_program_is_refused_before_core_ai_aborts_on_it(coreai_package, tmp_path):
    """A Core AI program cut short, the manifest's digests rewritten to match: Core AI's
    runtime aborts the process on it (SIGABRT, nothing said: item 18). The runtime refuses it
    first, naming the file: Core AI's own main.hash disagrees with the manifest, or, that
    rewritten too, the bytecode's sections do not cover the file."""
    import signal
    import subprocess

    from edge.core.mlir_bytecode import sections
    from edge.core.package import PackageError, read_package
    from edge.runtimes.python import Pipeline

    root, _ = coreai_package
    cut_hashed = _truncated_program(root, tmp_path, -1000, hash_too=True)
    read_package(cut_hashed)  # every size and digest agrees: the bytes alone are wrong
    # the abort the check prevents, in a process of its own (the check skipped)
    skipped = ("import edge.runtimes.python.coreai_session as c; "
               "c.check_program = lambda *a: None; ")
    ended = subprocess.run([sys.executable, "-c", skipped + GENERATE_ONE_STEP,
                            str(cut_hashed)], capture_output=True, timeout=600)
    assert ended.returncode == -signal.SIGABRT, ended.stderr[-500:]

    with pytest.raises(PackageError, match=r"pair_0.aimodel/main.mlirb: not a whole Core AI "
                       r"program \(block transformer/pair_0\): the bytecode ends \d+ bytes "
                       r"before the end of section \d+ .*truncated"):
        Pipeline.load(cut_hashed)
    cut = _truncated_program(root, tmp_path, -1000, hash_too=False)
    with pytest.raises(PackageError, match="pair_0.aimodel/main.mlirb: its sha256 in the "
                       "manifest is not the one Core AI wrote beside it in main.hash"):
        Pipeline.load(cut)
    # a cut on a section's boundary leaves whole sections, not every one a module has
    program = root / "models" / "transformer" / "pair_0.aimodel" / "main.mlirb"
    _, found = sections(program)
    last, header_at, _ = found[-1]
    on_boundary = _truncated_program(root, tmp_path, header_at, hash_too=True)
    with pytest.raises(PackageError, match=rf"the bytecode has no .*\({last}\) section"):
        Pipeline.load(on_boundary)


@pytest.mark.slow
def test_merged_steps_run_the_blocks_tdtm_functions(coreai_package, exported_package):
    """With --merge-steps the pairs run their TDTM function (a function of the pair's model,
    by name): the Core AI video is the ONNX package's merged one, not the unmerged one."""
    from edge.runtimes.python import Pipeline

    def run(root, **overrides):
        pipe = Pipeline.load(root)
        try:
            return pipe.generate(PROMPT, seed=2, steps=6, **overrides), pipe.last_run
        finally:
            pipe.close()

    got, figures = run(coreai_package[0], merge_steps=3)
    want, _ = run(exported_package[0], merge_steps=3)
    unmerged, _ = run(exported_package[0])
    assert figures["sampler"]["merged_calls"] == 3
    assert psnr(got, want) >= 40 and snr(got, want) >= 25
    assert psnr(got, want) > psnr(unmerged, want) + 10


# case -> (the session's models fixture, its key or None, the bound on every program's
# relative error at fp32): each family's tiny folder as the other targets' tests load it
# (tests/conftest.py); Open-Sora's decoder up blocks measure 2.9e-5. Wan 2.1's VAE tiles its
# 4 x 6 latents (conftest WAN_TILING), so its decoder runs a program per tile size; its
# package is the session's (the Swift runtime replays it too)
FAMILIES = {"wan2.1-tiled": ("wan_tiled", None, 1e-5), "wan2.2": ("wan22", None, 1e-5),
            "cogvideox-5b": ("cog_models", "5b", 1e-5),
            "ltx-timestep": ("ltx_models", "timestep", 1e-5),
            "opensora": ("opensora_model", None, 5e-5)}
SHARED_PACKAGES = {"wan2.1-tiled": "wan_tiled_coreai_package"}


@pytest.mark.slow
@pytest.mark.parametrize("case", FAMILIES)
def test_each_family_executes_through_core_ai_and_generates_its_pipelines_video(
        request, tmp_path, case):
    """Every block and variant of each family (Wan's and CogVideoX's chunked decoders with
    their first-piece functions, Wan 2.1's tiles, LTX's timestep-conditioned decoder)
    executed through Core AI within float32 rounding, and the package generated through Core
    AI against the family's diffusers pipeline (Wan 2.1's VAE tiling alike)."""
    fixture, key, bound = FAMILIES[case]
    model = request.getfixturevalue(fixture)
    model = model[key] if key else model
    if case in SHARED_PACKAGES:
        _, manifest = request.getfixturevalue(SHARED_PACKAGES[case])
    else:
        manifest = coreai_export(model, tmp_path / "pkg")
    for where, record in _records(manifest):
        assert record["validation"]["relative_error"] <= bound, (where, record["validation"])
    check = manifest["validation"]
    assert check["identical"] or (check["psnr_db"] >= 35 and check["snr_db"] >= 20), check


@pytest.mark.slow
def test_each_tile_size_runs_its_own_core_ai_functions(wan_tiled_coreai_package, wan_tiled):
    """The tiled decoder's stages are traced at the first tile (4 x 4 latents), the 4 x 2
    tile's programs are functions of each stage's model; the video Core AI generates is
    WanPipeline's with the same tiling, which its untiled video is not."""
    from edge.runtimes.python import Pipeline

    root, manifest = wan_tiled_coreai_package
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert decoder["tiles"] == {"latent_size": [4, 4], "latent_stride": [4, 2], "scale": 8}
    for block in decoder["blocks"]:
        assert set(block["variants"]) == {"first", "tile_4x2", "first_tile_4x2"}
        assert {v["model"] for v in block["variants"].values()} == {block["model"]}
    pipe = Pipeline.load(root)
    try:
        got = pipe.generate(PROMPT, seed=3, steps=2)[0]
    finally:
        pipe.close()
    want = wan_tiled.generate(PROMPT, seed=3, steps=2)[0]
    vae = wan_tiled.pipe.vae
    vae.disable_tiling()
    try:
        whole = wan_tiled.generate(PROMPT, seed=3, steps=2)[0]
    finally:
        vae.enable_tiling(*WAN_TILING)
    assert psnr(got, want) >= 40 and snr(got, want) >= 25
    assert psnr(whole, want) < 35


@pytest.mark.slow
def test_edge_record_records_the_executed_programs(coreai_package, tmp_path):
    """A conformance bundle of a Core AI package holds the calls Core AI's runtime made (no
    model folder: the programs run themselves), TDTM functions by their variant keys, and
    the frames the Core AI generation gives."""
    from edge.commands.record import RECORDED_WITH_CORE_AI, RecordError, record_bundle
    from edge.core.bundle import Bundle
    from edge.runtimes.python import Pipeline

    root, manifest = coreai_package
    info = record_bundle(root, PROMPT, tmp_path / "b", seed=4, overrides={"steps": 3,
                                                                          "merge_steps": 1})
    assert info["recorded_with"] == RECORDED_WITH_CORE_AI
    bundle = Bundle(tmp_path / "b")
    keys = [c["key"] for c in bundle.calls]
    assert sum(k.endswith("#tdtm") for k in keys) == 4     # the 4 pairs' merged first step
    assert sum(k.startswith("transformer/pair_") for k in keys) == 4 * 3
    pipe = Pipeline.load(root)
    try:
        video = pipe.generate(PROMPT, seed=4, steps=3, merge_steps=1)
    finally:
        pipe.close()
    assert np.array_equal(bundle.frames, video[0])
    with pytest.raises(RecordError, match="only a CoreML iphone package needs"):
        record_bundle(root, PROMPT, tmp_path / "c", model_folder=tmp_path)


def test_the_runtime_runs_where_an_event_loop_is_running(coreai_package):
    """Core AI's API is asynchronous and the runtime runs it on an event loop of its own
    thread, so a caller whose thread runs a loop (a notebook, Playwright's synchronous API)
    generates as any other: asyncio.Runner refuses to start inside a running loop. The
    caller's loop runs on a thread of the test's own (this worker's main thread may already
    run one: the browser tests' Playwright)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from edge.runtimes.python import Pipeline

    async def inside_a_running_loop():
        pipe = Pipeline.load(coreai_package[0])
        try:
            return pipe.generate(PROMPT, seed=5, steps=2)
        finally:
            pipe.close()

    with ThreadPoolExecutor(1) as caller:
        video = caller.submit(asyncio.run, inside_a_running_loop()).result()
    assert video.shape[0] == 1 and video.dtype == np.uint8 and video.std() > 0
