"""`edge eval --sweep`: what step leaping, token merging and the step cache buy and cost.

Runs an exported package with the Python runtime under one setting per row (baseline, LPL
dynamic and fixed, TDTM for half or all steps, step cache, guidance cutoff, LPL + TDTM, all
combined, all combined with the cutoff) and two memory regimes (every block resident; a
tight budget that streams the transformer's blocks every step, read cold). Per row:
transformer calls, the transformer's FLOPs (what the calls computed: a merged call or an
unguided one computes less than a full one) and their ratios to the baseline, wall time and
its ratio, PSNR of the frames against the baseline video of the same prompt and seed, and
the attribute scores of `edge eval`.

Settings are interleaved batch by batch (every setting runs batch 1, then batch 2, ...), so
a slow stretch of the machine falls on all rows alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.core.budget import parse_size
from edge.core.presets import CACHE_THRESHOLD, TAIL_RULE, guidance_cutoff, tail_leap
from edge.core.sampler import SamplerSettings
from edge.eval.classifier import AttributeClassifier
from edge.eval.metrics import score, summarize
from edge.eval.run import PromptSet
from edge.runtimes.python import Pipeline

# Step cache threshold of the sweep's rows, chosen on held-out prompts (docs/benchmarks.md)
DEFAULT_CACHE_THRESHOLD = CACHE_THRESHOLD
REGIMES = ("resident", "streamed")


@dataclass(frozen=True)
class Setting:
    name: str
    overrides: dict


# the tail rule of a package that names no fixed leap: tiny-sora's (after 6 of 30 steps, the
# rest in 10), scaled to the sweep's steps
DEFAULT_TAIL_RULE = TAIL_RULE


def sweep_settings(steps: int, leap_min_steps: int,
                   cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
                   shift: float = 1.0,
                   tail_rule: tuple[int, int, int] = DEFAULT_TAIL_RULE) -> list[Setting]:
    """The rows. Every row states each technique's switch, so package defaults never leak
    in; `half` (15 of 30) is where LPL fixed leaps and TDTM "first half" stops merging.

    The plain alternatives come right after the baseline, because a technique is only worth
    having where it beats them at equal calls: the same sampler with fewer uniform steps
    (16 and 20 of 30) and, where the package shifts its timesteps, half the shift at 16.
    LPL comes three ways: the dynamic cosine rule and a fixed leap at half, both straight to
    t = 0, and the tail rule `(after, tail steps, of steps)` — the package's own `--leap`,
    scaled to `steps` (tiny-sora: after 6 of 30, the rest in 10: docs/benchmarks.md) —
    which the combined rows use."""
    if steps < 2:
        raise ValueError(f"steps={steps}: the sweep needs at least 2 steps to leap or merge")
    half = steps // 2
    off = {"steps": steps, "shift": shift, "leap": False, "leap_after": None,
           "leap_steps": 1, "merge_steps": 0, "cache_threshold": 0.0, "guidance_steps": None}
    cutoff = guidance_cutoff(steps)
    fewer, some_fewer = max(1, round(steps * 8 / 15)), max(1, round(steps * 2 / 3))
    baselines = [(f"{fewer} steps", {"steps": fewer}),
                 (f"{some_fewer} steps", {"steps": some_fewer})]
    if shift > 1:
        baselines.append((f"{fewer} steps, shift {shift / 2:g}",
                          {"steps": fewer, "shift": shift / 2}))
    # dynamic leap keeps the package's tol and patience; min_steps no later than half
    dynamic = {"leap": True, "leap_min_steps": min(leap_min_steps, half)}
    leap_rule = tail_leap(steps, tail_rule)
    rows = [("baseline", {}), *baselines,
            ("LPL dynamic", dynamic),
            (f"LPL fixed at {half}", {"leap": True, "leap_after": half}),
            (f"LPL at {leap_rule['leap_after']} + {leap_rule['leap_steps']} steps", leap_rule),
            (f"TDTM first {half}", {"merge_steps": half}),
            ("TDTM all steps", {"merge_steps": steps}),
            ("step cache", {"cache_threshold": cache_threshold}),
            (f"guidance cutoff at {cutoff['guidance_steps']}", cutoff),
            ("LPL + TDTM", leap_rule | {"merge_steps": half}),
            ("all combined", leap_rule | {"merge_steps": half,
                                          "cache_threshold": cache_threshold}),
            ("all combined + cutoff", leap_rule | cutoff | {
                "merge_steps": half, "cache_threshold": cache_threshold})]
    return [Setting(name, off | o) for name, o in rows]


def package_settings(package: Path, steps: int,
                     cache_threshold: float = DEFAULT_CACHE_THRESHOLD) -> list[Setting]:
    """The rows for a package: its sampler's leap_min_steps, shift and fixed leap (the tail
    rule its `--leap` runs) decide three of them."""
    from edge.core.package import read_package

    sampler = SamplerSettings.from_dict(read_package(package, check_hashes=False)["sampler"])
    rule = DEFAULT_TAIL_RULE
    if sampler.leap_after is not None and sampler.leap_steps > 1:
        rule = (sampler.leap_after, sampler.leap_steps, sampler.steps)
    return sweep_settings(steps, sampler.leap_min_steps, cache_threshold, sampler.shift, rule)


def smallest_budget(package: Path) -> int:
    """The tightest budget the loader accepts: the largest block plus two pages."""
    from edge.core.package import read_package

    manifest = read_package(package, check_hashes=False)
    return max(b["files"][1]["bytes"] for c in manifest["components"]
               for b in c["blocks"]) + 8192


def pooled_psnr(videos: list[np.ndarray], references: list[np.ndarray]) -> float | None:
    """PSNR over every frame of every video against the reference's; None when equal."""
    se = sum(float(((v.astype(np.float64) - r.astype(np.float64)) ** 2).sum())
             for v, r in zip(videos, references, strict=True))
    mse = se / sum(v.size for v in videos)
    return None if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@dataclass
