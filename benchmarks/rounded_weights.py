"""Where 4 bits cost a model's video, tensor by tensor, without a Core ML export: the weights
are rounded in PyTorch as the iphone target's programs store them and the family's reference
renders the video, compared with the fp32 one (PSNR over the uint8 frames; SNR against the
video's own spread). Seconds a trial where an export is many minutes, and finer than a
`--quantize` rule (which picks a stored form per block): a pattern here matches tensors.

    python benchmarks/rounded_weights.py --model /tmp/edge-os/os12 --height 64 --width 64 \\
        --frames 17 --steps 2 \\
        --trial "cross=text_encoder/*:int8,transformer/*cross_attn*:int4-b32,*:int8" \\
        --trial "wan-rule=text_encoder/*:int4-b32,transformer/*:int4-b32,*:int8"

A trial is NAME=PATTERN:FORM,... over "component/tensor name" (the first matching pattern
wins; "fp32" leaves a tensor as it is). Forms: int8 (a scale per output channel, its largest /
127), int4-b32 and int4-b16 (a scale per block of 32 or 16 inputs, its largest / 7): the
exporter's stored forms of those names (exporters/iphone/compression.py), modelled on
coremltools' symmetric quantizers, not taken from them. Tensors under 2 048 values, which
coremltools leaves uncompressed (fp16 in the program), stay fp32 here. The model is checked
against one real export only: Wan's rule on Open-Sora's shapes rounds here to 27.2 dB, the
export's own check measured 26.9 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import time
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import torch

from edge.exporters.iphone.compression import WEIGHT_THRESHOLD


def int8_per_channel(w: torch.Tensor) -> torch.Tensor:
    flat = w.reshape(w.shape[0], -1)
    scale = (flat.abs().amax(1, keepdim=True) / 127).clamp_min(torch.finfo(w.dtype).tiny)
    return (torch.round(flat / scale).clamp(-127, 127) * scale).reshape(w.shape)


def int4_per_block(block: int):
    def rounded(w: torch.Tensor) -> torch.Tensor:
        if w.shape[1] % block:  # no whole blocks along the inputs: left as it is (here:
            # Open-Sora's patch embedding, 4 input channels)
            return w
        groups = w.reshape(w.shape[0], w.shape[1] // block, block, -1)
        scale = (groups.abs().amax(2, keepdim=True) / 7).clamp_min(torch.finfo(w.dtype).tiny)
        return (torch.round(groups / scale).clamp(-8, 7) * scale).reshape(w.shape)
    return rounded


FORMS = {"fp32": lambda w: w, "int8": int8_per_channel, "int4-b32": int4_per_block(32),
         "int4-b16": int4_per_block(16)}


def parse_trial(text: str) -> tuple[str, list[tuple[str, str]]]:
    name, _, rules = text.partition("=")
    pairs = [tuple(rule.rsplit(":", 1)) for rule in rules.split(",")]
    bad = [form for _, form in pairs if form not in FORMS]
    if not name or not rules or bad:
        raise SystemExit(f"--trial {text!r}: NAME=PATTERN:FORM,... with forms "
                         f"{', '.join(FORMS)}")
    return name, pairs


def components(model) -> dict[str, torch.nn.Module]:
    """The family model's PyTorch modules by package component."""
    pipe = model.pipe
    return {"text_encoder": pipe.text_encoder, "transformer": pipe.transformer,
            "vae_decoder": pipe.vae}


def compared(video: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    error = np.mean((video.astype(np.float64) - reference.astype(np.float64)) ** 2)
    return (10 * np.log10(255 ** 2 / error),
            10 * np.log10(np.var(reference.astype(np.float64)) / error))


def main() -> None:
    from edge.families import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--frames", type=int)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompt", default="a red circle moving left")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trial", action="append", required=True, type=parse_trial)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = load_model(args.model, height=args.height, width=args.width, frames=args.frames,
                       steps=args.steps)
    tensors = {f"{c}/{n}": p for c, module in components(model).items()
               for n, p in module.named_parameters()
               if p.dim() >= 2 and p.numel() >= WEIGHT_THRESHOLD}
    original = {k: p.detach().clone() for k, p in tensors.items()}
    reference = model.reference(args.prompt, seed=args.seed)
    for name, rules in args.trial:
        started = time.perf_counter()
        with torch.no_grad():
            for key, p in tensors.items():
                form = next((f for pattern, f in rules if fnmatch(key, pattern)), "fp32")
                p.copy_(FORMS[form](original[key]))
        psnr, snr = compared(model.reference(args.prompt, seed=args.seed), reference)
        print(f"{name:<24} PSNR {psnr:5.1f} dB  SNR {snr:5.1f} dB  "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
