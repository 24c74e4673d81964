"""Peak resident memory by component of one generation: where a package's RSS goes.

    python benchmarks/rss_by_component.py PACKAGE BUDGET_BYTES [STEPS]

Loads the package under the budget (streamed, cold reads), warms up with one step as `edge
bench` does, then generates once while a thread samples this process's RSS every 5 ms.
Prints, per component run (text encoder, each denoising call's transformer blocks, the VAE
decoder), the highest RSS seen and the loader's held bytes at that moment, and the RSS
before the generation: what the runtime holds beside the budget, and when.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge.runtimes.python import Pipeline  # noqa: E402

PAGE = 4096


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


def main(package: str, budget: int, steps: int = 3) -> dict:
    pipe = Pipeline.load(package, memory_budget=budget, cold_reads=True, check_hashes=False)
    pipe.generate("a red circle moving left", steps=1)
    phase = ["idle"]
    peaks: dict[str, tuple[int, int]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, held = rss_bytes(), pipe.loader.buffers.kept
            if rss > peaks.get(phase[0], (0, 0))[0]:
                peaks[phase[0]] = (rss, held)
            time.sleep(0.005)

    run_blocks = pipe._run_blocks

    def labelled(comp, *args, **kwargs):  # the component whose blocks are running
        phase[0] = comp.name
        try:
            return run_blocks(comp, *args, **kwargs)
        finally:
            phase[0] = "between"

    pipe._run_blocks = labelled
    before = rss_bytes()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    pipe.generate("a red circle moving left", steps=steps)
    done.set()
    thread.join()
    pipe.close()
    return {"rss_before_bytes": before, "budget_bytes": budget,
            "peak_rss_bytes": pipe.last_run["peak_rss_bytes"],
            "by_component": {k: {"rss_bytes": r, "held_bytes": h, "rss_above_held": r - h}
                             for k, (r, h) in peaks.items()}}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], int(args[1]), *(int(a) for a in args[2:])), indent=1))
