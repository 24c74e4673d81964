"""The graph rewrites onnxscript applies at export, less those whose matching grows with the
square of a graph's size.

`torch.onnx.export` hands each graph to onnxscript's optimizer, which tries its default
rewrite rules at every node. One, SlicesSplit (two Slices that halve a tensor's last axis
become one Split), is a two-node pattern that onnxscript matches by pairing nodes, and
chunked attention (edge/graph/attention.py) slices every query into many chunks: on the tiny
Open-Sora package the rule took 70.5 s of a 143.7 s ONNX export and never fired, and a real-size
video has thousands of chunks. Left out, a graph it would have rewritten keeps its two
Slices, which compute the same values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

QUADRATIC_RULES = frozenset({"SlicesSplit"})


@contextlib.contextmanager
def without_quadratic_rules() -> Iterator[None]:
    """onnxscript's default rewrite rules without QUADRATIC_RULES while the block lasts.
    onnxscript reads its defaults from `rewriter._DEFAULT_REWRITE_RULES` when it optimizes
    (it has no public way to pass the optimizer other rules); a version without that name
    is left as it is."""
    from onnxscript import rewriter

    rules = getattr(rewriter, "_DEFAULT_REWRITE_RULES", None)
    if rules is None:
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in rules
                                            if getattr(r, "name", None) not in QUADRATIC_RULES)
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules
