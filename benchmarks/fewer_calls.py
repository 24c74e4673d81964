"""What each way of making fewer or cheaper transformer calls costs and saves, in FLOPs and in
quality, side by side in one run: `edge eval --sweep`'s rows (the baseline, the plain
alternatives, leap, merge, step cache, guidance cutoff and their combinations) plus a few
more cutoffs, on `edge eval`'s 48 prompts (seeds from 0) and 48 held-out ones (training
combinations under training phrasings, seeds from 1000), every block resident.

    python benchmarks/fewer_calls.py dist/tiny-sora-onnx [--prompts 48] [--json out.json]

Prints one Markdown table: transformer calls and FLOPs per video and their ratios to the
guided 30-step baseline, each accuracy's change against the baseline pooled over both
prompt sets, PSNR against the baseline's videos per set, and the wall-time speedup (one
onnxruntime thread; a figure of this machine, the FLOPs are not). The FLOPs are what the
runtime counted from the package's per-block records (`last_run["transformer_flops"]`): an
unguided call (after the cutoff) runs half the batch, a merged one fewer tokens, a cached
one only the prologue and the epilogue.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge.core.presets import guidance_cutoff, tail_leap
from edge.eval.run import default_prompts, load_classifier
from edge.eval.sweep import Setting, package_settings, run_sweep
from edge.models.tiny_sora import DEFAULT_WEIGHTS

sys.path.insert(0, str(Path(__file__).parent))
from tune_sampler import tuning_prompts  # noqa: E402

ACCURACIES = ("color_acc", "shape_acc", "direction_acc")


def extra_settings(base: dict, steps: int) -> list[Setting]:
    """Cutoffs beside the sweep's one (a third of the steps): a sixth and a half; and the
    cutoff at a third with the leap alone."""
    third = guidance_cutoff(steps)
    return [Setting(f"guidance cutoff at {k}", base | {"guidance_steps": k})
            for k in (max(1, steps // 6), steps // 2)] + [
        Setting(f"leap + cutoff at {third['guidance_steps']}",
                base | tail_leap(steps) | third)]


def pooled_rows(results: list[dict]) -> list[dict]:
    """One row per setting over both prompt sets: the mean of the per-set figures (equal
    sets), the accuracies as changes against each set's baseline."""
    out = []
    for rows in zip(*(r["regimes"]["resident"] for r in results), strict=True):
        name = rows[0]["setting"]
        row = {"setting": name,
               "calls": sum(r["transformer_calls"] for r in rows) / len(rows),
               "gflop": sum(r["transformer_gflop"] for r in rows) / len(rows),
               "psnr": [r["psnr_db"] for r in rows],
               "speedup": sum(r["speedup"] for r in rows) / len(rows)}
        for k in ACCURACIES:
            row[k] = sum(r[k] for r in rows) / len(rows)
        out.append(row)
    base = out[0]
    for row in out:
        row["calls_ratio"] = base["calls"] / row["calls"]
        row["flops_ratio"] = base["gflop"] / row["gflop"]
        for k in ACCURACIES:
            row[f"{k}_change"] = row[k] - base[k]
    return out


def table(rows: list[dict]) -> str:
    head = ("| setting | calls | calls × | DiT GFLOP | FLOPs × | colour Δ | shape Δ | "
            "direction Δ | PSNR dB (built-in / held-out) | speedup |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        psnr = " / ".join("—" if p is None else f"{p:.1f}" for p in r["psnr"])
        lines.append(f"| {r['setting']} | {r['calls']:.1f} | {r['calls_ratio']:.2f} | "
                     f"{r['gflop']:.1f} | {r['flops_ratio']:.2f} | "
                     f"{r['color_acc_change']:+.3f} | {r['shape_acc_change']:+.3f} | "
                     f"{r['direction_acc_change']:+.3f} | {psnr} | {r['speedup']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--prompts", type=int, default=48, help="prompts of each set")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the per-set results here too")
    args = parser.parse_args()
    classifier = load_classifier(DEFAULT_WEIGHTS)
    settings = package_settings(args.package, args.steps)
    settings += extra_settings(settings[0].overrides, args.steps)
    sets = [(default_prompts()[:args.prompts], 0), (tuning_prompts(args.prompts), 1000)]
    results = []
    for prompts, seed in sets:
        results.append(run_sweep(args.package, classifier, prompts, steps=args.steps,
                                 seed=seed, batch=args.batch, regimes=("resident",),
                                 threads=1, settings=settings,
                                 on_generation=lambda name: print(".", end="", flush=True,
                                                                  file=sys.stderr)))
    print(file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(pooled_rows(results)))


if __name__ == "__main__":
    main()
