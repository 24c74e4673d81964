"""What every target's manifest starts with, and the files beside the blocks that every
runtime needs (tokenizer, null caption): one place, so the targets cannot drift apart."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

import edge
from edge.models.text_encoder import MAX_TOKENS, minilm_dir
from edge.models.tiny_sora import TinySora
from edge.package import FORMAT, FORMAT_VERSION, file_entry


def write_extras(pipe: TinySora, root: Path, raw_null_caption: bool = False) -> dict:
    """Write the tokenizer and the null caption into `root`; returns their manifest entries.
    `raw_null_caption` also writes a little-endian float32 copy (`.f32`), which Swift reads
    without an .npy parser."""
    tok_dir = root / "tokenizer"
    tok_dir.mkdir(parents=True)
    shutil.copy(minilm_dir() / "tokenizer.json", tok_dir / "tokenizer.json")
    null = pipe.transformer.null_caption.detach().numpy().astype("<f4")
    npy = root / "conditioning" / "null_caption.npy"
    npy.parent.mkdir(parents=True)
    np.save(npy, null)
    conditioning = {"null_caption": file_entry(root, npy)}
    if raw_null_caption:
        raw = npy.with_suffix(".f32")
        raw.write_bytes(null.tobytes())
        conditioning["null_caption_f32"] = file_entry(root, raw)
    return {"tokenizer": {"files": [file_entry(root, tok_dir / "tokenizer.json")],
                          "max_tokens": MAX_TOKENS},
            "conditioning": conditioning}


def manifest_head(pipe: TinySora, root: Path, target: str, model_name: str,
                  raw_null_caption: bool = False) -> dict:
    """The manifest's first fields (format, producer, target, model, tokenizer,
    conditioning, sampler defaults, latent shape), with the extra files written."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "producer": f"edge {edge.__version__}", "target": target, "model": model_name,
            **write_extras(pipe, root, raw_null_caption),
            "sampler": pipe.sampler.to_dict(), "latent_shape": list(pipe.latent_shape)}
