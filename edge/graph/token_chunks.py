"""A traced block whose activations are bounded chunk by chunk: its attention in query chunks
(edge/graph/attention.py) and its feed-forwards in token chunks (edge/graph/feed_forward.py),
both to the score limit in force. Every exporter traces inside `token_chunks`, and the dry run's
activation estimate counts inside it, so what the plan says is what the graphs hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from edge.graph.attention import chunked_attention
from edge.graph.feed_forward import chunked_feed_forward


@contextlib.contextmanager
def token_chunks(fused_attention: bool = False) -> Iterator[None]:
    """Within: attention and feed-forwards chunked; `fused_attention` as `chunked_attention`'s
    `fused`."""
    with chunked_attention(fused=fused_attention), chunked_feed_forward():
        yield
