"""Tiny random-weight diffusers Wan 2.1 pipeline folders, built offline from configs (no hub):
the reference edge's Wan family is held to."""

from __future__ import annotations

from pathlib import Path

import torch

from edge.families.scaled import small_tokenizer


def diffusers_frames(vae, z: torch.Tensor) -> torch.Tensor:
    """What WanPipeline makes of normalised latents z (B, C, T, h, w): denormalised,
    decoded by `vae.decode`, as frames in [0, 1] (B, 3, T', H, W)."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (vae.decode(z * std + mean).sample.clamp(-1, 1) + 1) / 2


def make_wan_folder(dest: Path, scheduler: str = "unipc", seed: int = 0, layers: int = 2,
                    text_layers: int = 2, version: str = "2.1") -> Path:
    """Write a tiny WanPipeline to `dest` with `save_pretrained`; returns `dest`.
    scheduler: "unipc" (Wan's default) or "euler" (flow-match Euler). version "2.2": Wan 2.2
    TI2V-5B's text-to-video shape: per-token timesteps (`expand_timesteps`), a 48-channel
    residual VAE with patch size 2 (16x spatial) and its own decoder width."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    tok = small_tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=text_layers,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1))
    wan22 = version == "2.2"
    z_dim = 48 if wan22 else 16
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=z_dim,
        out_channels=z_dim, text_dim=32, freq_dim=32, ffn_dim=48, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    if wan22:  # the latent statistics are the VAE's own numbers; any of the right length do
        stats = torch.Generator().manual_seed(seed + 1)
        vae = AutoencoderKLWan(
            base_dim=8, decoder_base_dim=12, z_dim=z_dim, dim_mult=[1, 2, 2, 2],
            num_res_blocks=1, temperal_downsample=[False, True, True], is_residual=True,
            patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16,
            latents_mean=(torch.randn(z_dim, generator=stats) * 0.5).tolist(),
            latents_std=(torch.rand(z_dim, generator=stats) + 0.5).tolist())
    else:
        vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True])
    if scheduler == "unipc":
        sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=3.0)
    else:
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    pipe = WanPipeline(tokenizer=tok, text_encoder=text_encoder.eval(),
                       transformer=transformer.eval(), vae=vae.eval(), scheduler=sched,
                       expand_timesteps=wan22)
    pipe.save_pretrained(dest)
    return dest
