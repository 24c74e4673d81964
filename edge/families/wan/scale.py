"""A diffusers Wan 2.1 folder with the real model's shapes and random weights, for speed and
memory benchmarks at real size without a download.

`edge scale-model --like wan2.1-t2v-1.3b OUT` writes a `WanPipeline` folder whose transformer
has Wan2.1-T2V-1.3B's shapes (1.42 B parameters, 5.7 GB fp32) and whose VAE is Wan's (127 M);
`--like wan2.1-small` the same architecture at a size a browser page holds (the web target's
benchmark: 8 blocks of width 256, a 2-layer UMT5 of width 512, the VAE at base width 32);
`--like wan2.2-ti2v-5b` Wan 2.2 TI2V-5B's shapes (transformer 5.00 B parameters, 18.6 GiB
fp32; its 705 M residual VAE; per-token timesteps).
The text encoder is a small UMT5 with the real output width (4096) unless `full_text_encoder`
asks for UMT5-XXL's shapes (5.7 B parameters, 22.7 GB fp32). Large models are written one
block per safetensors shard with diffusers' / transformers' index files, each block built on
its own, so memory holds one block at a time, never the model. Random weights cost exactly
what trained ones cost to read and compute; they make no video worth looking at.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edge.core.package import atomic_directory, check_replaceable
from edge.families.scaled import (
    identify_scaled_model,
    small_tokenizer,
    write_shards,
    write_text_encoder,
)

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
WAN21_T2V_13B = {"patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128,
                 "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
                 "ffn_dim": 8960, "num_layers": 30, "cross_attn_norm": True,
                 "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "image_dim": None,
                 "added_kv_proj_dim": None, "rope_max_seq_len": 1024}
# google/umt5-xxl encoder shapes
UMT5_XXL = {"d_model": 4096, "d_kv": 64, "num_heads": 64, "d_ff": 10240, "num_layers": 24,
            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu", "vocab_size": 256384}
# the small default: UMT5-XXL's output width (the transformer's text_dim), little else
UMT5_SMALL = UMT5_XXL | {"num_heads": 8, "d_ff": 1024, "num_layers": 2}

# Wan 2.1's architecture at a size a browser page holds in fp32 (the web target's benchmark):
# 8 blocks of width 256, a 2-layer UMT5 of width 512, Wan's VAE at a third of its width
WAN21_SMALL = WAN21_T2V_13B | {"num_attention_heads": 4, "attention_head_dim": 64,
                               "ffn_dim": 1024, "num_layers": 8, "text_dim": 512}
UMT5_SMALL_512 = UMT5_XXL | {"d_model": 512, "num_heads": 8, "d_ff": 1024, "num_layers": 2}


# Wan-AI/Wan2.2-TI2V-5B-Diffusers: the transformer (5.00 B parameters, 18.6 GiB fp32) and the
# residual VAE (705 M; 48 latent channels, RGB in 2x2 patches: 16x spatial). Its latent
# statistics here are placeholders of the right length: random weights need no real ones.
WAN22_TI2V_5B = WAN21_T2V_13B | {"num_attention_heads": 24, "attention_head_dim": 128,
                                 "in_channels": 48, "out_channels": 48, "ffn_dim": 14336}
WAN22_VAE = {"base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
             "num_res_blocks": 2, "temperal_downsample": [False, True, True],
             "is_residual": True, "in_channels": 12, "out_channels": 12, "patch_size": 2,
             "scale_factor_spatial": 16, "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48}


@dataclass(frozen=True)
class WanLike:
    """What `--like NAME` writes: the transformer's config, the small text encoder's (UMT5-XXL's
    with --full-text-encoder, where the transformer takes its width), the VAE's, and whether
    the pipeline hands the transformer a timestep per token (Wan 2.2 TI2V)."""

    transformer: dict
    text_encoder: dict
    vae: dict
    full_text_encoder: bool   # whether UMT5-XXL fits the transformer's text width
    expand_timesteps: bool = False


LIKE = {"wan2.1-t2v-1.3b": WanLike(WAN21_T2V_13B, UMT5_SMALL, {}, True),
        "wan2.1-small": WanLike(WAN21_SMALL, UMT5_SMALL_512, {"base_dim": 32}, False),
        "wan2.2-ti2v-5b": WanLike(WAN22_TI2V_5B, UMT5_SMALL, WAN22_VAE, True, True)}

def transformer_parts(config: dict) -> Iterator[tuple[str, nn.Module]]:
    """The transformer without its blocks, then each WanTransformerBlock on its own."""
    from diffusers import WanTransformer3DModel
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    dim = config["num_attention_heads"] * config["attention_head_dim"]
    yield "", WanTransformer3DModel(**(config | {"num_layers": 0}))
    for i in range(config["num_layers"]):
        yield f"blocks.{i}.", WanTransformerBlock(
            dim, config["ffn_dim"], config["num_attention_heads"], config["qk_norm"],
            config["cross_attn_norm"], config["eps"], config["added_kv_proj_dim"])


def text_encoder_parts(config) -> Iterator[tuple[str, nn.Module]]:
    """The UMT5 encoder without layers (embedding, final norm), then each layer."""
    from transformers import UMT5EncoderModel
    from transformers.models.umt5.modeling_umt5 import UMT5Block

    empty = config.__class__(**(config.to_dict() | {"num_layers": 0}))
    yield "", UMT5EncoderModel(empty)
    for i in range(config.num_layers):
        yield f"encoder.block.{i}.", UMT5Block(config, layer_idx=i)


def write_like(out: str | Path, like: str = "wan2.1-t2v-1.3b", seed: int = 0,
               on_part: Callable[[str], None] | None = None, force: bool = False,
               full_text_encoder: bool = False) -> dict:
    """Write the folder atomically; returns what was written (parameter counts). An earlier
    folder at `out` is replaced only with `force`, and only when scale-model wrote it."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
    from transformers import UMT5Config

    if like not in LIKE:
        raise ValueError(f"--like {like!r}: known: {', '.join(LIKE)}")
    shape = LIKE[like]
    if full_text_encoder and not shape.full_text_encoder:
        raise ValueError(f"--full-text-encoder: {like}'s transformer takes text of width "
                         f"{shape.transformer['text_dim']}, not UMT5-XXL's 4096")
    check_replaceable(Path(out), force, identify_scaled_model)
    torch.manual_seed(seed)
    tok = small_tokenizer()
    text = UMT5_XXL if full_text_encoder else shape.text_encoder | {"vocab_size": len(tok)}
    text_config = UMT5Config(**text, pad_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    index = {"_class_name": "WanPipeline", "_diffusers_version": "0.42.1",
             "boundary_ratio": None, "expand_timesteps": shape.expand_timesteps,
             "scheduler": ["diffusers", "UniPCMultistepScheduler"],
             "text_encoder": ["transformers", "UMT5EncoderModel"],
             "tokenizer": ["transformers", "T5Tokenizer"],
             "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": [None, None], "vae": ["diffusers", "AutoencoderKLWan"],
             "_edge_random_weights": {"like": like, "seed": seed}}
    with atomic_directory(out, identify_scaled_model) as tmp:
        (tmp / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
        tok.save_pretrained(tmp / "tokenizer")
        UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                flow_shift=3.0).save_pretrained(tmp / "scheduler")
        AutoencoderKLWan(**shape.vae).eval().save_pretrained(tmp / "vae")
        folder = tmp / "transformer"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(
            {"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.42.1",
             **shape.transformer}, indent=2) + "\n")
        transformer_params = write_shards(folder, "diffusion_pytorch_model.safetensors",
                                          "diffusion_pytorch_model.safetensors.index.json",
                                          transformer_parts(shape.transformer),
                                          shape.transformer["num_layers"] + 1, on_part)
        text_config.architectures = ["UMT5EncoderModel"]
        text_params = write_text_encoder(tmp / "text_encoder", text_config,
                                         text_encoder_parts(text_config), on_part)
    return {"like": like, "seed": seed, "transformer_params": transformer_params,
            "text_encoder_params": text_params}
