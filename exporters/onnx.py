"""`edge export --target onnx`: one ONNX graph per block, weights in flash-friendly files.

Each block's graph takes its weights as ordinary inputs instead of embedding them, and its
weights sit contiguous in one file per block (tensors 64-byte aligned, file padded to 4 KiB).
So the runtime alone decides when weight bytes are read: a block load is one large read, and
an onnxruntime session (graph only, a few hundred KB) is created once and never reloads
weights. Embedded or external-data initializers would make onnxruntime read the weights
itself at session creation, outside the loader's budget and prefetch.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from edge.core.manifest_schema import TILE_AXES
from edge.core.package import (
    atomic_directory,
    file_entry,
    write_manifest,
    write_weights_file,
)
from edge.core.video_metrics import psnr
from edge.exporters import ExportValidationError
from edge.exporters.graph_reuse import copy_of_earlier, graph_key, remember
from edge.exporters.onnx_registry import reused_torchlib_registry
from edge.exporters.onnx_rewrites import without_quadratic_rules
from edge.exporters.package_head import manifest_head
from edge.exporters.validation import VALIDATION_PROMPT, output_error
from edge.exporters.validation import check_validation as check_bound
from edge.graph.blocks import Block, chained, torch_block_opener
from edge.graph.family_model import FamilyModel
from edge.graph.lazy_weights import materialized
from edge.graph.reference_device import reference_record
from edge.graph.token_chunks import token_chunks
from edge.planning.compute_cost import flops_record

# fp32 max-abs error per block against PyTorch, for outputs up to 1 in magnitude; larger ones
# (a random model's activations reach thousands) are held to it relative to their largest
BLOCK_TOLERANCE = 1e-4


def write_weights(path: Path, tensors: dict[str, torch.Tensor]) -> list[dict]:
    """Write fp32 tensors into one file in the package's flash layout; return the table."""
    arrays = {n: t.detach().contiguous().numpy().astype(np.float32, copy=False)
              for n, t in tensors.items()}
    offsets = write_weights_file(path, arrays)
    return [{"name": n, "dtype": "float32", "shape": list(a.shape), "offset": offsets[n],
             "bytes": a.nbytes} for n, a in arrays.items()]


def graph_output(name: str) -> str:
    """ONNX forbids one name as both graph input and output (a layer maps `hidden` to
    `hidden`), so graph outputs carry a prefix; the manifest keeps the plain names."""
    return f"out:{name}"


class WeightsAsInputs(nn.Module):
    """Wraps a block so its parameters become graph inputs after the activations."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block.module
        self.n_inputs = len(block.inputs)
        self.names = list(block.parameters())

    def forward(self, *args):
        weights = dict(zip(self.names, args[self.n_inputs:], strict=True))
        return torch.func.functional_call(self.block, weights, args[:self.n_inputs])


def _multi_head_attention_schema() -> onnx.defs.OpSchema:
    """The part of onnxruntime's MultiHeadAttention schema edge uses (onnx carries no schema
    of onnxruntime's own operators, and onnxscript needs one to emit a node)."""
    from onnx.defs import OpSchema

    tensor = OpSchema.FormalParameter
    return OpSchema(
        "MultiHeadAttention", "com.microsoft", 1,
        inputs=[tensor("query", "T"), tensor("key", "T"), tensor("value", "T")],
        outputs=[tensor("output", "T")],
        type_constraints=[("T", ["tensor(float)"], "float")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "heads"),
                    OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "scale")])


