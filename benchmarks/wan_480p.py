"""One generation of a Wan package at its own size against diffusers' WanPipeline on the same
CPU: wall time, peak resident memory and the video's agreement.

    python benchmarks/wan_480p.py edge PACKAGE BUDGET [STEPS [GUIDANCE]]   # the edge runtime
    python benchmarks/wan_480p.py diffusers FOLDER PACKAGE [STEPS [GUIDANCE]]  # diffusers alike
    python benchmarks/wan_480p.py edge-latent PACKAGE BUDGET [STEPS [GUIDANCE]]  # no decoder
    python benchmarks/wan_480p.py compare         # the two videos (or the edge run alone)

Each mode runs in a process of its own (run them one after the other: peak RSS is the
process's VmHWM, and the two must not share the cores) and writes `<mode>.json` and
`<mode>.npy` (the uint8 video) into the folder named by $EDGE_BENCH_OUT (default
/tmp/edge-bench/wan480). The edge runtime reads blocks cold (page cache bypassed) under the
budget (the weights' budget, as `edge generate --memory-budget` takes it) and decodes lean as
that command does; diffusers runs in float32 with the VAE tiled as the package tiles
(edge.families.load_model sets it). Seeds mean diffusers' noise in both, so the videos are
the same video where the export is right. The compare mode prints PSNR and the error's SNR
over the reference video's own variance, and the matrix-product floor of the edge run
(FLOPs from `edge export --dry-run` given as $EDGE_BENCH_FLOPS, divided by this machine's
float32 matmul rate measured now); without a diffusers run it prints the edge run's figures
and floor alone. diffusers also keeps its denoised latents (`diffusers_latent.npy`, and the
wall up to them), and `edge-latent` stops at them as `output_type="latent"` does: where two
decoders do not fit the time there is, compare sets the transformer's half side by side (the
latents' SNR over their own variance, the wall up to them) beside a video run of either.
GUIDANCE (default: the package's): 1 runs the caption's half alone, half a step's
transformer work, where a whole guided run does not fit the time there is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from process_memory import status_bytes  # benchmarks/: run as scripts

PROMPT = "a red circle moving left"
SEED = 0


def out_dir() -> Path:
    path = Path(os.environ.get("EDGE_BENCH_OUT", "/tmp/edge-bench/wan480"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save(mode: str, video: np.ndarray, figures: dict) -> None:
    np.save(out_dir() / f"{mode}.npy", video)
    figures["peak_rss_bytes"] = status_bytes("VmHWM")
    (out_dir() / f"{mode}.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


def guidance_of(args: list[str]) -> dict:
    return {"guidance": float(args[3])} if len(args) > 3 else {}


def run_edge(package: str, budget: str, steps: int, guidance: dict,
             latent_only: bool = False) -> None:
    from edge.runtimes.python import Pipeline

    # lean decode, as `edge generate --memory-budget` loads it: one generation, so the
    # pinned transformer blocks make room for the decoder rather than wait for a next one
    pipe = Pipeline.load(package, memory_budget=budget, cold_reads=True, lean_decode=True)
    started = time.perf_counter()
    video = pipe.generate(PROMPT, seed=SEED, steps=steps, **guidance,
                          output_type="latent" if latent_only else "uint8")
    wall = time.perf_counter() - started
    run = pipe.last_run
    save("edge-latent" if latent_only else "edge", video,
         {"wall_s": wall, "steps": steps, "budget": budget, **guidance,
          "by_component_s": run["wall_s"],
          **{k: run.get(k) for k in ("bytes_read", "storage_read_bytes", "read_s", "io_wait_s",
                                     "compute_s", "overlap_efficiency", "peak_held_bytes")}})


def run_diffusers(folder: str, package: str, steps: int, guidance: dict) -> None:
    import torch

    from edge.families import load_model

    manifest = json.loads((Path(package) / "manifest.json").read_text())
    _, frames, h, w = manifest["latent_shape"]
    size = {"height": h * 8, "width": w * 8, "frames": (frames - 1) * 4 + 1}
    model = load_model(Path(folder), steps=steps, **size)
    pipe = model.pipe
    kept = {}

    def keep_latents(_pipe, _step: int, _t, tensors: dict) -> dict:
        # after each step's scheduler update (a new tensor each step, so a reference keeps
        # it); the last one's are what the VAE decodes next
        kept.update(latents=tensors["latents"], to_latents_s=time.perf_counter() - started)
        return tensors

    started = time.perf_counter()
    with torch.no_grad():
        video = pipe(PROMPT, negative_prompt="", height=size["height"], width=size["width"],
                     num_frames=size["frames"], num_inference_steps=steps,
                     guidance_scale=guidance.get("guidance", model.sampler.guidance),
                     generator=torch.Generator().manual_seed(SEED), output_type="np",
                     callback_on_step_end=keep_latents).frames
    wall = time.perf_counter() - started
    np.save(out_dir() / "diffusers_latent.npy", kept["latents"].numpy())
    save("diffusers", np.round(np.asarray(video) * 255).astype(np.uint8),
         {"wall_s": wall, "to_latents_s": kept["to_latents_s"], "steps": steps, **size,
          **guidance})


def agreement(ours: np.ndarray, ref: np.ndarray, uint8_video: bool) -> dict:
    """The error's SNR over the reference's own variance and its largest value; PSNR too for
    8-bit videos (latents have no peak)."""
    from edge.core.video_metrics import psnr, snr

    return ({"psnr_db": psnr(ours, ref)} if uint8_video else {}) | {
        "snr_db": snr(ours, ref),
        "max_abs_error": float(np.max(np.abs(ours.astype(np.float64) - ref)))}


def compare() -> None:
    from edge.planning.compute_cost import matmul_rate

    figures = {m: json.loads((out_dir() / f"{m}.json").read_text())
               for m in ("edge", "edge-latent", "diffusers") if (out_dir() / f"{m}.json").exists()}
    if not figures:
        sys.exit(f"compare: no run's figures in {out_dir()}")
    result = {}
    for mode in ("edge", "edge-latent", "diffusers"):
        if mode in figures:
            result |= {f"{mode}_wall_s": figures[mode]["wall_s"],
                       f"{mode}_peak_rss_gib": figures[mode]["peak_rss_bytes"] / 2**30}
    if "edge" in figures and "diffusers" in figures:
        result |= {"video": agreement(np.load(out_dir() / "edge.npy"),
                                      np.load(out_dir() / "diffusers.npy"), True),
                   "wall_ratio": figures["edge"]["wall_s"] / figures["diffusers"]["wall_s"]}
    if "edge-latent" in figures and "diffusers" in figures:
        # up to the latents: edge's text encoder and transformer against diffusers' loop
        phases = figures["edge-latent"]["by_component_s"]
        to_latents = phases["text_encoder"] + phases["transformer"]
        result |= {"latents": agreement(np.load(out_dir() / "edge-latent.npy"),
                                        np.load(out_dir() / "diffusers_latent.npy"), False),
                   "to_latents_ratio": to_latents / figures["diffusers"]["to_latents_s"]}
    flops = os.environ.get("EDGE_BENCH_FLOPS")
    if flops and "edge" in figures:
        rate = matmul_rate()
        result |= {"matmul_rate_gflops": rate / 1e9,
                   "floor_s": float(flops) / rate,
                   "edge_over_floor": figures["edge"]["wall_s"] / (float(flops) / rate)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode in ("edge", "edge-latent"):
        run_edge(args[0], args[1], int(args[2]) if len(args) > 2 else 1, guidance_of(args),
                 latent_only=mode == "edge-latent")
    elif mode == "diffusers":
        run_diffusers(args[0], args[1], int(args[2]) if len(args) > 2 else 1,
                      guidance_of(args))
    elif mode == "compare":
        compare()
    else:
        sys.exit(__doc__)
