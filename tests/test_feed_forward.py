"""Feed-forward layers in token chunks (edge/graph/feed_forward.py): the same numbers as the whole
layer, graphs whose every widening product holds one chunk's rows, and a dry run's activation
estimate that counts one chunk's hidden state."""

from __future__ import annotations

import onnx
import pytest
import torch
from diffusers.models.attention import FeedForward

import edge.graph.feed_forward as feed_forward
from edge.graph.attention import score_limit
from edge.graph.blocks import Block
from edge.graph.feed_forward import chunked_feed_forward, feed_forward_rows
from edge.models.stdit import Mlp

WIDTH, HIDDEN, TOKENS = 64, 96, 40


class Wrapped(torch.nn.Module):
    """A feed-forward inside a block, as the families' blocks hold theirs."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return x + self.layer(x)


def _layers():
    torch.manual_seed(0)
    return [FeedForward(WIDTH, inner_dim=HIDDEN, activation_fn="gelu-approximate"),
            Mlp(WIDTH, HIDDEN / WIDTH)]


@pytest.fixture
def rows_of_16(monkeypatch):
    """Chunks of 16 rows: a limit of one byte, the least rows 16 (tiny layers never chunk at
    the real floor)."""
    monkeypatch.setattr(feed_forward, "MIN_ROWS", 16)
    with score_limit(1):
        yield


@pytest.mark.parametrize("layer", _layers(), ids=["diffusers", "stdit"])
def test_chunks_compute_what_the_whole_layer_does(layer, rows_of_16):
    x = torch.randn(2, TOKENS, WIDTH)
    with torch.no_grad():
        want = layer(x)
        with chunked_feed_forward():
            got = layer(x)
    assert torch.equal(got, want)
    assert "forward" not in Mlp.__dict__  # the class as it was (nn.Sequential's forward)


def test_rows_follow_the_limit_and_the_floor():
    # Wan 1.3B at 480x832x17 under the default 64 MiB: 1 872 of 7 800 rows a chunk
    assert feed_forward_rows(8960, 7800, 64 * 2**20) == 1872
    assert feed_forward_rows(8960, 7800, 1) == feed_forward.MIN_ROWS
    assert feed_forward_rows(96, 40, 10**9) == 40


def _widening_rows(graph) -> list[int]:
    """Token rows of each product in an ONNX graph whose output is HIDDEN wide."""
    model = onnx.shape_inference.infer_shapes(onnx.load(graph))
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
              for v in model.graph.value_info}
    return [shapes[n.output[0]][-2] for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and shapes.get(n.output[0], [0])[-1] == HIDDEN]


@pytest.mark.parametrize("layer", _layers(), ids=["diffusers", "stdit"])
def test_an_exported_block_widens_one_chunk_at_a_time(tmp_path, layer, rows_of_16):
    from edge.exporters.onnx.package import export_validated_graph

    block = Block("t", "ff", Wrapped(layer).eval(), ["x"], ["y"],
                  (torch.randn(2, TOKENS, WIDTH),), [True])
    graph = tmp_path / "ff.onnx"
    error = export_validated_graph(block, graph, block.key)[1]["max_abs_error"]
    assert _widening_rows(graph) == [16, 16, 8]
    assert error <= 1e-5


def test_the_activation_estimate_counts_one_chunk(monkeypatch):
    from edge.planning.activation_memory import activation_peak

    layer = _layers()[0]
    block = Block("t", "ff", Wrapped(layer).eval(), ["x"], ["y"],
                  (torch.randn(2, 1024, WIDTH),), [True])
    whole = activation_peak(block)  # 1 024 rows: under the default limit, one chunk
    monkeypatch.setattr(feed_forward, "MIN_ROWS", 64)
    with score_limit(1):
        chunked = activation_peak(block)
    x, hidden, chunk_hidden = (2 * 1024 * WIDTH * 4, 2 * 1024 * HIDDEN * 4,
                               2 * 64 * HIDDEN * 4)
    assert whole >= x + 2 * hidden  # the input, the widened state and its GELU
    # the input, the chunks' outputs, them joined, and one chunk's widened state and GELU
    assert chunked <= 3 * x + 2 * chunk_hidden < whole


def test_web_kernels_of_a_chunked_block_replay_like_pytorch(rows_of_16):
    pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
    import numpy as np

    from edge.exporters.web.tvm_plan import BlockCompiler, web_example

    block = Block("t", "ff", Wrapped(_layers()[0]).eval(), ["x"], ["y"],
                  (torch.randn(1, TOKENS, WIDTH),))
    compiled = BlockCompiler().compile(block)
    (got,) = compiled.replay([t.numpy() for t in web_example(block)],
                             [p.numpy() for p in block.parameters().values()])
    (want,) = block.run(*block.example)
    assert np.abs(got - want.numpy()).max() < 1e-4
    # the hidden state's products hold one chunk's rows: 16, 16 and 8 of the 40 tokens
    values = compiled.plan.values
    widened = [values[call["args"][-1]]["shape"] for call in compiled.plan.calls
               if "matmul" in call["func"]]  # NT_matmul: the weight read in place
    assert [shape[-2] for shape in widened if shape[-1] == HIDDEN] == [16, 16, 8]


def test_core_ai_executes_a_chunked_block_like_pytorch(tmp_path, rows_of_16):
    pytest.importorskip("coreai", reason="Core AI's Python packages ([iphone] extra) are "
                        "not installed")
    from edge.exporters.iphone.coreai.package import PRECISIONS, export_block

    block = Block("t", "ff", Wrapped(_layers()[0]).eval(), ["x"], ["y"],
                  (torch.randn(1, TOKENS, WIDTH),))
    record = export_block(block, tmp_path, PRECISIONS["fp32"])
    assert record["validation"]["relative_error"] <= 1e-5
