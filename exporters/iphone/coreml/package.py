"""`edge export --target iphone`: one CoreML ML Program (`.mlpackage`) per block.

Each block of `edge.graph.blocks` is captured with `torch.export` (coremltools 9 cannot convert
some `jit.trace` graphs under numpy 2.4), converted to an ML Program with fp16 compute,
optionally compressed with `coremltools.optimize.coreml`, and saved. Shapes are
static, as the Neural Engine wants them, and the family's for the device
(`FamilyModel.shapes("iphone")`): one prompt (text encoder batch 1), the guidance batch of 2
for the transformer, and the decoder's pieces (tiny-sora: every frame of one video at once;
Wan: one latent frame of one video, the decoder chunked with its caches as inputs and
outputs and a "first" variant for the first frame). A block coremltools cannot convert (an
op it lacks, a tensor above rank 5) is refused naming the block and the op.

Compression (`quantize`, `compression`): "fp16" keeps fp16 weights; "8" is int8 linear
(symmetric, per output channel) quantization; "6" is k-means palettization with a per-tensor
lookup table (the granularity iOS 17 runs); "4" is worded by each family
(`FamilyModel.device_storage`), which gives each block the stored form its measured
sensitivity allows (`STORAGES`: for tiny-sora 4-bit tables for the embedding table and the VAE
decoder, 6-bit for the text encoder layers, int8 for the transformer). A block's config is applied
to its program before it is saved: the compressions work tensor by tensor, so compressing
block by block stores exactly the tables and scales that compressing the whole model before
cutting it would, and no block is left uncompressed (tested: a pair's base and TDTM
programs, two graphs over the same tensors, store byte-identical compressed weights).
Tensors under `WEIGHT_THRESHOLD` elements (norms, biases) stay fp16, coremltools' default.

Layouts (`--min-ios`, LAYOUTS): a block's variants (TDTM, a chunked component's `first`
piece) are other graphs over the block's very tensors. For iOS 18 (the default) a block and
its variants are the functions of one multifunction `.mlpackage` ("main" the block's own,
each variant under its name), which coremltools' `save_multifunction` writes with one weight
file, every tensor the functions share stored once. For iOS 17, which cannot load a function
by name, each variant is an `.mlpackage` of its own carrying a copy of the weights (the
"separate" layout). The transformer's caption-half variants (`unguided`, `tdtm_unguided`:
a call without guidance at a batch of one, `export_coreml(unguided=True)`, the CLI's
default for iOS 18) are functions too; the separate layout would copy the weights for each,
so it does not take them. Every program of an iOS 18 package is converted for iOS 18: coremltools
cannot merge iOS 17 palettized programs (it re-reads them with iOS 18's
`constexpr_lut_to_dense`, which has no `shape` input).

CoreML cannot predict on Linux, so validation here is (1) structural: the saved programs' inputs,
outputs, shapes and dtypes match the manifest and chain block to block; and (2) numeric: each
block's weights are read back out of its `.mlpackage` (edge.exporters.iphone.coreml.weights) and run
in the PyTorch reference block against fp32 (max-abs error), and the whole pipeline with those
weights renders the validation prompt for a PSNR against fp32 PyTorch
(edge.exporters.iphone.coreml.check); in a multifunction package, function by function. Compiling to
`.mlmodelc` needs macOS (Xcode or the app at run time); this exporter writes `.mlpackage` only,
without the ExecuTorch debug-handle map coremltools saves beside a torch.export program
(`executorch_debug_handle_mapping.json`, no part of the CoreML model).
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.core.budget import format_size
from edge.core.package import (
    PackageWriteError,
    file_entry,
    write_error_within,
)
from edge.exporters import ExportValidationError
from edge.exporters.iphone.compression import (  # noqa: F401  (the exporter's names too)
    AUTO,
    BY_FAMILY,
    FP16,
    INT8,
    QUANTIZE,
    STORAGES,
    UNIFORM,
    WEIGHT_THRESHOLD,
    Compression,
    Storage,
    auto_target,
    check_setting,
    compression,
    from_rule,
    linear4,
    palettized,
    partition_setting,
)
from edge.exporters.iphone.coreml.weights import MAIN, import_coremltools
from edge.exporters.shared.package_writer import PackageParts, write_package
from edge.graph.blocks import Block, chained, with_unguided
from edge.graph.family_model import FamilyModel, applied_tiles
from edge.graph.token_chunks import token_chunks
from edge.planning.plan import READ_UNIT, Partition, partition

OUTPUT_PREFIX = "out_"        # a program may not use one name as input and output
COMPUTE_UNITS = "cpuAndNeuralEngine"   # what the Swift runtime asks MLModel for by default
MACOS_ONLY_NOTE = (".mlmodelc compilation needs macOS: Xcode compiles bundled .mlpackage "
                   "files, or the app calls MLModel.compileModel(at:) on device")


@dataclass(frozen=True)
class Layout:
    """How a package stores a block's variants, and the oldest iOS that loads it."""

    name: str                  # the manifest's coreml.layout
    min_ios: int
    text: str                  # for the summary

    @property
    def deployment_target(self) -> str:
        return f"iOS{self.min_ios}"


