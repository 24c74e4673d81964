"""The Python runtime's generation time alone and beside other busy processes, side by side in
one run, for three ways of running onnxruntime's threads: its own default (one a core, idle
threads spinning between ops), edge's default (one a core, idle threads waiting) and one
thread (`--threads 1`).

    edge export --target onnx -o /tmp/ts                 # tiny-sora, the default model
    python benchmarks/contention.py /tmp/ts              # 10 steps, beside 2 busy processes
    python benchmarks/contention.py /tmp/ts --busy 4 --steps 20 --repeats 5

Each way runs in a fresh process: one warm-up generation, then `--repeats` timed ones (the
median is shown). The busy processes are Python loops that never sleep, as a compile or
another model would be; they start before the timed ways and stop after them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

# label -> Pipeline.load's threads and spinning
WAYS = {
    "onnxruntime's default (spinning)": (None, True),
    "edge's default (waiting)": (None, False),
    "one thread": (1, False),
}
BUSY_LOOP = "while True: pass"


def time_generations(package: str, threads: int | None, spinning: bool, steps: int,
                     repeats: int) -> list[float]:
    """In this (fresh) process: seconds of each timed generation."""
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(package, threads=threads, spinning=spinning)
    pipe.generate("a red ball rolls", seed=0, steps=steps)  # warm-up
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        pipe.generate("a red ball rolls", seed=seed, steps=steps)
        times.append(time.perf_counter() - start)
    return times


def run_way(package: str, way: str, steps: int, repeats: int) -> float:
    """The median of `way`'s timed generations, measured in a fresh process."""
    out = subprocess.run([sys.executable, __file__, package, "--child", way, "--steps",
                          str(steps), "--repeats", str(repeats)],
                         capture_output=True, text=True, check=True)
    return statistics.median(json.loads(out.stdout.splitlines()[-1]))


def measure(package: str, busy: int, steps: int, repeats: int) -> dict:
    alone = {way: run_way(package, way, steps, repeats) for way in WAYS}
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    try:
        beside = {way: run_way(package, way, steps, repeats) for way in WAYS}
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return {"alone": alone, "beside": beside}


def table(figures: dict, busy: int) -> str:
    alone, beside = figures["alone"], figures["beside"]
    base_alone, base_beside = alone[next(iter(WAYS))], beside[next(iter(WAYS))]
    rows = [f"| way | alone | beside {busy} busy | beside / alone | alone vs spinning "
            f"| beside vs spinning |", "|---|---|---|---|---|---|"]
    for way in WAYS:
        rows.append(f"| {way} | {alone[way]:.2f} s | {beside[way]:.2f} s "
                    f"| {beside[way] / alone[way]:.2f}x | {alone[way] / base_alone:.2f}x "
                    f"| {beside[way] / base_beside:.2f}x |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", help="an exported onnx package folder")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside it")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        threads, spinning = WAYS[args.child]
        print(json.dumps(time_generations(args.package, threads, spinning, args.steps,
                                          args.repeats)))
        return
    import os

    figures = measure(args.package, args.busy, args.steps, args.repeats)
    print(f"{args.package}: {args.steps} steps, median of {args.repeats} generations, "
          f"{os.cpu_count()} cores")
    print(table(figures, args.busy))


if __name__ == "__main__":
    main()
