"""Core AI's export with its workers one at a time against side by side, in one run.

    python benchmarks/coreai_workers.py [--quantize fp16] [--workers N] [--model FOLDER ...]

Exports the model's device blocks (`edge export --target iphone --min-ios 27 --quantize Q`,
exporters/iphone/coreai/package.py) twice into temporary folders: with one worker, then with N
side by side
(default: one a CPU, the exporter's own choice where memory allows: `worker_count`). Prints
each run's wall (the exporter's whole block loop: tracing, conversion, execution, checks)
and the ratio, and that both runs' executed errors are the same programs' (each block's
relative error equal). Core AI's Linux interpreter runs a program on one core, so the
ratio's ceiling is the worker count; fp16 (the interpreter emulates float16) makes
execution most of the time, as at real size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from model_options import add_model_options, model_from  # beside it


def export_with(workers: int, model, quantize: str, dest: Path) -> tuple[float, dict]:
    """(wall, each block's executed relative error by key) of the model's blocks exported
    with `workers` side by side."""
    import edge.exporters.iphone.coreai.package as coreai
    import edge.exporters.iphone.coreai.pool as pool
    from edge.exporters import ExportOptions
    from edge.exporters.iphone.coreai.layout import device_blocks, precision

    chosen = precision(ExportOptions(quantize=quantize, min_ios=27), model)
    pool.WORKERS = workers
    errors, started = {}, time.perf_counter()
    for name, blocks in device_blocks(model, chosen, None).components.items():
        for record in coreai.export_blocks(blocks, dest, chosen):
            errors[f"{name}/{record['name']}"] = record["validation"]["relative_error"]
    return time.perf_counter() - started, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(parser)
    parser.add_argument("--quantize", default="fp16")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="side by side (default: one a CPU)")
    args = parser.parse_args()
    model = model_from(args)
    with tempfile.TemporaryDirectory() as tmp:
        one, one_errors = export_with(1, model, args.quantize, Path(tmp) / "one")
        many, many_errors = export_with(args.workers, model, args.quantize,
                                        Path(tmp) / "many")
    print(f"{model.name} at {args.quantize}: {len(one_errors)} blocks")
    print(f"1 worker:  {one:7.1f} s")
    print(f"{args.workers} workers: {many:7.1f} s  ({one / many:.2f}x faster)")
    same = one_errors == many_errors
    print(f"the same executed errors, block for block: {same}")
    if not same:
        raise SystemExit(f"the runs differ: {one_errors} against {many_errors}")


if __name__ == "__main__":
    main()
