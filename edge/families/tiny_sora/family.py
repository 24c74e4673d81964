"""tiny-sora, the default model, as one family among others: its PyTorch pipeline
(edge/models/tiny_sora.py), its cut into blocks, and what its packages carry besides blocks
(a WordPiece tokenizer, a learned null caption, the flow-match Euler sampler).

Cuts:
  text_encoder  embeddings, layer_0 .. layer_5   (MiniLM; the last layer's states are the
                                                  caption tokens, so there is no head block)
  transformer   prologue, pair_0 .. pair_{N-1}, epilogue
  vae_decoder   head (scale, post-quant conv, conv_in, mid block), up_0, up_1, up_2_out
                (per frame: the runtime decodes latents laid out as frames, B*T x C x h x w)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.core.package import file_entry, write_null_caption
from edge.core.sampler import SamplerSettings
from edge.families import FamilyError
from edge.families.tiny_sora import NAME
from edge.graph.blocks import Block, EncoderLayerBlock
from edge.graph.family_model import Shapes, StorageRule
from edge.models.stdit import MergedPair, STDiTPair
from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
from edge.models.tiny_sora_folder import WeightsFolderError


class BertEmbeddingsBlock(nn.Module):
    """input_ids, attention_mask -> hidden states, additive attention bias."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.embeddings(input_ids=input_ids)
        bias = (1.0 - attention_mask.to(hidden.dtype))[:, None, None, :] * -1e4
        return hidden, bias


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
        block = Block("text_encoder", f"layer_{i}", EncoderLayerBlock(layer).eval(),
                      ["hidden", "attention_bias"], ["hidden"], (hidden, bias), [True, True])
        blocks.append(block)
        (hidden,) = block.run(hidden, bias)
    return blocks


class PairHalf(nn.Module):
    """The spatial or the temporal block of a pair, under the pair's parameter names."""

    def __init__(self, pair: STDiTPair, part: str, merged: bool = False) -> None:
        super().__init__()
        self.add_module(part, getattr(pair, part))
        self.part, self.merged = part, merged

    def forward(self, x, t_mod, y, y_bias):
        return getattr(self, self.part)(x, t_mod, y, y_bias, self.merged)


def split_pair(block: Block) -> list[Block]:
    """A transformer pair as two blocks, `<pair>_spatial` then `<pair>_temporal`, each with
    the pair's inputs and its TDTM variant when the pair has one: what a budget smaller than
    a pair may stream."""
    halves, example = [], block.example
    for part in ("spatial", "temporal"):
        variants = {"tdtm": PairHalf(block.module, part, merged=True)} if "tdtm" in \
            block.variants else {}
        half = Block(block.component, f"{block.name}_{part}", PairHalf(block.module, part),
                     block.inputs, block.outputs, example, block.dynamic_batch, variants)
        halves.append(half)
        example = (*half.run(*example), *example[1:])  # x changes; t_mod, y, y_bias pass on
    return halves


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
                      (x, t_mod, y, y_bias), [True] * 4, {"tdtm": MergedPair(pair)},
                      splitter=split_pair)
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


def cut_pipeline(pipe: TinySora, shapes: Shapes = Shapes()) -> dict[str, list[Block]]:
    """component name -> its blocks in execution order, at `shapes` (the decoder takes
    latents laid out as frames: all of a video's at once unless `shapes` says how many)."""
    frames = shapes.decoder_frames or pipe.latent_shape[1]
    return {"text_encoder": cut_text_encoder(pipe, batch=shapes.prompts),
            "transformer": cut_transformer(pipe, batch=shapes.guidance_batch),
            "vae_decoder": cut_vae_decoder(pipe, frames=frames)}


# the static shapes each target runs tiny-sora at: the desktop runtime traces at batch 2
# (its batch is dynamic); a device encodes one prompt; the web decodes 4 frames per call (a
# WebGPU kernel is compiled for one shape; 4 keeps the largest buffer small)
SHAPES = {"onnx": Shapes(prompts=2, guidance_batch=2, decoder_frames=2),
          "iphone": Shapes(prompts=1, guidance_batch=2),
          "web": Shapes(prompts=1, guidance_batch=2, decoder_frames=4)}


