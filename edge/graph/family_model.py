"""What the exporters ask of a model, whatever its family (`FamilyModel`), and the two
shapes of its answers (`Shapes`, `StorageRule`). The families (edge/families/) implement it;
the exporters and runtimes import only this, so they know no family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edge.core.sampler import SamplerSettings
from edge.core.tiles import Tiling
from edge.graph.blocks import Block, Chunking


@dataclass(frozen=True)
class Shapes:
    """The static shapes a target runs a family's blocks at: the family's preset for that
    target (`FamilyModel.shapes`). A dynamic batch (ONNX) still traces at these sizes."""

    prompts: int = 2                   # captions per text encoder call
    guidance_batch: int = 2            # latents per transformer call (caption and null)
    decoder_frames: int | None = None  # latent frames per decoder call; None: the family's
                                       # own piece (all frames, or one for a chunked decoder)
    videos: int = 2                    # videos per decoder call where its input is laid out
                                       # as videos (B, C, T, h, w): 1 on a device
    tiled_decoder: bool = False        # a family that tiles its decoder (its `tiled`) traces
                                       # graphs of any tile size giving unclamped frames,
                                       # clamped by the runtime after blending (ONNX)
    static_tiles: bool = False         # with tiled_decoder, on a target of static shapes
                                       # (iphone, web): traced at the first tile of the video's
                                       # latents, a variant per other tile size it needs
                                       # (manifest_schema.tile_variant); where one tile holds
                                       # the latents, the whole frame as without tiles


@dataclass(frozen=True)
class StorageRule:
    """A `--quantize` setting a family words itself for the device (`FamilyModel.
    device_storage`): the stored form of each block as (block key pattern, storage name) rules, the
    first pattern that matches a block key winning (fnmatch: "text_encoder/*"); the names are the
    CoreML exporter's stored forms (exporters/iphone/coreml/package.py STORAGES: "fp16", "int8",
    "lut6", "lut4", "lut4-g16", ...). Chosen by measuring where bits cost the video
    (docs/benchmarks.md): which blocks' errors compound differs by family, and so does where the
    bytes are."""

    rules: tuple[tuple[str, str], ...]
    psnr_floor_db: float    # the export's end-to-end check refuses a package under it
    note: str               # why the rules are what they are, for the manifest
    # (block key pattern, tensor name pattern, storage name): tensors inside a block stored
    # in another form than the block's rule gives it, the first match winning (Open-Sora:
    # the cross-attention kept at int8 in pairs stored as int4). A tensor pattern matches
    # the parameter's name in the block ("spatial.cross_attn.q_linear.weight") and the
    # weight's name in the converted program ("p_spatial_cross_attn_q_linear_weight_to_fp16")
    # alike when written with wildcards around a name part ("*cross_attn*").
    tensors: tuple[tuple[str, str, str], ...] = ()


class FamilyModel(Protocol):
    name: str                       # the model's name (package folder names use it)
    family: str                     # the family's name, recorded in the manifest
    chunked: dict[str, Chunking]    # components the runtime runs chunk by chunk
    device_storage: dict[str, StorageRule]  # the --quantize settings it words itself ("4")
    # built without weights, each block's read from the model folder while it is exported or
    # run (edge/graph/lazy_weights.py): only the onnx target exports such a model
    out_of_core: bool

    @property
    def sampler(self) -> SamplerSettings: ...

    @property
    def latent_shape(self) -> tuple[int, ...]: ...

    def shapes(self, target: str) -> Shapes:
        """The static shapes this family's blocks take on `target` ("onnx", "iphone",
        "web"): one prompt on a device, the guidance batch, the decoder's pieces."""

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        """component name -> its blocks in execution order, at `shapes` (default: the onnx
        target's). A block the family lets the planner split for a budget carries its
        `splitter`."""

    def package_fields(self, root: Path, raw_null_caption: bool = False) -> dict:
        """Write tokenizer and conditioning files into `root`; return the manifest fields
        (tokenizer, conditioning, sampler, latent_shape, and layout fields if any)."""

    def generate(self, prompt: str, seed: int = 0,
                 on_step: Callable[[int, int], None] | None = None,
                 steps: int | None = None) -> np.ndarray:
        """The PyTorch reference video, uint8 (1, T, H, W, 3), for the runtime's noise of
        `seed` (and `steps`, default the sampler's): what an exported package must
        reproduce."""


def applied_tiles(model: FamilyModel, shapes: Shapes) -> dict[str, Tiling]:
    """The components `model.cut(shapes)` tiles, with their tiling (the manifest's `tiles`):
    the family's `tiled` where the target tiles, and on a target of static shapes only where
    the latents take more than one tile."""
    if not shapes.tiled_decoder:
        return {}
    size = model.latent_shape[-2:]
    return {name: tiling for name, tiling in getattr(model, "tiled", {}).items()
            if not shapes.static_tiles or tiling.applies(*size)}