def _multi_head_attention(q, k, v, heads: int, scale: float):
    """edge::attention as onnxruntime's MultiHeadAttention (com.microsoft): query, key and
    value as (batch, tokens, heads × head dim), the layout in which its CPU kernel runs flash
    attention (measured: 16 384 tokens, 4 heads in a 239 MB peak against 4.5 GB for the
    written-out softmax). Back to (batch, heads, tokens, head dim) after."""
    from onnxscript import opset18 as op
    from onnxscript.values import Op, Opset

    multi_head_attention = Op(Opset("com.microsoft", 1), "MultiHeadAttention",
                              _multi_head_attention_schema())

    def tokens_first(x):  # (B, H, S, d) -> (B, S, H*d); 0 keeps a (dynamic) dimension
        return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))

    out = multi_head_attention(tokens_first(q), tokens_first(k), tokens_first(v),
                               num_heads=heads, scale=scale)
    out = op.Reshape(out, op.Constant(value_ints=[0, 0, heads, -1]))
    return op.Transpose(out, perm=[0, 2, 1, 3])


def traced(module: nn.Module, args: tuple, shapes: tuple) -> torch.export.ExportedProgram:
    """torch.export as torch.onnx.export's own first capture does it (non-strict, sizes 0
    and 1 not specialised, a batch range narrowed as torch suggests when a guard needs it)."""
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(backed_size_oblivious=True):
        try:
            return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        except torch._dynamo.exc.UserError as err:
            refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(
                err.msg, shapes)
            return torch.export.export(module, args, dynamic_shapes=refined, strict=False)


