"""Reading a diffusers pipeline folder the way every family does: its JSON files checked
field by field, its components listed, its pipeline loaded in float32 from local files only.
Each error is a FamilyError naming the file, field or value."""

from __future__ import annotations

import inspect
import json
import math
import re
import warnings
from pathlib import Path

from edge.core.budget import physical_memory_bytes
from edge.core.files import kind_of
from edge.core.sampler import SamplerSettings
from edge.families import FamilyError
from edge.families.config_check import check_component, component_builder, stored_tensors


def read_json(path: Path) -> dict:
    kind = kind_of(path)
    if kind != "a file":  # a FIFO would block the read; a link loop is not "missing"
        raise FamilyError(f"{path}: {kind}" if kind == "missing" or kind.startswith("unreadable")
                          else f"{path}: is {kind}, not a JSON file")
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise FamilyError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise FamilyError(f"{path}: not JSON ({err})") from None
    if not isinstance(value, dict):
        raise FamilyError(f"{path}: must be a JSON object")
    return value


def check_component_folders(folder: Path, components: tuple[str, ...]) -> dict:
    """model_index.json lists each of `components`, and each is a folder; returns the index."""
    index = read_json(folder / "model_index.json")
    for name in components:
        entry = index.get(name)
        if not isinstance(entry, list) or entry[0] is None:
            raise FamilyError(f"{folder / 'model_index.json'}: no {name!r} component")
        kind = kind_of(folder / name)
        if kind != "a folder":
            raise FamilyError(f"{folder / name}: {kind if kind == 'missing' else 'is ' + kind}"
                              f" (model_index.json lists {name!r} as a component folder)")
        check_component_files(folder / name)
    return index


def check_component_files(component: Path) -> None:
    """Every entry of a component folder is a file or a folder: diffusers opens whatever
    weights and configs it finds there, and a FIFO would block that read for ever (a device
    or a socket is no file either). Its JSON files (configs, tokenizer files) are read here
    first, so one that is not UTF-8 JSON is named, not reported by a library without it."""
    for entry in sorted(component.iterdir()):
        kind = kind_of(entry)
        if kind not in ("a file", "a folder"):
            raise FamilyError(f"{entry}: is {kind}, not a file; a model folder holds files "
                              "and folders only")
        if kind == "a file" and entry.suffix == ".json":
            read_json(entry)
        if kind == "a file" and entry.name == "tokenizer.json":
            check_tokenizer_file(entry)


def check_tokenizer_file(path: Path) -> None:
    """A tokenizer.json the `tokenizers` library reads: transformers, given JSON that is no
    tokenizer, fails with a bare KeyError ('added_tokens') that names nothing."""
    import json

    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001  (the library raises its own Exception)
        raise FamilyError(f"{path}: not a tokenizer the tokenizers library reads "
                          f"({str(err).strip()[:200]})") from None
    # the library fills in what a file leaves out; transformers reads the file itself and
    # expects every top-level field the library writes
    missing = sorted(set(json.loads(tokenizer.to_str())) - set(read_json(path)))
    if missing:
        raise FamilyError(f"{path}: lacks {', '.join(map(repr, missing))}, which every "
                          "tokenizer.json the tokenizers library writes holds")


def number_field(cfg: dict, key: str, default: float, path: Path) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FamilyError(f"{path}: {key}={value!r}; must be a number")
    return float(value)


def checked_sampler(path: Path, shift_key: str, settings: SamplerSettings) -> SamplerSettings:
    """The settings as the runtimes will check them (edge/core/options.py), refused here, before
    any work, naming the file and its field."""
    from edge.core.options import check_settings

    try:
        return check_settings(settings)
    except ValueError as err:
        raise FamilyError(f"{path}: {shift_key}={settings.shift!r} gives no usable sampler: "
                          f"{err}") from None


def train_timesteps(cfg: dict, path: Path) -> int:
    n_train = cfg.get("num_train_timesteps", 1000)
    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 2:
        raise FamilyError(f"{path}: num_train_timesteps={n_train!r}; must be an integer of at "
                          "least 2")
    return n_train


