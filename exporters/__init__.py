"""Per-target exporters: each turns a family's blocks (edge/families) into one target's
package, knowing no family by name. `TARGETS` names each target's module, which answers the
same four questions (`edge export` asks nothing else):

- `check(options)`: refuse options the target does not take, before any work;
- `folder_name(model_name, options)`: the default package folder's name;
- `prepare(model, options) -> Prepared`: the family's blocks at the target's shapes (for
  the onnx target re-cut for a budget), with the lines `--dry-run` prints;
- `export(model, prepared, dest, options, progress) -> manifest` and
  `summary(manifest, dest, seconds) -> str`.

Modules are imported on use: the iphone target needs coremltools (the [iphone] extra), the
web target's WebGPU path TVM (the [web] extra); `target` refuses a target whose modules are
not installed before any work, as a ModuleNotFoundError naming the module, and a target's
`check` refuses so what only some of its options need (`--web-paths webgpu,wasm`: TVM).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

TARGETS = {"onnx": "edge.exporters.onnx.target", "iphone": "edge.exporters.iphone.target",
           "web": "edge.exporters.web.target"}
# what each target's compiler needs whatever its options (the web's TVM: web/target.py check)
NEEDS = {"onnx": ("torch", "onnx"), "iphone": ("torch", "coremltools"),
         "web": ("torch", "onnx")}


class ExportValidationError(RuntimeError):
    """An export whose output failed its check against the PyTorch reference (a block's
    error, the end-to-end PSNR, a program's structure); nothing was written."""


class ExportOptionError(ValueError):
    """An export option the target does not take, or a value it cannot use."""


@dataclass(frozen=True)
class ExportOptions:
    """What `edge export` was asked besides the model and the destination."""

    memory_budget: int | None = None   # bytes
    quantize: str | None = None        # iphone: fp16, 8, 6, 4, auto[:TARGET]; web: fp32,
                                       # fp16, 8, 4
    min_ios: int | None = None         # iphone: 18 (multifunction programs) or 17
    ort_url: str | None = None         # web: where the page loads onnxruntime-web
    bundle_ort: Path | None = None     # web: a local onnxruntime-web dist to copy in
    web_paths: str | None = None       # web: "webgpu,wasm" (both, None) or "wasm"
    # web and iphone --min-ios 27: whether the transformer's blocks are also written at the
    # caption's half of the guidance batch (variants `unguided`), so calls without guidance
    # run half the work (None: the target's default, yes)
    unguided_variants: bool | None = None
    # onnx and iphone --min-ios 27: which blocks the export runs and holds to PyTorch, "all"
    # (None) or "distinct" (one of each repeated program: Core AI's interpreter, or a
    # block's forward pass at a real video size, takes minutes a block)
    execute: str | None = None
    # onnx: the end-to-end check's result from a check run beside the export (`edge export
    # --check small|blocks`), recorded as the manifest's validation instead of running one
    end_to_end: dict | None = None


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


def target(name: str) -> ModuleType:
    """The module of target `name`; an unknown name is refused, listing the known ones."""
    if name not in TARGETS:
        raise ExportOptionError(f"unknown --target {name!r}; available: {', '.join(TARGETS)}")
    need_modules(f"--target {name}", NEEDS[name])
    return importlib.import_module(TARGETS[name])


def need_modules(what: str, modules: tuple[str, ...]) -> None:
    """A ModuleNotFoundError naming the first of `modules` not installed, which `what` needs
    (the CLI answers it with the extra to install: edge/commands/extras.py)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"{what} needs {module}", name=module)


_OWNED = {"quantize": "--quantize applies to --target iphone and web, not {}",
          "min_ios": "--min-ios applies to --target iphone, not {}",
          "ort_url": "--ort-url and --bundle-ort apply to --target web, not {}",
          "bundle_ort": "--ort-url and --bundle-ort apply to --target web, not {}",
          "web_paths": "--web-paths applies to --target web, not {}",
          "memory_budget": "--memory-budget is not built for --target {} yet",
          "unguided_variants": "--unguided-variants/--no-unguided-variants apply to --target "
                               "web and iphone --min-ios 18 or 27, not {} (an ONNX graph takes "
                               "any batch)",
          "execute": "--execute applies to --target onnx and iphone --min-ios 27, not {} "
                     "(whose programs run here block by block)",
          "end_to_end": "--check small and --check blocks apply to --target onnx, not {} "
                        "(its end-to-end check runs at the export's size)"}


# --execute: which blocks an export runs and holds to PyTorch (onnx, iphone --min-ios 27)
EXECUTE = ("all", "distinct")


def check_execute(options: ExportOptions) -> None:
    if options.execute not in (None, *EXECUTE):
        raise ExportOptionError(f"--execute {options.execute!r}: one of {', '.join(EXECUTE)}")


def refuse_others(target_name: str, options: ExportOptions, takes: set[str]) -> None:
    """Refuse every option given that `target_name` does not take."""
    for key, message in _OWNED.items():
        if getattr(options, key) is not None and key not in takes:
            raise ExportOptionError(message.format(target_name))


def refuse_out_of_core(target_name: str, model) -> None:
    """A model built without weights (larger than memory, `FamilyModel.out_of_core`) goes to
    the onnx and web targets only: the iphone's converts whole programs with their
    weights."""
    if model.out_of_core:
        raise ExportOptionError(
            f"--target {target_name}: {model.name} is loaded out of core (its float32 "
            "weights exceed half this machine's memory, or --out-of-core was given); only "
            "--target onnx and --target web export a model block by block from storage")
