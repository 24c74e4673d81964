"""Pick the step cache threshold (and check the leap defaults) on prompts that are not in
`edge eval`'s set: training combinations under training phrasings, seeds from 1000.

    python benchmarks/tune_sampler.py dist/tiny-sora-onnx [--prompts 16] [--leap-curve]
    python benchmarks/tune_sampler.py dist/tiny-sora-onnx --leap-tails [--seed 1000]

Prints, per setting, transformer calls, PSNR against the 30-step video of the same seed and
the attribute accuracies. Quality figures only; wall times come from `edge eval --sweep`.
"""

from __future__ import annotations

import argparse

import numpy as np

from edge.eval.metrics import score, summarize
from edge.eval.run import load_classifier
from edge.eval.sweep import pooled_psnr
from edge.models.tiny_sora import DEFAULT_WEIGHTS
from edge.models.tiny_sora_data import TRAIN_COMBINATIONS, TRAIN_TEMPLATES
from edge.runtimes.python import Pipeline

SETTINGS = {
    "baseline": {},
    "cache 0.05": {"cache_threshold": 0.05},
    "cache 0.1": {"cache_threshold": 0.1},
    "cache 0.2": {"cache_threshold": 0.2},
    "LPL dynamic (defaults)": {"leap": True},
    "LPL patience 2": {"leap": True, "leap_patience": 2},
}
# --leap-curve: how quality depends on where the leap happens
LEAP_CURVE = {"baseline": {}} | {f"LPL fixed at {n}": {"leap": True, "leap_after": n}
                                 for n in (15, 18, 21, 24)}
# --leap-tails: a leap after n steps into a re-planned tail of k steps (n + k calls), beside
# uniform schedules of the same number of calls, every switch stated (a package's defaults
# never leak in)
OFF = {"steps": 30, "leap": False, "leap_after": None, "leap_steps": 1, "merge_steps": 0,
       "cache_threshold": 0.0}
LEAP_TAILS = {"baseline": OFF} | {
    f"leap at {n} + {k}": OFF | {"leap": True, "leap_after": n, "leap_steps": k}
    for n, k in ((4, 10), (4, 12), (6, 10), (8, 9), (12, 5), (15, 1))} | {
    f"{n} uniform steps": OFF | {"steps": n} for n in (14, 16, 17)}
# --combined: the leap rule with token merging and the step cache
TAIL = OFF | {"leap": True, "leap_after": 6, "leap_steps": 10}
COMBINED = {"baseline": OFF, "leap at 6 + 10": TAIL} | {
    f"+ merge {m}, cache {c}": TAIL | {"merge_steps": m, "cache_threshold": c}
    for m, c in ((8, 0.0), (16, 0.0), (8, 0.1), (16, 0.1), (8, 0.2), (16, 0.2))}


def tuning_prompts(n: int, pick_seed: int = 99) -> list[tuple[str, object]]:
    rng = np.random.default_rng(pick_seed)
    picks = rng.choice(len(TRAIN_COMBINATIONS), n, replace=False)
    return [(TRAIN_TEMPLATES[i % len(TRAIN_TEMPLATES)].format(
        color=a.color, shape=a.shape, direction=a.direction), a)
        for i, a in enumerate(TRAIN_COMBINATIONS[k] for k in picks)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--leap-curve", action="store_true")
    parser.add_argument("--leap-tails", action="store_true")
    parser.add_argument("--combined", action="store_true")
    parser.add_argument("--seed", type=int, default=1000, help="seed of the first prompt")
    parser.add_argument("--pick-seed", type=int, default=99, help="which training prompts")
    args = parser.parse_args()
    settings = (COMBINED if args.combined else LEAP_TAILS if args.leap_tails
                else LEAP_CURVE if args.leap_curve else SETTINGS)
    prompts = tuning_prompts(args.prompts, args.pick_seed)
    pipe = Pipeline.load(args.package, threads=1)
    classifier = load_classifier(DEFAULT_WEIGHTS)
    labels = np.array([a.labels for _, a in prompts])
    seeds = [args.seed + i for i in range(len(prompts))]
    videos = {}
    for name, overrides in settings.items():
        video = pipe.generate([p for p, _ in prompts], seed=seeds, **overrides)
        videos[name] = video
        s = summarize(score(classifier, video, labels))
        psnr = pooled_psnr(list(video), list(videos["baseline"]))
        print(f"{name:<24} calls {pipe.last_run['sampler']['transformer_calls']:>3}  PSNR "
              f"{'-' if psnr is None else f'{psnr:.1f}':>5}  colour {s['color_acc']:.3f}  "
              f"shape {s['shape_acc']:.3f}  direction {s['direction_acc']:.3f}  "
              f"consistency {s['consistency']:.3f}", flush=True)


if __name__ == "__main__":
    main()
