"""A diffusers CogVideoX-2B folder with the real model's shapes and random weights, for speed
and memory benchmarks at real size without a download (`edge scale-model --like cogvideox-2b
OUT`): the transformer and a small T5 of T5-XXL's width written one block per safetensors
shard (edge/families/scaled.py), the VAE whole."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from edge.families.scaled import FamilyLike, write_family_like

# THUDM/CogVideoX-2b transformer/config.json (1.69 B parameters): 2B's sin-cos positions
COGVIDEOX_2B = {"num_attention_heads": 30, "attention_head_dim": 64, "in_channels": 16,
                "out_channels": 16, "time_embed_dim": 512, "text_embed_dim": 4096,
                "num_layers": 30, "sample_height": 60, "sample_width": 90, "sample_frames": 49,
                "patch_size": 2, "max_text_seq_length": 226,
                "use_rotary_positional_embeddings": False}

# THUDM/CogVideoX-2b vae/config.json: AutoencoderKLCogVideoX's defaults, written out
COGVIDEOX_VAE = {"block_out_channels": [128, 256, 256, 512], "latent_channels": 16,
                 "layers_per_block": 3, "scaling_factor": 1.15258426}

# THUDM/CogVideoX-2b scheduler/scheduler_config.json
COGVIDEOX_SCHEDULER = {"prediction_type": "v_prediction", "beta_schedule": "scaled_linear",
                       "clip_sample": False, "rescale_betas_zero_snr": True,
                       "timestep_spacing": "trailing", "snr_shift_scale": 3.0}



def cogvideox_block(config: dict) -> nn.Module:
    """One CogVideoXBlock as CogVideoXTransformer3DModel builds it from its (full) config."""
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    return CogVideoXBlock(
        dim=config["num_attention_heads"] * config["attention_head_dim"],
        num_attention_heads=config["num_attention_heads"],
        attention_head_dim=config["attention_head_dim"],
        time_embed_dim=config["time_embed_dim"], dropout=config["dropout"],
        activation_fn=config["activation_fn"], attention_bias=config["attention_bias"],
        norm_elementwise_affine=config["norm_elementwise_affine"], norm_eps=config["norm_eps"])


LIKE = {"cogvideox-2b": FamilyLike("CogVideoXPipeline", "CogVideoXTransformer3DModel",
                                   "AutoencoderKLCogVideoX", "CogVideoXDDIMScheduler",
                                   COGVIDEOX_2B, COGVIDEOX_VAE, COGVIDEOX_SCHEDULER,
                                   cogvideox_block)}


def write_like(out: str | Path, like: str, seed: int = 0,
               on_part: Callable[[str], None] | None = None, force: bool = False) -> dict:
    """Write the folder of preset `like` atomically (edge/families/scaled.py)."""
    return write_family_like(out, like, LIKE, seed, on_part, force)
