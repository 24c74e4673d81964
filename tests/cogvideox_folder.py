"""Tiny random-weight diffusers CogVideoX pipeline folders, built offline from configs (no
hub): the reference edge's CogVideoX family is held to."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_parts import tiny_t5_encoder

from edge.families.scaled import small_tokenizer

# the transformer's own size, in latent cells and frames: exports at another size make the
# sin-cos position table there (diffusers rebuilds it in place when the sizes differ)
SAMPLE = {"sample_height": 4, "sample_width": 6, "sample_frames": 9}


def make_cogvideox_folder(dest: Path, rotary: bool = False, seed: int = 0, layers: int = 2,
                          text_layers: int = 2, text_tokens: int = 16) -> Path:
    """Write a tiny CogVideoXPipeline to `dest` with `save_pretrained`; returns `dest`.
    rotary: CogVideoX-5B's shape (3D rotary positions in attention, no sin-cos table);
    else 2B's (a 3D sin-cos table added to the patches)."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    torch.manual_seed(seed)
    tok = small_tokenizer()
    text_encoder = tiny_t5_encoder(len(tok), text_layers)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=8, out_channels=8,
        time_embed_dim=16, text_embed_dim=32, num_layers=layers, max_text_seq_length=text_tokens,
        use_rotary_positional_embeddings=rotary, **SAMPLE)
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 16, 16), latent_channels=8, layers_per_block=1,
        norm_num_groups=4, temporal_compression_ratio=4, sample_height=32, sample_width=48,
        scaling_factor=0.7)
    scheduler = CogVideoXDDIMScheduler(
        beta_schedule="scaled_linear", clip_sample=False, prediction_type="v_prediction",
        rescale_betas_zero_snr=True, timestep_spacing="trailing",
        snr_shift_scale=1.0 if rotary else 3.0)
    pipe = CogVideoXPipeline(tokenizer=tok, text_encoder=text_encoder.eval(), vae=vae.eval(),
                             transformer=transformer.eval(), scheduler=scheduler)
    pipe.save_pretrained(dest)
    return dest
