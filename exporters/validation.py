"""A block's outputs on a target against the PyTorch block's, as every exporter measures
them: the error where they differ (equal values count none, so an attention bias's -inf
against -inf is no error, and NaN stays NaN so it fails any bound) and the largest finite
reference magnitude the error is judged against."""

from __future__ import annotations

import numpy as np
import torch


def worst_difference(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over the entries where they differ; NaN if any is NaN."""
    with np.errstate(invalid="ignore"):  # inf - inf, where they are equal and count 0
        diff = np.where(got == want, 0.0, got.astype(np.float64) - want)
    return float(np.abs(diff).max(initial=0.0))


def largest_finite(want: np.ndarray) -> float:
    return float(np.abs(want[np.isfinite(want)]).max(initial=0.0))


def output_error(got: list[np.ndarray], want: tuple[torch.Tensor, ...]) -> dict:
    """The manifest's `validation` of a block's outputs: {"max_abs_error",
    "reference_max_abs"}."""
    error = scale = 0.0
    for g, w in zip(got, want, strict=True):
        w = w.detach().float().numpy()
        worst = worst_difference(np.asarray(g), w)
        error = float("nan") if np.isnan(worst) or np.isnan(error) else max(error, worst)
        scale = max(scale, largest_finite(w))
    return {"max_abs_error": error, "reference_max_abs": scale}
