"""Open-Sora 1.2 cut into the blocks edge exports, as On-device Sora cut it: the transformer
into an embedding part, one block per spatial-temporal pair and the final layer; the VAE's
decoder into the temporal decoder and the 2D decoder. Chained, each component
computes what edge/families/opensora/stdit3.py and vae.py compute (tested).

Transformer (latents in diffusers' layout (B, C, T, h, w), time in [0, 1]):
  prologue  latent, t, caption, caption_mask -> x (B, T*S, C), temb (B, C) for the final
            layer, t_mlp (B, 6C) for every block, t_mod (B, 6, C) pair 0's spatial
            modulation (what the step cache reads), y (B, L, C), y_bias (B, L); the position
            table of the export size and the frame rate are constants of the block
  pair_i    x, t_mlp, y, y_bias -> x: spatial block i then temporal block i (rotary tables
            of the export's frames inside); its "tdtm" variant merges frame pairs
  epilogue  x, temb -> velocity: the final layer, unpatchified, the first latent channels
            negated: Open-Sora predicts x0 - noise, edge's flow schedulers step noise - x0
VAE decoder (latents (B, C, T, h, w) -> frames (B, 3, F, H, W) in [0, 1]):
  temporal  z -> the 2D VAE's latents of every frame: each chunk of latent frames decoded
            alone, the chunks as one batch
  spatial   2D latents -> frames: the 2D decoder, one frame after another inside the graph
            (a call holds one frame's activations)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge.families.opensora.stdit3 import STDiT3, caption_bias, position_table, rotary_tables
from edge.families.opensora.vae import SPATIAL_SCALE, OpenSoraVAE
from edge.graph.reference_device import on_device_of


class OpenSoraPrologue(nn.Module):
    def __init__(self, model: STDiT3, latent_shape: tuple[int, int, int, int], height: int,
                 width: int, fps: float) -> None:
        super().__init__()
        cfg = model.cfg
        self.x_embedder, self.t_embedder = model.x_embedder, model.t_embedder
        self.fps_embedder, self.t_block = model.fps_embedder, model.t_block
        self.y_proj = model.y_embedder.y_proj
        # pair 0's spatial table beside the shared modulation: the cache's t_mod
        self.first_table = model.spatial_blocks[0].scale_shift_table
        self.frames, rows, cols = model.grid(latent_shape)
        self.pos = nn.Parameter(position_table(rows, cols, cfg.hidden_size, height, width,
                                               cfg.input_sq_size), requires_grad=False)
        self.register_buffer("fps", torch.tensor([float(fps)]), persistent=False)
        self.hidden = cfg.hidden_size

    def forward(self, latent, t, caption, caption_mask):
        b = latent.shape[0]
        x = self.x_embedder(latent).reshape(b, self.frames, -1, self.hidden) + self.pos
        temb = self.t_embedder(t * 1000) + self.fps_embedder(self.fps.expand(b))
        t_mlp = self.t_block(temb)
        t_mod = self.first_table[None] + t_mlp.reshape(b, 6, -1)
        return (x.flatten(1, 2), temb, t_mlp, t_mod, self.y_proj(caption),
                caption_bias(caption_mask, caption.dtype))


class OpenSoraPair(nn.Module):
    """Spatial block i then temporal block i; `merged`: TDTM in both."""

    def __init__(self, spatial: nn.Module, temporal: nn.Module, freqs: torch.Tensor,
                 frames: int, merged: bool = False) -> None:
        super().__init__()
        self.spatial, self.temporal = spatial, temporal
        self.frames, self.merged = frames, merged
        cos, sin = rotary_tables(freqs, frames)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x, t_mlp, y, y_bias):
        rope = (self.rope_cos, self.rope_sin)
        x = self.spatial(x, t_mlp, y, y_bias, self.frames, merged=self.merged)
        return self.temporal(x, t_mlp, y, y_bias, self.frames, rope, merged=self.merged)


class OpenSoraEpilogue(nn.Module):
    def __init__(self, model: STDiT3, latent_shape: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.final_layer = model.final_layer
        self.grid = model.grid(latent_shape)
        self.unpatchify = model.unpatchify
        self.channels = model.cfg.in_channels

    def forward(self, x, temb):
        out = self.unpatchify(self.final_layer(x, temb), self.grid)
        return -out[:, :self.channels]


def cut_transformer_modules(model: STDiT3, latent_shape: tuple[int, int, int, int],
                            height: int, width: int, fps: float
                            ) -> tuple[nn.Module, list[tuple[nn.Module, nn.Module]], nn.Module]:
    """(prologue, [(pair, its tdtm variant)], epilogue) at this export size."""
    frames = model.grid(latent_shape)[0]
    pairs = [(OpenSoraPair(s, t, model.rope.freqs, frames).eval(),
              OpenSoraPair(s, t, model.rope.freqs, frames, merged=True).eval())
             for s, t in zip(model.spatial_blocks, model.temporal_blocks, strict=True)]
    return (OpenSoraPrologue(model, latent_shape, height, width, fps).eval(), pairs,
            OpenSoraEpilogue(model, latent_shape).eval())


class TemporalStage(nn.Module):
    """z (B, C, n*micro_z, h, w) -> 2D latents (B, C', n*micro_frame_size, h, w)."""

    def __init__(self, vae: OpenSoraVAE) -> None:
        super().__init__()
        self.temporal_vae = vae.temporal_vae
        self.scale, self.shift = vae.scale, vae.shift
        self.micro_z, self.micro_frames = vae.micro_z, vae.micro_frame_size

    def forward(self, z):
        # reshapes of rank 5 at most (CoreML's limit): each chunk's frames and pixels as one
        # axis while the chunks move between the batch and time
        b, c, t, h, w = z.shape
        n = t // self.micro_z
        # scale and shift are plain tensors here (folded into the graph): in z's dtype, so a
        # half-precision conversion computes in half
        z = (z * on_device_of(self.scale, z).to(z.dtype)
             + on_device_of(self.shift, z).to(z.dtype))
        chunks = z.reshape(b, c, n, -1).transpose(1, 2).reshape(b * n, c, self.micro_z, h, w)
        x = self.temporal_vae.decode(chunks, self.micro_frames)
        x = x.reshape(b, n, x.shape[1], -1).transpose(1, 2)
        return x.reshape(b, x.shape[1], n * self.micro_frames, h, w)


class SpatialDecoder(nn.Module):
    """The 2D VAE's decoder over 2D latents (B, C, F, h, w) -> frames (B, 3, F, H, W) in
    [0, 1], one frame after another: a frame's activations at full resolution are freed before
    the next frame starts, so a call holds one frame's (0.3 GiB at 240 x 432 in float32)
    instead of the chunk's 17 (5 GiB). The loop is unrolled in the graph (the frames are a
    fixed count: one chunk); a runtime that frees each tensor after its last use in graph
    order (onnxruntime does) peaks at one frame. Frames are independent in the 2D VAE, so the
    video is Open-Sora's, which decodes `micro_batch_size` frames at a time for the same
    reason."""

    def __init__(self, vae: OpenSoraVAE) -> None:
        super().__init__()
        spatial = vae.spatial_vae.module
        decoder = spatial.decoder
        self.post_quant_conv = spatial.post_quant_conv
        self.conv_in, self.mid_block = decoder.conv_in, decoder.mid_block
        self.up_blocks = decoder.up_blocks
        self.norm, self.act, self.conv = decoder.conv_norm_out, decoder.conv_act, decoder.conv_out

    def decode_frame(self, x: torch.Tensor) -> torch.Tensor:
        """One frame's 2D latents (B, C, h, w) -> (B, 3, H, W) in [0, 1]."""
        x = x / SPATIAL_SCALE
        if self.post_quant_conv is not None:
            x = self.post_quant_conv(x)
        h = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            for resnet in block.resnets:
                h = resnet(h, None)
            # the upsampler written out (nearest x2, conv): diffusers' Upsample2D branches on
            # the batch reaching 64, a guard an export with a dynamic batch cannot keep
            for upsampler in block.upsamplers or ():
                h = upsampler.conv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        h = self.conv(self.act(self.norm(h)))
        return (h / 2 + 0.5).clamp(0, 1)

    def forward(self, x):
        return torch.stack([self.decode_frame(x[:, :, i]) for i in range(x.shape[2])], dim=2)


def cut_decoder_modules(vae: OpenSoraVAE) -> list[tuple[str, nn.Module]]:
    """(name, module) of the decoder's blocks in order."""
    return [("temporal", TemporalStage(vae).eval()), ("spatial", SpatialDecoder(vae).eval())]