def export_graph(block: Block, path: Path, fused_attention: bool = True,
                 weight_inputs: tuple[nn.Module, list[str], tuple] | None = None) -> None:
    """The block as an ONNX graph, weights as inputs after the activations. Its attention
    never holds a whole score matrix: onnxruntime's fused MultiHeadAttention where it has no
    mask (`fused_attention`), query chunks elsewhere (edge/graph/attention.py). `weight_inputs`:
    (module, weight input names, their example tensors) where the weights are fed otherwise
    than as the block's float32 parameters (a web package's stored forms)."""
    module, weight_names, weights = weight_inputs or (
        WeightsAsInputs(block), list(block.parameters()), tuple(block.parameters().values()))
    shapes = dynamic_axes(block) + [None] * len(weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the exporter's constant folder logs harmless "Evaluation failed" notes, and its op
    # registry four "torchvision is not installed" lines per graph; keep them quiet
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    input_names = block.inputs + weight_names
    output_names = [graph_output(n) for n in block.outputs]
    convert = functools.partial(
        torch.onnx.export, input_names=input_names, output_names=output_names, dynamo=True,
        external_data=False, verbose=False,
        custom_translation_table={torch.ops.edge.attention.default: _multi_head_attention})
    with warnings.catch_warnings(), without_quadratic_rules(), reused_torchlib_registry():
        warnings.simplefilter("ignore")
        with token_chunks(fused_attention=fused_attention):
            # traced once: the program keys the graph (an identical block's is copied,
            # exporters/graph_reuse.py) and is what onnx converts
            try:
                program = traced(module, block.example + weights, (tuple(shapes),))
            except Exception:  # torch.onnx's capture has strategies this one lacks: its own
                convert(module, block.example + weights, str(path),
                        dynamic_shapes=(tuple(shapes),))
                return
        key = graph_key(program, (input_names, output_names, fused_attention, [
            (str(t.dtype), tuple(t.shape)) for t in block.example + weights],
            block.dynamic_batch))
        if copy_of_earlier(key, path):
            return
        # the shapes again: onnx then names the dynamic axes "batch", as for a module
        convert(program, (), str(path), dynamic_shapes=(tuple(shapes),))
    remember(key, path)


MAX_BATCH = 4096
VIDEO_RANK = 5  # (B, C, T, H, W): the inputs whose height and width `dynamic_space` frees


def dynamic_axes(block: Block) -> list[dict | None]:
    """torch.export's dynamic axes of each input: the batch where `dynamic_batch` says, the
    height and width of a video-shaped input where `dynamic_space` does."""
    # bounded: a graph whose batch folds in frames (B*F) otherwise meets int32 size guards
    # torch cannot refine (Open-Sora's 2D decoder); no call batches more than this
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    height, width = (torch.export.Dim(name, min=1) for name in TILE_AXES)
    axes = []
    for t, d in zip(block.example, block.dynamic_batch, strict=True):
        found = ({0: batch} if d else {}) | (
            {3: height, 4: width} if block.dynamic_space and t.dim() == VIDEO_RANK else {})
        axes.append(found or None)
    return axes


def signature(names: list[str], tensors: tuple[torch.Tensor, ...], dynamic: list[bool],
              dynamic_space: bool = False):
    def shape(t: torch.Tensor, d: bool) -> list:
        dims = ["batch" if d else t.shape[0], *t.shape[1:]]
        if dynamic_space and t.dim() == VIDEO_RANK:
            dims[3:] = list(TILE_AXES)
        return dims

    return [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": shape(t, d)}
            for n, t, d in zip(names, tensors, dynamic, strict=True)]


def check_validation(validation: dict, what: str) -> None:
    """`validation.check_validation` at the ONNX bound, BLOCK_TOLERANCE."""
    check_bound(validation, what, BLOCK_TOLERANCE)


def validate_block(block: Block, graph: Path, want: tuple[torch.Tensor, ...],
                   weights: dict[str, np.ndarray] | None = None) -> dict:
    """`output_error` of the ONNX graph against the PyTorch block's outputs `want` on its
    example inputs; `weights`: the graph's weight inputs where they are not the block's
    parameters (a web package's stored forms)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    feed = {n: t.numpy() for n, t in zip(block.inputs, block.example, strict=True)}
    feed |= weights if weights is not None else {
        n: t.numpy() for n, t in block.parameters().items()}
    return output_error(session.run([graph_output(n) for n in block.outputs], feed), want)


# `--execute distinct`: a graph that computes what one validated in this export does is not run
NOT_VALIDATED = ("not run at export (--execute distinct): its graph is {}'s but for metadata "
                 "(the same nodes, initializers and signature), and that one was validated")


def computation_digest(graph: Path) -> str:
    """sha256 of what an ONNX graph computes: the file less its metadata. torch.onnx writes
    the traced program's range constraints there, whose symbol names differ between traces
    of one block (Wan's at 480x832x81, in token chunks), so such graphs differ as files in
    those bytes alone."""
    model = onnx.load(str(graph))
    del model.metadata_props[:]
    del model.graph.metadata_props[:]
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def export_validated_graph(block: Block, graph: Path, what: str,
                           validated: dict[str, str] | None = None) -> tuple:
    """Export `block`'s graph and check it against PyTorch; returns (outputs, validation).
    `validated` (--execute distinct): the `computation_digest` of each graph this export
    validated, to the block that was; a graph among them is written unvalidated, its
    outputs shapes only, and no forward pass runs (at Wan's 480x832x81 a block's reference
    and graph run are minutes each, and its 30 blocks convert to one graph)."""
    with materialized(block.module):
        export_graph(block, graph)
        digest = computation_digest(graph) if validated is not None else None
        if digest is not None and digest in validated:
            return block.output_shapes(), {"executed": False,
                                           "why": NOT_VALIDATED.format(validated[digest])}
        outputs = block.reference()  # the reference, and the signatures' source
        validation = validate_block(block, graph, outputs)
    check_validation(validation, f"block {what}: ONNX output")
    if digest is not None:
        validated[digest] = what
    return outputs, validation


def export_variants(block: Block, root: Path, validated: dict[str, str] | None = None) -> dict:
    """One more graph per variant (e.g. "tdtm"); the variant reads the base block's weights
    file, since its parameters are the base block's (same names), so nothing is duplicated.
    A variant with a signature of its own (e.g. a chunked component's "first") records it."""
    records = {}
    for name in block.variants:
        variant = block.variant(name)
        if list(variant.parameters()) != list(block.parameters()):
            raise ExportValidationError(f"block {block.key} variant {name}: its parameters "
                                        "are not the base block's")
        graph = root / "graphs" / block.component / f"{block.name}.{name}.onnx"
        outputs, validation = export_validated_graph(variant, graph,
                                                     f"{block.key} variant {name}", validated)
        entry = file_entry(root, graph)
        records[name] = {"graph": entry["path"], "files": [entry], "validation": validation,
                         "flops": flops_record(variant)}
        if isinstance(block.variants[name], Block):  # a signature of its own
            records[name] |= block_signature(variant, outputs)
    return records


def block_signature(block: Block, outputs: tuple[torch.Tensor, ...]) -> dict:
    dynamic_out = block.dynamic_outputs or [True] * len(outputs)
    return {"inputs": signature(block.inputs, block.example, block.dynamic_batch,
                                block.dynamic_space),
            "outputs": signature(block.outputs, outputs, dynamic_out, block.dynamic_space)}


def export_block(block: Block, root: Path, validated: dict[str, str] | None = None) -> dict:
    # a model larger than memory: this block's weights are read now and dropped after
    with materialized(block.module):
        return _export_block(block, root, validated)


def _export_block(block: Block, root: Path, validated: dict[str, str] | None) -> dict:
    graph = root / "graphs" / block.component / f"{block.name}.onnx"
    weights = root / "weights" / block.component / f"{block.name}.bin"
    outputs, validation = export_validated_graph(block, graph, block.key, validated)
    table = write_weights(weights, block.parameters())
    files = [file_entry(root, graph), file_entry(root, weights)]
    variants = export_variants(block, root, validated)
    # the block's files list every file it uses, its variants' graphs too, so verification
    # and the unlisted-file check cover them
    files += [f for v in variants.values() for f in v["files"]]
    record = {
        "name": block.name,
        "files": files,
        "graph": files[0]["path"],
        "weights": {"path": files[1]["path"], "tensors": table},
        "weight_bytes": block.weight_bytes(),
        **block_signature(block, outputs),
        "validation": validation,
        "flops": flops_record(block),
    }
    if variants:
        record["variants"] = variants
    return record


def export_onnx(model: FamilyModel, dest: Path, model_name: str | None = None,
                components: dict[str, list[Block]] | None = None,
                on_block: Callable[[str], None] | None = None,
                validate_end_to_end: Callable[[Path], dict] | None = None,
                plan: dict | None = None, distinct_only: bool = False) -> dict:
    """Export every block of `model` (a family's model, edge/families) to `dest` atomically;
    returns the manifest. `components`: the blocks, if already cut (default: the family's
    cut); `plan`: how they were cut for a memory budget (edge/planning/plan.py), recorded in the
    manifest; `distinct_only` (--execute distinct): a block or variant whose graph computes
    what one validated before in this export does (`computation_digest`) is written
    unvalidated, saying so, and runs no forward pass."""
    components = components or model.cut()
    validated: dict[str, str] | None = {} if distinct_only else None
    with atomic_directory(dest) as root:
        manifest = manifest_head(model, root, "onnx", model_name or model.name)
        if plan is not None:
            manifest["plan"] = plan
        manifest["components"] = []
        for name, blocks in components.items():
            records = []
            for block in chained(blocks, computed_only=distinct_only):
                records.append(export_block(block, root, validated))
                if on_block:
                    on_block(block.key)
            record = {"name": name, "blocks": records}
            if name in model.chunked:
                record["chunked"] = model.chunked[name].to_dict(blocks)
            tiling = getattr(model, "tiled", {}).get(name)
            if tiling is not None:  # its graphs take any tile (Block.dynamic_space)
                record["tiles"] = tiling.to_dict()
            manifest["components"].append(record)
        write_manifest(root, manifest)
        if validate_end_to_end:
            manifest["validation"] = validate_end_to_end(root)
            write_manifest(root, manifest)
    return manifest


PSNR_LIMIT_DB = 40.0


def end_to_end_check(model: FamilyModel, seed: int = 0,
                     on_step: Callable[[int, int], None] | None = None,
                     memory_budget: int | None = None,
                     components: dict[str, list[Block]] | None = None
                     ) -> Callable[[Path], dict]:
    """A check for `export_onnx`: the package run by the Python runtime must reproduce the
    family's PyTorch reference video (diffusers' own pipeline for a diffusers folder) on a
    fixed prompt and seed (PSNR >= 40 dB). `on_step(done, total)` counts the denoising steps
    of both generations (minutes on a large model). `memory_budget`: the runtime streams
    under it, so the check does not hold a second copy of a large model beside the one being
    exported. A model exported out of core (`model.out_of_core`) is never held whole: its
    reference is its PyTorch blocks (`components`, as exported; default: the family's cut)
    streamed under the same budget (default: twice the largest block), not diffusers'
    pipeline."""

    def progress(offset: int) -> Callable[[int, int], None] | None:
        return None if on_step is None else lambda i, n: on_step(offset + i, 2 * n)

    def check(root: Path) -> dict:
        budget, blocks = memory_budget, components
        streamed = model.out_of_core
        if streamed and blocks is None:
            blocks = model.cut()
        if streamed and budget is None:
            budget = streaming_budget(blocks)
        got = package_video(root, budget, seed, progress(0))
        reference_progress = progress(model.sampler.steps)
        if streamed:
            want = streamed_reference(root, blocks, budget, seed, reference_progress)
        else:
            want = model.generate(VALIDATION_PROMPT, seed=seed, on_step=reference_progress)
        value = psnr(got, want)
        if not value >= PSNR_LIMIT_DB:
            raise ExportValidationError(
                f"end to end: the exported package's video differs from PyTorch's "
                f"(PSNR {value:.1f} dB < {PSNR_LIMIT_DB:g} dB) on {VALIDATION_PROMPT!r}, "
                f"seed {seed}")
        # identical videos have an infinite PSNR, which JSON cannot hold: null and a flag
        identical = bool(value == float("inf"))
        return {"prompt": VALIDATION_PROMPT, "seed": seed, "identical": identical,
                "psnr_db": None if identical else round(float(value), 2),
                **({"reference": STREAMED_REFERENCE} if streamed else {}),
                **reference_record()}

    return check


STREAMED_REFERENCE = "the family's PyTorch blocks, streamed with the package's weights"


def streaming_budget(components: dict[str, list[Block]]) -> int:
    """The budget an out-of-core check streams under unless given: twice the largest
    block's float32 weights."""
    return 2 * max(b.weight_bytes() for bs in components.values() for b in bs)


def package_video(root: Path, budget: int | None, seed: int,
                  on_step: Callable[[int, int], None] | None,
                  open_block: Callable | None = None) -> np.ndarray:
    """The Python runtime's video of the package at `root` on the validation prompt,
    streaming under `budget`; `open_block`: what runs each block (default: its graph)."""
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(root, memory_budget=budget, open_block=open_block)
    try:
        return runtime.generate(VALIDATION_PROMPT, seed=seed, on_step=on_step)
    finally:
        runtime.close()


def streamed_reference(root: Path, components: dict[str, list[Block]], budget: int,
                       seed: int, on_step: Callable[[int, int], None] | None,
                       fed_weights: bool = True) -> np.ndarray:
    """The check's reference for a model larger than memory: the Python runtime's
    generation with each block (and variant) run by its PyTorch module, the loader
    streaming the weights under `budget` as it does for the graphs. `fed_weights=False`:
    the blocks read their own float32 weights from the folder instead of the package's."""
    blocks = {b.key: b for bs in components.values() for b in bs}
    return package_video(root, budget, seed, on_step,
                         torch_block_opener(blocks, fed_weights=fed_weights))
