"""`edge eval`: tiny-sora's prompt set scored by the attribute classifier, or with --sweep
every leap/merge/cache setting of a package (optionally on Ray)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from edge.commands import common
from edge.core.console import echo, fail
from edge.core.noise import MAX_SEED


def evaluate(
    prompts: Annotated[Path | None, typer.Option(
        help="Text file, one prompt per line [default: 48 built-in prompts incl. held-out "
             "combinations and unseen paraphrases].", exists=True, dir_okay=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    seed: Annotated[int, typer.Option(
        min=0, max=MAX_SEED, help="Seed of the first prompt; prompt i uses seed+i.")] = 0,
    steps: Annotated[int | None, typer.Option(min=1, help="Denoising steps [default: 30].")] = None,
    batch: Annotated[int, typer.Option(min=1, help="Prompts generated together.")] = 8,
    weights: common.WeightsOption = None,
    sweep: Annotated[bool, typer.Option(
        "--sweep", help="Run an exported package under every leap/merge/cache setting, all "
        "blocks resident and streamed under a tight budget; one table per regime.")] = False,
    package: Annotated[Path, typer.Option(
        help="With --sweep: the exported package.", file_okay=False)] = Path(
        "dist/tiny-sora-onnx"),
    memory_budget: Annotated[str | None, typer.Option(
        help="With --sweep: the streamed regime's budget [default: the smallest that "
             "works].")] = None,
    cache_threshold: common.CacheOption = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="With --sweep: onnxruntime threads [default: onnxruntime's].")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="With --sweep: also draw speed against quality (one point per setting and "
             "regime) to this PNG.", dir_okay=False)] = None,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Run each prompt chunk (with --sweep: each setting and chunk) as a Ray "
        "task on a local Ray instance, or on the cluster --ray-address names "
        "(docs/scale.md).")] = False,
    ray_address: Annotated[str | None, typer.Option(
        help="Join the Ray cluster at HOST:PORT (implies --ray).")] = None,
) -> None:
    """Generate videos for a prompt set and score colour, shape, direction, consistency and
    coherence with the shipped attribute classifier."""
    from tqdm import tqdm

    from edge.eval.run import default_prompts, load_classifier, read_prompts, reference_scores
    from edge.eval.run import evaluate as run_eval
    from edge.models.tiny_sora import DEFAULT_WEIGHTS

    try:
        prompt_set = read_prompts(prompts) if prompts else default_prompts()
    except ValueError as err:
        fail(str(err))
    if plot is not None and not sweep:
        fail("--plot draws a sweep: add --sweep")
    if plot is not None and plot.suffix.lower() != ".png":
        fail(f"--plot {plot}: the plot is written as PNG; name a .png file")
    if plot is not None:  # before the sweep's hours, not after
        from edge.core.files import OutputError, check_output_file

        try:
            check_output_file(plot, "--plot")
        except OutputError as err:
            fail(str(err))
    if memory_budget is not None and not sweep:
        fail("--memory-budget is the streamed regime's budget of a sweep: add --sweep")
    memory_budget = common.budget_option(memory_budget)
    if sweep:
        _eval_sweep(package, prompt_set, load_classifier(weights or DEFAULT_WEIGHTS), as_json,
                    plot, ray_address if ray_address else ray, steps=steps or 30, seed=seed,
                    batch=batch, memory_budget=memory_budget, cache_threshold=cache_threshold,
                    threads=threads)
        return
    classifier = load_classifier(weights or DEFAULT_WEIGHTS)
    overrides = {"steps": steps} if steps else {}
    started = time.perf_counter()
    with tqdm(total=len(prompt_set), desc="generating", unit="prompt", disable=as_json) as bar:
        if ray or ray_address:
            with _ray_connection(ray_address):
                from edge.eval.on_ray import generate_on_ray

                generate = generate_on_ray(weights, overrides, prompt_set, seed, batch,
                                           on_batch=bar.update)
            result = run_eval(generate, classifier, prompt_set, seed=seed, batch=batch)
        else:
            pipe = common.load_reference_pipeline(weights)
            result = run_eval(lambda p, s: pipe.generate(p, s, **overrides), classifier,
                              prompt_set, seed=seed, batch=batch, on_batch=bar.update)
    result["steps"] = steps or common.reference_sampler(weights).steps
    result["ray"] = bool(ray or ray_address)
    result["wall_s"] = round(time.perf_counter() - started, 2)
    result["real_clips"] = reference_scores(classifier, prompt_set, seed)
    if as_json:
        echo(json.dumps(result))
        return
    echo(f"{'metric':<16}{'all prompts':>12}{'held-out':>10}{'real clips':>12}")
    for key in ("color_acc", "shape_acc", "direction_acc", "consistency", "coherence",
                "n_prompts"):
        row = [result.get(key), result.get(f"held_out_{key}"), result["real_clips"].get(key)]
        cells = "".join(f"{common.cell(v):>{w}}" for v, w in zip(row, (12, 10, 12), strict=True))
        echo(f"{key:<16}{cells}")
    echo(f"{result['steps']} steps, {result['wall_s']} s")


@contextlib.contextmanager
def _ray_connection(address: str | None, enabled: bool = True):
    """Connected to Ray inside (a local instance without an address); a cluster that cannot
    be reached ends the command with its address, before any work."""
    if not enabled:
        yield
        return
    import ray

    from edge.eval.on_ray import RayError, connect

    try:
        connected = connect(address)
    except RayError as err:
        fail(str(err))
    try:
        yield
    except ray.exceptions.RayTaskError as err:  # a task failed for a reason retries can't fix
        fail(f"a Ray task failed: {err.cause if err.cause else err}")
    finally:
        if connected:
            ray.shutdown()


def _ray_regimes():
    """The sweep's generations as Ray tasks (edge/eval/on_ray.py)."""
    from edge.eval.on_ray import run_regimes

    return run_regimes


