"""A family's model run with other weights for a while (the weights a package stores, read
back or decoded), its own kept in a scratch file on disk meanwhile: the model is held once (a
deep copy would hold it twice, 6 GB more for Wan 1.3B). The exporters' end-to-end checks of
stored forms render the model's reference video this way."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from edge.blocks import Block


@contextmanager
def weights_replaced(components: dict[str, list[Block]],
                     replace: Callable[[dict[str, list[Block]]], None]) -> Iterator[None]:
    """`replace(components)` overwrites the blocks' parameters (shared with their family's
    model) in place for the duration of the block; they are restored after, even on error."""
    originals = {id(p): p for blocks in components.values() for b in blocks
                 for p in b.module.parameters()}
    with tempfile.TemporaryFile(prefix="edge-fp32-weights-") as spill:
        for p in originals.values():
            spill.write(p.detach().numpy().tobytes())
        try:
            replace(components)
            yield
        finally:
            spill.seek(0)
            with torch.no_grad():
                for p in originals.values():
                    data = bytearray(spill.read(p.numel() * p.element_size()))
                    p.copy_(torch.frombuffer(data, dtype=p.dtype).view_as(p))
