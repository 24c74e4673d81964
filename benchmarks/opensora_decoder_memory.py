"""What Open-Sora 1.2's 2D decoder holds a call when a chunk's 17 frames go through it as one
batch against one frame after another (edge/families/opensora/blocks.py SpatialDecoder), at
VAE-v1.2's real shapes with random weights (edge/families/opensora/scale.py; no download).

Both forms are exported as the ONNX exporter exports a block (weights as inputs) and each is
run by onnxruntime in a fresh process: the peak RSS the call adds over the loaded session,
side by side, with the activation estimate `edge export --dry-run` prints for each
(edge/planning/activation_memory.py) and the two videos' largest difference.

    python benchmarks/opensora_decoder_memory.py [--size 240x432] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
from process_memory import reset_peak_rss, status_bytes  # benchmarks/: run as scripts
from torch import nn


class Batched(nn.Module):
    """The 2D decoder over every frame of the chunk as one batch (edge's cut before)."""

    def __init__(self, frame_by_frame: nn.Module) -> None:
        super().__init__()
        self.inner = frame_by_frame

    def forward(self, x):
        b, c, f, h, w = x.shape
        out = self.inner.decode_frame(x.transpose(1, 2).reshape(b * f, c, h, w))
        return out.reshape(b, f, *out.shape[1:]).transpose(1, 2)


def blocks(size: str):
    """(frame by frame, batched) spatial decoder blocks of one chunk at `size`."""
    from edge.families.opensora.blocks import SpatialDecoder
    from edge.families.opensora.scale import vae_module
    from edge.graph.blocks import Block

    torch.manual_seed(0)
    height, width = (int(v) for v in size.split("x"))
    vae = vae_module().eval()
    channels = vae.temporal_vae.cfg.in_out_channels
    x = torch.randn(1, channels, vae.micro_frame_size, height // 8, width // 8)
    spatial = SpatialDecoder(vae).eval()
    return {name: Block("vae_decoder", "spatial", module, ["latents_2d"], ["frames"], (x,),
                        [False])
            for name, module in (("frame by frame", spatial), ("batched", Batched(spatial)))}


def run_graph(graph: str, inputs: str, threads: int) -> dict:
    """One call of the graph in this (fresh) process: the peak RSS it adds over the loaded
    session and its inputs."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(inputs))
    loaded = reset_peak_rss()  # the session's loading peak does not hide the call's
    started = time.perf_counter()
    (frames,) = session.run(None, feeds)
    seconds = time.perf_counter() - started
    peak = status_bytes("VmHWM")
    np.save(inputs.replace(".npz", ".out.npy"), frames)
    return {"call_peak_bytes": peak - loaded, "seconds": seconds}


def main() -> None:
    import numpy as np

    from edge.core.budget import format_size
    from edge.exporters.shared.onnx_graph import export_graph
    from edge.planning.activation_memory import activation_peak

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="240x432", help="HEIGHTxWIDTH (Open-Sora's 240p)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rows, videos = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, block in blocks(args.size).items():
            graph = Path(tmp, name.replace(" ", "_") + ".onnx")
            export_graph(block, graph)
            inputs = str(graph.with_suffix(".npz"))
            np.savez(inputs, latents_2d=block.example[0].numpy(),
                     **{k: v.detach().numpy() for k, v in block.parameters().items()})
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                row = pool.submit(run_graph, str(graph), inputs, args.threads).result()
            row["estimate_bytes"] = activation_peak(block)
            videos[name] = np.load(inputs.replace(".npz", ".out.npy"))
            rows[name] = row
            print(json.dumps({"form": name, "size": args.size, **row}), flush=True)
    one, batched = rows["frame by frame"], rows["batched"]
    print(f"{args.size}, 17 frames: frame by frame {format_size(one['call_peak_bytes'])} "
          f"(estimate {format_size(one['estimate_bytes'])}), batched "
          f"{format_size(batched['call_peak_bytes'])} (estimate "
          f"{format_size(batched['estimate_bytes'])}): "
          f"{batched['call_peak_bytes'] / one['call_peak_bytes']:.1f}x less a call; "
          f"{one['seconds']:.1f} s against {batched['seconds']:.1f} s; videos "
          f"{float(np.abs(videos['frame by frame'] - videos['batched']).max()):.1e} apart")


if __name__ == "__main__":
    main()
