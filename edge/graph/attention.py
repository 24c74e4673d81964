"""Attention that never holds the whole score matrix in an exported graph.

A block's attention, traced as it is, exports as softmax(q kᵀ) v over the full
(heads × queries × keys) score matrix: at Wan's 480×832×81 (32 760 tokens, 12 heads) that is
~51 GB per video per block call. Inside `chunked_attention(limit)` every call of
`torch.nn.functional.scaled_dot_product_attention` (the families' own blocks and diffusers'
modules alike, which look it up at call time) splits its queries into row chunks whose score
matrix holds at most `limit` bytes per video, so a graph traced there computes one chunk's
scores after another and a runtime that frees each chunk's scores before the next (onnxruntime,
Core ML, the web's kernels) peaks at one chunk. Each row of softmax(q kᵀ) v depends on its own
query only, so the chunks compute exactly what the whole does.

Outside the context PyTorch's own SDPA runs (its CPU kernel is already memory-efficient), so
the reference numerics every export is checked against stay diffusers' own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar

import torch
import torch.nn.functional as F

# PyTorch's own, whatever a context patches in its place
_TORCH_SDPA = F.scaled_dot_product_attention


@torch.library.custom_op("edge::attention", mutates_args=())
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                    scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) v on (batch, heads, tokens, head dim), no mask: one operator that
    an exporter maps to its runtime's fused attention (onnxruntime's MultiHeadAttention,
    which runs flash attention on the CPU and never holds the score matrix)."""
    return _TORCH_SDPA(q, k, v, scale=scale)


@fused_attention.register_fake
def _(q, k, v, heads, scale):
    return q.new_empty(*q.shape[:-1], v.shape[-1])


def written_out_attention(q, k, v, attn_mask=None, scale=None, masked_score=float("-inf")):
    """softmax(q kᵀ · scale + mask) v as plain operators, the scores a tensor of their own; a
    boolean mask's excluded scores set to `masked_score`."""
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        scores = (scores + attn_mask if attn_mask.dtype != torch.bool
                  else scores.masked_fill(~attn_mask, masked_score))
    return scores.softmax(-1) @ v


@contextlib.contextmanager
def replaced_sdpa(function) -> Iterator[None]:
    """Within: `function` is `torch.nn.functional.scaled_dot_product_attention`, for every
    caller that looks it up at call time (the families' blocks, diffusers' modules)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = function
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


# bytes of one video's attention scores a graph may hold at once when the export is given
# no memory budget: no chunking at the sizes tiny models run (≤ 64 MiB is ≥ 4 000 tokens at
# one head), chunks of ~1 000 rows at Wan's 480p with 12 heads
DEFAULT_SCORE_BYTES = 64 * 2**20


# fewer rows than this per chunk save little memory and multiply the graph's nodes (a
# text encoder's 512 tokens at a tiny limit would be 512 chunks); at Wan's 480x832x81 the
# default limit is 42 rows, above it
MIN_ROWS = 16


def query_rows(heads: int, queries: int, keys: int, limit: int, itemsize: int = 4,
               min_rows: int = MIN_ROWS) -> int:
    """Query rows per chunk so one chunk's scores for one video hold at most `limit` bytes,
    but never fewer than `min_rows`."""
    per_row = heads * keys * itemsize
    return max(min_rows, min(queries, limit // per_row))


def score_limit_for_budget(budget: int | None) -> int:
    """The score bytes a chunk may hold under a memory budget: an eighth of the budget (the
    weights streamed in and the block's other activations share the rest), never above the
    default."""
    if budget is None:
        return DEFAULT_SCORE_BYTES
    return max(1 << 20, min(DEFAULT_SCORE_BYTES, budget // 8))


# the limit the exporters trace under; a target's export sets it from the memory budget
_LIMIT: ContextVar[tuple[int, int]] = ContextVar("attention_score_limit",
                                                 default=(DEFAULT_SCORE_BYTES, MIN_ROWS))


@contextlib.contextmanager
def score_limit(limit: int, min_rows: int = MIN_ROWS) -> Iterator[None]:
    """Within: `chunked_attention()` chunks to `limit` score bytes per video, in chunks of
    at least `min_rows` query rows (the tests make tiny models' attention chunk this way)."""
    if limit < 1 or min_rows < 1:
        raise ValueError(f"an attention score limit and its rows must be positive, not "
                         f"{limit} bytes, {min_rows} rows")
    token = _LIMIT.set((limit, min_rows))
    try:
        yield
    finally:
        _LIMIT.reset(token)


def budget_score_limit(budget: int | None) -> contextlib.AbstractContextManager[None]:
    """`score_limit` for an export under `budget` (`score_limit_for_budget`)."""
    return score_limit(score_limit_for_budget(budget))


def current_score_limit() -> tuple[int, int]:
    """(score bytes per video, least rows per chunk) that `chunked_attention()` uses."""
    return _LIMIT.get()


def _sliced_mask(mask: torch.Tensor | None, queries: int, start: int, stop: int):
    # a mask broadcast over the queries (a key bias, shape [..., 1, keys]) serves every chunk
    if mask is None or mask.dim() < 2 or mask.shape[-2] != queries:
        return mask
    return mask[..., start:stop, :]


@contextlib.contextmanager
def chunked_attention(fused: bool = False) -> Iterator[None]:
    """Within: scaled-dot-product attention in query chunks of at most the `score_limit` in
    force (see the module's docstring). It chunks whatever SDPA is in force on entry (the
    web's written-out one, say). Causal attention (no family's) runs whole. `fused`: attention
    without a mask is `fused_attention` instead, whole, for a runtime whose fused operator
    holds no score matrix (the masked rest is chunked)."""
    limit, min_rows = current_score_limit()
    inner = F.scaled_dot_product_attention

    def chunked(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
        queries, keys = q.shape[-2], k.shape[-2]
        if (fused and attn_mask is None and not is_causal and not dropout_p and q.dim() == 4
                and k.shape[1] == q.shape[1]):
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            return fused_attention(q, k, v, q.shape[1], scale)
        heads = math.prod(q.shape[1:-2])
        rows = query_rows(heads, queries, keys, limit, q.element_size(), min_rows)
        if rows >= queries or is_causal:
            return inner(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        pieces = []
        for start in range(0, queries, rows):
            stop = min(queries, start + rows)
            pieces.append(inner(q[..., start:stop, :], k, v,
                                attn_mask=_sliced_mask(attn_mask, queries, start, stop),
                                dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa))
        return torch.cat(pieces, dim=-2)

    with replaced_sdpa(chunked):
        yield
