"""Cut a pipeline into blocks: the units that exporters compile and runtimes load one by one.

A block is a module with named tensor inputs and outputs and its own parameters. Chained in
order, a component's blocks compute exactly what the component computes (tested). Cuts:

  text_encoder  embeddings, layer_0 .. layer_5   (MiniLM; the last layer's states are the
                                                  caption tokens, so there is no head block)
  transformer   prologue, pair_0 .. pair_{N-1}, epilogue
  vae_decoder   head (scale, post-quant conv, conv_in, mid block), up_0, up_1, up_2_out
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from edge.models.stdit import MergedPair
from edge.models.tiny_sora import TinySora


@dataclass
class Block:
    component: str
    name: str
    module: nn.Module
    inputs: list[str]
    outputs: list[str]
    example: tuple[torch.Tensor, ...]      # example inputs, batch first
    dynamic_batch: list[bool] = field(default_factory=list)  # per input
    # other computations of this block with the same inputs, outputs and parameters (the
    # very same tensors, same names), e.g. {"tdtm": the temporally merged pair}
    variants: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.component}/{self.name}"

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.module.named_parameters()}

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters().values())

    @torch.no_grad()
    def run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.module(*inputs)
        return out if isinstance(out, tuple) else (out,)


class BertEmbeddingsBlock(nn.Module):
    """input_ids, attention_mask -> hidden states, additive attention bias."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.embeddings(input_ids=input_ids)
        bias = (1.0 - attention_mask.to(hidden.dtype))[:, None, None, :] * -1e4
        return hidden, bias


class BertLayerBlock(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        out = self.layer(hidden, attention_mask=attention_bias)
        return out[0] if isinstance(out, tuple) else out


class VaeHead(nn.Module):
    """scaled latents (N, C, h, w) -> decoder features after the mid block."""

    def __init__(self, vae) -> None:
        super().__init__()
        self.scale = float(vae.config.scaling_factor)
        self.post_quant_conv = vae.post_quant_conv
        self.conv_in = vae.decoder.conv_in
        self.mid_block = vae.decoder.mid_block

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.mid_block(self.conv_in(self.post_quant_conv(z / self.scale)))


class VaeUp(nn.Module):
    def __init__(self, up_block: nn.Module) -> None:
        super().__init__()
        self.up = up_block

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.up(h)


class VaeUpOut(nn.Module):
    """last up block + output convolution -> frames (N, 3, H, W) in [0, 1]."""

    def __init__(self, vae) -> None:
        super().__init__()
        dec = vae.decoder
        self.up, self.norm, self.act, self.conv_out = (dec.up_blocks[-1], dec.conv_norm_out,
                                                       dec.conv_act, dec.conv_out)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.conv_out(self.act(self.norm(self.up(h))))
        return (x.clamp(-1, 1) + 1) / 2


def cut_text_encoder(pipe: TinySora, batch: int = 2) -> list[Block]:
    from edge.models.text_encoder import tokenize

    bert = pipe.text_encoder.bert
    ids, mask = tokenize(pipe.text_encoder.tokenizer, ["a red circle moving left",
                                                       "the blue box slides up"][:batch])
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    emb = BertEmbeddingsBlock(bert.embeddings).eval()
    blocks = [Block("text_encoder", "embeddings", emb, ["input_ids", "attention_mask"],
                    ["hidden", "attention_bias"], (ids, mask), [True, True])]
    hidden, bias = blocks[0].run(ids, mask)
    for i, layer in enumerate(bert.encoder.layer):
        block = Block("text_encoder", f"layer_{i}", BertLayerBlock(layer).eval(),
                      ["hidden", "attention_bias"], ["hidden"], (hidden, bias), [True, True])
        blocks.append(block)
        (hidden,) = block.run(hidden, bias)
    return blocks


def cut_transformer(pipe: TinySora, batch: int = 2) -> list[Block]:
    model, cfg = pipe.transformer, pipe.transformer.cfg
    g = torch.Generator().manual_seed(0)
    latent = torch.randn(batch, *pipe.latent_shape, generator=g)
    t = torch.rand(batch, generator=g)
    caption = torch.randn(batch, cfg.caption_len, cfg.caption_dim, generator=g)
    mask = torch.ones(batch, cfg.caption_len, dtype=torch.int64)
    mask[:, 8:] = 0
    pro = Block("transformer", "prologue", model.prologue,
                ["latent", "t", "caption", "caption_mask"], ["x", "t_mod", "c", "y", "y_bias"],
                (latent, t, caption, mask), [True] * 4)
    x, t_mod, c, y, y_bias = pro.run(*pro.example)
    blocks = [pro]
    for i, pair in enumerate(model.pairs):
        block = Block("transformer", f"pair_{i}", pair, ["x", "t_mod", "y", "y_bias"], ["x"],
                      (x, t_mod, y, y_bias), [True] * 4, {"tdtm": MergedPair(pair)})
        blocks.append(block)
        (x,) = block.run(*block.example)
    blocks.append(Block("transformer", "epilogue", model.epilogue, ["x", "c"], ["velocity"],
                        (x, c), [True, True]))
    return blocks


def cut_vae_decoder(pipe: TinySora, frames: int = 2) -> list[Block]:
    vae = pipe.vae
    g = torch.Generator().manual_seed(1)
    c, _, h, w = pipe.latent_shape
    z = torch.randn(frames, c, h, w, generator=g)
    modules = [("head", VaeHead(vae), "z")] + [
        (f"up_{i}", VaeUp(u), "h") for i, u in enumerate(vae.decoder.up_blocks[:-1])] + [
        (f"up_{len(vae.decoder.up_blocks) - 1}_out", VaeUpOut(vae), "h")]
    blocks, x = [], z
    for i, (name, module, in_name) in enumerate(modules):
        out_name = "frames" if i == len(modules) - 1 else "h"
        block = Block("vae_decoder", name, module.eval(), [in_name], [out_name], (x,), [True])
        blocks.append(block)
        (x,) = block.run(x)
    return blocks


def cut_pipeline(pipe: TinySora) -> dict[str, list[Block]]:
    """component name -> its blocks in execution order."""
    return {"text_encoder": cut_text_encoder(pipe), "transformer": cut_transformer(pipe),
            "vae_decoder": cut_vae_decoder(pipe)}
