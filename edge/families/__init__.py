"""Model families: which code knows how to load, cut and sample a model.

Each family is a folder, edge/families/<family>/: its `__init__.py` registers it (name, the
diffusers pipeline class it reads, the folder it takes, its export options as data) without
torch, so the command line reads every family at start; `family.py` loads, cuts and samples
it. `load_model(folder)` reads `folder/model_index.json` (a diffusers pipeline folder), picks
the family by its `_class_name` and loads the model from local files only (a Hub id is
fetched into huggingface_hub's cache first, and read there: hub.py); no folder means
the shipped tiny-sora (a tiny-sora weights folder has no model_index.json: it is recognised
by its `tiny-sora.json`; an Open-Sora 1.2 folder of released checkpoints by its
transformer's config, model_type STDiT3). Every family answers the same questions
(`FamilyModel`, edge/graph/family_model.py); the exporters, the package format and the
runtimes know no family names.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from edge.core.declared import Option
from edge.core.files import kind_of
from edge.families.pipeline_options import SIZE_OPTIONS as _SIZES

if TYPE_CHECKING:
    from edge.graph.family_model import FamilyModel


class FamilyError(ValueError):
    """A model folder edge cannot take; the message names the folder, file or value."""


# family name -> its folder under edge/families/; the first is the default model
_FOLDERS = {"tiny-sora": "tiny_sora", "wan": "wan", "cogvideox": "cogvideox", "ltx": "ltx",
            "opensora": "opensora"}
FAMILIES = tuple(_FOLDERS)
DEFAULT_FAMILY = FAMILIES[0]
# the export options that size a diffusers family's package (tiny-sora's come with its weights)
SIZE_OPTIONS = tuple(option.name for option in _SIZES)


def registered(family: str) -> ModuleType:
    """A family's registration (edge/families/<family>/__init__.py): NAME, PIPELINE, FOLDER,
    OPTIONS, read without torch."""
    return importlib.import_module(f"edge.families.{_FOLDERS[family]}")


def family_module(family: str) -> ModuleType:
    """The family itself (edge/families/<family>/family.py): load, accepts, its model."""
    return importlib.import_module(f"edge.families.{_FOLDERS[family]}.family")


def pipeline_families() -> dict[str, str]:
    """`_class_name` in model_index.json -> the family that reads such a folder."""
    return {registered(f).PIPELINE: f for f in FAMILIES if registered(f).PIPELINE}


def declared_options(family: str) -> tuple[Option, ...]:
    """The export options a family's `load` takes, as it declares them."""
    return registered(family).OPTIONS


def export_options(family: str) -> tuple[str, ...]:
    """The names of a family's export options; `edge export` takes them as --options of the
    same names."""
    return tuple(option.name for option in declared_options(family))


def check_size(family: str, folder: Path | None) -> dict[str, int] | None:
    """The small video size the family's exports may be checked end to end at (`edge export
    --check small`), from the folder's JSON files; None where the family's size is fixed
    (tiny-sora)."""
    small = getattr(family_module(family), "check_size", None)
    return None if small is None else small(folder)


