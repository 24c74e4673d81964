"""The web target's launch plans (exporters/tvm_plan.py): a block through TVM relax to WebGPU
kernels plus a static launch plan, replayed on the CPU with TVM's llvm build of the same
kernels and compared to the PyTorch block."""

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")

from edge.families.tiny_sora import cut_text_encoder, cut_transformer  # noqa: E402
from exporters.tvm_plan import BlockCompiler, PlanError, read_plan, web_example  # noqa: E402


@pytest.fixture(scope="module")
def compiler():
    return BlockCompiler()


def _replay_error(compiled, block) -> float:
    inputs = [t.numpy() for t in web_example(block)]
    weights = [p.numpy() for p in block.parameters().values()]
    outputs = compiled.replay(inputs, weights)
    expected = [t.numpy() for t in block.run(*block.example)]
    assert [o.shape for o in outputs] == [e.shape for e in expected]
    return max(float(np.abs(o - e).max()) for o, e in zip(outputs, expected, strict=True))


def test_epilogue_plan_replays_like_pytorch(pipeline, compiler):
    block = cut_transformer(pipeline)[-1]
    compiled = compiler.compile(block)
    assert _replay_error(compiled, block) < 1e-4
    plan = compiled.plan
    assert plan.inputs == block.inputs and plan.weights == list(block.parameters())
    assert plan.calls and all(call["kernels"] for call in plan.calls)
    for call in plan.calls:
        for k in call["kernels"]:
            assert k["kernel"] in compiled.wgsl
            assert all(g >= 1 for g in k["grid"])
            assert sorted(k["bindings"]) == list(range(len(call["args"])))
            assert "@compute" in compiled.wgsl[k["kernel"]]


def test_layers_of_one_structure_share_one_compilation(pipeline, compiler):
    layers = cut_text_encoder(pipeline, batch=1)[1:3]
    first, second = compiler.compile(layers[0]), compiler.compile(layers[1])
    assert second.lowered is first.lowered and second.wgsl is first.wgsl
    # the shared plan is run with each layer's own weights
    assert _replay_error(first, layers[0]) < 1e-4
    assert _replay_error(second, layers[1]) < 1e-4


def test_plan_refuses_a_weight_list_that_does_not_match(pipeline, compiler):
    block = cut_transformer(pipeline)[-1]
    compiled = compiler.compile(block)
    with pytest.raises(PlanError, match="transformer/epilogue.*weights"):
        read_plan(compiled.lowered, block.inputs, compiled.plan.weights[:-1], block.key)


def test_export_validation_refuses_a_plan_that_drifts(pipeline, compiler):
    """The exporter's check replays the plan and compares it with the PyTorch module; a
    module that computes something else (here: other weights) fails the export."""
    import copy

    import torch

    from exporters.onnx import ExportValidationError
    from exporters.web import validate

    block = cut_transformer(pipeline)[-1]
    compiled = compiler.compile(block)
    assert validate(compiled, block, block.module, block.key) < 1e-4
    drifted = copy.deepcopy(block.module)
    with torch.no_grad():
        next(drifted.parameters()).mul_(1.01)
    with pytest.raises(ExportValidationError, match="transformer/epilogue.*differs from PyTorch"):
        validate(compiled, block, drifted, block.key)
