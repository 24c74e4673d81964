"""How a web package stores its weights (exporters/web/storage.py): each form's decoding, the
weights file's table, the manifest's check of it, the wasm graph that decodes in itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge.exporters.web.storage import (
    HALF_MAX,
    INT4_GROUP,
    INT8_MIN_ELEMENTS,
    SCALE_SUFFIX,
    check_form,
    store,
    stored_bytes,
    write_stored,
)


def test_half_is_exact_widening_and_keeps_what_half_cannot_hold_in_float32():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    w[0, 1] = 3e-5  # rounds to a half's subnormal, which is stored as zero
    got = store("w", w, "fp16")
    assert got.data.dtype == np.float16 and got.scale is None
    expected = w.numpy().astype(np.float16).astype(np.float32)
    assert expected[0, 1] != 0
    expected[np.abs(expected) < 2.0**-14] = 0
    assert np.array_equal(got.decoded, expected)
    big = w.clone()
    big[0, 0] = 2 * HALF_MAX
    assert store("big", big, "fp16").data.dtype == np.float32
    tiny = torch.full((8,), 1e-6)  # a half's subnormal: stored as zero (WGSL may flush it)
    assert not store("tiny", tiny, "fp16").decoded.any()


def test_int8_rows_decode_within_half_a_step_of_their_scale():
    w = torch.randn(128, 64) * torch.linspace(0.01, 10, 128)[:, None]  # rows of every size
    w[5] = 0  # a zero row decodes to zeros
    got = store("w", w, "8")
    assert got.data.dtype == np.int8 and got.scale.shape == (128,)
    assert np.abs(got.data).max() == 127 and got.data.min() >= -127
    error = np.abs(got.decoded - w.numpy()).max(axis=1)
    assert (error <= got.scale * 0.5 * (1 + 1e-5)).all()
    assert not got.decoded[5].any()
    # what stays half in an int8 package: vectors, and tensors too small to be worth a scale
    assert store("bias", torch.randn(4096), "8").data.dtype == np.float16
    assert store("small", torch.randn(8, 8), "8").data.dtype == np.float16
    assert INT8_MIN_ELEMENTS > 64


def test_int4_groups_decode_within_half_a_step_of_their_scale():
    """A matrix's rows in groups of 32 inputs, each group's values -7..7 times its scale, two
    a byte (offset by 8, the first in the low nibble); a group of zeros decodes to zeros; what
    int4 does not fit (a convolution's kernel, rows not splitting into groups) is int8 by row,
    the small rest half."""
    from edge.exporters.web.storage import INT4_OFFSET, unpack_nibbles

    gen = torch.Generator().manual_seed(1)
    w = torch.randn(96, 128, generator=gen) * torch.linspace(0.01, 10, 128)  # groups of every size
    w[3, :INT4_GROUP] = 0
    got = store("w", w, "4")
    assert got.dtype == "int4" and got.shape == (96, 128) and got.data.dtype == np.uint8
    assert got.data.shape == (96 * 128 // 2,) and got.scale.shape == (96, 128 // INT4_GROUP)
    assert got.scale.dtype == np.float16 and got.scale.min() >= 2.0**-14  # normal halves
    nibbles = unpack_nibbles(got.data).astype(int) - INT4_OFFSET
    assert nibbles.min() >= -7 and nibbles.max() == 7
    assert nibbles[0] == np.rint(w[0, 0].item() / got.scale[0, 0])  # the low nibble first
    error = np.abs(got.decoded - w.numpy()).reshape(96, -1, INT4_GROUP).max(axis=2)
    assert (error <= got.scale.astype(np.float32) * 0.5 * (1 + 1e-5)).all()
    # each group's step is its largest value / 7 rounded up to a half: within 0.1% of it
    step = np.abs(w.numpy()).reshape(96, -1, INT4_GROUP).max(axis=2) / 7
    assert (got.scale[4:] >= step[4:]).all() and (got.scale[4:] <= step[4:] * 1.001).all()
    assert not got.decoded[3, :INT4_GROUP].any()
    assert store("conv", torch.randn(64, 16, 3, 3), "4").dtype == "int8"
    assert store("odd", torch.randn(128, 48), "4").dtype == "int8"  # 48 inputs: no groups of 32
    assert store("bias", torch.randn(4096), "4").dtype == "float16"


def test_dry_run_sizes_match_what_is_stored():
    for shape in [(4096,), (64, 64), (256, 16, 3), (8, 8), (128, 48)]:
        t = torch.randn(shape)
        for form in ("fp32", "fp16", "8", "4"):
            stored = store("t", t, form)
            assert stored_bytes(t, form) == sum(a.nbytes for a in stored.arrays().values())


def test_the_weights_table_names_each_int8_tensors_scales(tmp_path):
    from edge.core.manifest_schema import PackageError, _check_weights

    stored = [store("a.weight", torch.randn(96, 64), "8"), store("a.bias", torch.randn(96), "8")]
    table = write_stored(tmp_path / "w.bin", stored)
    assert [t["name"] for t in table] == ["a.weight", "a.weight" + SCALE_SUFFIX, "a.bias"]
    assert table[0]["dtype"] == "int8" and table[0]["scale"] == "a.weight" + SCALE_SUFFIX
    raw = (tmp_path / "w.bin").read_bytes()
    for t, arrays in zip(table, [stored[0].data, stored[0].scale, stored[1].data], strict=True):
        assert raw[t["offset"]:t["offset"] + t["bytes"]] == arrays.tobytes()
    block = {"files": [{"path": "w.bin"}], "weights": {"path": "w.bin", "tensors": table}}
    files = {"w.bin": {"bytes": len(raw)}}
    _check_weights(block, files, "block x")
    table[0]["scale"] = "a.bias"  # a scale of the wrong shape and dtype
    with pytest.raises(PackageError, match="'a.weight'.*its scale 'a.bias' must be a float32 "
                       r"tensor of the block of shape \[96\]"):
        _check_weights(block, files, "block x")
    table[0]["scale"] = "a.weight" + SCALE_SUFFIX
    table[2]["scale"] = "a.weight" + SCALE_SUFFIX  # a half has no scale
    with pytest.raises(PackageError, match="'a.bias': only an int8 tensor"):
        _check_weights(block, files, "block x")


def test_the_weights_table_gives_an_int4_tensor_its_shape_group_and_scales(tmp_path):
    from edge.core.manifest_schema import PackageError, _check_weights, fed_as

    stored = [store("a.weight", torch.randn(64, 96), "4")]
    table = write_stored(tmp_path / "w.bin", stored)
    assert table[0] | {"offset": 0} == {"name": "a.weight", "dtype": "int4", "shape": [64, 96],
                                        "offset": 0, "bytes": 64 * 96 // 2,
                                        "scale": "a.weight" + SCALE_SUFFIX, "group": INT4_GROUP}
    assert table[1]["shape"] == [64, 3] and fed_as(table[0]) == ("uint8", [64 * 96 // 2])
    raw = (tmp_path / "w.bin").read_bytes()
    block = {"files": [{"path": "w.bin"}], "weights": {"path": "w.bin", "tensors": table}}
    files = {"w.bin": {"bytes": len(raw)}}
    _check_weights(block, files, "block x")
    table[0]["group"] = 64  # 96 inputs do not split into groups of 64
    with pytest.raises(PackageError, match="'a.weight': group 64 does not divide its rows of 96"):
        _check_weights(block, files, "block x")
    table[0]["group"] = 16  # groups that disagree with the scales' shape
    with pytest.raises(PackageError, match=r"must be a float16 tensor of the block of shape "
                       r"\[64, 6\]"):
        _check_weights(block, files, "block x")
    del table[0]["scale"], table[0]["group"]
    with pytest.raises(PackageError, match="'a.weight': an int4 tensor needs its scales"):
        _check_weights(block, files, "block x")


def test_an_unknown_form_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="--quantize '3': the web target stores weights as "
                       "fp32, fp16, 8, 4"):
        check_form("3")


@pytest.mark.parametrize("form", ["fp16", "8", "4"])
def test_the_wasm_graph_takes_the_stored_tensors_and_decodes_them(tmp_path, form):
    """The wasm path's ONNX graph of a block fed its stored arrays gives the block's outputs
    with the decoded weights; the graph's weight inputs have the stored dtypes."""
    import onnx

    from edge.exporters.shared.onnx_graph import export_graph, validate_block
    from edge.exporters.web.storage import (
        graph_weights,
        run_decoded,
        stored_arrays,
        stored_weights,
    )
    from edge.graph.blocks import Block

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                 torch.nn.Linear(128, 32))
    block = Block("transformer", "mlp", module, ["x"], ["y"], (torch.randn(2, 64),),
                  dynamic_batch=[False])
    stored = stored_weights(block, form)
    path = tmp_path / "mlp.onnx"
    export_graph(block, path, fused_attention=False, weight_inputs=graph_weights(block, stored))
    feeds = stored_arrays(stored)
    want = run_decoded(block, stored)
    assert validate_block(block, path, want, feeds)["max_abs_error"] < 1e-5
    kinds = {i.name: i.type.tensor_type.elem_type for i in onnx.load(path).graph.input}
    expect = {"fp16": onnx.TensorProto.FLOAT16, "8": onnx.TensorProto.INT8,
              "4": onnx.TensorProto.UINT8}[form]  # int4: its packed bytes
    assert kinds["0.weight"] == expect and kinds["x"] == onnx.TensorProto.FLOAT
    scale = {"fp16": None, "8": onnx.TensorProto.FLOAT, "4": onnx.TensorProto.FLOAT16}[form]
    assert kinds.get("0.weight" + SCALE_SUFFIX) == scale
    # storing costs something, but little (int4 on random weights: a tenth of the output)
    full = block.run(*block.example)[0]
    bound = {"fp16": 0.01, "8": 0.05, "4": 0.2}[form]
    assert 0 < (want[0] - full).abs().max() < bound * full.abs().max()


