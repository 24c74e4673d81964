"""A diffusers folder's component configs checked against their model classes and stored
weights before diffusers or transformers builds anything from them.

Both libraries pass config values straight to the model's constructor: a string where an
integer belongs fails deep inside (`TypeError`), a negative layer count as an `IndexError`, a
layer count larger than the weights fails while loading with a meta-device message, a smaller
one loads with the extra weights silently dropped (the warning is silenced), and a count of
ten million builds modules for minutes. So, for each weighted component, in order:

1. every field whose class default is a number, a bool or a list has a value of that type,
   and sizes and counts are at least 1 (`check_field_types`);
2. no layer count exceeds the layers numbered in the stored weights (a cheap bound, read
   from the safetensors headers, that keeps step 3 from building millions of modules);
3. the model built on the meta device (no storage) has exactly the stored tensors, by name
   and shape: none missing, none unused (`check_against_weights`).
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from edge.families import FamilyError

# integer fields that size or count something: below 1 they build nothing diffusers can run
SIZE_FIELD = re.compile(r"^(num_|d_)|_(dim|size|heads|layers|blocks|channels)$"
                        r"|^layers_per_block$")
# the counts of repeated layers, bounded by the numbered layers in the stored weights
# (`depth`: Open-Sora's STDiT3 block pairs)
COUNT_FIELD = re.compile(r"^num_(\w+_)?(layers|blocks)$|^layers_per_block$|^num_res_blocks$"
                         r"|^depth$")
NUMBERED = re.compile(r"\.(\d+)\.")


def model_class(library: str, class_name: str):
    return getattr(importlib.import_module(library), class_name)


def _defaults(cls) -> dict:
    """The constructor's defaults: a diffusers model's own, a transformers model's config's."""
    init = cls.config_class.__init__ if hasattr(cls, "config_class") else cls.__init__
    return {n: p.default for n, p in inspect.signature(init).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _type_error(value, default, key: str) -> str | None:
    """Why `value` cannot stand where the class's default is `default`, or None."""
    if default is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "must be true or false"
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be an integer"
        if default >= 1 and SIZE_FIELD.search(key) and value < 1:
            return "must be at least 1"
        return None
    if isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if isinstance(default, tuple | list):
        if not isinstance(value, list | tuple):
            return "must be a list"
        kinds = {type(d) for d in default}
        if kinds == {int} and not all(isinstance(v, int) and not isinstance(v, bool)
                                      for v in value):
            return "must be a list of integers"
        if kinds == {int} and SIZE_FIELD.search(key) and any(v < 1 for v in value):
            return "must hold integers of at least 1"
    return None


def check_field_types(path: Path, cfg: dict, cls) -> None:
    """Each field of `cfg` (read from `path`) that the class has a default for holds a value
    of the default's kind; refused naming the file, the field and the value."""
    defaults = _defaults(cls)
    for key, value in cfg.items():
        if key.startswith("_") or key not in defaults:
            continue
        why = _type_error(value, defaults[key], key)
        if why:
            raise FamilyError(f"{path}: {key}={value!r}; {why} ({cls.__name__} takes it as "
                              f"{type(defaults[key]).__name__}, e.g. {defaults[key]!r})")


def numbered_layers(names) -> int:
    """The most layers any one repeated module has in `names` (`blocks.29.attn.q.weight`
    counts layer 29 of `blocks`): the largest count a config may ask for."""
    seen: dict[str, set[str]] = {}
    for name in names:
        for match in NUMBERED.finditer(f".{name}."):
            seen.setdefault(name[:max(match.start() - 1, 0)], set()).add(match.group(1))
    return max((len(v) for v in seen.values()), default=0)


def check_layer_counts(path: Path, cfg: dict, stored: dict) -> None:
    """No count field asks for more layers than the stored weights number."""
    most = numbered_layers(stored)
    for key, value in cfg.items():
        if COUNT_FIELD.match(key) and isinstance(value, int) and value > most:
            raise FamilyError(f"{path}: {key}={value}, but the weights beside it number at "
                              f"most {most} layers of any one kind")


