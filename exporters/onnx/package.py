"""`edge export --target onnx`: one ONNX graph per block (exporters/shared/onnx_graph.py),
weights in flash-friendly files.

Each block's graph takes its weights as ordinary inputs instead of embedding them, and its
weights sit contiguous in one file per block (tensors 64-byte aligned, file padded to 4 KiB).
So the runtime alone decides when weight bytes are read: a block load is one large read, and
an onnxruntime session (graph only, a few hundred KB) is created once and never reloads
weights. Embedded or external-data initializers would make onnxruntime read the weights
itself at session creation, outside the loader's budget and prefetch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from edge.core.manifest_schema import TILE_AXES
from edge.core.package import file_entry, write_weights_file
from edge.core.video_metrics import psnr
from edge.exporters import ExportValidationError
from edge.exporters.shared.onnx_graph import (
    VIDEO_RANK,
    check_validation,
    computation_digest,
    export_graph,
    validate_block,
)
from edge.exporters.shared.package_run import (
    STREAMED_REFERENCE,
    package_video,
    streamed_reference,
    streaming_budget,
)
from edge.exporters.shared.package_writer import PackageParts, write_package
from edge.exporters.shared.validation import VALIDATION_PROMPT
from edge.graph.blocks import Block, chained
from edge.graph.family_model import FamilyModel, applied_tiles
from edge.graph.lazy_weights import materialized
from edge.graph.reference_device import reference_record
from edge.planning.compute_cost import flops_record


def write_weights(path: Path, tensors: dict[str, torch.Tensor]) -> list[dict]:
    """Write fp32 tensors into one file in the package's flash layout; return the table."""
    arrays = {n: t.detach().contiguous().numpy().astype(np.float32, copy=False)
              for n, t in tensors.items()}
    offsets = write_weights_file(path, arrays)
    return [{"name": n, "dtype": "float32", "shape": list(a.shape), "offset": offsets[n],
             "bytes": a.nbytes} for n, a in arrays.items()]


def signature(names: list[str], tensors: tuple[torch.Tensor, ...], dynamic: list[bool],
              dynamic_space: bool = False):
    def shape(t: torch.Tensor, d: bool) -> list:
        dims = ["batch" if d else t.shape[0], *t.shape[1:]]
        if dynamic_space and t.dim() == VIDEO_RANK:
            dims[3:] = list(TILE_AXES)
        return dims

    return [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": shape(t, d)}
            for n, t, d in zip(names, tensors, dynamic, strict=True)]


# `--execute distinct`: a graph that computes what one validated in this export does is not run
NOT_VALIDATED = ("not run at export (--execute distinct): its graph is {}'s but for metadata "
                 "(the same nodes, initializers and signature), and that one was validated")


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
    parts = PackageParts(
        "onnx",
        export_block=lambda name, block, root: export_block(block, root, validated),
        blocks=lambda name, blocks: chained(blocks, computed_only=distinct_only),
        head=lambda root: {} if plan is None else {"plan": plan},
        # a tiled component's graphs take any tile (Block.dynamic_space)
        tiles=applied_tiles(model, model.shapes("onnx")),
        check=None if validate_end_to_end is None else
        lambda root, manifest: validate_end_to_end(root))
    return write_package(model, dest, components, parts, model_name, on_block)


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
