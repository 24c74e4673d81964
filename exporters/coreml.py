"""`edge export --target iphone`: one CoreML ML Program (`.mlpackage`) per block.

Each block of `edge.blocks` is captured with `torch.export` (coremltools 9 cannot convert
some `jit.trace` graphs under numpy 2.4), converted to an ML Program for iOS 17 with fp16
compute, optionally compressed with `coremltools.optimize.coreml`, and saved. Shapes are
static, as the Neural Engine wants them: one prompt (text encoder batch 1), the guidance
batch of 2 for the transformer, and every frame of one video at once for the VAE decoder.

Compression (`quantize`): "fp16" keeps fp16 weights; "8" is int8 linear (symmetric, per
output channel) quantization; "6" and "4" are k-means palettization with a per-tensor lookup
table (the granularity iOS 17 runs). The same `OptimizationConfig` is applied to every
block's program before it is saved: both compressions work tensor by tensor, so compressing
block by block stores exactly the tables and scales that compressing the whole model before
cutting it would, and no block is left uncompressed (tested: a pair's base and TDTM
programs, two graphs over the same tensors, store byte-identical compressed weights).
Tensors under `WEIGHT_THRESHOLD` elements (norms, biases) stay fp16, coremltools' default.

CoreML cannot predict on Linux, so validation here is (1) structural: the saved programs'
inputs, outputs, shapes and dtypes match the manifest and chain block to block; and (2)
numeric: each block's weights are read back out of its `.mlpackage` (exporters.coreml_weights)
and run in the PyTorch reference block against fp32 (max-abs error), and the whole pipeline
with those weights renders the validation prompt for a PSNR against fp32 PyTorch
(exporters.coreml_check). Compiling to `.mlmodelc` needs macOS (Xcode or the app at run
time); this exporter writes `.mlpackage` only.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.blocks import Block
from edge.families.tiny_sora import (
    TinySoraModel,
    cut_text_encoder,
    cut_transformer,
    cut_vae_decoder,
)
from edge.models.tiny_sora import TinySora
from edge.package import atomic_directory, file_entry, write_manifest
from exporters.coreml_weights import import_coremltools
from exporters.package_head import manifest_head

QUANTIZE = ("fp16", "8", "6", "4")
WEIGHT_THRESHOLD = 2048       # coremltools' default: smaller tensors are not compressed
OUTPUT_PREFIX = "out_"        # a program may not use one name as input and output
DEPLOYMENT_TARGET = "iOS17"
COMPUTE_UNITS = "cpuAndNeuralEngine"   # what the Swift runtime asks MLModel for by default
MACOS_ONLY_NOTE = (".mlmodelc compilation needs macOS: Xcode compiles bundled .mlpackage "
                   "files, or the app calls MLModel.compileModel(at:) on device")


class ExportValidationError(RuntimeError):
    pass


def cut_for_device(pipe: TinySora) -> dict[str, list[Block]]:
    """The shared block cut at the static shapes the device runs: one prompt."""
    frames = pipe.latent_shape[1]
    return {"text_encoder": cut_text_encoder(pipe, batch=1),
            "transformer": cut_transformer(pipe, batch=2),
            "vae_decoder": cut_vae_decoder(pipe, frames=frames)}


def _coreml_dtype(t: torch.Tensor):
    # CoreML has no int64 inputs: token ids and masks travel as int32
    return np.int32 if t.dtype in (torch.int64, torch.int32) else np.float32


def manifest_dtype(t: torch.Tensor) -> str:
    return "int32" if _coreml_dtype(t) is np.int32 else "float32"


def optimization_config(quantize: str):
    """The `coremltools.optimize.coreml` config of a --quantize setting (None for fp16)."""
    import_coremltools()
    import coremltools.optimize.coreml as cto

    if quantize == "fp16":
        return None
    if quantize == "8":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                         granularity="per_channel",
                                         weight_threshold=WEIGHT_THRESHOLD)
    elif quantize in ("6", "4"):
        op = cto.OpPalettizerConfig(mode="kmeans", nbits=int(quantize),
                                    granularity="per_tensor",
                                    weight_threshold=WEIGHT_THRESHOLD)
    else:
        raise ValueError(f"--quantize {quantize!r} not understood; use one of "
                         f"{', '.join(QUANTIZE)}")
    return cto.OptimizationConfig(global_config=op)


def compression_record(quantize: str) -> dict:
    return {"fp16": {"method": "none", "weights": "float16"},
            "8": {"method": "linear_symmetric", "dtype": "int8",
                  "granularity": "per_channel"},
            "6": {"method": "palettize_kmeans", "nbits": 6, "granularity": "per_tensor"},
            "4": {"method": "palettize_kmeans", "nbits": 4, "granularity": "per_tensor"},
            }[quantize] | {"setting": quantize, "weight_threshold": WEIGHT_THRESHOLD}


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


def convert_module(module: nn.Module, block: Block, quantize: str):
    """torch.export -> ML Program (iOS 17, fp16 compute) -> compressed; an unsaved MLModel."""
    ct = import_coremltools()

    example = tuple(t.contiguous() for t in block.example)  # CoreML wants contiguous inputs
    # coremltools draws its own progress bars per conversion pass; the export shows one bar
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        program = drop_aliases(torch.export.export(module.eval(), example)
                               .run_decompositions({}))
        model = ct.convert(
            program, convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS17,
            compute_precision=ct.precision.FLOAT16,
            inputs=[ct.TensorType(name=n, shape=tuple(t.shape), dtype=_coreml_dtype(t))
                    for n, t in zip(block.inputs, example, strict=True)],
            outputs=[ct.TensorType(name=OUTPUT_PREFIX + n) for n in block.outputs])
        config = optimization_config(quantize)
        if config is not None:
            import coremltools.optimize.coreml as cto

            compress = (cto.linear_quantize_weights if quantize == "8"
                        else cto.palettize_weights)
            model = compress(model, config)
    model.short_description = f"edge block {block.key} ({quantize})"
    return model


def signature(names: list[str], tensors: tuple[torch.Tensor, ...]) -> list[dict]:
    return [{"name": n, "dtype": manifest_dtype(t), "shape": list(t.shape)}
            for n, t in zip(names, tensors, strict=True)]


def package_files(root: Path, mlpackage: Path) -> list[dict]:
    """File records of everything inside an .mlpackage folder, sorted by path."""
    return [file_entry(root, p) for p in sorted(mlpackage.rglob("*")) if p.is_file()]


def weights_file_bytes(mlpackage: Path) -> int:
    return sum(p.stat().st_size for p in mlpackage.rglob("weight*.bin"))


def export_model(module: nn.Module, block: Block, root: Path, relative: str, quantize: str,
                 reference: tuple[torch.Tensor, ...]) -> dict:
    """Convert, compress and save one program; check its weights numerically."""
    from exporters.coreml_check import block_numerics

    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    convert_module(module, block, quantize).save(str(path))
    files = package_files(root, path)
    # the program's spec and its weights file, under the package format's `graph`/`weights`
    # (CoreML reads the weights itself, so there is no tensor table)
    spec = f"{relative}/Data/com.apple.CoreML/model.mlmodel"
    weights = f"{relative}/Data/com.apple.CoreML/weights/weight.bin"
    listed = {f["path"] for f in files}
    if spec not in listed or weights not in listed:
        raise ExportValidationError(f"{path}: the saved program lacks {spec} or {weights}")
    return {"model": relative, "files": files, "graph": spec,
            "weights": {"path": weights, "tensors": []},
            "weight_bytes": weights_file_bytes(path),
            "validation": block_numerics(path, module, block, reference)}


def export_block(block: Block, root: Path, quantize: str) -> dict:
    reference = block.run(*block.example)
    base = f"models/{block.component}/{block.name}"
    record = {"name": block.name}
    record |= export_model(block.module, block, root, f"{base}.mlpackage", quantize,
                           reference)
    record["reference_weight_bytes"] = block.weight_bytes()
    record["inputs"] = signature(block.inputs, block.example)
    record["outputs"] = signature(block.outputs, reference)
    variants = getattr(block, "variants", None) or {}
    if variants:
        # the runtime loads a variant instead of the base program, never both
        record["variants"] = {}
        for name, module in variants.items():
            with torch.no_grad():
                out = module(*block.example)
            out = out if isinstance(out, tuple) else (out,)
            variant = replace(block, module=module)
            record["variants"][name] = export_model(
                module, variant, root, f"{base}.{name}.mlpackage", quantize, out)
            # the block's files are all it may load, so a package check covers variants too
            record["files"] = record["files"] + record["variants"][name]["files"]
    return record


def export_coreml(pipe: TinySora, dest: Path, quantize: str = "fp16",
                  model_name: str = "tiny-sora",
                  components: dict[str, list[Block]] | None = None,
                  on_block: Callable[[str], None] | None = None,
                  validate_end_to_end: Callable[[Path, dict], dict] | None = None) -> dict:
    """Export every block to `dest` atomically as .mlpackage programs; returns the manifest.

    Raises ExportValidationError (and writes nothing) if a program's interface does not
    match the manifest or the blocks do not chain."""
    from exporters.coreml_check import check_structure

    optimization_config(quantize)  # refuse a bad setting before converting anything
    components = components or cut_for_device(pipe)
    with atomic_directory(dest) as root:
        manifest = manifest_head(TinySoraModel(pipe), root, "iphone", model_name,
                                 raw_null_caption=True)
        manifest["coreml"] = {
            "format": "mlprogram", "minimum_deployment_target": DEPLOYMENT_TARGET,
            "compute_precision": "float16", "compute_units": COMPUTE_UNITS,
            "output_prefix": OUTPUT_PREFIX, "compression": compression_record(quantize),
            "compiled": False, "note": MACOS_ONLY_NOTE}
        manifest["components"] = []
        for name, blocks in components.items():
            records = []
            for block in blocks:
                records.append(export_block(block, root, quantize))
                if on_block:
                    on_block(block.key)
            manifest["components"].append({"name": name, "blocks": records})
        problems = check_structure(root, manifest)
        if problems:
            raise ExportValidationError("structure: " + "; ".join(problems))
        if validate_end_to_end:
            manifest["validation"] = validate_end_to_end(root, manifest)
        write_manifest(root, manifest)
    return manifest