# Measured (docs/benchmarks.md, benchmarks/coreml_quantize.py): errors in the transformer grow
# over the denoising steps and in the text encoder steer every step, while the VAE's show once
# in the frames; the bytes are mostly the text encoder's (MiniLM's embedding table alone is 46%
# of them). So: the table at 4 bits, the encoder layers at 6, the transformer at 8, the VAE at
# 4 - 5.4 bits per weight: weight files 6.06x smaller than fp32, the whole package 5.6x (iOS 18
# layout; 5.0x for iOS 17's variant copies); worst of 8 videos 36.5 dB.
STORAGE_4 = StorageRule(
    (("text_encoder/embeddings", "lut4"), ("text_encoder/*", "lut6"),
     ("transformer/*", "int8"), ("vae_decoder/*", "lut4")),
    psnr_floor_db=35.0,
    note="4 bits where the measured error stays small: the embedding table and the VAE "
         "decoder; text encoder layers at 6 bits; transformer at 8 bits")


@dataclass
class TinySoraModel:
    """The loaded tiny-sora pipeline, answering what exporters ask of a family's model."""

    pipe: TinySora
    name: str = NAME
    family: str = NAME
    chunked: dict = field(default_factory=dict)   # every component runs whole
    device_storage: dict = field(default_factory=lambda: {"4": STORAGE_4})
    out_of_core: bool = False    # its shipped weights are always loaded whole

    @property
    def sampler(self) -> SamplerSettings:
        return self.pipe.sampler

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return self.pipe.latent_shape

    def shapes(self, target: str) -> Shapes:
        return SHAPES.get(target, SHAPES["onnx"])

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        return cut_pipeline(self.pipe, shapes or self.shapes("onnx"))

    def package_fields(self, root: Path, raw_null_caption: bool = False) -> dict:
        """Write the tokenizer and the null caption into `root`; return the manifest fields
        that describe them and the generation (sampler, latents, decode layout).
        `raw_null_caption` also writes a little-endian float32 copy (`.f32`), which Swift reads
        without an .npy parser."""
        from edge.models.text_encoder import MAX_TOKENS, minilm_dir

        tok_dir = root / "tokenizer"
        tok_dir.mkdir(parents=True)
        shutil.copy(minilm_dir() / "tokenizer.json", tok_dir / "tokenizer.json")
        conditioning = write_null_caption(
            root, self.pipe.transformer.null_caption.detach().numpy(), raw_null_caption)
        rows = self.pipe.text_encoder.bert.get_input_embeddings().num_embeddings
        return {"tokenizer": {"files": [file_entry(root, tok_dir / "tokenizer.json")],
                              "max_tokens": MAX_TOKENS, "embedding_rows": rows},
                "conditioning": conditioning,
                "sampler": self.sampler.to_dict(), "latent_shape": list(self.latent_shape)}

    def generate(self, prompt: str, seed: int = 0,
                 on_step: Callable[[int, int], None] | None = None,
                 steps: int | None = None) -> np.ndarray:
        """The PyTorch reference video (1, T, H, W, 3) uint8 for the export's end-to-end
        check: the runtime's initial noise for `seed`, the package's sampler settings."""
        overrides = {} if steps is None else {"steps": steps}
        return self.pipe.generate(prompt, seed=seed, on_step=on_step, **overrides)


def load(folder: Path | None = None) -> TinySoraModel:
    """tiny-sora from a weights folder (default: the shipped weights)."""
    try:
        pipe = TinySora.load(folder or DEFAULT_WEIGHTS)
    except WeightsFolderError as err:
        raise FamilyError(str(err)) from None
    return TinySoraModel(pipe, name=folder.resolve().name if folder else NAME)
