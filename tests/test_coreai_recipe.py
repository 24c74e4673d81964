"""`--quantize auto` for the Core AI layout (exporters/iphone/coreai/recipe.py): each block's forms
simulated as coreai-opt stores them, their bytes held to what Core AI's program stores, the
recipe chosen from the measurement and rendered whole against its floor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("coreai_torch", reason="Core AI's converter (coreai-torch, the [iphone] "
                    "extra) is not installed")

from edge.exporters.iphone.coreai.recipe import (  # noqa: E402  (after the skip)
    CANDIDATES,
    chosen_precision,
    compressed_axes,
    form_name,
    recipe_check,
    simulated_forms,
)


def _blocks(model) -> dict:
    from edge.exporters.iphone.coreml.package import cut_for_device

    return {b.key: b for bs in cut_for_device(model).values() for b in bs}


def test_each_form_stores_what_coreai_opt_stores_in_fewer_bytes(tiny_sora):
    """A text-encoder layer in each form: its matrices quantized by coreai-opt's formula
    (exporters/iphone/coreai/simulated.py), everything else float16 in every form, the bytes
    falling with the bits (int8 about a quarter of fp32 with its scales, int4 per 32 inputs
    4.5 bits a weight)."""
    from edge.exporters.iphone.coreai.simulated import quantized

    block = _blocks(tiny_sora)["text_encoder/layer_0"]
    axes = compressed_axes(block)
    params = block.parameters()
    assert axes and set(axes) < set(params)   # the matrices, not the norms and biases
    forms = simulated_forms(block, CANDIDATES)
    fp32 = block.weight_bytes()
    sizes = {form: size for form, (_, size) in forms.items()}
    assert sizes["fp16"] == fp32 // 2
    assert sizes["fp16"] > sizes["int8"] > sizes["int4-b32"]
    assert 0.24 < sizes["int8"] / fp32 < 0.3 and 0.14 < sizes["int4-b32"] / fp32 < 0.2
    name = next(iter(axes))
    for form, dtype, block_size in (("int8", "int8", None), ("int4-b32", "int4", 32)):
        want = quantized(params[name].numpy(), axes[name], dtype, block_size)
        assert np.array_equal(forms[form][0][name].numpy(), want.astype(np.float32)), form
    kept = next(n for n in params if n not in axes)
    half = params[kept].half().float()
    assert all(torch.equal(stored[kept], half) for stored, _ in forms.values())
    assert not torch.equal(forms["int4-b32"][0][name], forms["int8"][0][name])


def test_the_simulated_bytes_are_the_programs(tmp_path, tiny_sora):
    """The bytes the recipe counts for int4 with a scale per 32 inputs are the weights of the
    program Core AI writes (its ops on top: tens of KB here)."""
    from edge.exporters.iphone.compression import STORAGES, Compression
    from edge.exporters.iphone.coreai.package import export_block, stored_precision

    block = _blocks(tiny_sora)["text_encoder/layer_0"]
    int4 = stored_precision(Compression("int4", (("*", STORAGES["int4-b32"]),), 0.0),
                            tiny_sora)
    record = export_block(block, tmp_path / "int4", int4)
    counted = simulated_forms(block, ["int4-b32"])["int4-b32"][1]
    assert 0.9 < counted / record["weight_bytes"] <= 1, (counted, record["weight_bytes"])


def test_form_names_are_read_back_from_a_stored_forms_record():
    from edge.exporters.iphone.compression import STORAGES

    assert form_name(None) == "fp16"
    assert form_name(STORAGES["int8"].record) == "int8"
    assert form_name(STORAGES["int4-b32"].record) == "int4-b32"


@pytest.mark.slow  # 6 blocks x 3 forms, short renders, then the recipe rendered whole
def test_auto_chooses_forms_per_block_and_the_recipe_holds_its_floor(tiny_sora):
    """tiny-sora's text encoder layers measured in coreai-opt's forms (one video, 2 steps): a
    target between all-int8 and all-int4 mixes forms, each block's rule in the Core AI
    setting; the recipe rendered whole with its simulated weights clears the floor set from
    the prediction."""
    from edge.exporters.iphone.coreml.package import cut_for_device
    from edge.exporters.iphone.coreml.recipe import VIDEOS

    layers = [b for b in cut_for_device(tiny_sora)["text_encoder"] if "layer" in b.name]
    components = {"text_encoder": layers}
    precision, setting = chosen_precision(tiny_sora, components, "auto:5x",
                                          videos=VIDEOS[:1], steps=2)
    forms = {form_name(precision.stored_form(b.key).weights) for b in layers}
    assert forms <= set(CANDIDATES) and "int4-b32" in forms, forms
    assert precision.setting == "auto:5x" and precision.dtype is torch.float16
    assert ("chosen by measurement for auto:5x: 3 forms of each of 6 blocks, each alone on 1 "
            "videos") in setting.note
    assert [r["blocks"] for r in precision.record["rules"]][:6] == [b.key for b in layers]
    stored = sum(simulated_forms(b, [f])[f][1] for b in layers
                 for f in [form_name(precision.stored_form(b.key).weights)])
    assert stored <= sum(b.weight_bytes() for b in layers) / 5
    check = recipe_check(tiny_sora, components, precision, setting, steps=2)
    assert check["psnr_db"] is None or check["psnr_db"] >= setting.psnr_floor_db
    assert check["measures"] == "coreai-opt's stored weights simulated in fp32 PyTorch"


def test_the_dry_run_counts_auto_at_fp16_and_says_how_it_is_chosen(tmp_path):
    from typer.testing import CliRunner

    from edge.commands import app

    args = ["export", "--target", "iphone", "--min-ios", "27", "--dry-run",
            "-o", str(tmp_path / "pkg")]
    result = CliRunner().invoke(app, [*args, "--quantize", "auto:7x"])
    assert result.exit_code == 0, result.output
    assert "of Core AI models at fp16 for iOS 27" in result.output
    assert ("--quantize auto:7x: each block's stored form is chosen at export by measurement "
            "(3 forms x 17 blocks, coreai-opt's weights simulated") in result.output
    result = CliRunner().invoke(app, [*args, "--quantize", "auto:small"])
    assert result.exit_code != 0
    assert "the target after 'auto:' is a worst-video PSNR" in result.output
    assert not (tmp_path / "pkg").exists()
