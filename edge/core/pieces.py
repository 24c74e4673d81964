"""Where a chunked component's pieces start and stop (edge/graph/blocks.py Chunking): shared by the
export-side chain and the Python runtime, so it imports nothing heavy."""

from __future__ import annotations


def piece_bounds(length: int, size: int, first_size: int | None = None
                 ) -> list[tuple[int, int]]:
    """(start, stop) of each piece of an axis of `length` cut in pieces of `size` after a
    first of `first_size` (default `size`); a length they do not tile is refused (a runtime
    mirrors this: runtimes/python/pipeline.py, runtimes/web/chunks.js)."""
    first = size if first_size is None else first_size
    if length < first or (length - first) % size:
        raise ValueError(f"{length} along the chunked axis is not a first piece of {first} "
                         f"and pieces of {size}")
    return [(0, first)] + [(a, a + size) for a in range(first, length, size)]
