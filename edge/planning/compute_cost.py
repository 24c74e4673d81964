"""What a generation computes, counted from shapes alone, and what that costs on this machine.

A long export or check should say what it will take before it starts: at Wan 1.3B's
480x832x17 one denoising step is tens of TFLOP, at 480x832x81 hundreds. Each block is run on
shape-only tensors (edge/graph/shapes_only.py) under PyTorch's FLOP counter (matrix products and
convolutions, the work that dominates; attention written out as two matrix products, as the
chunked graphs compute it), and the counts are put together as the runtimes run the blocks:
the text encoder once, the transformer once per step, a chunked decoder once per piece. The
time is a floor: the FLOPs over this machine's measured matrix-multiply rate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from edge.core.tiles import Tiling
from edge.graph.attention import replaced_sdpa
from edge.graph.blocks import Block, Chunking
from edge.graph.lazy_weights import materialized
from edge.graph.shapes_only import active, shapes_only
from edge.planning.activation_memory import block_signature, written_out_sdpa


def block_flops(block: Block) -> int:
    """Floating-point operations of one call of `block` at its example's shapes and batch."""
    with (replaced_sdpa(written_out_sdpa), shapes_only(), materialized(block.module),
          torch.no_grad()):
        inputs = tuple(torch.empty(t.shape, dtype=t.dtype) for t in block.example)
        with FlopCounterMode(display=False) as counter:
            block.module(*inputs)
    return counter.get_total_flops()


def flops_record(block: Block) -> dict:
    """The manifest's `flops` of a block: the floating-point operations of one call per row
    of its batch (`per_row`), and the input whose first axis counts the rows (`rows_input`;
    None for a block without a batch, whose `per_row` is a whole call's). A runtime counts a
    generation's work as per_row x the rows each call ran."""
    batched = [i for i, dynamic in enumerate(block.dynamic_batch) if dynamic]
    rows = int(block.example[batched[0]].shape[0]) if batched else 1
    return {"per_row": block_flops(block) // max(rows, 1),
            "rows_input": block.inputs[batched[0]] if batched else None}


def blocks_flops(blocks: list[Block]) -> int:
    """The sum of `block_flops` over `blocks`, blocks alike (a transformer's repeated
    layers) counted once each."""
    by_signature: dict[tuple, int] = {}
    total = 0
    for block in blocks:
        signature = block_signature(block)
        if signature not in by_signature:
            by_signature[signature] = block_flops(block)
        total += by_signature[signature]
    return total


@dataclass(frozen=True)
class GenerationCost:
    """FLOPs of one generation, by what the runtime calls."""

    text_encoder: int   # once per generation
    step: int           # the transformer (every guidance half) once per step
    steps: int
    decoder: int        # every piece of the video

    @property
    def total(self) -> int:
        return self.text_encoder + self.step * self.steps + self.decoder


def generation_cost(components: dict[str, list[Block]], chunked: dict[str, Chunking],
                    latent_shape: tuple[int, ...], steps: int,
                    tiled: dict[str, Tiling] | None = None) -> GenerationCost:
    """What a generation of `steps` full steps computes (TDTM and step leaping, which skip
    work, left out: an upper bound). A chunked decoder's blocks run once per piece of the
    latent's frames, the first piece as its variant (`Chunking.first_variant`) where the
    blocks have one; a decoder in `tiled` runs per tile, its blocks traced at a whole tile
    (edge/core/tiles.py: the tiles at the far edges count for the area they cover)."""
    def component(name: str) -> int:
        blocks = components.get(name, [])
        flops = blocks_flops(blocks)
        if name != "vae_decoder" or not blocks:
            return flops
        z = blocks[0].example[0]
        # a decoder taking whole videos (B, *latent_shape) was traced with a batch of them
        # (the onnx target's two); one taking frames (frames, C, h, w) has no batch axis
        batched = z.dim() - len(latent_shape)
        rows = z.shape[0] if batched else 1
        tiles = (tiled or {}).get(name)
        per_tile = (tiles.tiles_of_work(*latent_shape[-2:]) if tiles is not None else 1.0)
        chunking = chunked.get(name)
        if chunking is None:
            return round(flops // rows * per_tile)
        frames = latent_shape[chunking.axis - batched]
        first_size = chunking.first_size or chunking.size
        later = math.ceil(max(frames - first_size, 0) / chunking.size)
        first = blocks_flops([b.variant(chunking.first_variant)
                              if chunking.first_variant in b.variants else b for b in blocks])
        return round((first + flops * later) // rows * per_tile)

    return GenerationCost(text_encoder=component("text_encoder"),
                          step=component("transformer"), steps=steps,
                          decoder=component("vae_decoder"))


def model_generation_cost(model, components: dict[str, list[Block]]) -> GenerationCost:
    """`generation_cost` of a family's model (edge/graph/family_model.py) cut into `components`,
    at its sampler's steps."""
    return generation_cost(components, model.chunked, tuple(model.latent_shape),
                           model.sampler.steps, getattr(model, "tiled", None))


def matmul_rate(seconds: float = 0.5, size: int = 1024) -> float:
    """FLOP/s of float32 matrix products of `size` on this machine, with PyTorch's threads:
    the rate a generation's floor is counted at. Outside `shapes_only` (fake products take
    no time)."""
    if active():
        raise RuntimeError("matmul_rate measures real products: call it outside shapes_only")
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # the first call pays for setting up
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.mm(a, b)
        runs += 1
    return 2 * size**3 * runs / elapsed


def format_flops(flops: int) -> str:
    for scale, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP")):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops / 1e6:.3g} MFLOP"


def format_seconds(seconds: float) -> str:
    if seconds < 0.1:
        return "under 0.1 s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def cost_lines(cost: GenerationCost, rate: float) -> list[str]:
    """The --dry-run lines: the FLOPs of each part and the floor at `rate` FLOP/s."""
    return [f"compute per generation: {format_flops(cost.total)} ({cost.steps} steps of "
            f"{format_flops(cost.step)}, text encoder {format_flops(cost.text_encoder)}, "
            f"decoder {format_flops(cost.decoder)})",
            f"at this machine's float32 matrix-product rate ({rate / 1e9:.0f} GFLOP/s): at "
            f"least {format_seconds(cost.total / rate)} a generation, "
            f"{format_seconds(cost.step / rate)} a step"]
