"""Model families: which code knows how to load, cut and sample a model.

`load_model(folder)` reads `folder/model_index.json` (a diffusers pipeline folder), picks the
family by its `_class_name` and loads the model from local files only; no folder means the
shipped tiny-sora (a tiny-sora weights folder has no model_index.json: it is recognised by its
`tiny-sora.json`). One module per family answers the same questions (`FamilyModel`); the
exporters, the package format and the runtimes know no family names.
"""

from __future__ import annotations

import json
from pathlib import Path

# the protocol lives beside the exporters' view of a model; the families import it from here
from edge.family_model import FamilyModel, Shapes, StorageRule  # noqa: F401 (re-exported)
from edge.files import kind_of


class FamilyError(ValueError):
    """A model folder edge cannot take; the message names the folder, file or value."""


# `_class_name` in model_index.json -> family module name (edge/families/<module>.py)
PIPELINE_FAMILIES = {"WanPipeline": "wan", "CogVideoXPipeline": "cogvideox",
                     "LTXPipeline": "ltx"}
TARGETS_BY_FAMILY = {"tiny-sora": ("onnx", "iphone", "web"), "wan": ("onnx", "iphone", "web"),
                     "cogvideox": ("onnx", "iphone", "web"), "ltx": ("onnx", "iphone", "web")}


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
