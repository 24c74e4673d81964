"""Model families: which code knows how to load, cut and sample a model.

`load_model(folder)` reads `folder/model_index.json` (a diffusers pipeline folder), picks the
family by its `_class_name` and loads the model from local files only; no folder means the
shipped tiny-sora (a tiny-sora weights folder has no model_index.json: it is recognised by its
`tiny-sora.json`). One module per family answers the same questions (`FamilyModel`); the
exporters, the package format and the runtimes know no family names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edge.blocks import Block, Chunking
from edge.files import kind_of
from edge.sampler import SamplerSettings


class FamilyError(ValueError):
    """A model folder edge cannot take; the message names the folder, file or value."""


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


@dataclass(frozen=True)
class StorageRule:
    """A `--quantize` setting a family words itself for the device (`FamilyModel.
    device_storage`): the stored form of each block as (block key pattern, storage name)
    rules, the first pattern that matches a block key winning (fnmatch: "text_encoder/*");
    the names are the CoreML exporter's stored forms (exporters/coreml.py STORAGES: "fp16",
    "int8", "lut6", "lut4", "lut4-g16", ...). Chosen by measuring where bits cost the video
    (docs/benchmarks.md): which blocks' errors compound differs by family, and so does where
    the bytes are."""

    rules: tuple[tuple[str, str], ...]
    psnr_floor_db: float    # the export's end-to-end check refuses a package under it
    note: str               # why the rules are what they are, for the manifest


class FamilyModel(Protocol):
    name: str                       # the model's name (package folder names use it)
    family: str                     # the family's name, recorded in the manifest
    chunked: dict[str, Chunking]    # components the runtime runs chunk by chunk
    device_storage: dict[str, StorageRule]  # the --quantize settings it words itself ("4")

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


# `_class_name` in model_index.json -> family module name (edge/families/<module>.py)
PIPELINE_FAMILIES = {"WanPipeline": "wan", "CogVideoXPipeline": "cogvideox",
                     "LTXPipeline": "ltx"}
TARGETS_BY_FAMILY = {"tiny-sora": ("onnx", "iphone", "web"), "wan": ("onnx", "iphone", "web"),
                     "cogvideox": ("onnx", "iphone"), "ltx": ("onnx", "iphone")}


def family_of(folder: Path | None) -> str:
    """The family name of a model folder (None: the shipped tiny-sora), refused with a
    message naming the folder or value when edge cannot take it."""
    if folder is None or (folder / "tiny-sora.json").is_file():
        return "tiny-sora"
    index = folder / "model_index.json"
    kind = kind_of(folder)
    if kind == "missing":
        raise FamilyError(f"{folder}: no such model folder")
    if kind != "a folder":
        raise FamilyError(f"{folder}: is {kind}, not a model folder")
    kind = kind_of(index)
    if kind == "missing":
        raise FamilyError(f"{folder}: no model_index.json (a diffusers pipeline folder has one; "
                          "a tiny-sora weights folder has tiny-sora.json)")
    if kind != "a file":  # a FIFO would block the read
        raise FamilyError(f"{index}: is {kind}, not a JSON file")
    try:
        class_name = json.loads(index.read_text()).get("_class_name")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise FamilyError(f"{index}: not a JSON object ({err})") from None
    if class_name not in PIPELINE_FAMILIES:
        raise FamilyError(f"{index}: _class_name {class_name!r} is not a supported pipeline; "
                          f"supported: {', '.join(sorted(PIPELINE_FAMILIES))} (and tiny-sora "
                          "weights folders)")
    return PIPELINE_FAMILIES[class_name]


def check_target(family: str, target: str) -> None:
    if target not in TARGETS_BY_FAMILY[family]:
        raise FamilyError(f"--target {target} is not built for {family} models yet; "
                          f"{family} exports to {', '.join(TARGETS_BY_FAMILY[family])} "
                          "(docs/families.md)")


def check_options(family: str, options: dict) -> None:
    """Refuse export options the family does not take (tiny-sora's video size and sampler come
    with its weights)."""
    given = ", ".join(f"--{k}" for k, v in options.items() if v is not None)
    if family == "tiny-sora" and given:
        raise FamilyError(f"{given}: for diffusers pipeline folders; tiny-sora's video size "
                          "and sampler come with its weights")


def load_model(folder: Path | None = None, **options) -> FamilyModel:
    """Load the model in `folder` (None: the shipped tiny-sora) through its family.
    `options` are the family's export options (e.g. height, width, frames for Wan)."""
    family = family_of(folder)
    check_options(family, options)
    if family == "tiny-sora":
        from edge.families import tiny_sora

        return tiny_sora.load(folder)
    import importlib

    return importlib.import_module(f"edge.families.{family}").load(folder, **options)
