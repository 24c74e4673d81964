"""T5-family text encoders cut into blocks: T5 v1.1 (transformers' T5EncoderModel:
CogVideoX, LTX-Video) and UMT5 (Wan).

T5 computes the relative position bias in layer 0 only and hands it to the later layers. So
layer 0's block gives the bias as a second output and every later layer takes it: (1, heads,
L, L), the same for every prompt at a length, so it costs one tensor between blocks, not a
weight per layer. CogVideoX and LTX-Video run T5 without an attention mask (their pipelines
call it on the padded ids alone): the blocks take none. Open-Sora passes the mask: then the
embeddings block turns it into an additive bias (B, 1, 1, L) which every layer takes beside
the position bias (transformers' T5 adds the two in each attention).

UMT5 computes its bias in every layer, so each layer is a block of its own that takes only
the hidden states and the mask's additive bias; WanPipeline masks the prompt, and zeroes the
states past it after the final norm.
"""

from __future__ import annotations

import torch
from torch import nn

from edge.graph.blocks import Block, EncoderLayerBlock


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


class T5MaskedFirstLayer(nn.Module):
    """Layer 0 under a mask: hidden, the mask's additive bias -> hidden, the position bias
    it computed."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, attention_bias: torch.Tensor):
        hidden, bias, _ = self.layer(hidden, attention_bias, None)
        return hidden, bias


class T5MaskedLayer(nn.Module):
    """A later layer under a mask: hidden, layer 0's position bias, the mask's bias ->
    hidden."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, position_bias: torch.Tensor,
                attention_bias: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden, attention_bias, position_bias)[0]


class T5Layer(nn.Module):
    """A later layer: hidden, layer 0's position bias -> hidden."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden, None, position_bias)[0]


class T5Final(nn.Module):
    """The final norm."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)


def cut_t5_encoder(encoder: nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> list[Block]:
    """The blocks of a T5EncoderModel's `encoder` (a T5Stack), traced on `input_ids`:
    embeddings, layer_0 .. layer_{N-1}, final; chained they equal the encoder unmasked, or
    under `attention_mask` where one is given (the module's docstring)."""
    masked = attention_mask is not None
    if masked:
        blocks = [Block("text_encoder", "embeddings",
                        UMT5Embeddings(encoder.embed_tokens).eval(),
                        ["input_ids", "attention_mask"], ["hidden", "attention_bias"],
                        (input_ids, attention_mask), [True, True])]
        hidden, mask_bias = blocks[0].run(input_ids, attention_mask)
    else:
        blocks = [Block("text_encoder", "embeddings", T5Embeddings(encoder.embed_tokens).eval(),
                        ["input_ids"], ["hidden"], (input_ids,), [True])]
        (hidden,) = blocks[0].run(input_ids)
    bias = None
    for i, layer in enumerate(encoder.block):
        if i == 0 and masked:
            block = Block("text_encoder", "layer_0", T5MaskedFirstLayer(layer).eval(),
                          ["hidden", "attention_bias"], ["hidden", "position_bias"],
                          (hidden, mask_bias), [True, True], dynamic_outputs=[True, False])
            hidden, bias = block.run(hidden, mask_bias)
        elif masked:
            block = Block("text_encoder", f"layer_{i}", T5MaskedLayer(layer).eval(),
                          ["hidden", "position_bias", "attention_bias"], ["hidden"],
                          (hidden, bias, mask_bias), [True, False, True])
            (hidden,) = block.run(hidden, bias, mask_bias)
        elif i == 0:
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


# UMT5's additive bias of masked tokens: finite in fp16, where a device computing in fp16
# turns float32's min (transformers' choice) into -inf and 0 x -inf into NaN; exp(-1e4) is 0
# in float32 all the same, so the softmax is unchanged
MASKED_BIAS = -1e4


class UMT5Embeddings(T5Embeddings):
    """input_ids, attention_mask -> token embeddings, additive attention bias (B, 1, 1, L)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = super().forward(input_ids)
        masked = (1.0 - attention_mask.to(hidden.dtype))[:, None, None, :]
        return hidden, masked * MASKED_BIAS


class UMT5Final(T5Final):
    """The final norm; the states past the prompt zeroed (WanPipeline trims and zero-pads)."""

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden) * attention_mask[..., None].to(hidden.dtype)


def cut_umt5_encoder(encoder: nn.Module, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> list[Block]:
    """The blocks of a UMT5EncoderModel's `encoder`, traced on `input_ids` and their mask:
    embeddings, layer_0 .. layer_{N-1}, final; chained they equal the encoder masked, the
    states past the prompt zeroed."""
    blocks = [Block("text_encoder", "embeddings", UMT5Embeddings(encoder.embed_tokens).eval(),
                    ["input_ids", "attention_mask"], ["hidden", "attention_bias"],
                    (input_ids, attention_mask), [True, True])]
    hidden, bias = blocks[0].run(input_ids, attention_mask)
    for i, layer in enumerate(encoder.block):
        block = Block("text_encoder", f"layer_{i}", EncoderLayerBlock(layer).eval(),
                      ["hidden", "attention_bias"], ["hidden"], (hidden, bias), [True, True])
        blocks.append(block)
        (hidden,) = block.run(hidden, bias)
    blocks.append(Block("text_encoder", "final", UMT5Final(encoder.final_layer_norm).eval(),
                        ["hidden", "attention_mask"], ["hidden"], (hidden, attention_mask),
                        [True, True]))
    return blocks