LAYOUTS = {18: Layout("multifunction", 18, "a block's variants are functions of its "
                      ".mlpackage, sharing its weight file"),
           17: Layout("separate", 17, "each variant is an .mlpackage of its own, with a copy "
                      "of its block's weights")}
DEFAULT_MIN_IOS = 18
DEBUG_MAP = "executorch_debug_handle_mapping.json"
_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def unguided_refusal(min_ios: int) -> str:
    return (f"--unguided-variants with --min-ios {min_ios}: that layout stores each variant "
            "as a program with its own copy of the weights; use --min-ios 18 (functions of "
            "one program) or 27 (Core AI)")


def layout(min_ios: int) -> Layout:
    """The layout of `--min-ios min_ios`, or a ValueError naming the known ones."""
    if min_ios not in LAYOUTS:
        raise ValueError(f"--min-ios {min_ios!r} not understood; use 27, "
                         f"{' or '.join(str(k) for k in LAYOUTS)} (27: a Core AI model per "
                         "block, executed at export; 18: a block and its variants as one "
                         "multifunction .mlpackage; 17: one .mlpackage per variant)")
    return LAYOUTS[min_ios]


def deployment_target(setting: Compression, min_ios: int) -> str:
    """The package's iOS: `--min-ios`'s, or a ValueError when the setting's stored forms need a
    later one (iOS 17 cannot decompress per-grouped-channel tables or int4 blocks)."""
    need = setting.min_ios
    if need > layout(min_ios).min_ios:
        needing = sorted({pattern for pattern, *_, s in (*setting.rules, *setting.tensor_rules)
                          if s.min_ios == need})
        others = [k for k, c in UNIFORM.items() if c.min_ios <= min_ios]
        raise ValueError(f"--quantize {setting.setting} stores {', '.join(needing)} in forms "
                         f"iOS {need} decompresses; --min-ios {min_ios} cannot load them: use "
                         f"--min-ios {need} or --quantize {' / '.join(others)}")
    return f"iOS{layout(min_ios).min_ios}"


def cut_for_device(model: FamilyModel) -> dict[str, list[Block]]:
    """The family's blocks at the static shapes it runs on the device (one prompt)."""
    return model.cut(model.shapes("iphone"))


def device_blocks(model: FamilyModel, quantize: str, budget: int | None,
                  read_unit: int = READ_UNIT) -> Partition:
    """The device cut re-cut for a memory budget (edge/planning/plan.py), each block counted as the
    bytes its program stores at `quantize` (what the Swift loader holds for it). The same
    arguments give the same blocks: `edge record` re-cuts a package's model this way."""
    setting = partition_setting(quantize, model)
    return partition(cut_for_device(model), budget, read_unit,
                     size_of=lambda block: estimated_bytes(block, setting))


