"""Per-target exporters: each turns a family's blocks (edge/families) into one target's
package, knowing no family by name. Each target is a folder, exporters/<target>/: its
`__init__.py` registers it (NAME, HELP, NEEDS, its export OPTIONS as data, whether it exports a
model block by block from storage) without torch, so the command line reads every target at
start; its `target.py` answers the same four questions (`edge export` asks nothing else):

- `check(options)`: refuse options the target does not take, before any work;
- `folder_name(model_name, options)`: the default package folder's name;
- `prepare(model, options) -> Prepared`: the family's blocks at the target's shapes (for
  the onnx target re-cut for a budget), with the lines `--dry-run` prints;
- `export(model, prepared, dest, options, progress) -> manifest` and
  `summary(manifest, dest, seconds) -> str`.

Target modules are imported on use: the iphone target needs coremltools (the [iphone] extra),
the web target's WebGPU path TVM (the [web] extra); `target` refuses a target whose modules are
not installed before any work, as a ModuleNotFoundError naming the module, and a target's
`check` refuses so what only some of its options need (`--web-paths webgpu,wasm`: TVM).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from types import ModuleType
from typing import Any

from edge.core.declared import Option, by_name, takers_text

# target name -> its folder under exporters/
_FOLDERS = {"onnx": "onnx", "iphone": "iphone", "web": "web"}
TARGETS = tuple(_FOLDERS)


class ExportValidationError(RuntimeError):
    """An export whose output failed its check against the PyTorch reference (a block's
    error, the end-to-end PSNR, a program's structure); nothing was written."""


class ExportOptionError(ValueError):
    """An export option the target does not take, or a value it cannot use."""


def registered(name: str) -> ModuleType:
    """A target's registration (exporters/<target>/__init__.py), read without torch."""
    return importlib.import_module(f"edge.exporters.{_FOLDERS[name]}")


@functools.cache
def declared_options() -> dict[str, list[tuple[str, Option]]]:
    """Every target option by name -> (target, declaration) for each target taking it."""
    return by_name({name: registered(name).OPTIONS for name in TARGETS})


# What `edge export` was asked besides the model and the destination: a field for each option
# some target declares (None: not given; a declaration's `parse` has made its value, e.g. the
# budget in bytes), and `end_to_end`: the onnx end-to-end check's result from a check run
# beside the export (`edge export --check small|blocks`), recorded as the manifest's
# validation instead of running one.
ExportOptions = make_dataclass(
    "ExportOptions",
    [(name, Any, field(default=None)) for name in declared_options()]
    + [("end_to_end", "dict | None", field(default=None))],
    frozen=True)
ExportOptions.__module__ = __name__  # pickling and reprs find it here (make_dataclass's own
                                     # module= comes with Python 3.12)
ExportOptions.__doc__ = ("What `edge export` was asked besides the model and the destination: "
                         "the targets' declared options (None: not given) and `end_to_end`.")


@dataclass
class Prepared:
    """The blocks a target will export, and what a dry run says about them."""

    components: dict            # component name -> list[edge.graph.blocks.Block]
    notes: list[str] = field(default_factory=list)        # said before exporting too
    plan_lines: list[str] = field(default_factory=list)   # the --dry-run table
    manifest_plan: dict | None = None                     # how they were re-cut, if they were
    # the bytes a runtime holds of each block's weights, by key, where not float32's (the
    # web's stored forms, which its wasm path holds)
    held_bytes: dict[str, int] | None = None
    # bytes of a float activation as the target's programs compute (the iPhone's float16);
    # the activation estimate traces float32 and is scaled by it
    activation_itemsize: int = 4
    # the rows of a call's batch a runtime runs at once under a budget, by component (the
    # Python runtime splits an ONNX package's dynamic batch: RUNTIME_BATCH_PIECES); None: the
    # batch as traced
    batch_pieces: dict[str, int] | None = None

    @property
    def block_count(self) -> int:
        return sum(len(blocks) for blocks in self.components.values())


@dataclass
class Progress:
    """Callbacks for long work: a block written; a step of an end-to-end check's generations
    (done, total); a measurement made to choose how blocks are stored (`--quantize auto`:
    done, total, what was measured)."""

    on_block: Callable[[str], None] | None = None
    on_check_step: Callable[[int, int], None] | None = None
    on_measure: Callable[[int, int, str], None] | None = None


def inputs_text(block) -> str:
    """A block's inputs and their static shapes, for a --dry-run table: "x [2, 320, 64], ..."."""
    return ", ".join(f"{n} {list(t.shape)}" for n, t in zip(block.inputs, block.example,
                                                             strict=True))


def target(name: str, options: dict | None = None) -> ModuleType:
    """The module of target `name`; an unknown name is refused, listing the known ones, and
    an install that lacks what the target needs (the registration's NEEDS, and with
    `options` given its `needs(options)` where it has one) is answered naming all of it at
    once. Without `options`, the target's `check` asks for what they add."""
    if name not in TARGETS:
        raise ExportOptionError(f"unknown --target {name!r}; available: {', '.join(TARGETS)}")
    registration = registered(name)
    more, instead = (registration.needs(options)
                     if options is not None and hasattr(registration, "needs") else ((), None))
    need_modules(f"--target {name}", (*registration.NEEDS, *more), instead)
    return importlib.import_module(f"edge.exporters.{_FOLDERS[name]}.target")


def need_modules(what: str, modules: tuple[str, ...], instead: tuple | None = None) -> None:
    """A ModuleNotFoundError for the `modules` not installed, which `what` needs: its `name`
    the first, `missing` all of them, `instead` (a lighter choice and the modules it needs)
    where there is one. The CLI answers it with the extras to install in one line
    (edge/commands/extras.py)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        err = ModuleNotFoundError(f"{what} needs {', '.join(missing)}", name=missing[0])
        err.missing, err.instead = missing, instead
        raise err


def check_declared(target_name: str, options: ExportOptions) -> None:
    """Refuse every option given that `target_name` does not declare, naming the targets
    (and layouts) that take it, and a value outside its declaration's choices."""
    for name, takers in declared_options().items():
        value = getattr(options, name)
        if value is None:
            continue
        mine = dict(takers).get(target_name)
        if mine is None:
            raise ExportOptionError(f"{takers[0][1].flag} applies to --target "
                                    f"{takers_text(takers)}, not {target_name}")
        try:
            mine.check_choice(value)
        except ValueError as err:
            raise ExportOptionError(str(err)) from None


def out_of_core_targets() -> list[str]:
    """The targets that export a model too large for memory block by block from storage, as
    --target says them (with the layout, where only one of a target's does)."""
    return [name if takes is True else f"{name} {takes}" for name in TARGETS
            if (takes := registered(name).READS_BLOCKS_FROM_STORAGE)]


def reads_blocks_from_storage(target_name: str, options: ExportOptions) -> bool:
    """Whether `target_name` with `options` exports a model larger than memory: True or
    False for the whole target, else its layout's answer (`reads_blocks_from_storage`)."""
    module = registered(target_name)
    takes = module.READS_BLOCKS_FROM_STORAGE
    return module.reads_blocks_from_storage(options) if isinstance(takes, str) else takes


def refuse_out_of_core(target_name: str, model, layout: str = "") -> list[str]:
    """A model built without weights (larger than memory, `FamilyModel.out_of_core`) goes to
    the targets that read blocks from storage only (`out_of_core_targets`): Core ML converts
    whole programs with their weights (`layout` names it). A plan (a cut of shapes only,
    `--dry-run`) needs no weights: it goes on, with a note saying the export would be
    refused."""
    from edge.graph import shapes_only

    if not model.out_of_core:
        return []
    only = ", ".join(f"--target {name}" for name in out_of_core_targets())
    why = (f"--target {target_name}{layout}: {model.name} is loaded out of core (its float32 "
           "weights exceed half this machine's memory, or --out-of-core was given); only "
           f"{only} export a model block by block from storage")
    if shapes_only.active():
        return [f"a plan only: {why}"]
    raise ExportOptionError(why)
