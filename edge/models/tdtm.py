"""Temporal Dimension Token Merging (TDTM): the merge and unmerge of consecutive frames.

Tokens (B, T, S, D): merge averages frames 2i and 2i+1 into one (T -> ceil(T/2)); with an
odd T the last frame stays as it is. Unmerge copies each merged frame back to the frames it
came from, so unmerge(merge(x)) == x exactly when each pair of frames is equal, and
merge(unmerge(m)) == m always. Both are static reshapes for a given T, so they export to
every target as plain tensor ops.
"""

from __future__ import annotations

import torch


def merged_frames(frames: int) -> int:
    return (frames + 1) // 2


def merge_frames(x: torch.Tensor) -> torch.Tensor:
    """(B, T, S, D) -> (B, ceil(T/2), S, D): the mean of each pair of consecutive frames."""
    b, t, s, d = x.shape
    even = t - t % 2
    pairs = x[:, :even].reshape(b, even // 2, 2, s, d).mean(2)
    return pairs if even == t else torch.cat([pairs, x[:, even:]], 1)


def unmerge_frames(m: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, ceil(T/2), S, D) -> (B, T, S, D): each merged frame copied to both its frames."""
    b, _, s, d = m.shape
    even = frames - frames % 2
    pairs = m[:, :even // 2, None].expand(b, even // 2, 2, s, d).reshape(b, even, s, d)
    return pairs if even == frames else torch.cat([pairs, m[:, even // 2:]], 1)


def merge_token_frames(h: torch.Tensor, frames: int) -> torch.Tensor:
    """Tokens laid out frame by frame, (B, F*S, D) -> (B, ceil(F/2)*S, D): `merge_frames` on
    a transformer's flattened sequence (Wan, CogVideoX, LTX-Video)."""
    b, s, d = h.shape
    return merge_frames(h.view(b, frames, s // frames, d)).flatten(1, 2)


def unmerge_token_frames(m: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, ceil(F/2)*S, D) -> (B, F*S, D): `unmerge_frames` on a flattened sequence."""
    b, _, d = m.shape
    return unmerge_frames(m.view(b, merged_frames(frames), -1, d), frames).flatten(1, 2)


def pair_first_frames(table: torch.Tensor, frames: int, axis: int) -> torch.Tensor:
    """A per-token table (RoPE cos or sin) whose axis `axis` runs over the tokens frame by
    frame, kept at the first frame of each pair: the positions the merged tokens take."""
    pairs = (slice(None),) * axis + (slice(0, None, 2),)
    return table.unflatten(axis, (frames, -1))[pairs].flatten(axis, axis + 1)
