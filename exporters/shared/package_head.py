"""What every target's manifest starts with: format fields, then what the model's family
writes beside the blocks (tokenizer, conditioning, sampler, latent shape and layout). One
place, so the targets cannot drift apart."""

from __future__ import annotations

from pathlib import Path

import edge
from edge.core.noise import NOISE
from edge.core.package import FORMAT, FORMAT_VERSION
from edge.graph.family_model import FamilyModel


def manifest_head(model: FamilyModel, root: Path, target: str, model_name: str,
                  raw_null_caption: bool = False) -> dict:
    """The manifest's first fields, with the family's extra files written into `root`.
    `raw_null_caption`: also a raw float32 copy of a null caption (Swift reads no .npy)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "producer": f"edge {edge.__version__}", "target": target, "model": model_name,
            "family": model.family, "noise": NOISE, **model.package_fields(root, raw_null_caption)}
