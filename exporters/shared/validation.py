"""A block's outputs on a target against the PyTorch block's, as every exporter measures
them: the error where they differ (equal values count none, so an attention bias's -inf
against -inf is no error, and NaN stays NaN so it fails any bound) and the largest finite
reference magnitude the error is judged against."""

from __future__ import annotations

import numpy as np
import torch

from edge.exporters import ExportValidationError

# the prompt every exporter's end-to-end check renders
VALIDATION_PROMPT = "a red circle moving left"


def worst_difference(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over the entries where they differ; NaN if any is NaN."""
    with np.errstate(invalid="ignore"):  # inf - inf, where they are equal and count 0
        diff = np.where(got == want, 0.0, got.astype(np.float64) - want)
    return float(np.abs(diff).max(initial=0.0))


def worse(a: float, b: float) -> float:
    """The larger of two errors, NaN if either is (max() keeps or drops a NaN by the order
    of its arguments; a NaN must fail every bound)."""
    return float("nan") if np.isnan(a) or np.isnan(b) else max(a, b)


def largest_finite(want: np.ndarray) -> float:
    return float(np.abs(want[np.isfinite(want)]).max(initial=0.0))


def output_error(got: list[np.ndarray], want: tuple[torch.Tensor, ...]) -> dict:
    """The manifest's `validation` of a block's outputs: {"max_abs_error",
    "reference_max_abs"}."""
    error = scale = 0.0
    for g, w in zip(got, want, strict=True):
        w = w.detach().float().numpy()
        error = worse(error, worst_difference(np.asarray(g), w))
        scale = max(scale, largest_finite(w))
    return {"max_abs_error": error, "reference_max_abs": scale}


def check_validation(validation: dict, what: str, tolerance: float) -> None:
    """Refuse a block whose error exceeds `tolerance` times the larger of 1 and its
    reference's largest magnitude (float32 rounding grows with the values: an Open-Sora
    prologue carries a caption embedding in the hundreds); NaN is refused too."""
    limit = tolerance * max(1.0, validation["reference_max_abs"])
    if not validation["max_abs_error"] <= limit:
        raise ExportValidationError(
            f"{what} differs from PyTorch by {validation['max_abs_error']:.3g} (max-abs; the "
            f"limit is {limit:.3g}: {tolerance:g} of the larger of 1 and its largest "
            f"output, {validation['reference_max_abs']:.3g})")


def relative_error(validation: dict) -> float:
    """A block's error over the larger of 1 and its reference's largest magnitude (the
    measure its bound is set on); a record without the magnitude counts it 1."""
    return validation["max_abs_error"] / max(1.0, validation.get("reference_max_abs", 1.0))


def worst_block(manifest: dict) -> tuple[float, str]:
    """(relative error, "component/block") of the package's worst checked block."""
    return max(((relative_error(b["validation"]), f"{c['name']}/{b['name']}")
                for c in manifest["components"] for b in c["blocks"]
                if b["validation"].get("max_abs_error") is not None), default=(0.0, "none"))
