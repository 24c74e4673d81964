"""Attention in query chunks (edge/graph/attention.py): the same numbers as PyTorch's SDPA, and
graphs whose every softmax holds one chunk's rows, never the whole score matrix. The
families' shared test exports trace their attention chunked (conftest.py), so their
end-to-end checks against diffusers hold for chunked graphs; test_family_contract.py checks
each package's graphs are chunked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graph_shapes import softmax_rows

from edge.graph.attention import (
    DEFAULT_SCORE_BYTES,
    MIN_ROWS,
    chunked_attention,
    query_rows,
    score_limit,
    score_limit_for_budget,
)


def _qkv(batch=2, heads=3, queries=37, keys=29, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, queries, dim, generator=g),
            torch.randn(batch, heads, keys, dim, generator=g),
            torch.randn(batch, heads, keys, dim, generator=g))


@pytest.mark.parametrize("mask", [None, "key_bias", "full", "bool", "scale"])
def test_chunks_compute_what_the_whole_attention_does(mask):
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(1)
    kwargs = {
        None: {},
        "key_bias": {"attn_mask": torch.randn(2, 1, 1, 29, generator=g)},
        "full": {"attn_mask": torch.randn(2, 1, 37, 29, generator=g)},
        "bool": {"attn_mask": torch.rand(37, 29, generator=g) > 0.3},
        "scale": {"scale": 0.37},
    }[mask]
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    calls = []
    original = F.scaled_dot_product_attention

    def counting(q, *args, **kw):
        calls.append(q.shape[-2])
        return original(q, *args, **kw)

    F.scaled_dot_product_attention = counting
    try:
        with score_limit(1, min_rows=5), chunked_attention():
            got = F.scaled_dot_product_attention(q, k, v, **kwargs)
    finally:
        F.scaled_dot_product_attention = original
    assert calls == [5] * 7 + [2]  # 37 rows in chunks of 5
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert F.scaled_dot_product_attention is original


def test_rows_follow_the_limit_and_the_floor():
    per_row = 12 * 32_760 * 4  # Wan 1.3B at 480x832x81: 12 heads, one row of scores
    assert query_rows(12, 32_760, 32_760, DEFAULT_SCORE_BYTES) == DEFAULT_SCORE_BYTES // per_row
    assert query_rows(12, 32_760, 32_760, 1) == MIN_ROWS == 16
    assert query_rows(2, 18, 18, DEFAULT_SCORE_BYTES) == 18  # tiny: one chunk, the whole
    assert score_limit_for_budget(None) == DEFAULT_SCORE_BYTES
    assert score_limit_for_budget(256 * 2**20) == 32 * 2**20
    assert score_limit_for_budget(10**12) == DEFAULT_SCORE_BYTES
    with pytest.raises(ValueError, match="positive"):
        with score_limit(0):
            pass


def test_an_exported_block_holds_one_chunk_and_matches_pytorch(tmp_path, tiny_sora):
    """tiny-sora's first transformer pair in ONNX under a limit of 64 rows: its spatial and
    temporal self-attention fused, their cross-attention over the caption (a padding mask) in
    chunks of 64 of its 256 query rows, and the block validates against PyTorch
    (export_validated_graph's max-abs check)."""
    from collections import Counter

    import onnx

    from edge.exporters.onnx.package import export_validated_graph

    block = next(b for b in tiny_sora.cut(tiny_sora.shapes("onnx"))["transformer"]
                 if b.name == "pair_0")
    graph = tmp_path / "block.onnx"
    with score_limit(1, min_rows=64):
        error = export_validated_graph(block, graph, block.key)[1]["max_abs_error"]
    assert softmax_rows(graph) == [64] * 8  # a spatial and a temporal block: 2 of each
    assert Counter(n.op_type for n in onnx.load(graph).graph.node)["MultiHeadAttention"] == 2
    assert error <= 1e-4


def test_attention_without_a_mask_is_one_fused_operator_in_onnx(tmp_path):
    """In an ONNX graph, attention without a mask is onnxruntime's MultiHeadAttention (flash
    attention on the CPU), whole, with the same numbers as PyTorch; with a mask it is
    chunked."""
    from collections import Counter

    import onnx

    from edge.exporters.onnx.package import export_validated_graph
    from edge.graph.blocks import Block

    class TwoAttentions(torch.nn.Module):
        def forward(self, q, k, v, bias):
            return (F.scaled_dot_product_attention(q, k, v)
                    + F.scaled_dot_product_attention(q, k, v, attn_mask=bias))

    q, k, v = _qkv(queries=40, keys=40)
    bias = torch.randn(2, 1, 40, 40)
    block = Block("t", "a", TwoAttentions(), ["q", "k", "v", "bias"], ["out"],
                  (q, k, v, bias), [True] * 4)
    graph = tmp_path / "a.onnx"
    with score_limit(1, min_rows=16):
        error = export_validated_graph(block, graph, block.key)[1]["max_abs_error"]
    ops = Counter(n.op_type for n in onnx.load(graph).graph.node)
    assert ops["MultiHeadAttention"] == 1 and ops["Softmax"] == 3  # 40 rows: 16 + 16 + 8
    assert softmax_rows(graph) == [16, 16, 8]
    assert error <= 1e-4
