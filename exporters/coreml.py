"""`edge export --target iphone`: one CoreML ML Program (`.mlpackage`) per block.

Each block of `edge.blocks` is captured with `torch.export` (coremltools 9 cannot convert
some `jit.trace` graphs under numpy 2.4), converted to an ML Program for iOS 17 with fp16
compute, optionally compressed with `coremltools.optimize.coreml`, and saved. Shapes are
static, as the Neural Engine wants them, and the family's for the device
(`FamilyModel.shapes("iphone")`): one prompt (text encoder batch 1), the guidance batch of 2
for the transformer, and the decoder's pieces (tiny-sora: every frame of one video at once;
Wan: one latent frame of one video, the decoder chunked with its caches as inputs and
outputs and a "first" program for the first frame). A block coremltools cannot convert (an
op it lacks, a tensor above rank 5) is refused naming the block and the op.

Compression (`quantize`, `COMPRESSIONS`): "fp16" keeps fp16 weights; "8" is int8 linear
(symmetric, per output channel) quantization; "6" is k-means palettization with a per-tensor
lookup table (the granularity iOS 17 runs); "4" gives each block the storage its measured
sensitivity allows (4-bit tables for the embedding table and the VAE decoder, 6-bit for the
text encoder layers, int8 for the transformer; see COMPRESSIONS). A block's config is applied
to its program before it is saved: the compressions work tensor by tensor, so compressing
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
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.blocks import Block
from edge.families import FamilyModel
from edge.package import atomic_directory, file_entry, write_manifest
from exporters import ExportValidationError
from exporters.coreml_weights import import_coremltools
from exporters.package_head import manifest_head

WEIGHT_THRESHOLD = 2048       # coremltools' default: smaller tensors are not compressed
OUTPUT_PREFIX = "out_"        # a program may not use one name as input and output
COMPUTE_UNITS = "cpuAndNeuralEngine"   # what the Swift runtime asks MLModel for by default
MACOS_ONLY_NOTE = (".mlmodelc compilation needs macOS: Xcode compiles bundled .mlpackage "
                   "files, or the app calls MLModel.compileModel(at:) on device")


def cut_for_device(model: FamilyModel) -> dict[str, list[Block]]:
    """The family's blocks at the static shapes it runs on the device (one prompt)."""
    return model.cut(model.shapes("iphone"))


def _coreml_dtype(t: torch.Tensor):
    # CoreML has no int64 inputs: token ids and masks travel as int32
    return np.int32 if t.dtype in (torch.int64, torch.int32) else np.float32


def manifest_dtype(t: torch.Tensor) -> str:
    return "int32" if _coreml_dtype(t) is np.int32 else "float32"


@dataclass(frozen=True)
class Storage:
    """How one block's weights are stored: a coremltools compression (or fp16) and the
    manifest's record of it."""

    record: dict                      # e.g. {"method": "palettize_kmeans", "nbits": 4, ...}
    bits: int                         # per weight, for size estimates (tables left out)
    op_config: Callable[[], object] | None = None   # a coremltools OpConfig; None: fp16


@dataclass(frozen=True)
class Compression:
    """One `--quantize` setting: the storage of each block (the first rule whose pattern
    matches the block key, fnmatch-style, e.g. "text_encoder/layer_*"), and the iOS that the
    stored forms need."""

    setting: str
    deployment_target: str            # the iOS the stored forms need (ct.target's name)
    rules: tuple[tuple[str, Storage], ...]
    note: str = ""                    # why the rules are what they are

    def storage(self, block_key: str) -> Storage:
        return next(s for pattern, s in self.rules if fnmatch(block_key, pattern))

    def optimization_config(self, block_key: str):
        """The `coremltools.optimize.coreml` config of one block (None for fp16)."""
        op = self.storage(block_key).op_config
        if op is None:
            return None
        import_coremltools()
        import coremltools.optimize.coreml as cto

        return cto.OptimizationConfig(global_config=op())

    def record(self) -> dict:
        """The manifest's coreml.compression."""
        out = {"setting": self.setting, "weight_threshold": WEIGHT_THRESHOLD}
        if len(self.rules) == 1:   # one storage for every block
            out |= self.rules[0][1].record
        else:
            out["rules"] = [{"blocks": pattern, **storage.record}
                            for pattern, storage in self.rules]
        return out | ({"note": self.note} if self.note else {})


def _linear8():
    import coremltools.optimize.coreml as cto

    return cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                       granularity="per_channel",
                                       weight_threshold=WEIGHT_THRESHOLD)


def palettized(nbits: int) -> Storage:
    """k-means palettization, one lookup table per tensor (what iOS 17 runs)."""
    def config():
        import coremltools.optimize.coreml as cto

        return cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_tensor",
                                      weight_threshold=WEIGHT_THRESHOLD)

    return Storage({"method": "palettize_kmeans", "nbits": nbits, "granularity": "per_tensor"},
                   nbits, config)


FP16 = Storage({"method": "none", "weights": "float16"}, 16)
INT8 = Storage({"method": "linear_symmetric", "dtype": "int8", "granularity": "per_channel"},
               8, _linear8)

