"""How a web package stores its weights (exporters/web_storage.py): each form's decoding, the
weights file's table, the manifest's check of it, the wasm graph that decodes in itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge.exporters.web_storage import (
    HALF_MAX,
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


def test_dry_run_sizes_match_what_is_stored():
    for shape in [(4096,), (64, 64), (256, 16, 3), (8, 8)]:
        t = torch.randn(shape)
        for form in ("fp32", "fp16", "8"):
            stored = store("t", t, form)
            assert stored_bytes(t, form) == sum(a.nbytes for a in stored.arrays().values())


def test_the_weights_table_names_each_int8_tensors_scales(tmp_path):
    from edge.manifest_schema import PackageError, _check_weights

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


def test_an_unknown_form_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="--quantize '4': the web target stores weights as "
                       "fp32, fp16, 8"):
        check_form("4")


@pytest.mark.parametrize("form", ["fp16", "8"])
def test_the_wasm_graph_takes_the_stored_tensors_and_decodes_them(tmp_path, form):
    """The wasm path's ONNX graph of a block fed its stored arrays gives the block's outputs
    with the decoded weights; the graph's weight inputs have the stored dtypes."""
    import onnx

    from edge.blocks import Block
    from edge.exporters.onnx import export_graph, validate_block
    from edge.exporters.web_storage import (
        graph_weights,
        run_decoded,
        stored_arrays,
        stored_weights,
    )

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
    expect = onnx.TensorProto.INT8 if form == "8" else onnx.TensorProto.FLOAT16
    assert kinds["0.weight"] == expect and kinds["x"] == onnx.TensorProto.FLOAT
    assert (kinds.get("0.weight" + SCALE_SUFFIX) == onnx.TensorProto.FLOAT) == (form == "8")
    # storing costs something, but little
    full = block.run(*block.example)[0]
    assert 0 < (want[0] - full).abs().max() < 0.05 * full.abs().max()


def test_a_scalar_weight_stays_a_scalar(tmp_path):
    """A 0-d parameter (LTX's timestep_scale_multiplier) keeps its shape in the table and the
    graph's example: onnxruntime refuses a feed of another rank."""
    stored = [store("s", torch.tensor(1000.0), "fp16")]
    assert write_stored(tmp_path / "w.bin", stored)[0]["shape"] == []
    from edge.blocks import Block
    from edge.exporters.web_storage import graph_weights

    block = Block("transformer", "s", torch.nn.Linear(2, 2), ["x"], ["y"], (torch.ones(1, 2),))
    assert graph_weights(block, stored)[2][0].dim() == 0
