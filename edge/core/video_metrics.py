"""How far one uint8 video is from another: PSNR, and SNR against the reference's own spread.
One definition for the exporters' checks, the benchmarks and the tests."""

from __future__ import annotations

import numpy as np


def mse(got: np.ndarray, want: np.ndarray) -> float:
    """Mean squared error of two videos, in float64 whatever their dtype."""
    return float(np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2))


def psnr_of_mse(error: float) -> float:
    """Peak signal-to-noise ratio in dB of 8-bit videos whose mean squared error is `error`
    (inf when 0): errors that add (exporters/iphone/coreml/recipe.py) are summed as MSEs first."""
    return float("inf") if error <= 0 else float(10 * np.log10(255.0**2 / error))


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of 8-bit videos (inf when equal)."""
    return psnr_of_mse(mse(got, want))


def snr(got: np.ndarray, want: np.ndarray) -> float:
    """The error against the reference video's own spread (dB): random-weight videos have so
    little contrast that another seed's video still scores 30 dB PSNR; SNR tells them apart."""
    error = mse(got, want)
    return float("inf") if error == 0 else float(10 * np.log10(want.astype(np.float64).var()
                                                                / error))