def estimated_bytes(block, setting: Compression) -> int:
    """Stored weight bytes of a block at a setting, before exporting: tensors of at least
    WEIGHT_THRESHOLD elements at the bits the setting gives this block (block scales
    counted, per-channel scales and lookup tables left out), the rest fp16. Constants the
    converter computes from the weights (a layer's position bias) are not parameters and are
    left out too."""
    bits = sum(p.numel() * (setting.tensor_storage(block.key, name).bits
                            if p.numel() >= WEIGHT_THRESHOLD else 16)
               for name, p in block.parameters().items())
    return int(bits // 8)


def _coreml_dtype(t: torch.Tensor):
    # CoreML has no int64 inputs: token ids and masks travel as int32
    return np.int32 if t.dtype in (torch.int64, torch.int32) else np.float32


def manifest_dtype(t: torch.Tensor) -> str:
    return "int32" if _coreml_dtype(t) is np.int32 else "float32"


def drop_aliases(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Remove `aten.alias` nodes (a slice over a whole axis, as TDTM's merge of an even
    frame count makes), which coremltools 9 cannot convert; an alias is its input."""
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.alias.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    program.graph_module.recompile()
    return program


def unconvertible(err: Exception) -> str:
    """What coremltools could not convert, in one line: the op ("Unsupported fx node
    _upsample_nearest_exact2d") or the layer and rank ("rank <= 5 ... reshape ... rank 6")."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    unsupported = next((line for line in lines if line.startswith("Unsupported fx node")), None)
    return unsupported or (lines[-1] if lines else type(err).__name__)


def temporary_write_failure(err: Exception, key: str) -> PackageWriteError | None:
    """coremltools writes each converted program's weights under the temporary folder
    (TMPDIR) before anything reaches the package: a failure to write there (its MIL
    FileWriter's "Unknown error", or an errno of a full or unwritable disk) is the machine's,
    not the model's, and is said so."""
    if "FileWriter" not in str(err) and write_error_within(err) is None:
        return None
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    return PackageWriteError(
        f"{folder}: coremltools could not write block {key}'s temporary model files there "
        f"({format_size(free)} free; {unconvertible(err)}); free space there or point TMPDIR "
        "at a folder with room. Nothing was written")


def convert_module(module: nn.Module, block: Block, setting: Compression,
                   min_ios: int = DEFAULT_MIN_IOS):
    """torch.export -> ML Program (fp16 compute, the package's iOS) -> compressed; an unsaved
    MLModel."""
    ct = import_coremltools()
    target = deployment_target(setting, min_ios)

    example = tuple(t.contiguous() for t in block.example)  # CoreML wants contiguous inputs
    # coremltools draws its own progress bars per conversion pass; the export shows one bar
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        with token_chunks():  # no program holds a whole score matrix or hidden state
            program = drop_aliases(torch.export.export(module.eval(), example)
                                   .run_decompositions({}))
        try:
            model = ct.convert(
                program, convert_to="mlprogram",
                minimum_deployment_target=getattr(ct.target, target),
                compute_precision=ct.precision.FLOAT16,
                inputs=[ct.TensorType(name=n, shape=tuple(t.shape), dtype=_coreml_dtype(t))
                        for n, t in zip(block.inputs, example, strict=True)],
                outputs=[ct.TensorType(name=OUTPUT_PREFIX + n) for n in block.outputs])
        except (NotImplementedError, ValueError, RuntimeError, TypeError, OSError) as err:
            failed_write = temporary_write_failure(err, block.key)
            if failed_write is not None:
                raise failed_write from None
            raise ExportValidationError(f"block {block.key}: CoreML cannot take it: "
                                        f"{unconvertible(err)}") from None
        compress = setting.compressor(block.key, weight_names(model, setting))
        if compress is not None:
            model = compress(model)
    model.short_description = f"edge block {block.key} ({setting.setting})"
    return model


def weight_names(model, setting: Compression) -> list[str]:
    """The converted program's weight names a tensor rule may pick out (none without one)."""
    if not setting.tensor_rules:
        return []
    import coremltools.optimize.coreml as cto

    return list(cto.get_weights_metadata(model, weight_threshold=WEIGHT_THRESHOLD))


def signature(names: list[str], tensors: tuple[torch.Tensor, ...]) -> list[dict]:
    return [{"name": n, "dtype": manifest_dtype(t), "shape": list(t.shape)}
            for n, t in zip(names, tensors, strict=True)]


def package_files(root: Path, mlpackage: Path) -> list[dict]:
    """File records of everything inside an .mlpackage folder, sorted by path."""
    return [file_entry(root, p) for p in sorted(mlpackage.rglob("*")) if p.is_file()]


def weights_file_bytes(mlpackage: Path) -> int:
    return sum(p.stat().st_size for p in mlpackage.rglob("weight*.bin"))


def save_program(model, path: Path) -> None:
    """Save an MLModel as an .mlpackage, less coremltools' ExecuTorch debug map."""
    model.save(str(path))
    (path / DEBUG_MAP).unlink(missing_ok=True)


def save_functions(programs: dict[str, Path], path: Path) -> None:
    """Saved single-function programs as the functions of one multifunction .mlpackage
    (`programs`: function name -> program; the first is the default): coremltools writes
    one weight file, each tensor the functions share once."""
    ct = import_coremltools()
    desc = ct.utils.MultiFunctionDescriptor()
    for name, program in programs.items():
        desc.add_function(str(program), MAIN, name)
    desc.default_function_name = next(iter(programs))
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        ct.utils.save_multifunction(desc, str(path))
    (path / DEBUG_MAP).unlink(missing_ok=True)


def program_record(root: Path, relative: str, module: nn.Module, block: Block,
                   reference: tuple[torch.Tensor, ...], function: str | None = None,
                   tensors: dict[str, int] | None = None) -> dict:
    """The manifest record of one saved program (or one function of it), with its weights
    read back and checked numerically. `tensors`: filled with the distinct tensors the
    program stores (digest -> elements), for the fp32 reference of the package's size."""
    from edge.exporters.iphone.coreml.check import block_numerics

    path = root / relative
    files = package_files(root, path)
    # the program's spec and its weights file, under the package format's `graph`/`weights`
    # (CoreML reads the weights itself, so there is no tensor table)
    spec = f"{relative}/Data/com.apple.CoreML/model.mlmodel"
    weights = f"{relative}/Data/com.apple.CoreML/weights/weight.bin"
    listed = {f["path"] for f in files}
    if spec not in listed:
        raise ExportValidationError(f"{path}: the saved program lacks {spec}")
    if weights not in listed:  # every weight small enough to sit inline in the spec
        weights = spec
    record = {"model": relative} | ({"function": function} if function else {})
    return record | {"files": files, "graph": spec,
                     "weights": {"path": weights, "tensors": []},
                     "weight_bytes": weights_file_bytes(path),
                     "validation": block_numerics(path, module, block, reference,
                                                  function or MAIN, tensors)}


def export_block(block: Block, root: Path, setting: Compression,
                 min_ios: int = DEFAULT_MIN_IOS) -> dict:
    """Convert, compress and save a block and its variants (as the layout of `min_ios`
    stores them); check each program's weights numerically. The record's
    `reference_weight_bytes`: the fp32 bytes of the distinct tensors the block's programs
    store (its parameters and the tables the converter computed from them, each once)."""
    reference = block.reference()
    base = f"models/{block.component}/{block.name}"
    variants = {name: block.variant(name) for name in block.variants}  # own signatures
    refused = [n for n in variants if n == MAIN or not _FUNCTION_NAME.fullmatch(n)]
    if refused:
        raise ExportValidationError(f"block {block.key}: variant name {refused[0]!r} cannot "
                                    f"name a CoreML function (a letter or _, then letters, "
                                    f"digits or _; not {MAIN!r})")
    outputs = {name: v.run(*v.example) for name, v in variants.items()}
    tensors: dict[str, int] = {}
    path = root / f"{base}.mlpackage"
    path.parent.mkdir(parents=True, exist_ok=True)
    shared = bool(variants) and layout(min_ios).name == "multifunction"
    if shared:  # one program, a function per graph, one weight file
        with tempfile.TemporaryDirectory(prefix="edge-coreml-") as tmp:
            parts = {MAIN: Path(tmp) / f"{MAIN}.mlpackage"}
            save_program(convert_module(block.module, block, setting, min_ios), parts[MAIN])
            for name, variant in variants.items():
                parts[name] = Path(tmp) / f"{name}.mlpackage"
                save_program(convert_module(variant.module, variant, setting, min_ios),
                             parts[name])
            save_functions(parts, path)
    else:
        save_program(convert_module(block.module, block, setting, min_ios), path)
    record = {"name": block.name}
    record |= program_record(root, f"{base}.mlpackage", block.module, block, reference,
                             MAIN if shared else None, tensors)
    record["inputs"] = signature(block.inputs, block.example)
    record["outputs"] = signature(block.outputs, reference)
    if variants:
        # the runtime loads a variant instead of the base program, never both
        record["variants"] = {}
        for name, variant in variants.items():
            relative = f"{base}.mlpackage" if shared else f"{base}.{name}.mlpackage"
            if not shared:
                save_program(convert_module(variant.module, variant, setting, min_ios),
                             root / relative)
            entry = program_record(root, relative, variant.module, variant, outputs[name],
                                   name if shared else None, tensors)
            if isinstance(block.variants[name], Block):  # e.g. a chunked component's first
                entry["inputs"] = signature(variant.inputs, variant.example)
                entry["outputs"] = signature(variant.outputs, outputs[name])
            record["variants"][name] = entry
            if not shared:  # the block's files are all it may load: a variant's are among them
                record["files"] = record["files"] + entry["files"]
    record["reference_weight_bytes"] = 4 * sum(tensors.values())
    return record


def export_coreml(model: FamilyModel, dest: Path, quantize: str | Compression = "fp16",
                  model_name: str | None = None, min_ios: int = DEFAULT_MIN_IOS,
                  components: dict[str, list[Block]] | None = None,
                  on_block: Callable[[str], None] | None = None,
                  validate_end_to_end: Callable[[Path, dict, dict], dict] | None = None,
                  plan: dict | None = None, unguided: bool = False) -> dict:
    """Export every block to `dest` atomically as .mlpackage programs; returns the manifest.
    `components`: the blocks to export (default: the family's device cut); `plan`: how they
    were re-cut for a memory budget (edge/planning/plan.py), recorded in the manifest. `unguided`:
    the transformer's blocks also at the caption's half of the guidance batch
    (`edge.graph.blocks.with_unguided`), as functions of each block's program (the multifunction
    layout only: the separate one would store the weights again for each).

    Raises ExportValidationError (and writes nothing) if a program's interface does not
    match the manifest or the blocks do not chain."""
    from edge.exporters.iphone.coreml.check import check_structure

    setting = compression(quantize, model)  # refuse a bad setting or layout before converting
    deployment_target(setting, min_ios)
    if unguided and layout(min_ios).name != "multifunction":
        raise ValueError(unguided_refusal(min_ios))
    components = components or cut_for_device(model)
    coreml = {"format": "mlprogram",
              "minimum_deployment_target": deployment_target(setting, min_ios),
              "layout": layout(min_ios).name, "compute_precision": "float16",
              "compute_units": COMPUTE_UNITS, "output_prefix": OUTPUT_PREFIX,
              "compression": setting.record(), "compiled": False, "note": MACOS_ONLY_NOTE}

    def structure(root: Path, manifest: dict) -> dict:
        problems = check_structure(root, manifest)
        if problems:
            raise ExportValidationError("structure: " + "; ".join(problems))
        return {}

    parts = PackageParts(
        "iphone", raw_null_caption=True,
        export_block=lambda name, block, root: export_block(block, root, setting, min_ios),
        blocks=lambda name, blocks: (with_unguided(b) if unguided and name == "transformer"
                                     else b for b in chained(blocks)),
        head=lambda root: {"coreml": coreml} | ({} if plan is None else {"plan": plan}),
        tiles=applied_tiles(model, model.shapes("iphone")),
        tail=structure,
        check=None if validate_end_to_end is None else
        lambda root, manifest: validate_end_to_end(root, manifest, components))
    return write_package(model, dest, components, parts, model_name, on_block)