COMPRESSIONS = {c.setting: c for c in (
    Compression("fp16", "iOS17", (("*", FP16),)),
    Compression("8", "iOS17", (("*", INT8),)),
    Compression("6", "iOS17", (("*", palettized(6)),)),
    # Measured (docs/benchmarks.md, benchmarks/coreml_quantize.py): errors in the transformer
    # grow over the denoising steps and in the text encoder steer every step, while the VAE's
    # show once in the frames; the bytes are mostly the text encoder's (MiniLM's embedding
    # table alone is 46% of them). So: the table at 4 bits, the encoder layers at 6, the
    # transformer at 8, the VAE at 4 - 5.4 bits per weight, >= 6x smaller than fp32.
    Compression("4", "iOS17", (
        ("text_encoder/embeddings", palettized(4)),
        ("text_encoder/*", palettized(6)),
        ("transformer/*", INT8),
        ("vae_decoder/*", palettized(4)),
    ), note="4 bits where the measured error stays small: the embedding table and the VAE "
            "decoder; text encoder layers at 6 bits; transformer at 8 bits"),
)}
QUANTIZE = tuple(COMPRESSIONS)


def compression(quantize: str) -> Compression:
    """The setting named `quantize`, or a ValueError naming the known ones."""
    if quantize not in COMPRESSIONS:
        raise ValueError(f"--quantize {quantize!r} not understood; use one of "
                         f"{', '.join(QUANTIZE)}")
    return COMPRESSIONS[quantize]


def compression_record(quantize: str) -> dict:
    return compression(quantize).record()


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


def convert_module(module: nn.Module, block: Block, quantize: str):
    """torch.export -> ML Program (fp16 compute, the setting's iOS) -> compressed; an unsaved
    MLModel."""
    ct = import_coremltools()
    setting = compression(quantize)

    example = tuple(t.contiguous() for t in block.example)  # CoreML wants contiguous inputs
    # coremltools draws its own progress bars per conversion pass; the export shows one bar
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        program = drop_aliases(torch.export.export(module.eval(), example)
                               .run_decompositions({}))
        try:
            model = ct.convert(
                program, convert_to="mlprogram",
                minimum_deployment_target=getattr(ct.target, setting.deployment_target),
                compute_precision=ct.precision.FLOAT16,
                inputs=[ct.TensorType(name=n, shape=tuple(t.shape), dtype=_coreml_dtype(t))
                        for n, t in zip(block.inputs, example, strict=True)],
                outputs=[ct.TensorType(name=OUTPUT_PREFIX + n) for n in block.outputs])
        except (NotImplementedError, ValueError, RuntimeError, TypeError) as err:
            raise ExportValidationError(f"block {block.key}: CoreML cannot take it: "
                                        f"{unconvertible(err)}") from None
        config = setting.optimization_config(block.key)
        if config is not None:
            import coremltools.optimize.coreml as cto

            linear = isinstance(config.global_config, cto.OpLinearQuantizerConfig)
            compress = cto.linear_quantize_weights if linear else cto.palettize_weights
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
    if spec not in listed:
        raise ExportValidationError(f"{path}: the saved program lacks {spec}")
    if weights not in listed:  # every weight small enough to sit inline in the spec
        weights = spec
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
    if block.variants:
        # the runtime loads a variant instead of the base program, never both
        record["variants"] = {}
        for name, found in block.variants.items():
            variant = block.variant(name)  # its own signature where it declares one
            out = variant.run(*variant.example)
            entry = export_model(variant.module, variant, root, f"{base}.{name}.mlpackage",
                                 quantize, out)
            if isinstance(found, Block):  # e.g. a chunked component's first piece
                entry["inputs"] = signature(variant.inputs, variant.example)
                entry["outputs"] = signature(variant.outputs, out)
            record["variants"][name] = entry
            # the block's files are all it may load, so a package check covers variants too
            record["files"] = record["files"] + entry["files"]
    return record


def export_coreml(model: FamilyModel, dest: Path, quantize: str = "fp16",
                  model_name: str | None = None,
                  components: dict[str, list[Block]] | None = None,
                  on_block: Callable[[str], None] | None = None,
                  validate_end_to_end: Callable[[Path, dict], dict] | None = None) -> dict:
    """Export every block to `dest` atomically as .mlpackage programs; returns the manifest.

    Raises ExportValidationError (and writes nothing) if a program's interface does not
    match the manifest or the blocks do not chain."""
    from exporters.coreml_check import check_structure

    compression(quantize)  # refuse a bad setting before converting anything
    components = components or cut_for_device(model)
    with atomic_directory(dest) as root:
        manifest = manifest_head(model, root, "iphone", model_name or model.name,
                                 raw_null_caption=True)
        manifest["coreml"] = {
            "format": "mlprogram",
            "minimum_deployment_target": compression(quantize).deployment_target,
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
            component = {"name": name, "blocks": records}
            if name in model.chunked:  # run piece by piece, state carried (as for onnx)
                component["chunked"] = model.chunked[name].to_dict(blocks)
            manifest["components"].append(component)
        problems = check_structure(root, manifest)
        if problems:
            raise ExportValidationError("structure: " + "; ".join(problems))
        if validate_end_to_end:
            manifest["validation"] = validate_end_to_end(root, manifest)
        write_manifest(root, manifest)
    return manifest