def _expected(module) -> tuple[dict[str, tuple], list[list[str]]]:
    """{tensor name: shape} a state dict of `module` holds, and the groups of names one tied
    parameter goes by (any one of them may be the stored one)."""
    shapes: dict[str, tuple] = {}
    groups: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        shapes[name] = tuple(p.shape)
        groups.setdefault(id(p), []).append(name)
    persistent = set(module.state_dict(keep_vars=True))
    for name, b in module.named_buffers():
        if name in persistent:
            shapes[name] = tuple(b.shape)
            groups.setdefault(id(b), []).append(name)
    return shapes, list(groups.values())


def _ignored(cls, kind: str) -> list[re.Pattern]:
    """The class's own patterns of tensors it does not load (`kind`: "unexpected") or need
    not find stored ("missing")."""
    found = getattr(cls, f"_keys_to_ignore_on_load_{kind}", None) or []
    return [re.compile(p) for p in found]


def _listed(names, limit: int = 4) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_against_weights(component: Path, cls, module, stored: dict) -> None:
    """`module` (built on the meta device) has exactly the tensors `stored` holds ({name:
    header with .shape}): a missing, an unused or a differently shaped tensor is refused
    naming the component's config and the tensors."""
    if hasattr(module, "tie_weights"):
        module.tie_weights()  # transformers ties T5's embeddings when it loads, not builds
    shapes, groups = _expected(module)
    config = component / "config.json"
    missing = [g[0] for g in groups if not any(n in stored for n in g)
               and not any(p.search(g[0]) for p in _ignored(cls, "missing"))]
    if missing:
        raise FamilyError(f"{config}: the model it describes has tensors the weights in "
                          f"{component} lack: {_listed(missing)} (does a layer count or a "
                          "size in the config exceed the weights?)")
    unused = [n for n in stored if n not in shapes
              and not any(p.search(n) for p in _ignored(cls, "unexpected"))]
    if unused:
        raise FamilyError(f"{component}: stored tensors the model {config} describes does "
                          f"not have: {_listed(unused)} (a layer count or a module of the "
                          "config smaller than the weights?)")
    for name, shape in shapes.items():
        if name in stored and tuple(stored[name].shape) != shape:
            raise FamilyError(f"{stored[name].path}: tensor {name!r} has shape "
                              f"{list(stored[name].shape)}, but {config} makes it "
                              f"{list(shape)}")


def component_builder(component: Path, library: str, class_name: str):
    """(class, build): the model class model_index.json names for a component, and a function
    building it from the component's config (weights are not read)."""
    cls = model_class(library, class_name)
    if library == "diffusers":
        def build():
            return cls.from_config(cls.load_config(component))
    else:  # transformers
        def build():
            return cls(cls.config_class.from_pretrained(component))
    return cls, build


def stored_tensors(component: Path) -> dict:
    """{name: header} of the tensors a component folder's safetensors files store (one file
    or shards with their index; headers only); a broken file refused as a FamilyError."""
    from edge.graph.lazy_weights import FolderWeights, ShardError

    try:
        return FolderWeights(component).tensors
    except ShardError as err:
        raise FamilyError(str(err)) from None


def check_component(component: Path, library: str, class_name: str, cfg: dict) -> None:
    """Steps 1 to 3 of the module's docstring for one component folder with safetensors
    weights (a component stored otherwise is left to its library); `cfg`: its config.json,
    read."""
    from accelerate import init_empty_weights

    if not any(component.glob("*.safetensors")):
        return
    cls, build = component_builder(component, library, class_name)
    config = component / "config.json"
    check_field_types(config, cfg, cls)
    stored = stored_tensors(component)
    check_layer_counts(config, cfg, stored)
    try:
        with init_empty_weights(include_buffers=True):  # no storage, buffers included
            module = build()
    except (TypeError, ValueError, IndexError, AssertionError, ZeroDivisionError) as err:
        # a combination of fields the class itself refuses (heads not dividing a width...)
        raise FamilyError(f"{config}: {cls.__name__} cannot be built from it: "
                          f"{str(err).strip()[:300]}") from None
    check_against_weights(component, cls, module, stored)
