"""How far one uint8 video is from another: PSNR, and SNR against the reference's own spread.
One definition for the exporters' checks, the benchmarks and the tests."""

from __future__ import annotations

import numpy as np


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of 8-bit videos (inf when equal)."""
    mse = float(np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def snr(got: np.ndarray, want: np.ndarray) -> float:
    """The error against the reference video's own spread (dB): random-weight videos have so
    little contrast that another seed's video still scores 30 dB PSNR; SNR tells them apart."""
    want = want.astype(np.float64)
    mse = float(np.mean((got.astype(np.float64) - want) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(want.var() / mse))