def component_config(folder: Path, component: str, model_class,
                     filename: str = "config.json") -> dict:
    """A component's config file, each field missing there at the class's own default (as
    diffusers and transformers fill it when they load the folder)."""
    path = folder / component / filename
    cfg = read_json(path)
    defaults = {n: p.default for n, p in inspect.signature(model_class.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return defaults | cfg | {"_path": path}


def int_field(cfg: dict, key: str, least: int = 1) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise FamilyError(f"{cfg['_path']}: {key}={value!r}; must be an integer of at least "
                          f"{least}")
    return value


def stored_dtypes(component: Path) -> set[str]:
    """The dtypes of the tensors stored in a component folder's safetensors files (headers
    only: nothing is loaded)."""
    from safetensors import safe_open

    found = set()
    for path in sorted(component.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            found |= {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
    return found


def load_error(folder: Path, message: str) -> str:
    """diffusers' loading error, said in terms of the folder: a weight whose shape is not the
    config's is named with its file."""
    from safetensors import safe_open

    found = re.search(r"because (\S+) expected shape torch\.Size\((\[.*?\])\), but got "
                      r"torch\.Size\((\[.*?\])\)", message)
    if found:
        tensor, want, got = found.groups()
        for component in ("transformer", "vae", "text_encoder"):
            for path in sorted((folder / component).glob("*.safetensors")):
                with safe_open(path, "pt") as f:
                    if tensor in f.keys():  # noqa: SIM118
                        return (f"{path}: tensor {tensor!r} has shape {got}, but "
                                f"{folder / component / 'config.json'} makes it {want}")
        return f"{folder}: tensor {tensor!r} has shape {got}, its config makes it {want}"
    return f"{folder}: diffusers could not load the pipeline: {message.strip()[:400]}"


def load_float32_pipeline(folder: Path, pipeline_class) -> tuple:
    """The folder's pipeline of `pipeline_class` in float32, from local files only, its
    progress bar off (edge shows its own); (pipeline, notes on converted weights)."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    try:  # the folder was checked by the family first: model_index.json and every component
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = pipeline_class.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, RuntimeError) as err:
        raise FamilyError(load_error(folder, str(err))) from None
    notes: list[str] = []
    for name in ("text_encoder", "transformer", "vae"):
        setattr(pipe, name, getattr(pipe, name).float().eval())
        stored = stored_dtypes(folder / name) - {"F32"}
        if stored:
            notes.append(f"{folder / name}: weights stored as {', '.join(sorted(stored))}, "
                         "converted to float32 (packages hold float32)")
    pipe.set_progress_bar_config(disable=True)
    return pipe, notes


# components whose weights an out-of-core load leaves in the folder until a block needs them
WEIGHTED_COMPONENTS = ("text_encoder", "transformer", "vae")


def weights_bytes_float32(folder: Path) -> int:
    """What the weighted components' tensors take in memory as float32 (headers only)."""
    return sum(math.prod(t.shape) * 4 for name in WEIGHTED_COMPONENTS
               for t in stored_tensors(folder / name).values())


def larger_than_memory(folder: Path) -> bool:
    """Whether the model's float32 weights would take more than half this machine's memory:
    then an export holds one block at a time (`load_storage_free_pipeline`). A component
    stored otherwise than as safetensors (PyTorch's .bin) is loaded whole by diffusers."""
    if any(not any((folder / name).glob("*.safetensors")) for name in WEIGHTED_COMPONENTS):
        return False
    return weights_bytes_float32(folder) > physical_memory_bytes() // 2


def _empty_model(folder: Path, library: str, class_name: str):
    """The model class model_index.json names for a component, built without weights."""
    from edge.graph.lazy_weights import ShardError, empty_component

    _, build = component_builder(folder, library, class_name)
    try:
        return empty_component(build, folder)
    except ShardError as err:
        raise FamilyError(str(err)) from None


def check_weighted_components(folder: Path, components: tuple[str, ...] = WEIGHTED_COMPONENTS
                              ) -> None:
    """Each component's config against its class and its stored weights
    (edge/families/config_check.py), before either library builds a model from it."""
    index = read_json(folder / "model_index.json")
    for name in components:
        check_component(folder / name, *index[name][:2],
                        read_json(folder / name / "config.json"))


def load_storage_free_pipeline(folder: Path, pipeline_class,
                               components: tuple[str, ...] = WEIGHTED_COMPONENTS) -> tuple:
    """The folder's pipeline with `components` built on the meta device, their weights read
    block by block when exported (edge/graph/lazy_weights.py); the tokenizer and scheduler loaded
    as usual. (pipeline, notes): a note on weights stored in another dtype than float32."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    index = read_json(folder / "model_index.json")
    empties = {name: _empty_model(folder / name, *index[name]) for name in components}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = pipeline_class.from_pretrained(folder, local_files_only=True, **empties)
    except (OSError, ValueError, RuntimeError) as err:
        raise FamilyError(load_error(folder, str(err))) from None
    pipe.set_progress_bar_config(disable=True)
    # the float32 bytes the parameters will take, from the models built (no file read again)
    gib = sum(p.numel() for m in empties.values() for p in m.parameters()) * 4 / 2**30
    notes = [f"{folder}: exported out of core ({gib:.1f} GiB of float32 weights): each "
             "block's weights are read from the folder when it is exported, then dropped"]
    for name in components:
        stored = stored_dtypes(folder / name) - {"F32"}
        if stored:
            notes.append(f"{folder / name}: weights stored as {', '.join(sorted(stored))}, "
                         "converted to float32 (packages hold float32)")
    return pipe, notes


def load_family_pipeline(folder: Path, pipeline_class, out_of_core: bool | None = None
                         ) -> tuple:
    """The folder's pipeline in float32, whole or (`out_of_core`) its models without weights,
    each block's read when it is exported; `out_of_core` None: out of core when the float32
    weights exceed half this machine's memory. (pipeline, notes, out_of_core)."""
    check_weighted_components(folder)
    if out_of_core is None:
        out_of_core = larger_than_memory(folder)
    load = load_storage_free_pipeline if out_of_core else load_float32_pipeline
    return (*load(folder, pipeline_class), out_of_core)
