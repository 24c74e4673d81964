"""LTX-Video 0.9.x text to video (diffusers `LTXPipeline`): T5 v1.1 text encoder,
`LTXVideoTransformer3DModel`, `AutoencoderKLLTXVideo`, FlowMatchEulerDiscreteScheduler with
dynamic shifting, from a local diffusers pipeline folder.

Cuts (each chained component equals the diffusers component; tests/test_ltx.py):
  text_encoder  embeddings, layer_0 (gives the relative position bias), layer_1 ..
                layer_{N-1} (take it), final (edge/families/t5.py); no mask: LTXPipeline
                encodes the padded ids alone and masks the padding in the transformer
  transformer   prologue (proj_in on the packed latents, AdaLN-single time embedding, the
                caption projection, the prompt mask as a cross-attention bias, RoPE cos/sin
                for the export size and frame rate stored as weights), block_0 ..
                block_{N-1}, epilogue (norm, scale-shift, proj_out, unpacked)
  vae_decoder   head (latent denormalisation, the decode noise mix of a timestep-conditioned
                decoder, conv_in, mid block), up_0 .. up_{K-1}, out (norm, the decoder's
                own time modulation, conv_out, unpatchify, to [0, 1]); the whole clip at once

Latents are (B, C, F, h, w), unpacked, as LTXPipeline draws their noise (randn of that shape,
then packed): a seed draws what LTXPipeline draws for `torch.Generator().manual_seed(seed)`,
and latents handed to the runtime are unpacked (diffusers' `latents=` takes them packed:
`LTXPipeline._pack_latents`). With LTX's patch of 1 packing is only a transpose: the
prologue packs, the epilogue unpacks, and Euler's step is the same numbers either way.

The VAE decoder is not causal in time (each convolution pads with copies of the first and
the last frame), so it cannot be run frame by frame as Wan's: it runs over the whole clip.
Its norms are per position (RMS over channels), so the only coupling across frames and
pixels is the convolutions' reach: a windowed decode with overlaps could be exact, and is
not built yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edge.core.options import decode_values
from edge.families.ltx import NAME
from edge.families.ltx.folder_checks import (
    DEFAULT_SIZE,
    FRAME_RATE,
    TEXT_TOKENS,
    DecodeSettings,
    check_components,
    check_folder,
    check_video_size,
    decode_settings,
    latent_tokens,
    load_pipeline,
    sampler_settings,
    video_multiple,
)
from edge.families.ltx.networks import (
    GraphFriendlyUpBlock,
    LTXBlockCut,
    LTXDecoderHead,
    LTXDecoderOut,
    LTXEpilogue,
    LTXPrologue,
    MergedLTXBlock,
)
from edge.families.pipeline_run import (
    Accepted,
    PipelineModel,
    load_family,
    with_steps,
)
from edge.families.t5 import cut_t5_encoder
from edge.graph.blocks import Block
from edge.graph.family_model import Shapes


@dataclass
class LTXModel(PipelineModel):
    frame_rate: float
    decode: DecodeSettings | None   # None: a plain decoder (0.9.0)
    family = NAME
    text_tokens: int = TEXT_TOKENS

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        pipe = self.pipe
        return (pipe.transformer.config.in_channels,
                (self.frames - 1) // pipe.vae_temporal_compression_ratio + 1,
                self.height // pipe.vae_spatial_compression_ratio,
                self.width // pipe.vae_spatial_compression_ratio)

    def _ids(self, prompts: list[str]) -> torch.Tensor:
        return self._tokens(prompts).input_ids

    def _tokens(self, prompts: list[str]):
        return self.pipe.tokenizer(prompts, padding="max_length", max_length=self.text_tokens,
                                   truncation=True, add_special_tokens=True,
                                   return_tensors="pt")

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        shapes = shapes or self.shapes("onnx")
        ids = self._ids(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_t5_encoder(self.pipe.text_encoder.encoder, ids),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(shapes.videos)}

    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE cos/sin (S, D) LTXPipeline's call gives the transformer at this size and
        frame rate (its rope_interpolation_scale)."""
        pipe, (_, f, h, w) = self.pipe, self.latent_shape
        scale = (pipe.vae_temporal_compression_ratio / self.frame_rate,
                 pipe.vae_spatial_compression_ratio, pipe.vae_spatial_compression_ratio)
        probe = torch.zeros(1, f * h * w, 1)  # the module reads its batch size alone
        cos, sin = pipe.transformer.rope(probe, f, h, w, scale)
        return cos[0], sin[0]

    def _cut_transformer(self, batch: int) -> list[Block]:
        model = self.pipe.transformer
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.rand(batch, generator=g)
        caption = torch.randn(batch, self.text_tokens, model.config.caption_channels,
                              generator=g)
        # prompts of different lengths, so the bias's rows differ
        mask = (torch.arange(self.text_tokens) < torch.arange(1, batch + 1)[:, None] * 5)
        mask = mask.long()
        pro_out = ["x", "context", "t_mod", "temb", "caption_bias", "rope_cos", "rope_sin"]
        pro = Block("transformer", "prologue",
                    LTXPrologue(model, self.rope(), self.sampler.num_train_timesteps).eval(),
                    ["latent", "t", "caption", "caption_mask"], pro_out,
                    (latent, t, caption, mask), [True] * 4,
                    dynamic_outputs=[True] * 5 + [False] * 2)
        feeds = dict(zip(pro_out, pro.run(*pro.example), strict=True))
        blocks = [pro]
        block_in = ["x", "context", "t_mod", "caption_bias", "rope_cos", "rope_sin"]
        frames = self.latent_shape[1]
        # blocks take the prologue's activations as stand-ins (Block.chained), made real
        # by edge.graph.blocks.chained as the exporters run them: the cut runs no block
        for i, b in enumerate(model.transformer_blocks):
            variants = {"tdtm": MergedLTXBlock(b, frames).eval()} if frames > 1 else {}
            blocks.append(Block("transformer", f"block_{i}", LTXBlockCut(b).eval(), block_in,
                                ["x"], tuple(feeds[n] for n in block_in),
                                [True] * 4 + [False] * 2, variants, chained=("x",)))
        blocks.append(Block("transformer", "epilogue",
                            LTXEpilogue(model, self.latent_shape).eval(), ["x", "temb"],
                            ["velocity"], (feeds["x"], feeds["temb"]), [True, True],
                            chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, videos: int) -> list[Block]:
        """head, up_0 .., out over the whole clip; `videos`: the batch traced."""
        vae = self.pipe.vae
        g = torch.Generator().manual_seed(1)
        z = torch.randn(videos, *self.latent_shape, generator=g)
        ins, example = ["z"], (z,)
        if self.decode is not None:
            ins += ["decode_t", "decode_noise", "decode_noise_scale"]
            example += (torch.rand(videos, generator=g) * 0.1,
                        torch.randn(videos, *self.latent_shape, generator=g),
                        torch.rand(videos, generator=g) * 0.1)
        carried = ["h"] + (["temb"] if self.decode is not None else [])
        head = Block("vae_decoder", "head", LTXDecoderHead(vae).eval(), ins, carried, example,
                     [True] * len(ins))
        blocks = [head]
        feeds = head.run(*example)
        for i, up in enumerate(vae.decoder.up_blocks):
            block = Block("vae_decoder", f"up_{i}", GraphFriendlyUpBlock(up).eval(), carried,
                          ["h"], feeds, [True] * len(carried))
            blocks.append(block)
            feeds = (*block.run(*feeds), *feeds[1:])
        blocks.append(Block("vae_decoder", "out", LTXDecoderOut(vae.decoder).eval(), carried,
                            ["frames"], feeds, [True] * len(carried)))
        return blocks

    def package_fields(self, root: Path, raw_null_caption: bool = False) -> dict:
        fields = super().package_fields(root, raw_null_caption)
        fields["video"]["frame_rate"] = self.frame_rate
        if self.decode is not None:
            fields["decode"] = self.decode.to_dict()
        return fields

    def start(self, latents: np.ndarray | None, seed: int | None) -> dict:
        """Latents (B, C, F, h, w), packed here as LTXPipeline takes them, a seed, or both:
        then the seed's generator draws only the decode noise (LTXPipeline draws it from its
        generator after the latents, which it was not asked to draw)."""
        if latents is None and seed is None:
            raise ValueError("give the reference latents, a seed or both")
        start = {}
        if latents is not None:
            start["latents"] = self.pipe._pack_latents(torch.from_numpy(latents))
        if seed is not None:
            start["generator"] = torch.Generator("cpu").manual_seed(seed)
        return start

    def pipeline_options(self, seed: int | None, decode_timestep: float | None = None,
                         decode_noise_scale: float | None = None,
                         guidance_rescale: float = 0.0) -> dict:
        """`reference(..., decode_timestep=, decode_noise_scale=, guidance_rescale=)`: the
        decode settings (default: the model's), LTXPipeline's guidance_rescale (the sampler
        setting of the same name); the frame rate the model was exported for."""
        options = {"frame_rate": self.frame_rate, "guidance_rescale": guidance_rescale}
        if self.decode is not None:
            t, s = decode_values(self.decode.to_dict(), decode_timestep, decode_noise_scale)
            if s and seed is None:  # LTXPipeline would draw it from the global generator
                raise ValueError("a decode noise scale over 0 needs a seed for the decode "
                                 "noise")
            options |= {"decode_timestep": t, "decode_noise_scale": s}
        return options


def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): a few
    latent frames, two patches a side."""
    shapes = check_components(folder)
    side = 2 * video_multiple(shapes)
    return {"height": side, "width": side, "frames": shapes.temporal + 1}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            sigmas: tuple[float, ...] | None = None,
            frame_rate: float | None = None, decode_timestep: float | None = None,
            decode_noise_scale: float | None = None) -> Accepted:
    """What this family takes, from the folder's JSON files alone (nothing loaded): every
    component, the components against each other, the scheduler as edge's sampler (its
    shift from this size's latent tokens), the video size (default LTXPipeline's 512 x 704,
    161 frames) and frame rate (default 25) against the model, the decode settings against
    the decoder. Refuses anything else with a FamilyError naming the file, field or
    option."""
    check_folder(folder)
    shapes = check_components(folder)
    given = {"height": height, "width": width, "frames": frames}
    size = {k: DEFAULT_SIZE[k] if v is None else v for k, v in given.items()}
    rate = FRAME_RATE if frame_rate is None else frame_rate
    check_video_size(shapes, **size, frame_rate=rate)
    decode = decode_settings(shapes, folder / "vae" / "config.json", decode_timestep,
                             decode_noise_scale)
    sampler = sampler_settings(folder / "scheduler" / "scheduler_config.json",
                               latent_tokens(shapes, **size))
    return Accepted(size, with_steps(sampler, steps, sigmas),
                    {"frame_rate": rate, "decode": decode})


def load(folder: Path, out_of_core: bool | None = None, **options) -> LTXModel:
    """The folder's LTXPipeline as an edge model at this size; `options`: what `accepts`
    takes. `frame_rate`: the frames per second the RoPE positions are scaled for
    (LTXPipeline's frame_rate); `decode_timestep`, `decode_noise_scale`: the manifest's
    defaults for a timestep-conditioned decoder (LTXPipeline's: 0 and the timestep's value),
    which a generation may override; `out_of_core`: build the models without weights and read
    each block's when it is exported (default: when the float32 weights exceed half this
    machine's memory)."""
    return load_family(folder, accepts, load_pipeline, LTXModel, out_of_core, **options)
