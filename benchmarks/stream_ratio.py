"""Streamed vs all-resident wall time, interleaved in one process, for a machine whose other
load varies: `edge bench` runs its modes one after another (each in a fresh process, for its
own peak RSS), so load that changes between modes moves its ratio. Here both pipelines live in
one process and generate in alternation (resident, streamed, resident, ...), so each pair of
runs sees the same load; the per-round ratios and their median are printed.

    python benchmarks/stream_ratio.py PACKAGE BUDGET [ROUNDS] [STEPS]
"""

from __future__ import annotations

import json
import statistics
import sys

from edge.core.budget import parse_size
from edge.runtimes.python.pipeline import Pipeline

PROMPT = "a red circle moving left"


def main() -> None:
    package, budget = sys.argv[1], parse_size(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    resident = Pipeline.load(package, check_hashes=False)
    streamed = Pipeline.load(package, memory_budget=budget, cold_reads=True,
                             check_hashes=False)
    resident.generate(PROMPT, seed=0, steps=1)  # every block read once, before timing
    rows = []
    for i in range(rounds):
        resident.generate(PROMPT, seed=i, steps=steps)
        streamed.generate(PROMPT, seed=i, steps=steps)
        r, s = resident.last_run, streamed.last_run
        rows.append({"resident_s": r["wall_s"]["total"], "streamed_s": s["wall_s"]["total"],
                     "ratio": s["wall_s"]["total"] / r["wall_s"]["total"],
                     "io_wait_s": s["io_wait_s"], "bytes_read": s["bytes_read"],
                     "read_bandwidth_bytes_per_s": s["read_bandwidth_bytes_per_s"],
                     "peak_held_bytes": s["peak_held_bytes"]})
        print(json.dumps(rows[-1]), flush=True)
    ratios = [row["ratio"] for row in rows]
    print(json.dumps({"rounds": rounds, "steps": steps, "budget_bytes": budget,
                      "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                      "max_ratio": max(ratios),
                      "ratio_of_sums": sum(r["streamed_s"] for r in rows)
                      / sum(r["resident_s"] for r in rows)}))
    resident.close()
    streamed.close()


if __name__ == "__main__":
    main()
