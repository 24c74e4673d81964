"""`edge bench`: one generation resident, streamed and naive, beside a cold read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from edge.commands import common
from edge.core.console import echo, fail


def bench(
    package: Annotated[Path, typer.Argument(help="An exported package folder.", exists=True,
                                            file_okay=False)],
    memory_budget: Annotated[str, typer.Option(
        help="Budget for the streamed and naive modes, e.g. 64MB.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    prompt: Annotated[str, typer.Option()] = "a red circle moving left",
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: 30].")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="onnxruntime threads.")] = None,
    lean: Annotated[bool, typer.Option(
        "--lean", help="Also time 'lean': streamed, with the pinned blocks let go before the "
        "VAE decode and read again on the next generation.")] = False,
    repeats: Annotated[int, typer.Option(
        min=1, help="Timed generations per mode; the median is reported.")] = 1,
) -> None:
    """Time one generation all-resident, streamed with prefetch under the budget, and naive
    (load on demand, no prefetch), beside a cold sequential read of the weights."""
    from edge.core.budget import BudgetError, format_size
    from edge.core.package import PackageError
    from edge.runtimes.python.bench import MODES
    from edge.runtimes.python.bench import bench as run_bench

    modes = (*MODES, "lean") if lean else MODES
    try:
        result = run_bench(package, common.budget_option(memory_budget), prompt=prompt, steps=steps,
                           threads=threads, modes=modes, repeats=repeats)
    except (PackageError, BudgetError, ValueError) as err:
        fail(str(err))
    if as_json:
        echo(json.dumps(result))
        return
    cold = result["cold_sequential_read"]
    echo(f"cold sequential read: {format_size(cold['bytes'])} at "
         f"{format_size(int(cold['bytes_per_s']))}/s")
    echo(f"{'mode':<10}{'wall s':>9}{'x resident':>11}{'x floor':>8}{'read':>11}"
         f"{'io wait s':>10}{'overlap':>9}{'bw/cold':>8}{'peak RSS':>11}")
    for mode in modes:
        r = result[mode]
        echo(f"{mode:<10}{r['wall_s']:>9.2f}{r['wall_vs_resident']:>11.2f}"
             f"{r['wall_vs_floor']:>8.2f}"
             f"{format_size(r['bytes_read']):>11}{r['io_wait_s']:>10.2f}"
             f"{common.cell(r['overlap_efficiency']):>9}{common.cell(r['read_bw_fraction']):>8}"
             f"{format_size(r['peak_rss_bytes']):>11}")