def is_opensora_folder(folder: Path) -> bool:
    """Whether `folder` is laid out as Open-Sora 1.2's released checkpoints (the opensora
    family): its transformer's config says STDiT3. JSON only, no torch."""
    config = folder / "transformer" / "config.json"
    if kind_of(config) != "a file":
        return False
    try:
        return json.loads(config.read_text()).get("model_type") == "STDiT3"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def family_of(folder: Path | None) -> str:
    """The family name of a model folder (None: the shipped tiny-sora), refused with a
    message naming the folder or value when edge cannot take it."""
    if folder is None or (folder / "tiny-sora.json").is_file():
        return DEFAULT_FAMILY
    index = folder / "model_index.json"
    kind = kind_of(folder)
    if kind == "missing":
        raise FamilyError(f"{folder}: no such model folder")
    if kind != "a folder":
        raise FamilyError(f"{folder}: is {kind}, not a model folder")
    kind = kind_of(index)
    if kind == "missing":
        if is_opensora_folder(folder):
            return "opensora"
        raise FamilyError(f"{folder}: no model_index.json (a diffusers pipeline folder has one; "
                          "a tiny-sora weights folder has tiny-sora.json; an Open-Sora 1.2 "
                          "folder has transformer/config.json of model_type STDiT3)")
    if kind != "a file":  # a FIFO would block the read
        raise FamilyError(f"{index}: is {kind}, not a JSON file")
    try:
        class_name = json.loads(index.read_text()).get("_class_name")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise FamilyError(f"{index}: not a JSON object ({err})") from None
    pipelines = pipeline_families()
    if class_name not in pipelines:
        raise FamilyError(f"{index}: _class_name {class_name!r} is not a supported pipeline; "
                          f"supported: {', '.join(sorted(pipelines))} (and tiny-sora "
                          "weights folders)")
    return pipelines[class_name]


def check_options(family: str, options: dict) -> None:
    """Refuse, naming the option, an export option given (not None) that the family does not
    declare: tiny-sora's video size and sampler come with its weights; an option of some
    families' own (e.g. LTX-Video's frame rate) names the families that take it."""
    refused = [k for k, v in options.items() if v is not None and k not in export_options(family)]
    sizes = [k for k in refused if k in SIZE_OPTIONS]
    if family == "tiny-sora" and sizes:
        raise FamilyError(f"{', '.join(f'--{k}' for k in sizes)}: for diffusers pipeline "
                          "folders; tiny-sora's video size and sampler come with its weights")
    for name in refused:
        takers = [f for f in sorted(FAMILIES) if name in export_options(f)]
        raise FamilyError(f"--{name.replace('_', '-')}: {family} models do not take it "
                          + (f"(an export option of {', '.join(takers)} models)" if takers
                             else "(no family takes it)"))


def exported_options(manifest: dict) -> dict:
    """The options that load a package's model again at the shapes it was exported at: what
    the manifest's `video` records of the options its family declares (the size; LTX-Video's
    frame rate, which its RoPE tables are computed for)."""
    family = manifest.get("family")
    video = manifest.get("video") or {}
    return ({k: v for k, v in video.items() if k in export_options(family)}
            if family in FAMILIES else {})


# options that say how a model is loaded, not what it is run at: a loaded model keeps them
LOAD_OPTIONS = ("out_of_core", "lora")


def model_at_size(model: FamilyModel, folder: Path, **options) -> FamilyModel:
    """`model`, loaded from `folder`, at the size and sampler its family's `accepts` makes of
    `options` (the export options, as `load_model` takes them), sharing its weights rather
    than reading them again: a check beside a large export must not hold the model twice (a
    second load of Wan 1.3B is 5.7 GB more). Its adapters come with it, being in the
    weights."""
    import dataclasses

    accepts = family_module(family_of(folder)).accepts
    given = {k: v for k, v in options.items() if v is not None and k not in LOAD_OPTIONS}
    from edge.families.pipeline_run import accepted_with_recipe

    accepted = accepted_with_recipe(accepts, folder, **given)
    # replace(), not a copy: a model's fields derived from its size (CogVideoX's decoder
    # chunking) are made again
    resized = dataclasses.replace(model, sampler=accepted.sampler, **accepted.size,
                                  **accepted.own)
    if "adapters" in vars(model):  # set after loading, not a field
        resized.adapters = model.adapters
    return resized


def load_model(folder: Path | None = None, **options) -> FamilyModel:
    """Load the model in `folder` (None: the shipped tiny-sora) through its family.
    `options` are the family's export options (`export_options`; None: the family's
    default)."""
    family = family_of(folder)
    check_options(family, options)
    given = {k: v for k, v in options.items() if v is not None}
    return family_module(family).load(folder, **given)
