"""`edge bench`: the same generation side by side under three loading strategies.

  resident   every block in memory (read once, before the timed run)
  streamed   the memory budget, pinned + streamed blocks, prefetch on a background thread
  naive      the same budget, no pinning and no prefetch: load on demand, free after use
             (what accelerate-style disk offload does)
  lean       streamed, the pinned blocks let go before the VAE decode and read again on the
             next generation (`lean_decode`): less peak memory for more reads; not run
             unless asked for

Every mode times the generations after a one-step warm-up in the same process: an app
generates more than once, and the first generation's one-time costs (onnxruntime's
first-run set-up of each session, reading the blocks a mode keeps pinned) would otherwise
fall on the streamed and naive modes only. The warm-up's own figures are reported
(`first_run`), so the one-time cost stays visible. With `repeats` > 1 a mode's figures are
those of its median generation by wall time (every wall in `wall_s_runs`): on a shared
machine one generation's wall moves by several percent from run to run.

plus a cold sequential read of the package's weight files, the storage limit the streamed
modes are compared with: a mode's floor is max(resident wall, its bytes read at the cold
sequential rate). Streamed and naive runs read with the page cache bypassed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from edge.core.package import read_package
from edge.runtimes.python.loader import read_file
from edge.runtimes.python.pipeline import Pipeline

MODES = ("resident", "streamed", "naive")


def cold_sequential_read(paths: list[Path]) -> dict:
    """Read every file once with the page cache bypassed; bytes per second."""
    total, started = 0, time.perf_counter()
    for path in paths:  # weight files are whole pages, as O_DIRECT needs
        size = path.stat().st_size
        read_file(path, size, cold=True)
        total += size
    seconds = time.perf_counter() - started
    return {"bytes": total, "seconds": seconds, "bytes_per_s": total / seconds}


def _mode_options(mode: str, budget: int | None) -> dict:
    if mode == "resident":
        return {"memory_budget": None, "prefetch": 1, "cold_reads": False}
    if mode == "streamed":
        return {"memory_budget": budget, "prefetch": 1, "cold_reads": True}
    if mode == "lean":
        return {"memory_budget": budget, "prefetch": 1, "cold_reads": True, "lean_decode": True}
    return {"memory_budget": budget, "prefetch": 0, "cold_reads": True, "pin": False}


def run_mode(package: Path, mode: str, budget: int | None, prompt: str, seed: int,
             steps: int | None, threads: int | None, repeats: int = 1) -> dict:
    pipe = Pipeline.load(package, threads=threads, check_hashes=False,
                         **_mode_options(mode, budget))
    overrides = {"steps": steps} if steps else {}
    # warm-up, every mode alike: sessions set up, pinned blocks read (resident: every block)
    pipe.generate(prompt, seed=seed, **(overrides | {"steps": 1}))
    first = pipe.last_run
    runs = []
    for _ in range(repeats):
        pipe.generate(prompt, seed=seed, **overrides)
        runs.append(pipe.last_run)
    pipe.close()
    # the median generation (the lower middle one for an even count)
    run = sorted(runs, key=lambda r: r["wall_s"]["total"])[(repeats - 1) // 2]
    return {"wall_s": run["wall_s"]["total"], "wall_s_by_component": run["wall_s"],
            "wall_s_runs": [r["wall_s"]["total"] for r in runs],
            # peaks over every generation of the mode
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
            "peak_held_bytes": max(r["peak_held_bytes"] for r in runs),
            "bytes_read": run["bytes_read"], "io_wait_s": run["io_wait_s"],
            "read_s": run["read_s"], "compute_s": run["compute_s"],
            "overlap_efficiency": run["overlap_efficiency"],
            "read_bandwidth_bytes_per_s": run["read_bandwidth_bytes_per_s"],
            "transformer_calls": run["transformer_calls"],
            "resident_blocks": len(pipe.loader.pinned),
            "first_run": {"steps": 1, "wall_s": first["wall_s"]["total"],
                          "bytes_read": first["bytes_read"]}}


def bench(package: str | Path, budget: int | None, prompt: str = "a red circle moving left",
          seed: int = 0, steps: int | None = None, threads: int | None = None,
          modes: tuple[str, ...] = MODES, repeats: int = 1) -> dict:
    """Each mode runs in a fresh child process, so peak RSS is that mode's alone;
    `repeats` timed generations each (the median reported)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats {repeats!r}: must be a whole number of at least 1")
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    package = Path(package)
    read_package(package)  # verified once here; the runs skip re-hashing the same files
    weights = sorted((package / "weights").rglob("*.bin"))
    result: dict = {"package": str(package), "memory_budget_bytes": budget, "prompt": prompt,
                    "steps": steps, "repeats": repeats, "cpu_count": os.cpu_count()}
    result["cold_sequential_read"] = cold_sequential_read(weights)
    for mode in modes:
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            result[mode] = pool.submit(run_mode, package, mode, budget, prompt, seed, steps,
                                       threads, repeats).result()
        bw = result[mode]["read_bandwidth_bytes_per_s"]
        result[mode]["read_bw_fraction"] = (
            bw / result["cold_sequential_read"]["bytes_per_s"] if bw else None)
    if "resident" in result:
        cold_bw = result["cold_sequential_read"]["bytes_per_s"]
        for mode in modes:
            r = result[mode]
            r["wall_vs_resident"] = r["wall_s"] / result["resident"]["wall_s"]
            # the best a mode could do: compute as when resident, or read its bytes as fast as
            # a cold sequential read, whichever takes longer
            r["floor_s"] = max(result["resident"]["wall_s"], r["bytes_read"] / cold_bw)
            r["wall_vs_floor"] = r["wall_s"] / r["floor_s"]
    return result
