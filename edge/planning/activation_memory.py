"""How much memory a block call's activations take, estimated from shapes alone.

Weights are what the loader streams under a budget (edge/planning/plan.py); the activations a call
makes come on top, and at real video sizes they are the larger part (Wan 1.3B's block at
480x832x81 holds ~4.7 GiB of them, its weights 177 MiB). The estimate runs the block on shape-only
tensors (edge/graph/shapes_only.py), its attention written out in the query chunks the exporters
trace (edge/graph/attention.py), and counts the bytes of every buffer an operator makes while a
tensor holds it (PyTorch frees it at its last reference; a view shares its base's), the
block's inputs included; the peak of the sum is the figure. Weights are not counted. It is
what eager PyTorch holds, close to what a runtime that frees each buffer after its last use
holds; onnxruntime's fused attention holds less (no chunk scores at all).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from edge.core.budget import MIB, BudgetError, format_size
from edge.core.manifest_schema import TILE_VARIANT
from edge.graph.attention import replaced_sdpa, written_out_attention
from edge.graph.blocks import Block
from edge.graph.lazy_weights import materialized
from edge.graph.shapes_only import shapes_only
from edge.graph.token_chunks import token_chunks


def written_out_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                      enable_gqa=False):
    # the scores as a tensor of their own, so the count holds them (a fake SDPA makes none)
    return written_out_attention(q, k, v, attn_mask, scale)


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages the operators it sees make while any tensor holds
    them (a view shares its base's), and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.holders: dict[int, int] = {}   # storage -> tensors alive on it
        self.sizes: dict[int, int] = {}
        self.finalizers: list[weakref.finalize] = []
        self.now = self.peak = 0

    def hold(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.holders:
            self.holders[key], self.sizes[key] = 0, storage.nbytes()
            self.now += self.sizes[key]
            self.peak = max(self.peak, self.now)
        self.holders[key] += 1
        self.finalizers.append(weakref.finalize(tensor, self._release, key))

    def _release(self, key: int) -> None:
        if key not in self.holders:  # counted no more (`stop`)
            return
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.now -= self.sizes.pop(key)

    def stop(self) -> None:
        """Count nothing more: the finalizers of tensors still alive (kept by a cycle until
        the garbage collector runs, say) are dropped, so none runs later, elsewhere."""
        for finalizer in self.finalizers:
            finalizer.detach()
        self.finalizers.clear()
        self.holders.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(value, torch.Tensor):
                self.hold(value)
        return out


# The rows of a dynamic batch the Python runtime gives each call of a component under a
# memory budget, for one prompt (runtimes/python/sessions.py, run_in_batch_pieces): the
# transformer takes the caption and the null half of the guidance batch as two calls, the
# decoder one video.
# A device's programs have a static batch and run as traced.
RUNTIME_BATCH_PIECES = {"transformer": 1, "vae_decoder": 1}


def _call_shapes(block: Block, batch: int | None) -> list[tuple[int, ...]]:
    """The example's shapes, a dynamic batch at `batch` rows (None: as traced). A tiled
    decoder's example is one tile already (its family traces it so)."""
    dynamic = block.dynamic_batch or [False] * len(block.example)
    return [(batch, *t.shape[1:]) if batch is not None and d else tuple(t.shape)
            for t, d in zip(block.example, dynamic, strict=True)]


def activation_peak(block: Block, batch: int | None = None) -> int:
    """Bytes of activations a call of `block` holds at once, at its example's shapes and
    batch (a dynamic batch at `batch` rows where given), attention and feed-forwards chunked
    to the score limit in force (see the module's docstring)."""
    # written out first, then chunked: the chunks' scores are tensors the count sees
    with (replaced_sdpa(written_out_sdpa), shapes_only(), token_chunks(),
          materialized(block.module), torch.no_grad()):
        inputs = tuple(torch.empty(shape, dtype=t.dtype) for shape, t
                       in zip(_call_shapes(block, batch), block.example, strict=True))
        counter = _LiveBytes()
        try:
            for t in inputs:
                counter.hold(t)
            with counter:
                out = block.module(*inputs)
            del out, inputs
        finally:
            counter.stop()
    return counter.peak


def block_signature(block: Block, batch: int | None = None) -> tuple:
    params = tuple((n, tuple(p.shape)) for n, p in block.module.named_parameters())
    inputs = tuple((shape, t.dtype) for shape, t
                   in zip(_call_shapes(block, batch), block.example, strict=True))
    return type(block.module), params, inputs


def activation_peaks(blocks: list[Block],
                     pieces: dict[str, int] | None = None) -> dict[str, int]:
    """`activation_peak` of each block by key, a component's dynamic batch at its `pieces`
    rows where given; blocks alike (the same module type, parameter shapes and inputs: a
    transformer's repeated blocks) are traced once."""
    by_signature: dict[tuple, int] = {}
    out = {}
    for block in blocks:
        batch = (pieces or {}).get(block.component)
        signature = block_signature(block, batch)
        if signature not in by_signature:
            by_signature[signature] = activation_peak(block, batch)
        out[block.key] = by_signature[signature]
    return out


