"""Pick the step cache threshold (and check the leap defaults) on prompts that are not in
`edge eval`'s set: training combinations under training phrasings, seeds from 1000.

    python benchmarks/tune_sampler.py dist/tiny-sora-onnx [--prompts 16] [--leap-curve]

Prints, per setting, transformer calls, PSNR against the 30-step video of the same seed and
the attribute accuracies. Quality figures only; wall times come from `edge eval --sweep`.
"""

from __future__ import annotations

import argparse

import numpy as np

from edge.data import TRAIN_COMBINATIONS, TRAIN_TEMPLATES
from edge.eval.metrics import score, summarize
from edge.eval.run import load_classifier
from edge.models.tiny_sora import DEFAULT_WEIGHTS
from edge.sweep import pooled_psnr
from runtimes.python import Pipeline

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


def tuning_prompts(n: int) -> list[tuple[str, object]]:
    rng = np.random.default_rng(99)
    picks = rng.choice(len(TRAIN_COMBINATIONS), n, replace=False)
    return [(TRAIN_TEMPLATES[i % len(TRAIN_TEMPLATES)].format(
        color=a.color, shape=a.shape, direction=a.direction), a)
        for i, a in enumerate(TRAIN_COMBINATIONS[k] for k in picks)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--leap-curve", action="store_true")
    args = parser.parse_args()
    settings = LEAP_CURVE if args.leap_curve else SETTINGS
    prompts = tuning_prompts(args.prompts)
    pipe = Pipeline.load(args.package, threads=1)
    classifier = load_classifier(DEFAULT_WEIGHTS)
    labels = np.array([a.labels for _, a in prompts])
    seeds = [1000 + i for i in range(len(prompts))]
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
