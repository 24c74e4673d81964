"""JSON fixtures of what a seed means (edge/core/noise.py), for the runtimes that mirror it
(JavaScript, Swift): for each case PyTorch's own
`torch.randn(shape, generator=torch.Generator().manual_seed(seed))`, so every mirror is
checked against torch, not against another mirror. `python tests/noise_fixtures.py` rewrites
tests/fixtures/noise/torch_randn.json; tests/test_noise.py checks that it still matches torch.

A case: `seed` (a decimal string: seeds run to 2^63 - 1, past JavaScript's exact integers),
`shape`, `count`; `values` (every value, float32 printed in full) up to 4096 values, else
`samples`: {`index`, `value`} at the start, the end (PyTorch redraws the last 16 values when
the count is not a multiple of 16) and strided through the middle, and `sum`, the float64 sum
of every value.

`draws`: consecutive draws of one generator (`torch_randn_draws`: LTX-Video's decode noise is
the draw after the initial latents): `seed`, `counts` (each draw's size; every one but the
last at least 16 values) and `values`, every value of each draw.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).parent / "fixtures" / "noise" / "torch_randn.json"
ALL_VALUES_UP_TO = 4096
SEEDS = [0, 1, 3, 42, 1234, 2**31 - 1, 2**32 - 1, 2**32 + 7, 2**53 + 1, 2**63 - 1]
SHAPES = [(1,), (2,), (5,), (15,), (16,), (17,), (31,), (33,), (100,)]
# a few seeds at sizes of a few thousand (a whole number of 16s and not)
MEDIUM_SEEDS = [0, 42, 2**63 - 1]
MEDIUM_SHAPES = [(1000,), (16, 3, 5, 7), (16, 2, 5, 9)]
# (seed, shape) of larger draws: a tiny Wan latent, and Wan2.1-T2V-1.3B's at 480x832x81
LARGE = [(42, (16, 3, 8, 8)), (3, (16, 21, 60, 104))]
# (seed, counts) of consecutive draws: a whole number of 16s first and not; one that crosses
# the engine's 624-word state; a last draw under 16 values
DRAWS = [(21, (32, 48)), (5, (17, 100)), (0, (700, 40)), (2**63 - 1, (33, 7))]


def torch_randn(shape: tuple[int, ...], seed: int) -> np.ndarray:
    import torch

    generator = torch.Generator("cpu").manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32).numpy()


def sample_indices(count: int) -> list[int]:
    middle = range(0, count, max(1, count // 200))
    return sorted({*range(min(64, count)), *range(max(0, count - 64), count), *middle})


def _float32(v: np.float32) -> float:
    return float(f"{v:.9g}")  # 9 digits carry a float32 exactly


def case(seed: int, shape: tuple[int, ...]) -> dict:
    values = torch_randn(shape, seed).reshape(-1)
    entry: dict = {"seed": str(seed), "shape": list(shape), "count": math.prod(shape)}
    if values.size <= ALL_VALUES_UP_TO:
        entry["values"] = [_float32(v) for v in values]
    else:
        index = sample_indices(values.size)
        entry["samples"] = {"index": index, "value": [_float32(values[i]) for i in index]}
        entry["sum"] = float(values.astype(np.float64).sum())
    return entry


def cases() -> list[dict]:
    return ([case(s, shape) for s in SEEDS for shape in SHAPES]
            + [case(s, shape) for s in MEDIUM_SEEDS for shape in MEDIUM_SHAPES]
            + [case(s, shape) for s, shape in LARGE])


def draws() -> list[dict]:
    import torch

    out = []
    for seed, counts in DRAWS:
        generator = torch.Generator("cpu").manual_seed(seed)
        values = [torch.randn(n, generator=generator, dtype=torch.float32).numpy()
                  for n in counts]
        out.append({"seed": str(seed), "counts": list(counts),
                    "values": [[_float32(v) for v in draw] for draw in values]})
    return out


def main() -> None:
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps({"definition": "torch.randn/cpu/float32", "cases": cases(),
                                   "draws": draws()}, separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