def test_a_scalar_weight_stays_a_scalar(tmp_path):
    """A 0-d parameter (LTX's timestep_scale_multiplier) keeps its shape in the table and the
    graph's example: onnxruntime refuses a feed of another rank."""
    stored = [store("s", torch.tensor(1000.0), "fp16")]
    assert write_stored(tmp_path / "w.bin", stored)[0]["shape"] == []
    from edge.exporters.web.storage import graph_weights
    from edge.graph.blocks import Block

    block = Block("transformer", "s", torch.nn.Linear(2, 2), ["x"], ["y"], (torch.ones(1, 2),))
    assert graph_weights(block, stored)[2][0].dim() == 0


def test_the_web_4_is_the_familys_rule_with_the_webs_nearest_forms(tiny_sora):
    """tiny-sora's `--quantize 4` (its iphone rule: a 4-bit palette for the embedding table
    and the decoder, 6 bits for the text encoder's layers, int8 for the transformer) stores
    int4 where the phone stores 4 bits and int8 where it stores 6 or 8; a family without a
    rule is refused by name, as is a rule naming a form the web lacks."""
    from edge.exporters.web.storage import web_storage
    from edge.graph.family_model import StorageRule

    storage = web_storage("4", tiny_sora)
    forms = {k: storage.form(k, "w") for k in ("text_encoder/embeddings", "text_encoder/layer_0",
                                                "transformer/pair_0", "vae_decoder/up_0")}
    assert forms == {"text_encoder/embeddings": "4", "text_encoder/layer_0": "8",
                     "transformer/pair_0": "8", "vae_decoder/up_0": "4"}
    record = storage.record()
    assert record["quantize"] == "4" and ["transformer/*", "8"] in record["blocks"]
    assert web_storage("8", tiny_sora).form("transformer/pair_0", "w") == "8"

    class NoRule:
        family, device_storage = "ltx-video", {}

    with pytest.raises(ValueError, match="--quantize 4 is worded by each family and ltx-video "
                       "models have no rule for it yet; use one of fp32, fp16, 8"):
        web_storage("4", NoRule())

    class OddRule:
        family = "odd"
        device_storage = {"4": StorageRule((("*", "lut5"),), 30.0, "")}

    with pytest.raises(ValueError, match="odd's --quantize 4 names stored form 'lut5'"):
        web_storage("4", OddRule())