class _Row:
    """What one setting accumulated over the batches of one regime."""

    wall_s: float = 0.0
    transformer_s: float = 0.0
    transformer_calls: int = 0
    predictions: int = 0
    merged_calls: int = 0
    generations: int = 0
    bytes_read: int = 0
    io_wait_s: float = 0.0
    # the transformer's FLOPs; None where the package's blocks record none (older exports)
    transformer_flops: int | None = 0

    def add(self, run: dict) -> None:
        self.wall_s += run["wall_s"]["total"]
        self.transformer_s += run["wall_s"]["transformer"]
        self.transformer_calls += run["sampler"]["transformer_calls"]
        self.predictions += run["sampler"]["calls"]
        self.merged_calls += run["sampler"]["merged_calls"]
        self.generations += 1
        self.bytes_read += run["bytes_read"]
        self.io_wait_s += run["io_wait_s"]
        flops = run.get("transformer_flops")
        self.transformer_flops = (None if flops is None or self.transformer_flops is None
                                  else self.transformer_flops + flops)


@dataclass(frozen=True)
class Chunk:
    """Prompts generated together, with their seeds (prompt i of the set gets seed + i)."""

    start: int
    prompts: PromptSet
    seeds: list[int]


def chunks(prompts: PromptSet, batch: int, seed: int) -> list[Chunk]:
    return [Chunk(start, prompts[start:start + batch],
                  [seed + start + i for i in range(len(prompts[start:start + batch]))])
            for start in range(0, len(prompts), batch)]


# what a generation's figures the rows need (pipe.last_run has more)
RUN_FIGURES = ("wall_s", "sampler", "bytes_read", "io_wait_s", "transformer_flops")


def generate_chunk(pipe: Pipeline, setting: Setting, chunk: Chunk) -> tuple[np.ndarray, dict]:
    """One setting on one chunk: the video and the run's figures."""
    video = pipe.generate([p for p, _ in chunk.prompts], seed=chunk.seeds, **setting.overrides)
    return video, {k: pipe.last_run[k] for k in RUN_FIGURES}


def warm_up(pipe: Pipeline, settings: list[Setting], prompts: PromptSet, seed: int) -> None:
    """Not counted: resident blocks loaded, both graphs of each pair run once."""
    pipe.generate(prompts[0][0], seed=seed, **(settings[0].overrides | {"steps": 2,
                                                                          "merge_steps": 1}))


def run_regime(pipe: Pipeline, settings: list[Setting], classifier: AttributeClassifier,
               prompts: PromptSet, seed: int = 0, batch: int = 1,
               on_generation: Callable[[str], None] | None = None) -> list[dict]:
    """Every setting on every prompt with one loaded pipeline; one result dict per row."""
    warm_up(pipe, settings, prompts, seed)
    chunk_list = chunks(prompts, batch, seed)
    results: dict[str, list[tuple[np.ndarray, dict]]] = {s.name: [] for s in settings}
    for chunk in chunk_list:
        for s in settings:
            results[s.name].append(generate_chunk(pipe, s, chunk))
            if on_generation:
                on_generation(s.name)
    return summarize_rows(settings, classifier, chunk_list, results)


