"""A group norm of videos (B, C, T, H, W) that every target converts: computed on
(B, C, T*H, W), the same statistics over the same memory, so the same numbers. CoreML lowers a
group norm by adding a rank, and rank 6 is past its limit of 5."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def video_group_norm(x: torch.Tensor, groups: int, weight: torch.Tensor | None,
                     bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """F.group_norm of a rank-5 video through rank 4; any other rank as it is."""
    if x.dim() != 5:
        return F.group_norm(x, groups, weight, bias, eps)
    b, c, t, h, w = x.shape
    return F.group_norm(x.reshape(b, c, t * h, w), groups, weight, bias, eps).reshape(
        b, c, t, h, w)


class VideoGroupNorm(nn.GroupNorm):
    """nn.GroupNorm (the same parameters and names) through `video_group_norm`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return video_group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