def test_a_tensor_rule_overrides_its_blocks(tiny_sora):
    from edge.exporters.web.storage import WebStorage
    from edge.graph.family_model import StorageRule

    rule = StorageRule((("transformer/*", "lut4"),), 30.0, "",
                       tensors=(("transformer/*", "*cross*", "int8"),))
    storage = WebStorage("4", rule)
    assert storage.form("transformer/pair_0", "a.cross_attn.q.weight") == "8"
    assert storage.form("transformer/pair_0", "a.self_attn.q.weight") == "4"
    assert storage.form("vae_decoder/up_0", "w") == "fp16"  # no rule names it


def test_a_setting_under_its_floor_is_refused_before_anything_is_written(tmp_path, tiny_sora):
    """The export's end-to-end check renders with the decoded weights first: a rule whose
    floor the video misses stops the export with the figures, and no package is left."""
    from edge.exporters import ExportValidationError
    from edge.exporters.web.package import export_web
    from edge.exporters.web.storage import WebStorage
    from edge.graph.family_model import StorageRule

    strict = WebStorage("4", StorageRule((("*", "lut4"),), 99.0, "every block at 4 bits"))
    dest = tmp_path / "pkg"
    with pytest.raises(ExportValidationError, match=r"end to end: with weights stored as 4 the "
                       r"video differs from fp32 PyTorch by PSNR \d+\.\d dB < 99 dB"):
        export_web(tiny_sora, dest, form=strict, validate_end_to_end=True)
    assert not dest.exists() and not list(tmp_path.iterdir())
    # and the model has its own weights back
    from edge.exporters.web.check import end_to_end_check

    steps = []  # the check's progress: both renders' steps, counted as one run
    fine = end_to_end_check(tiny_sora, tiny_sora.cut(tiny_sora.shapes("web")), WebStorage("fp32"),
                            on_step=lambda done, total: steps.append((done, total)))
    assert fine["identical"] and fine["psnr_db"] is None
    total = 2 * tiny_sora.sampler.steps
    assert [d for d, _ in steps] == list(range(1, total + 1))
    assert {t for _, t in steps} == {total}
