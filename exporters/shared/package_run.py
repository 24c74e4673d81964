"""A package run by the Python runtime, for the end-to-end checks of the onnx and web targets:
its video on the validation prompt, and the reference of a model larger than memory (its
PyTorch blocks streamed under the same budget)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge.exporters.shared.validation import VALIDATION_PROMPT
from edge.graph.blocks import Block, torch_block_opener

STREAMED_REFERENCE = "the family's PyTorch blocks, streamed with the package's weights"
# where the package's programs hold their weights (Core AI's): the blocks read the folder's
STREAMED_FROM_FOLDER = ("the family's PyTorch blocks, streamed, each reading its float32 "
                        "weights from the model folder")


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
