"""A diffusers LTX-Video 0.9.0 (2B) folder with the real model's shapes and random weights, for
speed and memory benchmarks at real size without a download (`edge scale-model --like
ltx-video-2b OUT`): the transformer and a small T5 of T5-XXL's width written one block per
safetensors shard (edge/families/scaled.py), the VAE whole."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from edge.families.scaled import FamilyLike, write_family_like

# Lightricks/LTX-Video 0.9.0: LTXVideoTransformer3DModel's defaults are its 2B transformer
# (1.92 B parameters), AutoencoderKLLTXVideo's its VAE; written out so a changed default in
# diffusers shows here
LTX_VIDEO_2B = {"in_channels": 128, "out_channels": 128, "num_attention_heads": 32,
                "attention_head_dim": 64, "cross_attention_dim": 2048, "num_layers": 28,
                "caption_channels": 4096}

LTX_VAE = {"latent_channels": 128, "patch_size": 4}

# Lightricks/LTX-Video scheduler/scheduler_config.json
LTX_SCHEDULER = {"use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05,
                 "base_image_seq_len": 1024, "max_image_seq_len": 4096,
                 "shift_terminal": 0.1, "time_shift_type": "exponential"}



def ltx_block(config: dict) -> nn.Module:
    """One LTXVideoTransformerBlock as LTXVideoTransformer3DModel builds it."""
    from diffusers.models.transformers.transformer_ltx import LTXVideoTransformerBlock

    return LTXVideoTransformerBlock(
        dim=config["num_attention_heads"] * config["attention_head_dim"],
        num_attention_heads=config["num_attention_heads"],
        attention_head_dim=config["attention_head_dim"],
        cross_attention_dim=config["cross_attention_dim"], qk_norm=config["qk_norm"],
        activation_fn=config["activation_fn"], attention_bias=config["attention_bias"],
        attention_out_bias=config["attention_out_bias"], eps=config["norm_eps"],
        elementwise_affine=config["norm_elementwise_affine"])


LIKE = {"ltx-video-2b": FamilyLike("LTXPipeline", "LTXVideoTransformer3DModel",
                                   "AutoencoderKLLTXVideo", "FlowMatchEulerDiscreteScheduler",
                                   LTX_VIDEO_2B, LTX_VAE, LTX_SCHEDULER, ltx_block)}


def write_like(out: str | Path, like: str, seed: int = 0,
               on_part: Callable[[str], None] | None = None, force: bool = False) -> dict:
    """Write the folder of preset `like` atomically (edge/families/scaled.py)."""
    return write_family_like(out, like, LIKE, seed, on_part, force)
