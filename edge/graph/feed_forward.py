"""Feed-forward layers that never hold a whole video's hidden state in an exported graph.

After attention is chunked (edge/graph/attention.py), a transformer block's largest activation is
its feed-forward's hidden state: Wan 1.3B at 480x832x81 widens 32 760 tokens to 8 960
channels, 1.2 GB a video in float32, and its GELU makes as much again. Inside
`chunked_feed_forward()` every diffusers `FeedForward` (Wan, CogVideoX, LTX-Video) and edge's
own `Mlp` (tiny-sora) runs its tokens in row chunks whose hidden state holds at most the
score limit in force (`edge.graph.attention.current_score_limit`: the one bound of a chunk's
largest intermediate, per video), so a graph traced there computes one chunk after another
and a runtime that frees each chunk's buffers before the next peaks at one chunk. A
feed-forward is applied to each token on its own, so the chunks compute what the whole does.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from edge.graph.attention import current_score_limit

# Fewer rows than this per chunk save little and multiply a graph's nodes: no tiny model's
# feed-forward is chunked, Wan 1.3B's at 480p in the default limit is (1 872 rows a chunk).
MIN_ROWS = 256


WidthOf = Callable[[nn.Module], int]
# The project's own feed-forward classes, each registered where it is defined
# (edge/models/stdit.py's Mlp), so this layer below the models imports none of them: a class
# not imported yet has no instance in any block to chunk.
_OWN_KINDS: list[tuple[type[nn.Module], WidthOf]] = []


def feed_forward_kind(width_of: WidthOf) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: `chunked_feed_forward()` runs this feed-forward class in token chunks;
    `width_of(module)` is its hidden width."""
    def register(kind: type[nn.Module]) -> type[nn.Module]:
        if all(known is not kind for known, _ in _OWN_KINDS):
            _OWN_KINDS.append((kind, width_of))
        return kind
    return register


def _layers() -> list[tuple[type[nn.Module], WidthOf]]:
    """(feed-forward class, its hidden width) for each kind a family's blocks use."""
    kinds = list(_OWN_KINDS)
    try:
        from diffusers.models.attention import FeedForward
    except ImportError:  # a runtime install traces nothing
        return kinds
    # net: the widening projection (with its activation), dropout, the narrowing Linear, ...
    kinds.append((FeedForward, lambda m: next(layer for layer in m.net
                                              if isinstance(layer, nn.Linear)).in_features))
    return kinds


def feed_forward_rows(width: int, tokens: int, limit: int, itemsize: int = 4,
                      min_rows: int = MIN_ROWS) -> int:
    """Token rows per chunk so one chunk's hidden state for one video holds at most `limit`
    bytes, never fewer than `min_rows` (and never more than there are tokens)."""
    return min(tokens, max(min_rows, limit // (width * itemsize)))


def _chunked(forward, width_of: Callable[[nn.Module], int]):
    def chunked_forward(self, x, *args, **kwargs):
        if x.dim() < 3:
            return forward(self, x, *args, **kwargs)
        limit, _ = current_score_limit()
        tokens = x.shape[-2]
        # a token row of one video: every dim but the batch and the tokens
        rows = feed_forward_rows(width_of(self) * math.prod(x.shape[1:-2]), tokens, limit,
                                 x.element_size(), MIN_ROWS)
        if rows >= tokens:
            return forward(self, x, *args, **kwargs)
        return torch.cat([forward(self, x[..., start:start + rows, :], *args, **kwargs)
                          for start in range(0, tokens, rows)], dim=-2)
    return chunked_forward


@contextlib.contextmanager
def chunked_feed_forward() -> Iterator[None]:
    """Within: every feed-forward a family uses runs in token chunks (the module docstring)."""
    layers = _layers()
    # a class's own forward, or None where it inherits one (nn.Sequential's, for Mlp)
    own = [kind.__dict__.get("forward") for kind, _ in layers]
    for kind, width_of in layers:
        kind.forward = _chunked(kind.forward, width_of)
    try:
        yield
    finally:
        for (kind, _), forward in zip(layers, own, strict=True):
            if forward is None:
                del kind.forward
            else:
                kind.forward = forward
