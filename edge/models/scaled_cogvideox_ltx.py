"""Diffusers CogVideoX-2B and LTX-Video 2B folders with the real models' shapes and random
weights, for speed and memory benchmarks at real size without a download (`edge scale-model
--like cogvideox-2b | ltx-video-2b OUT`; Wan's presets are edge/models/scaled_wan.py's).

Both take a T5 v1.1 XXL encoder's output (width 4096); the folder holds a small T5 of that
width, as the Wan presets hold a small UMT5. The transformer and the text encoder are written
one block per safetensors shard (scaled_wan's `write_shards`), so memory holds one block at a
time; the VAE, a few hundred M parameters, is written whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from edge.core.package import atomic_directory, check_replaceable
from edge.models.scaled import identify_scaled_model
from edge.models.scaled_wan import small_tokenizer, write_shards, write_text_encoder

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

# google/t5-v1_1-xxl encoder shapes at its output width (the transformers' text width) and
# little else, as scaled_wan's UMT5_SMALL
T5_SMALL = {"d_model": 4096, "d_kv": 64, "num_heads": 8, "d_ff": 1024, "num_layers": 2,
            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu"}


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


@dataclass(frozen=True)
class FamilyLike:
    """What `--like NAME` writes: the pipeline and component classes (diffusers names), their
    configs, and how to build one transformer block from the transformer's full config."""

    pipeline: str
    transformer_class: str
    vae_class: str
    scheduler_class: str
    transformer: dict
    vae: dict
    scheduler: dict
    block: Callable[[dict], nn.Module]
    text_encoder: dict = field(default_factory=T5_SMALL.copy)


LIKE = {"cogvideox-2b": FamilyLike("CogVideoXPipeline", "CogVideoXTransformer3DModel",
                                   "AutoencoderKLCogVideoX", "CogVideoXDDIMScheduler",
                                   COGVIDEOX_2B, COGVIDEOX_VAE, COGVIDEOX_SCHEDULER,
                                   cogvideox_block),
        "ltx-video-2b": FamilyLike("LTXPipeline", "LTXVideoTransformer3DModel",
                                   "AutoencoderKLLTXVideo", "FlowMatchEulerDiscreteScheduler",
                                   LTX_VIDEO_2B, LTX_VAE, LTX_SCHEDULER, ltx_block)}


def transformer_parts(shape: FamilyLike) -> Iterator[tuple[str, nn.Module]]:
    """The transformer without its blocks, then each block on its own under the name the
    whole model gives it (transformer_blocks.{i}.)."""
    import diffusers

    rest = getattr(diffusers, shape.transformer_class)(**(shape.transformer | {"num_layers": 0}))
    config = dict(rest.config)  # every argument, defaults included, for the blocks
    yield "", rest
    del rest  # one module in memory at a time
    for i in range(shape.transformer["num_layers"]):
        yield f"transformer_blocks.{i}.", shape.block(config)


def text_encoder_parts(config) -> Iterator[tuple[str, nn.Module]]:
    """The T5 encoder without layers (embedding, final norm), then each layer; only the first
    holds the relative attention bias, which T5 shares across its layers."""
    from transformers import T5EncoderModel
    from transformers.models.t5.modeling_t5 import T5Block

    empty = config.__class__(**(config.to_dict() | {"num_layers": 0}))
    yield "", T5EncoderModel(empty)
    for i in range(config.num_layers):
        yield f"encoder.block.{i}.", T5Block(config, has_relative_attention_bias=(i == 0),
                                             layer_idx=i)


def write_family_like(out: str | Path, like: str, seed: int = 0,
                      on_part: Callable[[str], None] | None = None, force: bool = False) -> dict:
    """Write the folder atomically; returns what was written (parameter counts). An earlier
    folder at `out` is replaced only with `force`, and only when scale-model wrote it."""
    import diffusers
    from transformers import T5Config

    if like not in LIKE:
        raise ValueError(f"--like {like!r}: known: {', '.join(LIKE)}")
    shape = LIKE[like]
    check_replaceable(Path(out), force, identify_scaled_model)
    torch.manual_seed(seed)
    tok = small_tokenizer()
    text_config = T5Config(**shape.text_encoder, vocab_size=len(tok), pad_token_id=0,
                           eos_token_id=1)
    text_config.architectures = ["T5EncoderModel"]
    index = {"_class_name": shape.pipeline, "_diffusers_version": diffusers.__version__,
             "scheduler": ["diffusers", shape.scheduler_class],
             "text_encoder": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "T5Tokenizer"],
             "transformer": ["diffusers", shape.transformer_class],
             "vae": ["diffusers", shape.vae_class],
             "_edge_random_weights": {"like": like, "seed": seed}}
    transformer_class = getattr(diffusers, shape.transformer_class)
    with atomic_directory(out, identify_scaled_model) as tmp:
        (tmp / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
        tok.save_pretrained(tmp / "tokenizer")
        getattr(diffusers, shape.scheduler_class)(**shape.scheduler).save_pretrained(
            tmp / "scheduler")
        getattr(diffusers, shape.vae_class)(**shape.vae).eval().save_pretrained(tmp / "vae")
        folder = tmp / "transformer"
        with torch.device("meta"):  # the full config.json, defaults included, without weights
            transformer_class(**shape.transformer).save_config(folder)
        transformer_params = write_shards(folder, "diffusion_pytorch_model.safetensors",
                                          "diffusion_pytorch_model.safetensors.index.json",
                                          transformer_parts(shape),
                                          shape.transformer["num_layers"] + 1, on_part)
        text_params = write_text_encoder(tmp / "text_encoder", text_config,
                                         text_encoder_parts(text_config), on_part)
    return {"like": like, "seed": seed, "transformer_params": transformer_params,
            "text_encoder_params": text_params}
