"""`edge export --target iphone --min-ios 27`: one Core AI model (`.aimodel`) per block,
every program executed at export.

Core AI (iOS 27) is Apple's successor to Core ML. Its Python packages (`coreai-core`,
`coreai-torch`, pinned in the [iphone] extra: they are beta) convert a `torch.export` graph
to a Core AI program, and their runtime executes programs on Linux through a bundled
reference interpreter. So, unlike a Core ML package, every program this exporter writes has
run before the package exists: each block's graph (and each variant's) is executed on the
block's example inputs and held to the PyTorch block.

A block and its variants (TDTM, a chunked component's `first` piece) are the functions of one
`.aimodel` (a folder: `main.mlirb`, MLIR bytecode with the weights inside; `main.hash`, its
sha256; `metadata.json`): the converter stores a tensor the graphs share once. Inputs and
outputs are float32 and int32 (Core AI narrows int64 to int32, as Core ML has no int64).

Storage (`--quantize`): "fp32" keeps the graph as PyTorch computes it; "fp16" converts the block in
half precision (weights and compute) behind float32 inputs and outputs, which on Linux the
interpreter emulates (slowly: fine at test sizes). Conversion and execution run in child processes
side by side (exporters/iphone/coreai/pool.py, exporters/iphone/coreai/worker.py): a crash there is
an error naming the block, and the package is not written. `--execute distinct` executes one block
of each repeated shape (`repeats`) and converts the rest unexecuted.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.core.files import held_temporary_folder
from edge.core.package import file_entry
from edge.exporters import ExportValidationError
from edge.exporters.iphone.compression import Compression, auto_target, compression
from edge.exporters.iphone.coreai.pool import run_worker
from edge.exporters.iphone.coreai.simulated import simulated_block, weight_axes
from edge.exporters.iphone.coreai.worker import PINNED
from edge.exporters.iphone.coreml.package import manifest_dtype, signature
from edge.exporters.iphone.coreml.weights import MAIN
from edge.exporters.shared.validation import largest_finite, worse, worst_difference
from edge.graph.blocks import Block, chained, with_unguided
from edge.graph.family_model import FamilyModel
from edge.graph.lazy_weights import materialized
from edge.graph.token_chunks import token_chunks

LAYOUT = "coreai"
MIN_IOS = 27
NOT_EXECUTED = ("converted, not executed (--execute distinct: it repeats the shapes of a block "
                "that was)")
OPT_THRESHOLD = 1024   # coreai-opt's: tensors of at most this many values keep their dtype
# The weights coreai-opt compresses (its passes' _OPS_WEIGHT_NEED_COMPRESSION: matrix
# products, 2-D convolutions, gathered tables): by rank, a matrix or a 2-D kernel. The video
# decoders' 3-D convolution kernels (rank 5), biases and norms stay at the compute dtype.
COMPRESSED_RANKS = (2, 4)


@dataclass(frozen=True)
class Precision:
    """How a block's graph is converted: its weights' and compute's dtype, and how near the
    executed program must come to the fp32 PyTorch block (relative to the output's largest
    magnitude). A setting worded per block (a family's `4`) stores each block as the first of
    `rules` whose pattern matches its key says."""

    setting: str
    dtype: torch.dtype
    tolerance: float
    record: dict
    weights: dict | None = None   # how coreai-opt stores the weights (None: as computed)
    rules: tuple[tuple[str, StoredForm], ...] = ()

    def stored_form(self, block_key: str) -> StoredForm:
        """The block's stored form: its rule's, else the setting's own."""
        return next((form for pattern, form in self.rules if fnmatch(block_key, pattern)),
                    StoredForm(self.weights, self.bits, self.tolerance))

    @property
    def bits(self) -> int:
        """Bits a weight is stored in (the dry run's estimate; scales come on top)."""
        if self.weights is not None:
            return int(self.weights["dtype"].removeprefix("int"))
        return 8 * self.dtype.itemsize


@dataclass(frozen=True)
class StoredForm:
    """One block's weights as coreai-opt stores them (`weights`: a Core ML stored form's
    record, exporters/iphone/compression.py; None: as computed), their bits a weight, and the
    executed program's tolerance against the fp32 block at that form."""

    weights: dict | None
    bits: float
    tolerance: float


INT8_WEIGHTS = {"method": "linear_symmetric", "dtype": "int8", "granularity": "per_channel"}
PRECISIONS = {
    # float rounding in another order of operations: the ONNX and web bound (a VAE up block
    # sums thousands of products an output through seven convolutions: Open-Sora's up
    # blocks execute up to 2.9e-5 from PyTorch)
    "fp32": Precision("fp32", torch.float32, 1e-4, {"method": "none", "weights": "float32"}),
    # half precision throughout: 2^-11 per rounding, grown through a block's layers
    "fp16": Precision("fp16", torch.float16, 3e-2, {"method": "none", "weights": "float16",
                                                    "compute": "float16"}),
    # int8 weights (per output channel, symmetric) dequantized for float16 compute
    "8": Precision("8", torch.float16, 6e-2, INT8_WEIGHTS | {"compute": "float16"},
                   weights=INT8_WEIGHTS),
}
# Settings stored in the Core ML layouts' forms (exporters/iphone/compression.py), block by block:
# the "4" each family words, behind float16 compute (its linear forms: int8, int4 per 32 inputs)
STORED_SETTINGS = ("4",)
# The executed program against the fp32 block, by the bits its weights are stored in: a
# guard against a broken program (a wrong layout reads as error of order one), not a measure
# of the stored form's cost; each block's error is recorded (docs/package-format.md).
TOLERANCE_BY_BITS = ((16, 3e-2), (8, 6e-2), (0, 0.3))
# A compressed program against the PyTorch block with coreai-opt's stored weights simulated:
# float16 compute is all that differs (the fp16 setting's bound)
SIMULATED_TOLERANCE = 3e-2


def _tolerance(bits: float) -> float:
    return next(tolerance for least, tolerance in TOLERANCE_BY_BITS if bits >= least)


def stored_precision(quantize: str | Compression, model: FamilyModel) -> Precision:
    """A setting of STORED_SETTINGS (or a Compression of the Core ML layouts' own) for
    `model`: each block's stored form (the family's rule for "4") made coreai-opt's, float16
    compute. A ValueError where a block's form is a lookup table, or the setting stores some
    tensors of a block otherwise (Core AI's passes store a whole program alike)."""
    setting = compression(quantize, model)
    quantize = setting.setting
    if setting.tensor_rules:
        raise ValueError(f"--quantize {quantize} with --min-ios {MIN_IOS}: {model.family}'s "
                         "rule stores some tensors of a block in another form "
                         f"({setting.tensor_rules[0][1]} of {setting.tensor_rules[0][0]}), "
                         "which Core AI's compression passes cannot (they store a whole "
                         "program alike); use 8 or fp16")
    tables = [(pattern, storage.record) for pattern, storage in setting.rules
              if storage.record["method"] == "palettize_kmeans"]
    if tables:
        pattern, record = tables[0]
        raise ValueError(f"--quantize {quantize} with --min-ios {MIN_IOS}: {model.family}'s "
                         f"rule stores {pattern} as {record['nbits']}-bit lookup tables, "
                         "which Core AI's k-means (coreai-opt "
                         f"{PINNED['coreai-opt']}) does not store faithfully yet (tiny-sora's "
                         "embedding table 0.42 off at 8 bits where int8 is 0.03; its fast "
                         "mode gives NaN); use 8 or fp16, or --min-ios 18 for this rule")
    rules = tuple((pattern, StoredForm(storage.record if storage.op_config else None,
                                       storage.bits, _tolerance(storage.bits)))
                  for pattern, storage in setting.rules)
    # coreai-opt's threshold in place of coremltools'
    record = setting.record() | {"compute": "float16", "weight_threshold": OPT_THRESHOLD}
    return Precision(quantize, torch.float16, _tolerance(min(f.bits for _, f in rules)),
                     record, rules=rules)


def check_setting(quantize: str) -> None:
    """A ValueError naming the settings there are if `quantize` is none of them (an auto
    target that does not parse is named by exporters/iphone/compression.py auto_target)."""
    if auto_target(quantize) is not None:
        return
    if quantize not in PRECISIONS and quantize not in STORED_SETTINGS:
        raise ValueError(f"--quantize {quantize!r} with --min-ios {MIN_IOS}: Core AI packages "
                         f"take {', '.join((*PRECISIONS, *STORED_SETTINGS))} or auto (auto:38dB, "
                         "auto:14MB, auto:7x)")


def check_precision(quantize: str, model: FamilyModel) -> Precision:
    """The setting named `quantize` for `model`'s blocks (a ValueError naming those there
    are, or why the family's rule does not apply). An auto setting is chosen at export by
    measurement (exporters/iphone/coreai/recipe.py); until then it counts as fp16, the most any of
    its forms stores."""
    check_setting(quantize)
    if auto_target(quantize) is not None:
        return PRECISIONS["fp16"]
    if quantize in STORED_SETTINGS:
        return stored_precision(quantize, model)
    return PRECISIONS[quantize]


def quantizes(quantize: str) -> bool:
    """Whether the setting needs coreai-opt (its weights stored in fewer bits)."""
    return (auto_target(quantize) is not None or quantize in STORED_SETTINGS
            or PRECISIONS[quantize].weights is not None)


def import_coreai(quantizing: bool = False) -> None:
    """Core AI's converter (and its quantizer, `quantizing`), or a ModuleNotFoundError naming
    it (the [iphone] extra brings them); checked before any work, as the conversion itself
    runs in a child process."""
    with warnings.catch_warnings():   # "validated with torch<=2.13.0; found 2.13.0+cpu"
        warnings.simplefilter("ignore")
        import coreai  # noqa: F401
        import coreai_torch  # noqa: F401
        if quantizing:
            import importlib.util

            if importlib.util.find_spec("coreai_opt") is None:
                raise ModuleNotFoundError("No module named 'coreai_opt'", name="coreai_opt")


# inputs a half-precision block still takes in float32: the timestep, which a float16 input
# would round by up to 0.25 near 1000 (Open-Sora's t*1000 too) before its sinusoid, which
# every family computes in float32 and casts to its MLP's dtype
FLOAT32_INPUTS = frozenset({"t"})


class HalfPrecision(nn.Module):
    """A block computed in float16 behind float32 inputs and outputs (integer inputs, token
    ids and masks, pass as they are; the inputs at positions `keep` stay float32)."""

    PREFIX = "inner."   # the block's tensors' names in this module

    def __init__(self, module: nn.Module, keep: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.inner = copy.deepcopy(module).half()
        self.keep = keep

    def forward(self, *inputs: torch.Tensor):
        out = self.inner(*(t.half() if t.is_floating_point() and i not in self.keep else t
                           for i, t in enumerate(inputs)))
        if isinstance(out, tuple):
            return tuple(o.float() for o in out)
        return out.float()


def _device_input(t: torch.Tensor) -> np.ndarray:
    # Core AI narrows int64 inputs to int32, as CoreML has no int64: the manifest's dtypes
    return t.contiguous().numpy().astype(np.dtype(manifest_dtype(t)), copy=False)


def _functions(block: Block) -> dict[str, Block]:
    """The graphs of a block's one model: its own ("main") and each variant's, by name."""
    return {MAIN: block} | {name: block.variant(name) for name in block.variants}


def model_path(block: Block) -> str:
    """The block's .aimodel folder, relative to the package."""
    return f"models/{block.component}/{block.name}.aimodel"


def _save_graph(block: Block, precision: Precision, where: Path,
                compressed: bool) -> tuple[dict, dict[str, tuple[int, int]]]:
    """torch.export the block's graph at its example shapes (attention chunked as on every
    target) and save it with its example inputs for the worker: the worker's entry, and
    (`compressed`: the stored form quantizes) the weights coreai-opt will compress, read off
    that graph for the simulated reference."""
    module = block.module.eval()
    if precision.dtype is torch.float16:
        module = HalfPrecision(module, frozenset(i for i, name in enumerate(block.inputs)
                                                 if name in FLOAT32_INPUTS))
    example = tuple(t.contiguous() for t in block.example)
    # a model larger than memory: this block's weights read for its graph, then dropped (the
    # saved graph holds them on disk for the worker)
    with materialized(block.module):
        try:
            with token_chunks():
                program = torch.export.export(module, example)
        except Exception as err:  # a graph torch cannot capture: the block and why
            raise ExportValidationError(f"block {block.key}: torch.export cannot capture its "
                                        f"{precision.setting} graph for Core AI: "
                                        f"{type(err).__name__}: {err}") from err
        torch.export.save(program, where.with_suffix(".pt2"))
    np.savez(where.with_suffix(".npz"),
             **{n: _device_input(t) for n, t in zip(block.inputs, example, strict=True)})
    entry = {"program": str(where.with_suffix(".pt2")), "inputs": str(where.with_suffix(".npz")),
             "input_names": list(block.inputs), "output_names": list(block.outputs)}
    return entry, weight_axes(program, HalfPrecision.PREFIX) if compressed else {}


def executed_error(got: dict[str, np.ndarray], block: Block,
                   reference: tuple[torch.Tensor, ...], precision: Precision,
                   seconds: float) -> dict:
    """The executed program's outputs against the fp32 PyTorch block (the tolerance: the
    block's stored form's)."""
    for name, want in zip(block.outputs, reference, strict=True):
        if got[name].shape != tuple(want.shape):
            raise ExportValidationError(f"block {block.key}: Core AI's {name} is "
                                        f"{list(got[name].shape)}, the block's "
                                        f"{list(want.shape)}")
    error, scale, relative = _output_errors(got, block.outputs, reference)
    return {"max_abs_error": error, "reference_max_abs": scale,
            "relative_error": relative,
            "tolerance": precision.stored_form(block.key).tolerance,
            "executed": f"Core AI runtime (coreai-core {PINNED['coreai-core']})",
            "execute_seconds": round(seconds, 4)}


def _output_errors(got: dict[str, np.ndarray], outputs: list[str],
                   reference: tuple[torch.Tensor, ...]) -> tuple[float, float, float]:
    """(largest error, largest reference magnitude, largest relative error) of the executed
    outputs: each output against its own largest magnitude (a mask's -1e4 is no scale for a
    hidden state beside it)."""
    error = scale = relative = 0.0
    for name, want in zip(outputs, reference, strict=True):
        want = want.float().numpy()
        err, top = worst_difference(got[name].astype(np.float32), want), largest_finite(want)
        error, scale = worse(error, err), max(scale, top)
        relative = worse(relative, err / max(top, np.finfo(np.float32).tiny))
    return error, scale, relative


def simulated_error(got: dict[str, np.ndarray], graph: Block,
                    axes: dict[str, tuple[int, int]], stored: dict) -> dict:
    """The executed program's outputs against the PyTorch graph with the weights coreai-opt
    stored (`axes`) simulated in it (exporters/iphone/coreai/simulated.py): what is left is float16
    compute."""
    want = simulated_block(graph, axes, stored).reference()
    error, _, relative = _output_errors(got, graph.outputs, want)
    return {"max_abs_error": error, "relative_error": relative,
            "tolerance": SIMULATED_TOLERANCE, "weights": len(axes)}


def _job(block: Block, root: Path, precision: Precision, scratch: Path,
         execute: bool = True) -> tuple[Path, dict[str, dict]]:
    """Save a block's graphs (its own as "main", each variant under its name) and the job
    that converts them into the functions of one .aimodel in `root` and (`execute`) executes
    them: the job's path, and by function the weights coreai-opt will compress (none
    uncompressed)."""
    scratch.mkdir()
    path = root / model_path(block)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = precision.stored_form(block.key).weights
    functions, compressed = [], {}
    for name, graph in _functions(block).items():
        entry, compressed[name] = _save_graph(graph, precision, scratch / name,
                                              weights is not None)
        functions.append({"name": name} | entry)
    job = {"aimodel": str(path), "results": str(scratch / "results.json"),
           "weights": weights, "functions": functions, "execute": execute}
    (scratch / "job.json").write_text(json.dumps(job))
    return scratch / "job.json", compressed


def repeats(blocks: list[Block]) -> list[bool]:
    """Whether each block repeats an earlier one's program up to its weights' values: the
    same module type, the same weight names and shapes, the same input shapes and the same
    variants (a transformer's block_1..29 repeat block_0; a decoder's stages do not repeat
    each other)."""
    seen, found = set(), []
    for block in blocks:
        shape = (type(block.module).__qualname__,
                 tuple((n, tuple(p.shape), p.dtype) for n, p in block.parameters().items()),
                 tuple((tuple(t.shape), t.dtype) for t in block.example),
                 tuple(block.variants))
        found.append(shape in seen)
        seen.add(shape)
    return found


def export_blocks(blocks: list[Block], root: Path, precision: Precision,
                  on_block: Callable[[str], None] | None = None,
                  unguided: bool = False, distinct_only: bool = False) -> list[dict]:
    """Convert each block and its variants as the functions of one .aimodel, execute each
    function on the block's example inputs and hold it to the PyTorch block; their records.
    Workers side by side (exporters/iphone/coreai/pool.py) share the list of blocks (their imports
    cost seconds), so every block's example inputs are made real (`chained`) before they
    start. `unguided`:
    each block also at the caption's half of its batch (`edge.graph.blocks.with_unguided`: the
    transformer's functions for calls without guidance). `distinct_only`: a block that
    repeats an earlier one's shapes (`repeats`) is converted and recorded unexecuted."""
    runs = ([not r for r in repeats(blocks)] if distinct_only else [True] * len(blocks))
    blocks = [with_unguided(b) if unguided else b for b in chained(blocks)]
    # held while in use: a folder an export killed outright left is removed by the next
    with held_temporary_folder("edge-coreai-") as tmp:
        jobs = [_job(block, root, precision, Path(tmp) / str(i), run)
                for i, (block, run) in enumerate(zip(blocks, runs, strict=True))]
        found = run_worker([path for path, _ in jobs], [b.key for b in blocks],
                           on_done=None if on_block is None else
                           lambda i: on_block(blocks[i].key))
        return [_record(block, root, precision, done, compressed)
                for block, done, (_, compressed) in zip(blocks, found, jobs, strict=True)]


def export_block(block: Block, root: Path, precision: Precision) -> dict:
    return export_blocks([block], root, precision)[0]


def _record(block: Block, root: Path, precision: Precision, found: dict,
            compressed: dict[str, dict]) -> dict:
    """A converted block's manifest record, each function's executed outputs checked
    (`compressed`: by function, the weights coreai-opt compressed, as `_job` found them)."""
    graphs = _functions(block)
    relative = model_path(block)
    path = root / relative
    records = {}
    for name, graph in graphs.items():
        reference = graph.reference()  # once: `chained` may have computed the main one
        if name not in found["functions"]:   # converted, not executed (--execute distinct)
            records[name] = {"validation": {"executed": False, "why": NOT_EXECUTED,
                                            "tolerance": precision.stored_form(
                                                block.key).tolerance},
                             "reference": reference}
            continue
        with np.load(found["functions"][name]["outputs"]) as saved:
            got = {n: saved[n] for n in graph.outputs}
        check = executed_error(got, graph, reference, precision,
                               found["functions"][name]["seconds"])
        what = f"block {block.key}{'' if name == MAIN else f' variant {name}'}"
        if not check["relative_error"] <= check["tolerance"]:
            raise ExportValidationError(
                f"{what}: executed by Core AI it differs from PyTorch by "
                f"{check['max_abs_error']:.3g} ({check['relative_error']:.3g} of its largest "
                f"output {check['reference_max_abs']:.3g}; {precision.setting} allows "
                f"{check['tolerance']:g} there)")
        stored = precision.stored_form(block.key).weights
        if stored is not None:
            check["simulated"] = simulated_error(got, graph, compressed[name], stored)
            if not check["simulated"]["relative_error"] <= SIMULATED_TOLERANCE:
                raise ExportValidationError(
                    f"{what}: executed by Core AI it differs from PyTorch with coreai-opt's "
                    f"{stored['dtype']} weights simulated by "
                    f"{check['simulated']['relative_error']:.3g} of its largest output (float16 "
                    f"compute allows {SIMULATED_TOLERANCE:g}): the program does not compute "
                    "with the weights it should store")
        records[name] = {"validation": check, "reference": reference}
    # everything Core AI wrote into the model's folder (main.mlirb: the program and its
    # weights; main.hash; metadata.json), so verification covers it all
    files = [file_entry(root, f) for f in sorted(path.rglob("*")) if f.is_file()]
    program = {"model": relative, "files": files, "graph": f"{relative}/main.mlirb",
               "weights": {"path": f"{relative}/main.mlirb", "tensors": []},
               "weight_bytes": (path / "main.mlirb").stat().st_size}
    record = {"name": block.name, **program, "function": MAIN,
              "inputs": signature(block.inputs, block.example),
              "outputs": signature(block.outputs, records[MAIN]["reference"]),
              "validation": records[MAIN]["validation"],
              "reference_weight_bytes": 4 * sum(p.numel() for p in
                                                block.parameters().values())}
    if block.variants:
        record["variants"] = {}
        for name in block.variants:
            # a function of the block's model: its weights are the model's
            entry = {k: program[k] for k in ("model", "files", "graph", "weights",
                                             "weight_bytes")}
            entry |= {"function": name, "validation": records[name]["validation"]}
            if isinstance(block.variants[name], Block):  # its own signature
                graph = graphs[name]
                entry["inputs"] = signature(graph.inputs, graph.example)
                entry["outputs"] = signature(graph.outputs, records[name]["reference"])
            record["variants"][name] = entry
    return record