def at_compute_precision(peaks: dict[str, int], itemsize: int) -> dict[str, int]:
    """Peaks traced in float32 as a target that computes in `itemsize`-byte floats holds
    them (the iPhone's float16: half; integer inputs, a few bytes, are scaled alike)."""
    return {key: peak * itemsize // 4 for key, peak in peaks.items()}


def activation_lines(components: dict[str, list[Block]], streaming_floor: int,
                     budget: int | None = None,
                     pieces: dict[str, int] | None = None, itemsize: int = 4) -> list[str]:
    """The --dry-run table of activations: one row per run of alike blocks, then the largest.
    `streaming_floor`: the least weight bytes a run holds (the two largest blocks: the one
    computing and the one read ahead). `pieces`: the rows of a dynamic batch a runtime
    gives each call, by component (`RUNTIME_BATCH_PIECES`; None: the batch as traced). A
    tiled decoder is traced at one tile, so its rows are a tile's calls. `itemsize`: bytes of
    a float as the target computes (`at_compute_precision`).
    Given a budget, the calls that cannot fit it even with every block streamed are named,
    and what it leaves the weights said (the loader's budget counts weights only)."""
    blocks = [b for bs in components.values() for b in bs]
    peaks = at_compute_precision(activation_peaks(blocks, pieces), itemsize)
    dtype = "float32" if itemsize == 4 else f"float{8 * itemsize} as the programs compute"
    batch = ("the batch as traced" if not pieces else "a call's batch as the runtime runs "
             "it: " + ", ".join(f"{c} {n}" for c, n in pieces.items()))
    lines = [f"{'activations per call':<34}{'peak':>12}  (estimated from shapes: "
             f"{dtype}, {batch}, attention and feed-forwards in chunks)"]
    rows: list[tuple[str, int]] = []
    run: list[str] = []
    for i, block in enumerate(blocks):
        run.append(block.key)
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        if (following is None or following.component != block.component
                or block_signature(following) != block_signature(block)):
            name = run[0] if len(run) == 1 else f"{run[0]} .. {run[-1].rpartition('/')[2]}"
            rows.append((name, peaks[block.key]))
            run = []
    lines += [f"{name:<34}{format_size(peak):>12}" for name, peak in rows]
    lines.append("largest call of each stage: " + ", ".join(
        f"{name} {format_size(max(peaks[b.key] for b in bs))}{_tiled(bs)}"
        for name, bs in components.items()))
    largest = max(peaks, key=peaks.get)
    lines.append(f"largest activation peak {format_size(peaks[largest])} ({largest}); with "
                 f"every block streamed ({format_size(streaming_floor)} of weights) a run "
                 f"needs at least {format_size(streaming_floor + peaks[largest])}")
    if budget is not None:
        over = [f"{name} ({format_size(streaming_floor + peak)})" for name, peak in rows
                if streaming_floor + peak > budget]
        lines.append(f"cannot fit {format_size(budget)} even streaming every block: "
                     + ", ".join(over) if over else _run_time_budget_line(budget,
                                                                          peaks[largest]))
    return lines


def _tiled(blocks: list[Block]) -> str:
    """" (a tile)" for a component decoded in tiles: traced at one tile, of any size (ONNX)
    or with a program per other size (manifest_schema.tile_variant)."""
    tiled = any(b.dynamic_space or any(TILE_VARIANT.search(v) for v in b.variants)
                for b in blocks)
    return " (a tile)" if tiled else ""


def _run_time_budget_line(budget: int, largest_peak: int) -> str:
    """What to give the runtime for a whole run within `budget`: a run-time budget counts
    weights alone (the loader's), so the residency a plan prints for `budget` holds that
    much in weights and the calls' activations come on top."""
    weights = (budget - largest_peak) >> 20 << 20  # whole MiB, rounded down
    return (f"every call fits {format_size(budget)} with the weights kept to "
            f"{format_size(weights)}: run with --memory-budget {weights >> 20}MiB for a run "
            f"within {format_size(budget)} in all (a run-time budget counts weights alone: "
            f"the residency above is for {format_size(budget)} of weights, and the largest "
            f"call adds {format_size(largest_peak)})")


def check_calls_fit(components: dict[str, list[Block]], budget: int, size: str,
                    pieces: dict[str, int] | None = None, itemsize: int = 4,
                    held_bytes: dict[str, int] | None = None) -> None:
    """Refuse (BudgetError) a budget that no call of the largest activations fits even with
    every other block streamed out: the call's activation peak beside its own block's
    weights. Named: the block, the size and both figures. Run on a shapes-only cut, before
    any work (seconds at any size). `itemsize` as `activation_lines`'; `held_bytes`: a block's
    weights as the target holds them, by key, where not float32's."""
    from edge.planning.plan import block_bytes

    blocks = [b for bs in components.values() for b in bs]
    peaks = at_compute_precision(activation_peaks(blocks, pieces), itemsize)
    held = held_bytes or {}
    need = {b.key: peaks[b.key] + held.get(b.key, block_bytes(b)) for b in blocks}
    worst = max(need, key=need.get)
    if need[worst] > budget:
        raise BudgetError(
            f"{worst} at {size} holds ~{format_size(peaks[worst])} of activations a call "
            f"(estimated from shapes, attention and feed-forwards in chunks) beside its "
            f"{format_size(need[worst] - peaks[worst])} of weights: more than --memory-budget "
            f"{format_size(budget)} even with every other block streamed; give a budget of at "
            f"least {-(-need[worst] // MIB)}MiB or a smaller --height, --width or --frames "
            "(edge export --dry-run lists every call's figure)")
