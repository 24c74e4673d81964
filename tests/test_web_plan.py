"""The web target's launch plans (exporters/web/tvm_plan.py): a block through TVM relax to WebGPU
kernels plus a static launch plan, replayed on the CPU with TVM's llvm build of the same
kernels and compared to the PyTorch block."""

import numpy as np
import pytest
import torch

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")

from edge.exporters.web.tvm_plan import BlockCompiler, PlanError, read_plan, web_example  # noqa: E402
from edge.families.tiny_sora.family import cut_text_encoder, cut_transformer  # noqa: E402
from edge.graph.blocks import Block  # noqa: E402


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


def test_the_optimizing_llvm_build_is_kept_for_blocks_with_real_work(pipeline, compiler):
    from edge.exporters.web.tvm_plan import OPTIMIZED_REPLAY_FLOPS, replay_target

    assert replay_target(OPTIMIZED_REPLAY_FLOPS - 1).attrs["opt-level"] == 0
    assert "opt-level" not in replay_target(OPTIMIZED_REPLAY_FLOPS).attrs
    block = cut_transformer(pipeline)[-1]
    compiled = compiler.compile(block)
    inputs = [t.numpy() for t in web_example(block)]
    weights = [p.numpy() for p in block.parameters().values()]
    quick = compiled.replay(inputs, weights, flops=0)
    optimized = compiled.replay(inputs, weights, flops=OPTIMIZED_REPLAY_FLOPS)
    assert len(compiled.built) == 2  # one build per optimization level, kept for the next
    for a, b in zip(quick, optimized, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


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


def test_a_shared_compilation_offers_the_same_kernel_choices(pipeline, compiler):
    """Pairs of one structure: the second, compiled from the first's kernels, offers the page
    the same alternative schedules to time (a compilation kept from an earlier export, too)."""
    pairs = cut_transformer(pipeline)[1:3]
    first, second = compiler.compile(pairs[0]), compiler.compile(pairs[1])
    assert second.lowered is first.lowered
    assert any("choices" in call for call in first.plan.calls)
    assert [c.get("choices") for c in second.plan.calls] == [
        c.get("choices") for c in first.plan.calls]


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

    from edge.exporters import ExportValidationError
    from edge.exporters.web.package import validate
    from edge.exporters.web.storage import stored_weights

    block = cut_transformer(pipeline)[-1]
    compiled = compiler.compile(block)
    stored = stored_weights(block, "fp32")
    record = validate(compiled, block, stored, block.reference(), block.key)
    assert record["max_abs_error"] < 1e-4 * max(1.0, record["reference_max_abs"])
    drifted = copy.deepcopy(block.module)
    with torch.no_grad():
        next(drifted.parameters()).mul_(1.01)
        drifted_outputs = (drifted(*block.example),)
    with pytest.raises(ExportValidationError, match="transformer/epilogue.*differs from PyTorch"):
        validate(compiled, block, stored, drifted_outputs, block.key)


@pytest.fixture(scope="module")
def wan_web_blocks(wan_model):
    """The tiny Wan's blocks at the web's shapes: {key: Block}."""
    return {b.key: b for blocks in wan_model.cut(wan_model.shapes("web")).values()
            for b in blocks}


def test_umt5_position_buckets_become_an_int32_constant(wan_web_blocks, compiler):
    """A UMT5 layer computes its relative position buckets with int64 arithmetic on aranges,
    which WGSL cannot hold: they depend only on the static length, so they are computed at
    export into one int32 constant (length² entries) and no kernel computes with 64 bits."""
    block = wan_web_blocks["text_encoder/layer_0"]
    compiled = compiler.compile(block)
    assert _replay_error(compiled, block) < 1e-4
    tokens = block.example[0].shape[1]
    assert [c.dtype for c in compiled.plan.constants if c.size == tokens * tokens] == [np.int32]
    assert not any("i64" in wgsl for wgsl in compiled.wgsl.values())


@pytest.mark.parametrize("key", ["vae_decoder/head", "vae_decoder/up_1"])
def test_wan_decoder_stages_and_their_first_frame_variants_replay(wan_web_blocks, compiler, key):
    """A causal decoder stage takes its caches (x[:, :, -1:] slices, imported as int64
    indices) and gives them back; its first-frame variant takes none."""
    block = wan_web_blocks[key]
    first = block.variant("first")
    assert len(first.inputs) == 1 < len(block.inputs)
    for b in (block, first):
        assert _replay_error(compiler.compile(b), b) < 1e-4


class _Erfinv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.erfinv(self.linear(x).tanh())


class _Argmax(_Erfinv):
    def forward(self, x):
        return self.linear(x).argmax(-1)  # an int64 result: no WGSL type holds it


def test_an_op_the_relax_frontend_lacks_is_refused_naming_block_and_op(compiler):
    block = Block("transformer", "block_0", _Erfinv(), ["x"], ["y"], (torch.randn(4, 4),))
    with pytest.raises(PlanError, match=r"block transformer/block_0: .*relax frontend does "
                                        r"not take .*erfinv"):
        compiler.compile(block)


def test_a_kernel_wgsl_cannot_hold_is_refused_naming_the_kernel(compiler):
    block = Block("transformer", "block_0", _Argmax(), ["x"], ["y"], (torch.randn(4, 4),))
    with pytest.raises(PlanError, match=r"block transformer/block_0: kernel argmax\w*: TVM's "
                                        r"WebGPU code generator refused it: .*int64"):
        compiler.compile(block)


class _Gelu(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

        self.register_buffer("scale", torch.ones(width), persistent=False)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * self.scale


def test_blocks_of_one_traced_program_are_imported_once(monkeypatch):
    """TVM's frontend runs once per traced program (BlockCompiler): other weights of one
    structure reuse the module; another shape, or a constant embedded with another value,
    imports anew, and each block still replays its own weights."""
    import edge.exporters.web.tvm_plan as tvm_plan

    imports = []
    frontend = tvm_plan._relax_module
    monkeypatch.setattr(tvm_plan, "_relax_module",
                        lambda program, key: imports.append(key) or frontend(program, key))

    def block(name: str, width: int, rows: int = 3) -> Block:
        return Block("transformer", name, _Gelu(width), ["x"], ["y"], (torch.randn(rows, width),))

    compiler = BlockCompiler()
    same = [block("block_0", 8), block("block_1", 8)]
    first = compiler.compile(same[0])
    second = compiler.compile(same[1])
    assert second.source is first.source
    assert imports == ["transformer/block_0"]
    compiler.compile(block("block_2", 16))        # other weight shapes
    compiler.compile(block("block_3", 8, rows=5))  # another input shape
    scaled = block("block_4", 8)
    scaled.module.scale.fill_(2.0)                 # an embedded constant's value
    compiler.compile(scaled)
    assert imports == [f"transformer/block_{i}" for i in (0, 2, 3, 4)]
    for compiled, b in ((first, same[0]), (second, same[1])):
        assert _replay_error(compiled, b) < 1e-5


def test_a_refused_block_writes_nothing(tiny_sora, tmp_path):
    from edge.exporters import ExportValidationError
    from edge.exporters.web.package import export_web

    bad = Block("transformer", "block_0", _Erfinv(), ["x"], ["y"], (torch.randn(4, 4),))
    dest = tmp_path / "pkg"
    with pytest.raises(ExportValidationError, match="transformer/block_0.*erfinv"):
        export_web(tiny_sora, dest, components={"transformer": [bad]})
    assert not dest.exists() and list(tmp_path.iterdir()) == []


class _Halves(torch.nn.Module):
    """A modulation split in two, as CogVideoX's epilogue splits shift and scale."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 16)

    def forward(self, x):
        shift, scale = self.linear(x).chunk(2, dim=-1)
        return shift, scale


def test_each_kernel_of_a_split_binds_its_own_output(compiler):
    """topi's split names every output T_split, one kernel writing each: each kernel must
    bind the output it writes (bound by name, both wrote the first, and the page's WebGPU
    path gave CogVideoX's epilogue a wrong scale)."""
    block = Block("transformer", "epilogue", _Halves(), ["x"], ["shift", "scale"],
                  (torch.randn(2, 8),))
    plan = compiler.compile(block).plan
    split = next(c for c in plan.calls if c["func"].startswith("split"))
    written = [{split["args"][i] for i in k["bindings"]} - {split["args"][0]}
               for k in split["kernels"]]
    assert len(split["kernels"]) == 2
    assert written[0] != written[1] and written[0] | written[1] == set(split["args"][1:])


class _ManyChunks(torch.nn.Module):
    """Attention in 12 query chunks, as chunked_attention traces a long video: the chunks are
    joined by one concatenation of 12 inputs."""

    def forward(self, q, k, v):
        chunks = [torch.softmax(c @ k.transpose(-1, -2), dim=-1) @ v
                  for c in q.split(2, dim=-2)]
        return torch.cat(chunks, dim=-2).transpose(1, 2)


def test_no_kernel_binds_more_storage_buffers_than_every_adapter_gives(compiler):
    """A wide concatenation becomes a tree of opaque concatenations of at most 7 inputs
    (FuseOps would join a chain of them back into one): 13 buffers in one kernel failed on an
    adapter allowing 10, and WebGPU promises 8."""
    from edge.exporters.web.tvm_plan import MAX_STORAGE_BUFFERS

    q, k, v = (torch.randn(1, 2, 24, 8) for _ in range(3))
    block = Block("transformer", "block_0", _ManyChunks(), ["q", "k", "v"], ["y"], (q, k, v))
    compiled = compiler.compile(block)
    bound = [len(k["bindings"]) for c in compiled.plan.calls for k in c["kernels"]]
    assert max(bound) <= MAX_STORAGE_BUFFERS
    joins = [c for c in compiled.plan.calls if c["func"].startswith("concatenate")]
    assert len(joins) == 3  # 12 = 7 + 5, then the two joined
    assert _replay_error(compiled, block) < 1e-5


class _ManyBranches(torch.nn.Module):
    """Injective work over many inputs summed up, as Wan 2.2's decoder adds its duplicated
    branches: FuseOps joins it all into one kernel binding every input."""

    def forward(self, *xs):
        total = xs[0].transpose(0, 1)
        for x in xs[1:]:
            total = total + x.transpose(0, 1) * 2.0
        return total


def test_fusion_stops_before_a_kernel_binds_too_many_buffers(compiler):
    from edge.exporters.web.tvm_plan import MAX_STORAGE_BUFFERS

    xs = tuple(torch.randn(4, 6) for _ in range(12))
    block = Block("vae_decoder", "up_2", _ManyBranches(), [f"x{i}" for i in range(12)], ["y"],
                  xs)
    compiled = compiler.compile(block)
    bound = [len(k["bindings"]) for c in compiled.plan.calls for k in c["kernels"]]
    assert max(bound) <= MAX_STORAGE_BUFFERS
    # still fused where it fits (each input's transpose with its scaling)
    assert any(c["func"].startswith("fused_") for c in compiled.plan.calls)
    assert _replay_error(compiled, block) < 1e-5


def test_a_one_token_prologue_is_scheduled_where_the_tiled_matmul_rule_fails(wan_folder,
                                                                            compiler):
    """Wan at 1 frame 16 x 16 is one token: dlight's Matmul rule asserts on its matmuls of
    one row; the rule is then skipped for that kernel (another schedules it), and the plan
    replays like PyTorch."""
    from edge.families import load_model

    model = load_model(wan_folder, height=16, width=16, frames=1)
    prologue = model.cut(model.shapes("web"))["transformer"][0]
    assert prologue.example[0].shape[-3:] == (1, 2, 2)  # latent 1 x 2 x 2: one 2 x 2 patch
    assert _replay_error(compiler.compile(prologue), prologue) < 1e-4


def test_a_one_token_transformer_block_compiles_with_scratch_buffers(wan_folder, compiler):
    """Wan at 1 frame 16 x 16 attends over one key: no dlight rule fuses that softmax, and
    its row maxima and sums stay in global memory between its kernels. They get scratch
    buffers past the call's arguments (the export failed validation on them, item 32), and
    the block replays like PyTorch (the browser test runs such kernels on WebGPU)."""
    from edge.families import load_model

    model = load_model(wan_folder, height=16, width=16, frames=1)
    block = model.cut(model.shapes("web"))["transformer"][1]
    compiled = compiler.compile(block)
    with_scratch = [c for c in compiled.plan.calls if c.get("scratch")]
    assert with_scratch
    for call in with_scratch:
        past = {i - len(call["args"]) for k in call["kernels"] for i in k["bindings"]
                if i >= len(call["args"])}
        assert past == set(range(len(call["scratch"])))
        views = [compiled.plan.values[v] for v in call["scratch"]]
        assert all(v["buffer"].startswith("storage:") for v in views)
    assert _replay_error(compiled, block) < 1e-4
