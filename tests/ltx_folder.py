"""Tiny random-weight diffusers LTX-Video pipeline folders, built offline from configs (no
hub): the reference edge's LTX family is held to. Two decoders: 0.9.0's plain one and a
timestep-conditioned one shaped as 0.9.5's (residual upsamplers that halve the channels, no
injected noise), both with LTX's non-causal padding in time."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_parts import tiny_t5_encoder

from edge.families.scaled import small_tokenizer

LATENT_CHANNELS = 8
# the VAE's 2 x 2 patches and two space-time upsamplings: 8x in space, 4x in time (LTX's
# own are 32x and 8x; the code paths are the same)
VAE_COMMON = {"latent_channels": LATENT_CHANNELS, "block_out_channels": (8, 16, 16, 16),
              "layers_per_block": (1, 1, 1, 1, 1),
              "spatio_temporal_scaling": (True, True, False, False), "patch_size": 2,
              "scaling_factor": 0.8}
PLAIN_DECODER = {"decoder_block_out_channels": (8, 16, 16, 16),
                 "decoder_layers_per_block": (1, 1, 1, 1, 1),
                 "decoder_spatio_temporal_scaling": (True, True, False, False)}
TIMESTEP_DECODER = {"decoder_block_out_channels": (16, 32),
                    "decoder_layers_per_block": (1, 1, 1),
                    "decoder_spatio_temporal_scaling": (True, True),
                    "decoder_inject_noise": (False, False, False),
                    "upsample_residual": (True, True), "upsample_factor": (2, 2),
                    "timestep_conditioning": True}
# LTX-Video 0.9.x's scheduler config (scheduler/scheduler_config.json of the hub folders)
SCHEDULER = {"use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05,
             "base_image_seq_len": 1024, "max_image_seq_len": 4096, "shift_terminal": 0.1}


def make_ltx_folder(dest: Path, timestep_decoder: bool = False, seed: int = 0,
                    layers: int = 2, text_layers: int = 2) -> Path:
    """Write a tiny LTXPipeline to `dest` with `save_pretrained`; returns `dest`.
    timestep_decoder: a decoder conditioned on the decode timestep (0.9.5's shape); else
    0.9.0's plain decoder."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    torch.manual_seed(seed)
    tok = small_tokenizer()
    text_encoder = tiny_t5_encoder(len(tok), text_layers)
    # inner width 32: RoPE's 3 axes x 5 frequencies x 2 leave 2 channels of padding, as
    # LTX's 2048 does
    transformer = LTXVideoTransformer3DModel(
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_attention_heads=2,
        attention_head_dim=16, cross_attention_dim=32, num_layers=layers, caption_channels=32)
    vae = AutoencoderKLLTXVideo(**VAE_COMMON,
                                **(TIMESTEP_DECODER if timestep_decoder else PLAIN_DECODER))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a latent space of its own: the denormalisation is not a no-op
        vae.latents_mean.copy_(0.3 * torch.randn(LATENT_CHANNELS, generator=g))
        vae.latents_std.copy_(0.5 + torch.rand(LATENT_CHANNELS, generator=g))
    pipe = LTXPipeline(tokenizer=tok, text_encoder=text_encoder.eval(), vae=vae.eval(),
                       transformer=transformer.eval(),
                       scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))
    pipe.save_pretrained(dest)
    return dest
