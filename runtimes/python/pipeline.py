"""The embeddable Python runtime: runs an edge package with onnxruntime; no torch needed.

    pipe = Pipeline.load("dist/tiny-sora-onnx", memory_budget="64MB")
    video = pipe.generate("a red circle moving left", seed=0)     # uint8 (T, H, W, 3)
    print(pipe.last_run)                                           # figures of that run
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge.package import read_package, resolve_inside
from edge.sampler import SamplerSettings, initial_noise, sample
from edge.tokenizer import load_tokenizer, tokenize
from runtimes.python.loader import BlockLoader, BlockWeights, parse_size


def _io_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage (Linux /proc/self/io)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@dataclass
class Component:
    name: str
    blocks: list[dict]
    sessions: dict[str, ort.InferenceSession] = field(default_factory=dict)

    def keys(self) -> list[str]:
        return [f"{self.name}/{b['name']}" for b in self.blocks]


class Pipeline:
    def __init__(self, root: Path, manifest: dict, loader: BlockLoader,
                 components: dict[str, Component]) -> None:
        self.root, self.manifest, self.loader, self.components = root, manifest, loader, components
        self.sampler = SamplerSettings(**manifest["sampler"])
        tok = manifest["tokenizer"]
        self.tokenizer = load_tokenizer(resolve_inside(root, tok["files"][0]["path"],
                                                       "tokenizer"), tok["max_tokens"])
        null = manifest["conditioning"]["null_caption"]["path"]
        self.null_caption = np.load(resolve_inside(root, null, "conditioning.null_caption"))
        self.latent_shape = tuple(manifest["latent_shape"])
        self.last_run: dict = {}
        self._compute_s = 0.0

    @classmethod
    def load(cls, package: str | Path, memory_budget: str | int | None = None,
             prefetch: int = 1, cold_reads: bool = False, threads: int | None = None,
             check_hashes: bool = True, pin: bool = True) -> Pipeline:
        """Verify the package (sizes, sha256, paths, version) before anything runs, plan the
        loader for `memory_budget` (refused if smaller than the largest block), and create
        one onnxruntime session per block graph (graphs only: weights come from the loader)."""
        root = Path(package)
        manifest = read_package(root, check_hashes=check_hashes)
        options = ort.SessionOptions()
        # onnxruntime's arena would keep the largest per-run buffers (e.g. transposed copies
        # of streamed weights) for the life of the session, outside the loader's budget
        options.enable_cpu_mem_arena = False
        if threads:
            options.intra_op_num_threads = threads
        components, weights = {}, {}
        for comp in manifest["components"]:
            c = Component(comp["name"], comp["blocks"])
            for block, key in zip(c.blocks, c.keys(), strict=True):
                where = f"block {key}"
                c.sessions[key] = ort.InferenceSession(
                    str(resolve_inside(root, block["graph"], where)), options,
                    providers=["CPUExecutionProvider"])
                wpath = resolve_inside(root, block["weights"]["path"], where)
                weights[key] = BlockWeights(key, wpath, wpath.stat().st_size,
                                            tuple(block["weights"]["tensors"]))
            components[c.name] = c
        loader = BlockLoader(weights, parse_size(memory_budget),
                             every_step=tuple(components["transformer"].keys()),
                             prefetch=prefetch, cold_reads=cold_reads, pin=pin)
        return cls(root, manifest, loader, components)

    def plan(self) -> list[dict]:
        """Per block: bytes and whether it stays resident under the budget."""
        return [{"block": k, "bytes": w.nbytes, "resident": k in self.loader.pinned}
                for k, w in self.loader.blocks.items()]

    def _run_blocks(self, comp: Component, runs, feeds: dict[str, np.ndarray]) -> dict:
        """Run a component's blocks once, in order, taking weights from the loader's `runs`
        and passing each block's outputs on by name."""
        for block in comp.blocks:
            key, weights = next(runs)
            inputs = {s["name"]: feeds[s["name"]] for s in block["inputs"]}
            started = time.perf_counter()
            outputs = comp.sessions[key].run([f"out:{s['name']}" for s in block["outputs"]],
                                             inputs | weights)
            self._compute_s += time.perf_counter() - started
            del weights  # a streamed block's memory is freed once nothing refers to it
            feeds = feeds | dict(zip((s["name"] for s in block["outputs"]), outputs,
                                     strict=True))
        return feeds

    def _run_component(self, name: str, feeds: dict[str, np.ndarray]) -> dict:
        comp = self.components[name]
        runs = self.loader.run(comp.keys())
        try:
            return self._run_blocks(comp, runs, feeds)
        finally:
            runs.close()

    def encode_prompts(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, mask = tokenize(self.tokenizer, prompts)
        out = self._run_component("text_encoder", {"input_ids": ids, "attention_mask": mask})
        return out["hidden"], mask

    def generate(self, prompts: str | list[str], seed: int | list[int] = 0,
                 on_step: Callable[[int, int], None] | None = None,
                 **sampler_overrides) -> np.ndarray:
        """uint8 video (B, T, H, W, 3); one prompt gives B = 1. Seeds as in the PyTorch
        pipeline (prompt i gets seed + i), so the two produce the same video."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        seeds = [seed + i for i in range(len(prompts))] if isinstance(seed, int) else seed
        settings = replace(self.sampler, **sampler_overrides)
        stats_before = self.loader.stats.as_dict()
        io_before = _io_read_bytes()
        figures: dict = {"wall_s": {}}
        self._compute_s = 0.0
        started = time.perf_counter()

        caption, mask = self.encode_prompts(prompts)
        b = len(prompts)
        caption2 = np.concatenate([caption, np.broadcast_to(self.null_caption,
                                                            (b, *self.null_caption.shape))])
        mask2 = np.concatenate([mask, np.ones_like(mask)])
        t1 = time.perf_counter()
        figures["wall_s"]["text_encoder"] = t1 - started

        # The transformer runs as one schedule of steps x blocks, so the loader prefetches
        # across step boundaries too.
        transformer = self.components["transformer"]
        runs = self.loader.run(transformer.keys() * settings.steps)
        calls = 0

        def predict(x: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
            nonlocal calls
            feeds = {"latent": np.concatenate([x, x]), "t": np.full(2 * b, t, np.float32),
                     "caption": caption2, "caption_mask": mask2}
            v = self._run_blocks(transformer, runs, feeds)["velocity"]
            calls += 1
            return v[:b], v[b:]

        try:
            latents = sample(predict, initial_noise(self.latent_shape, seeds), settings, on_step)
        finally:
            runs.close()
        t2 = time.perf_counter()
        figures["wall_s"]["transformer"] = t2 - t1

        c, t, h, w = self.latent_shape
        z = latents.transpose(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        frames = self._run_component("vae_decoder", {"z": z})["frames"]
        video = frames.reshape(b, t, *frames.shape[1:]).transpose(0, 1, 3, 4, 2)
        t3 = time.perf_counter()
        figures["wall_s"]["vae_decoder"] = t3 - t2
        figures["wall_s"]["total"] = t3 - started
        figures["transformer_calls"] = calls
        self.last_run = self._loader_figures(figures, stats_before, io_before)
        return np.round(video * 255).astype(np.uint8)

    def _loader_figures(self, figures: dict, stats_before: dict, io_before: int | None) -> dict:
        """Add what the loader and the OS counted during this run to `figures`."""
        after = self.loader.stats.as_dict()
        for k in ("bytes_read", "reads", "read_s", "io_wait_s"):
            figures[k] = after[k] - stats_before[k]
        figures["read_bandwidth_bytes_per_s"] = (figures["bytes_read"] / figures["read_s"]
                                                 if figures["read_s"] else None)
        io_after = _io_read_bytes()
        figures["storage_read_bytes"] = (io_after - io_before) if io_before is not None else None
        t_io, t_wall = figures["read_s"], figures["wall_s"]["total"]
        t_compute = figures["compute_s"] = self._compute_s
        figures["overlap_efficiency"] = (
            (t_io + t_compute - t_wall) / min(t_io, t_compute) if t_io > 0 else None)
        figures["peak_held_bytes"] = self.loader.stats.peak_held_bytes
        figures["peak_rss_bytes"] = _peak_rss_bytes()
        return figures

    def close(self) -> None:
        self.loader.close()
