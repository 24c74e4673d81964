"""What LTX-Video's VAE decoder costs in memory over a whole clip, at LTX-Video 0.9.0's real
shapes with random weights (edge/families/ltx/scale.py LTX_VAE; no download).

LTX's decoder is not causal in time (its convolutions pad with copies of the first and the
last frame), so edge runs it over the whole clip in one call (docs/families.md). Here
diffusers' own `vae.decode` (what the package's decoder stages compute, stage by stage) runs
at a few sizes, each in a fresh process: the peak RSS it adds over the loaded model, and a
least-squares line through those peaks in the number of decoded pixels (frames x height x
width), extrapolated to LTXPipeline's default size and to 512x768x121.

    python benchmarks/ltx_decoder_memory.py [--sizes 128x192x25 256x384x25 ...] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

SIZES = ["128x192x25", "256x384x25", "256x384x49", "256x384x97", "512x768x25"]
EXTRAPOLATE = ["512x704x161", "512x768x121"]   # LTXPipeline's default; LTX's 0.9.5 example


def parse(size: str) -> tuple[int, int, int]:
    height, width, frames = (int(v) for v in size.split("x"))
    return height, width, frames


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure(size: str, threads: int) -> dict:
    """One decode in this (fresh) process: the peak RSS it adds over the loaded model."""
    import torch
    from diffusers import AutoencoderKLLTXVideo

    from edge.families.ltx.scale import LTX_VAE

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(**LTX_VAE).eval()
    height, width, frames = parse(size)
    latents = torch.randn(1, LTX_VAE["latent_channels"],
                          (frames - 1) // vae.temporal_compression_ratio + 1,
                          height // vae.spatial_compression_ratio,
                          width // vae.spatial_compression_ratio)
    loaded = peak_rss()
    started = time.perf_counter()
    with torch.no_grad():
        video = vae.decode(latents, return_dict=False)[0]
    seconds = time.perf_counter() - started
    assert video.shape[2:] == (frames, height, width), video.shape
    return {"size": size, "pixels": frames * height * width,
            "decoder_parameters": sum(p.numel() for p in vae.decoder.parameters()),
            "model_rss_bytes": loaded, "decode_peak_bytes": peak_rss() - loaded,
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=SIZES, help="HEIGHTxWIDTHxFRAMES")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            rows.append(pool.submit(measure, size, args.threads).result())
        print(json.dumps(rows[-1]), flush=True)
    # least squares: peak = fixed + per_pixel * pixels
    n = len(rows)
    mx = sum(r["pixels"] for r in rows) / n
    my = sum(r["decode_peak_bytes"] for r in rows) / n
    per_pixel = (sum((r["pixels"] - mx) * (r["decode_peak_bytes"] - my) for r in rows)
                 / sum((r["pixels"] - mx) ** 2 for r in rows))
    fixed = my - per_pixel * mx
    fit = {"fixed_bytes": fixed, "bytes_per_pixel": per_pixel,
           "worst_fit_error": max(abs(fixed + per_pixel * r["pixels"] - r["decode_peak_bytes"])
                                  / r["decode_peak_bytes"] for r in rows)}
    for size in EXTRAPOLATE:
        height, width, frames = parse(size)
        fit[f"at_{size}_bytes"] = fixed + per_pixel * frames * height * width
    print(json.dumps(fit))


if __name__ == "__main__":
    main()
