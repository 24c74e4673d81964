"""Random-weight LoRA adapters in diffusers' format for the tiny family folders: made with
peft on the folder's own transformer and written by the pipeline's `save_lora_weights`,
as a trainer using diffusers writes them."""

from __future__ import annotations

from pathlib import Path

import torch

# every attention projection and both feed-forward layers, in each family's naming
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "net.0.proj", "net.2"]


def make_lora(folder: Path, dest: Path, rank: int = 4, seed: int = 0,
              strength: float = 2.0) -> Path:
    """A rank-`rank` LoRA for the transformer of the pipeline folder `folder`, written to
    `dest` (a .safetensors file); lora_B drawn at `strength` so the video visibly changes."""
    from diffusers import DiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe = DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    torch.manual_seed(seed)
    pipe.transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS,
                                            init_lora_weights=False))
    layers = get_peft_model_state_dict(pipe.transformer)
    for name, tensor in layers.items():
        if "lora_B" in name:
            tensor.copy_(torch.randn_like(tensor) * strength / rank ** 0.5)
    dest.parent.mkdir(parents=True, exist_ok=True)
    type(pipe).save_lora_weights(dest.parent, transformer_lora_layers=layers,
                                 weight_name=dest.name)
    return dest
