"""The PyTorch reference on a GPU against the CPU, side by side in one run (what
`edge export --device cuda` moves off the CPU).

    python benchmarks/reference_device.py FOLDER --height 480 --width 832 --frames 81 \\
        [--block transformer/block_0] [--video]

For one block at the export's shapes (the ONNX target's: a guidance batch of 2), on the
activations the blocks before it give: its forward pass as the export runs it (`Block.run`)
on the CPU and on the GPU (`edge.graph.reference_device`), each wall (the GPU's after one warm-up
call), and the largest difference over the CPU's largest output. With `--video`: the
family's reference video (diffusers' pipeline at the folder's sampler, `--steps`) on the GPU,
its wall and peak GPU memory, beside the floor the same video costs on this machine's CPU
(its FLOP count, edge/planning/compute_cost.py, over the float32 matmul rate measured in this run).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def timed(function) -> tuple[float, object]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = function()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def block_on_each(model, key: str, device: str) -> dict:
    from edge.graph.blocks import chained
    from edge.graph.reference_device import reference_device

    component = key.split("/")[0]
    for block in chained(model.cut()[component]):  # the blocks before it run on the CPU
        if block.key == key:
            break
    else:
        raise SystemExit(f"no block {key} in {component}")
    cpu_s, want = timed(lambda: block.run(*block.example))
    with reference_device(device):
        block.run(*block.example)  # the first call pays for CUDA's set-up and kernels
        gpu_s, got = timed(lambda: block.run(*block.example))
    scale = max(float(w.abs().max()) for w in want)
    error = max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))
    return {"block": key, "inputs": {n: list(t.shape) for n, t in zip(
                block.inputs, block.example, strict=True)},
            "cpu_s": round(cpu_s, 3), "gpu_s": round(gpu_s, 4),
            "cpu_over_gpu": round(cpu_s / gpu_s, 1),
            "max_abs_difference": error, "relative_difference": error / max(1.0, scale)}


def video_on(model, device: str) -> dict:
    from edge.graph.reference_device import reference_device
    from edge.planning.compute_cost import matmul_rate, model_generation_cost

    cost = model_generation_cost(model, model.cut())
    rate = matmul_rate()
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    with reference_device(device):
        seconds, video = timed(lambda: model.generate("a red circle moving left", seed=0))
    return {"steps": model.sampler.steps, "video_shape": list(video.shape),
            "gpu_s": round(seconds, 2),
            "gpu_peak_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
            "flops": cost.total, "cpu_matmul_flops_per_s": round(rate),
            "cpu_floor_s": round(cost.total / rate, 1),
            "cpu_floor_over_gpu": round(cost.total / rate / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--block", default="transformer/block_0")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--video", action="store_true")
    args = parser.parse_args()

    from edge.families import load_model
    from edge.graph.reference_device import resolve_device

    device = resolve_device(args.device)
    size = {"height": args.height, "width": args.width, "frames": args.frames}
    started = time.perf_counter()
    model = load_model(args.folder, steps=args.steps, **size)
    result = {"size": size, "device": str(device),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_s": round(time.perf_counter() - started, 1),
              "block": block_on_each(model, args.block, str(device))}
    print(json.dumps(result), flush=True)
    if args.video:
        result["video"] = video_on(model, str(device))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
