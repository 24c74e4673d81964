"""T5 v1.1 encoders (transformers' T5EncoderModel: CogVideoX, LTX-Video) cut into blocks.

Unlike UMT5, whose every layer computes its own relative position bias, T5 computes the bias
in layer 0 only and hands it to the later layers. So layer 0's block gives the bias as a
second output and every later layer takes it: (1, heads, L, L), the same for every prompt
at a length, so it costs one tensor between blocks, not a weight per layer. These families
run T5 without an attention mask (their pipelines call it on the padded ids alone): the
blocks take none.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.blocks import Block


class T5Embeddings(nn.Module):
    """input_ids -> token embeddings."""

    def __init__(self, embed_tokens: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class T5FirstLayer(nn.Module):
    """Layer 0: hidden -> hidden, and the relative position bias it computed."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, bias, _ = self.layer(hidden, None, None)
        return hidden, bias


class T5Layer(nn.Module):
    """A later layer: hidden, layer 0's position bias -> hidden."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden, None, position_bias)[0]


class T5Final(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)


def cut_t5_encoder(encoder: nn.Module, input_ids: torch.Tensor) -> list[Block]:
    """The blocks of a T5EncoderModel's `encoder` (a T5Stack), traced on `input_ids`:
    embeddings, layer_0 .. layer_{N-1}, final; chained they equal the encoder unmasked."""
    blocks = [Block("text_encoder", "embeddings", T5Embeddings(encoder.embed_tokens).eval(),
                    ["input_ids"], ["hidden"], (input_ids,), [True])]
    (hidden,) = blocks[0].run(input_ids)
    bias = None
    for i, layer in enumerate(encoder.block):
        if i == 0:
            block = Block("text_encoder", "layer_0", T5FirstLayer(layer).eval(), ["hidden"],
                          ["hidden", "position_bias"], (hidden,), [True],
                          dynamic_outputs=[True, False])
            hidden, bias = block.run(hidden)
        else:
            block = Block("text_encoder", f"layer_{i}", T5Layer(layer).eval(),
                          ["hidden", "position_bias"], ["hidden"], (hidden, bias), [True, False])
            (hidden,) = block.run(hidden, bias)
        blocks.append(block)
    blocks.append(Block("text_encoder", "final", T5Final(encoder.final_layer_norm).eval(),
                        ["hidden"], ["hidden"], (hidden,), [True]))
    return blocks