def summarize_rows(settings: list[Setting], classifier: AttributeClassifier,
                   chunk_list: list[Chunk],
                   results: dict[str, list[tuple[np.ndarray, dict]]]) -> list[dict]:
    """The rows of one regime from each setting's (video, figures) per chunk, in chunk order.
    Videos are scored chunk by chunk, as they were generated, wherever that was."""
    rows = {s.name: _Row() for s in settings}
    per_clip: dict[str, dict[str, list]] = {s.name: {} for s in settings}
    videos: dict[str, list[np.ndarray]] = {s.name: [] for s in settings}
    for s in settings:
        for chunk, (video, run) in zip(chunk_list, results[s.name], strict=True):
            rows[s.name].add(run)
            videos[s.name].extend(video)
            labels = np.array([a.labels for _, a in chunk.prompts])
            for k, v in score(classifier, video, labels).items():
                per_clip[s.name].setdefault(k, []).append(v)
    base = settings[0].name
    base_flops = rows[base].transformer_flops
    out = []
    for s in settings:
        r = rows[s.name]
        flops = r.transformer_flops
        scores = summarize({k: np.concatenate(v) for k, v in per_clip[s.name].items()})
        out.append({
            "setting": s.name, "overrides": s.overrides,
            "transformer_calls": r.transformer_calls / r.generations,
            "predictions": r.predictions / r.generations,
            "merged_calls": r.merged_calls / r.generations,
            "calls_ratio": rows[base].transformer_calls / r.transformer_calls,
            # per video, and the baseline's over this row's: the saving in work
            "transformer_gflop": None if flops is None else flops / len(videos[s.name]) / 1e9,
            "flops_ratio": None if flops is None or base_flops is None else base_flops / flops,
            "wall_s": r.wall_s, "speedup": rows[base].wall_s / r.wall_s,
            "transformer_s": r.transformer_s,
            "transformer_speedup": rows[base].transformer_s / r.transformer_s,
            "bytes_read": r.bytes_read, "io_wait_s": r.io_wait_s,
            "psnr_db": None if s.name == base else pooled_psnr(videos[s.name], videos[base]),
        } | scores)
    return out


def run_sweep(package: Path, classifier: AttributeClassifier, prompts: PromptSet,
              steps: int = 30, seed: int = 0, batch: int = 1,
              memory_budget: str | int | None = None,
              cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
              regimes: tuple[str, ...] = REGIMES, threads: int | None = None,
              on_generation: Callable[[str], None] | None = None,
              run_regimes: Callable | None = None,
              settings: list[Setting] | None = None) -> dict:
    """Both regimes on one prompt set. `memory_budget` is the streamed regime's (default:
    the smallest the package accepts); its reads bypass the page cache. `threads`:
    onnxruntime's threads per session (1 keeps timings steady on a busy machine).
    `run_regimes`: run the generations elsewhere, e.g. `edge.eval.on_ray.run_regimes` as
    tasks on the Ray cluster this process is connected to (default: here, one regime after
    the other). `settings`: the rows, if already read (default: the package's,
    `package_settings`)."""
    unknown = sorted(set(regimes) - set(REGIMES))
    if unknown:
        raise ValueError(f"unknown regime(s) {', '.join(unknown)}; known: {', '.join(REGIMES)}")
    budget = parse_size(memory_budget, "memory_budget") or smallest_budget(package)
    if settings is None:
        settings = package_settings(package, steps, cache_threshold)
    result: dict = {"package": str(package), "steps": steps, "seed": seed, "batch": batch,
                    "n_prompts": len(prompts), "cache_threshold": cache_threshold,
                    "threads": threads, "ray": run_regimes is not None,
                    "streamed_budget_bytes": budget, "regimes": {}}
    if run_regimes is not None:
        result["regimes"] = run_regimes(package, settings, classifier, prompts, seed, batch,
                                        budget, tuple(regimes), threads, on_generation)
        return result
    for regime in regimes:
        streamed = regime == "streamed"
        pipe = Pipeline.load(package, memory_budget=budget if streamed else None,
                             cold_reads=streamed, threads=threads)
        try:
            result["regimes"][regime] = run_regime(pipe, settings, classifier, prompts, seed,
                                                   batch, on_generation)
        finally:
            pipe.close()
    return result


def generations(n_prompts: int, batch: int, settings: int,
                regimes: int = len(REGIMES)) -> int:
    """How many generate() calls a sweep makes (for a progress bar)."""
    return regimes * settings * -(-n_prompts // batch)


COLUMNS = ("setting", "calls", "calls ×", "DiT GFLOP", "FLOPs ×", "wall s", "speedup",
           "DiT speedup", "PSNR dB",
           "colour", "shape", "direction", "consistency", "read MiB", "I/O wait s")


def format_table(rows: list[dict]) -> str:
    """A Markdown table of one regime's rows."""

    def cells(r: dict) -> list[str]:
        psnr = "—" if r["psnr_db"] is None else f"{r['psnr_db']:.1f}"
        gflop = "—" if r["transformer_gflop"] is None else f"{r['transformer_gflop']:.1f}"
        ratio = "—" if r["flops_ratio"] is None else f"{r['flops_ratio']:.2f}"
        return [r["setting"], f"{r['transformer_calls']:.1f}", f"{r['calls_ratio']:.2f}",
                gflop, ratio,
                f"{r['wall_s']:.1f}", f"{r['speedup']:.2f}", f"{r['transformer_speedup']:.2f}",
                psnr, f"{r['color_acc']:.3f}", f"{r['shape_acc']:.3f}",
                f"{r['direction_acc']:.3f}", f"{r['consistency']:.3f}",
                f"{r['bytes_read'] / 2**20:.0f}", f"{r['io_wait_s']:.2f}"]

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines)
