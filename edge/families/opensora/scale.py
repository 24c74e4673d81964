"""An Open-Sora 1.2 folder with the released checkpoints' shapes and random weights, in the
released layout the opensora family takes (`edge scale-model --like opensora-1.2 OUT`), for
speed and memory benchmarks at real size without a download.

transformer/  STDiT3 as hpcai-tech/OpenSora-STDiT-v3's config.json gives it (1.21 B
              parameters, as released), written one block per safetensors shard
vae/          VAE-v1.2's config.json: the temporal VAE (filters 128, 4 residual blocks a
              level) and, inside model.safetensors as released, the SDXL 2D VAE: their
              decoding halves only (215 M parameters; the encoders are not needed to
              sample). The config names the SDXL VAE's hub folder, whose shapes the family
              uses; no folder of that name is written, so nothing is looked up
text_encoder/ a small T5 v1.1 encoder of T5-XXL's width (4096), as the other presets hold
tokenizer/    a small Unigram T5 tokenizer
edge_random_weights.json   what wrote the folder (scale-model replaces only its own)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from edge.core.package import atomic_directory, check_replaceable
from edge.families.scaled import (
    T5_SMALL,
    identify_scaled_model,
    small_tokenizer,
    t5_encoder_parts,
    write_shards,
    write_text_encoder,
)

# hpcai-tech/OpenSora-STDiT-v3 config.json (the fields edge reads)
STDIT3_V3 = {"model_type": "STDiT3", "architectures": ["STDiT3"], "depth": 28,
             "hidden_size": 1152, "num_heads": 16, "patch_size": [1, 2, 2], "in_channels": 4,
             "caption_channels": 4096, "model_max_length": 300, "mlp_ratio": 4.0,
             "qk_norm": True, "pred_sigma": True, "input_sq_size": 512}
# hpcai-tech/OpenSora-VAE-v1.2 config.json
VAE_V12 = {"model_type": "VideoAutoencoderPipeline",
           "architectures": ["VideoAutoencoderPipeline"], "micro_frame_size": 17,
           "scale": [3.85, 2.32, 2.33, 3.06], "shift": [-0.10, 0.34, 0.27, 0.98],
           "vae_2d": {"type": "VideoAutoencoderKL", "micro_batch_size": 4,
                      "from_pretrained": "PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers",
                      "subfolder": "vae", "local_files_only": True},
           "vae_temporal": {"type": "VAE_Temporal", "from_pretrained": None, "filters": 128,
                            "channel_multipliers": [1, 2, 2, 4],
                            "temporal_downsample": [False, True, True],
                            "num_res_blocks": 4, "num_groups": 32, "in_out_channels": 4,
                            "latent_embed_dim": 4, "embed_dim": 4}}
LIKE = ("opensora-1.2",)
MARK = "edge_random_weights.json"


def transformer_parts(depth: int) -> Iterator[tuple[str, nn.Module]]:
    """STDiT3 without its blocks, then each spatial and temporal block on its own under the
    name the whole model gives it; the conditioning tables drawn small, not zero, so the
    random model's blocks see their modulation."""
    from edge.families.opensora.family import dataclass_config
    from edge.families.opensora.stdit3 import STDiT3, STDiT3Block, STDiT3Config

    cfg = dataclass_config(STDiT3Config, STDIT3_V3, Path("config.json"))
    rest = STDiT3(STDiT3Config(**{**cfg.__dict__, "depth": 0}))
    rest.y_embedder.y_embedding.normal_(std=0.1)
    rest.final_layer.scale_shift_table.data.normal_(std=cfg.hidden_size ** -0.5)
    yield "", rest
    del rest
    for i in range(depth):
        for kind, temporal in (("spatial", False), ("temporal", True)):
            block = STDiT3Block(cfg, temporal)
            block.scale_shift_table.data.normal_(std=cfg.hidden_size ** -0.5)
            yield f"{kind}_blocks.{i}.", block


def vae_module() -> nn.Module:
    """The VAE's decoding half at VAE-v1.2's shapes (the SDXL 2D VAE's), random weights."""
    from diffusers import AutoencoderKL

    from edge.families.opensora.family import SDXL_VAE, dataclass_config
    from edge.families.opensora.vae import OpenSoraVAE, TemporalVAEConfig

    temporal = dataclass_config(TemporalVAEConfig, VAE_V12["vae_temporal"], Path("config.json"))
    vae = OpenSoraVAE(temporal, AutoencoderKL(**{k: v for k, v in SDXL_VAE.items()}),
                      VAE_V12["micro_frame_size"])
    vae.scale.copy_(torch.tensor(VAE_V12["scale"]).reshape(vae.scale.shape))
    vae.shift.copy_(torch.tensor(VAE_V12["shift"]).reshape(vae.shift.shape))
    return vae


def write_like(out: str | Path, like: str = "opensora-1.2", seed: int = 0,
               on_part: Callable[[str], None] | None = None, force: bool = False) -> dict:
    """Write the folder atomically; returns what was written (parameter counts). An earlier
    folder at `out` is replaced only with `force`, and only when scale-model wrote it."""
    from safetensors.torch import save_file
    from transformers import T5Config

    if like not in LIKE:
        raise ValueError(f"--like {like!r}: known: {', '.join(LIKE)}")
    check_replaceable(Path(out), force, identify_scaled_model)
    torch.manual_seed(seed)
    tok = small_tokenizer()
    text_config = T5Config(**T5_SMALL, vocab_size=len(tok), pad_token_id=0, eos_token_id=1)
    text_config.architectures = ["T5EncoderModel"]
    with atomic_directory(out, identify_scaled_model) as tmp:
        (tmp / MARK).write_text(json.dumps({"random_weights": {"like": like, "seed": seed}})
                                + "\n")
        tok.save_pretrained(tmp / "tokenizer")
        (tmp / "vae").mkdir()
        (tmp / "vae" / "config.json").write_text(json.dumps(VAE_V12, indent=2) + "\n")
        vae = vae_module()
        save_file({k: v.contiguous() for k, v in vae.state_dict().items()},
                  tmp / "vae" / "model.safetensors", metadata={"format": "pt"})
        del vae
        if on_part:
            on_part("vae")
        folder = tmp / "transformer"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(STDIT3_V3, indent=2) + "\n")
        depth = STDIT3_V3["depth"]
        transformer_params = write_shards(folder, "model.safetensors",
                                          "model.safetensors.index.json",
                                          transformer_parts(depth), 2 * depth + 1, on_part)
        text_params = write_text_encoder(tmp / "text_encoder", text_config,
                                         t5_encoder_parts(text_config), on_part)
    return {"like": like, "seed": seed, "transformer_params": transformer_params,
            "text_encoder_params": text_params}
