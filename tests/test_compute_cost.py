"""The FLOP count of a generation from shapes (edge/planning/compute_cost.py): each block's count
equals the matrix products' own arithmetic, and a generation adds the blocks up as the
runtimes call them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edge.graph.blocks import Block, Chunking
from edge.graph.shapes_only import shapes_only
from edge.planning.compute_cost import (
    block_flops,
    blocks_flops,
    cost_lines,
    format_flops,
    generation_cost,
    matmul_rate,
)


class _Attention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_a_block_counts_its_products_attention_included():
    batch, tokens, width, heads = 2, 40, 16, 2
    block = Block("transformer", "b", _Attention(width), ["x"], ["y"],
                  (torch.randn(batch, tokens, width),))
    linear = 2 * batch * tokens * width * 3 * width
    # q k^T and the scores times v, written out as the chunked graphs compute them
    attention = 2 * (2 * batch * heads * tokens * tokens * (width // heads))
    assert block_flops(block) == linear + attention


def test_alike_blocks_are_counted_once_and_summed():
    blocks = [Block("transformer", f"b{i}", nn.Linear(8, 8), ["x"], ["y"],
                    (torch.randn(3, 8),)) for i in range(5)]
    assert blocks_flops(blocks) == 5 * 2 * 3 * 8 * 8


def test_a_generation_adds_blocks_as_the_runtime_calls_them():
    def block(component, n_in, n_out, example):
        return Block(component, "b", nn.Linear(n_in, n_out), ["x"], ["y"], (example,))

    # a video decoder (B, C, T, h, w) traced with two videos, run a latent frame at a time
    decoder = Block("vae_decoder", "b", nn.Conv3d(4, 4, 1), ["z"], ["frames"],
                    (torch.randn(2, 4, 1, 3, 3),))
    components = {"text_encoder": [block("text_encoder", 8, 8, torch.randn(2, 8))],
                  "transformer": [block("transformer", 8, 16, torch.randn(2, 8))] * 3,
                  "vae_decoder": [decoder]}
    chunked = {"vae_decoder": Chunking(input="z", output="frames", axis=2, size=1,
                                       first_variant="first")}
    cost = generation_cost(components, chunked, (4, 5, 3, 3), steps=7)
    assert cost.text_encoder == 2 * 2 * 8 * 8
    assert cost.step == 3 * 2 * 2 * 8 * 16
    per_frame = 2 * 9 * 4 * 4  # one video's frame: 9 positions, 4 in, 4 out
    assert cost.decoder == 5 * per_frame
    assert cost.total == cost.text_encoder + 7 * cost.step + cost.decoder


def test_a_tiled_decoder_counts_its_first_piece_and_every_tiles_area():
    from edge.core.tiles import Tiling

    # traced at a whole tile (4 x 4 latent), one video; its first piece has a variant
    # computing half the channels
    first = Block("vae_decoder", "b", nn.Conv3d(4, 2, 1), ["z"], ["frames"],
                  (torch.randn(1, 4, 1, 4, 4),))
    decoder = Block("vae_decoder", "b", nn.Conv3d(4, 4, 1), ["z"], ["frames"],
                    (torch.randn(1, 4, 1, 4, 4),), variants={"first": first})
    chunked = {"vae_decoder": Chunking(input="z", output="frames", axis=2, size=1,
                                       first_variant="first")}
    tiling = Tiling(latent_size=(4, 4), latent_stride=(3, 3), scale=8)
    # latents 4 x 7: tiles start at rows 0, 3 (4 and 1 high; diffusers starts a tile at
    # every stride) and columns 0, 3, 6 (4, 4 and 1 wide)
    assert tiling.tiles_of_work(4, 7) == (4 + 1) * (4 + 4 + 1) / 16
    assert tiling.tiles_of_work(4, 4) == 1.0  # one piece: no tiles
    cost = generation_cost({"vae_decoder": [decoder]}, chunked, (4, 3, 4, 7), steps=1,
                           tiled={"vae_decoder": tiling})
    per_tile_frame = 2 * 16 * 4 * 4
    assert cost.decoder == round((per_tile_frame // 2 + 2 * per_tile_frame) * 45 / 16)


def test_the_rate_is_measured_on_real_products_only():
    rate = matmul_rate(seconds=0.05, size=128)
    assert 1e8 < rate < 1e14
    with shapes_only(), pytest.raises(RuntimeError, match="outside shapes_only"):
        matmul_rate()
    assert format_flops(2_500_000_000_000) == "2.5 TFLOP"
    lines = cost_lines(generation_cost({}, {}, (1, 1, 1, 1), 3), rate)
    assert lines[0].startswith("compute per generation: 0 MFLOP (3 steps")
