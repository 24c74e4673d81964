"""What both web paths feed a block: its example inputs as the page makes them. Apart from
exporters/web/tvm_plan.py so a wasm-only package (`--web-paths wasm`) is exported without TVM."""

from __future__ import annotations

import torch

from edge.graph.blocks import Block


def web_example(block: Block) -> tuple[torch.Tensor, ...]:
    """The block's example inputs as the web runtime feeds them: int64 (no WGSL type) as
    int32, which every index in tiny-sora fits."""
    return tuple(t.to(torch.int32) if t.dtype == torch.int64 else t for t in block.example)