def _eval_sweep(package: Path, prompt_set, classifier, as_json: bool, plot: Path | None,
                ray: bool | str, **options) -> None:
    """`edge eval --sweep`: edge/eval/sweep.py."""
    from tqdm import tqdm

    from edge.core.budget import BudgetError
    from edge.core.package import PackageError
    from edge.eval.sweep import (
        DEFAULT_CACHE_THRESHOLD,
        format_table,
        generations,
        package_settings,
        run_sweep,
    )

    if options["cache_threshold"] is None:
        options["cache_threshold"] = DEFAULT_CACHE_THRESHOLD
    if not (package / "manifest.json").is_file():
        fail(f"no package at {package}: run `edge export --target onnx -o {package}` first")
    started = time.perf_counter()
    try:
        rows = package_settings(package, options["steps"], options["cache_threshold"])
    except (PackageError, ValueError) as err:
        fail(str(err))
    total = generations(len(prompt_set), options["batch"], len(rows))
    with _ray_connection(ray if isinstance(ray, str) else None, enabled=bool(ray)):
        with tqdm(total=total, desc="sweep", unit="run") as bar:  # stderr: JSON stays clean
            try:
                result = run_sweep(package, classifier, prompt_set, settings=rows,
                                   run_regimes=_ray_regimes() if ray else None,
                                   on_generation=lambda name: (bar.set_postfix_str(name),
                                                               bar.update()), **options)
            except (PackageError, BudgetError, ValueError) as err:  # RayError included
                fail(str(err))
    result["sweep_wall_s"] = round(time.perf_counter() - started, 1)
    if plot is not None:
        from edge.core.files import OutputError
        from edge.eval.sweep_plot import plot_frontier

        try:
            plot_frontier(result, plot)
        except OutputError as err:
            fail(str(err))
        result["plot"] = str(plot)
    if as_json:
        echo(json.dumps(result))
        return
    for regime, rows in result["regimes"].items():
        echo(f"\n{regime}" + (f" (budget {result['streamed_budget_bytes']} bytes, cold "
                                      "reads)" if regime == "streamed" else "") + ":")
        echo(format_table(rows))
    echo(f"\n{result['n_prompts']} prompts, {result['steps']} steps, batch "
         f"{result['batch']}, threads {result['threads'] or 'default'}, "
         f"{result['sweep_wall_s']} s" + (f"; plot: {plot}" if plot else ""))
