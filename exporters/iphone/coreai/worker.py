"""The child process that converts a block's graphs to one Core AI model and executes it.

Core AI's converter and runtime are beta native code: a failure inside them can end the
process (SIGABRT) rather than raise. The exporter therefore never calls them itself; it
saves each graph of a block (`torch.export.save`) with its example inputs, runs
`python -P worker.py JOB...` and reads back what this process wrote: the
`.aimodel` and, per function, the outputs of executing it on the example inputs through
Core AI's runtime (on Linux its bundled reference interpreter). A crash here becomes an
error naming the block in the exporter (exporters/iphone/coreai/pool.py).

Several workers may share one list of jobs, each taking the next job no other has claimed
(a `claim` file beside the job, created exclusively). Each JOB (one per block) is a JSON
file: {"aimodel": path, "results": path,
"functions": [{"name", "program" (a .pt2), "inputs" (.npz of the example inputs by name),
"input_names", "output_names"}], "execute": false to convert without executing}.
Results: {"ok": true, "functions": {name: {"outputs": .npz path, "seconds": float}}} or
{"ok": false, "stage": "convert" | "execute", "error": one line}.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

PINNED = {"coreai-core": "1.0.0b3", "coreai-torch": "0.4.3",   # as the [iphone] extra pins them
          "coreai-opt": "0.4.0"}


def quiet_imports():
    """coreai_torch warns that torch 2.13.0+cpu is newer than 2.13.0 (a local version label);
    coreai_opt prints that torchao's CUDA kernels are absent. Neither matters on a CPU."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        import coreai_torch
        from coreai.authoring import AIModelAsset, OSVersion
        from coreai.runtime import NDArray
    return coreai_torch, AIModelAsset, OSVersion, NDArray


def decompositions(coreai_torch) -> dict:
    """Core AI's table, with `empty_like` made `zeros_like`: torch's own decomposition gives
    `aten.empty_permuted`, which Core AI has no lowering for (diffusers' Wan RoPE makes its
    output with `empty_like`); zeros are a valid value for memory about to be overwritten."""
    import torch

    table = dict(coreai_torch.get_decomp_table())

    def empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None,
                   memory_format=None):
        return torch.zeros(x.shape, dtype=dtype or x.dtype, device=x.device)

    table[torch.ops.aten.empty_like.default] = empty_like
    return table


def one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:400]


def convert(job: dict, coreai_torch, OSVersion) -> None:
    import torch

    table = decompositions(coreai_torch)
    converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
    for function in job["functions"]:
        program = torch.export.load(function["program"]).run_decompositions(table)
        converter.add_exported_program(program, input_names=function["input_names"],
                                       output_names=function["output_names"],
                                       entrypoint_name=function["name"])
    program = converter.to_coreai()
    if job.get("weights"):
        program = quantized(program, job["weights"])
    program.save_asset(Path(job["aimodel"]), minimum_os=OSVersion.v27)


def quantized(program, weights: dict):
    """The program with its weights stored as `weights` (a Core ML stored form's record:
    {"method": "linear_symmetric", "dtype": "int8", "granularity": "per_channel"}, or
    "int4" "per_block" with a "block_size"), symmetric linear quantization by coreai-opt: a
    dequantizing op before each weight's use (tensors under coreai-opt's threshold of 1024
    values keep their dtype)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        from coreai_opt.coreai_utils import CompressionGranularity, DType, quantize_weights
    return quantize_weights(program, DType(weights["dtype"]),
                            granularity=CompressionGranularity(weights["granularity"]),
                            block_size=weights.get("block_size", 32))


async def execute(job: dict, AIModelAsset, NDArray) -> dict:
    done = {}
    async with AIModelAsset.load(Path(job["aimodel"])).executable() as model:
        for function in job["functions"]:
            run = model.load_function(function["name"])
            with np.load(function["inputs"]) as saved:
                feeds = {n: NDArray(np.ascontiguousarray(saved[n]))
                         for n in function["input_names"]}
            started = time.perf_counter()
            out = await run(feeds)
            seconds = time.perf_counter() - started
            path = Path(function["inputs"]).with_suffix(".out.npz")
            np.savez(path, **{n: np.array(out[n].numpy(), copy=True)
                              for n in function["output_names"]})
            done[function["name"]] = {"outputs": str(path), "seconds": seconds}
    return done


def run_job(job: dict, modules) -> dict:
    coreai_torch, AIModelAsset, OSVersion, NDArray = modules
    stage = "convert"
    try:
        convert(job, coreai_torch, OSVersion)
        if not job.get("execute", True):   # converted only (`edge export --execute distinct`)
            return {"ok": True, "functions": {}}
        stage = "execute"
        return {"ok": True, "functions": asyncio.run(execute(job, AIModelAsset, NDArray))}
    except Exception as err:  # the converter's and runtime's own types: reported, not raised
        return {"ok": False, "stage": stage, "error": one_line(err)}


def claimed(job_path: str) -> bool:
    """Whether this process takes the job: the first of the workers sharing the list to
    create its claim file (holding its pid, so a crash is traced to its job)."""
    try:
        fd = os.open(Path(job_path).with_name("claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def exit_with_parent() -> None:
    """End this process when the exporter that started it has ended (its parent changes):
    where the system cannot do it (Linux does, pool.py `_die_with_parent`), a worker would
    go on converting for nobody."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main(job_paths: list[str]) -> int:
    """Each job not claimed by another worker, in turn; the first that fails ends the run
    (the export stops there)."""
    exit_with_parent()
    modules = quiet_imports()
    for job_path in job_paths:
        if not claimed(job_path):
            continue
        job = json.loads(Path(job_path).read_text())
        found = run_job(job, modules)
        # written whole, then renamed: the exporter watches for the file to count progress
        partial = Path(job["results"] + ".partial")
        partial.write_text(json.dumps(found))
        partial.rename(job["results"])
        if not found["ok"]:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
