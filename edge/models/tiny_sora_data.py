"""Procedural captioned videos: one coloured shape crossing a black frame.

Each clip is a (frames, height, width, 3) float32 array in [0, 1]. Every attribute the caption
names (colour, shape, motion direction) is visible in the pixels, so a classifier trained on
these clips can score generated videos. Some colour/shape/direction combinations are kept out
of training (`HELD_OUT`), and some caption templates too (`EVAL_TEMPLATES`), so evaluation can
ask for things the model never saw together.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.95, 0.15, 0.12),
    "green": (0.15, 0.85, 0.2),
    "blue": (0.2, 0.35, 1.0),
    "yellow": (0.98, 0.88, 0.1),
    "purple": (0.7, 0.2, 0.9),
    "white": (0.95, 0.95, 0.95),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = ("left", "right", "up", "down")

# Words a caption may use for each attribute value (the first is the canonical one).
COLOR_WORDS = {c: [c] for c in COLORS} | {"purple": ["purple", "violet"]}
SHAPE_WORDS = {"circle": ["circle", "ball", "disc"], "square": ["square", "box", "block"],
               "triangle": ["triangle"]}
DIRECTION_WORDS = {
    "left": ["left", "to the left", "leftward"],
    "right": ["right", "to the right", "rightward"],
    "up": ["up", "upward", "towards the top"],
    "down": ["down", "downward", "towards the bottom"],
}
TRAIN_TEMPLATES = (
    "a {color} {shape} moving {direction}",
    "a {color} {shape} moves {direction}",
    "{color} {shape} going {direction}",
    "the {color} {shape} slides {direction}",
    "a {shape}, {color}, moving {direction}",
    "one {color} {shape} drifting {direction} on black",
)
# Never seen in training: paraphrases for evaluation only.
EVAL_TEMPLATES = (
    "there is a {color} {shape} travelling {direction}",
    "video of a {color} {shape} that heads {direction}",
)


@dataclass(frozen=True)
class Attributes:
    color: str
    shape: str
    direction: str

    @property
    def labels(self) -> tuple[int, int, int]:
        return (list(COLORS).index(self.color), SHAPES.index(self.shape),
                DIRECTIONS.index(self.direction))


def all_combinations() -> list[Attributes]:
    return [Attributes(c, s, d) for c, s, d in itertools.product(COLORS, SHAPES, DIRECTIONS)]


def is_held_out(a: Attributes) -> bool:
    """One combination in six is kept out of training; every colour, shape and direction
    (and every pair of them) still appears in training with some other value."""
    ci, si, di = a.labels
    return (ci + 2 * si + 3 * di) % 6 == 0


TRAIN_COMBINATIONS = [a for a in all_combinations() if not is_held_out(a)]
HELD_OUT = [a for a in all_combinations() if is_held_out(a)]


def caption(a: Attributes, rng: np.random.Generator, templates=TRAIN_TEMPLATES) -> str:
    """A caption for `a`, drawing the template and the synonyms at random."""
    template = templates[rng.integers(len(templates))]
    pick = lambda words: words[rng.integers(len(words))]  # noqa: E731
    return template.format(color=pick(COLOR_WORDS[a.color]), shape=pick(SHAPE_WORDS[a.shape]),
                           direction=pick(DIRECTION_WORDS[a.direction]))


def _coverage(shape: str, x: np.ndarray, y: np.ndarray, cx: np.ndarray, cy: np.ndarray,
              r: float) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] from a signed distance with a one-pixel ramp.

    x, y: pixel centre grids (H, W); cx, cy: per-frame centres (T, 1, 1)."""
    dx, dy = x - cx, y - cy
    if shape == "circle":
        sdf = np.sqrt(dx * dx + dy * dy) - r
    elif shape == "square":
        sdf = np.maximum(np.abs(dx), np.abs(dy)) - 0.85 * r
    elif shape == "triangle":  # pointing up, circumradius ~1.2 r
        rr = 1.2 * r
        edges = [(0.0, 1.0), (np.sqrt(3) / 2, -0.5), (-np.sqrt(3) / 2, -0.5)]  # outward normals
        # normals are in y-up coordinates; image rows grow downward, hence -dy
        sdf = np.max([nx * dx - ny * -dy - rr / 2 for nx, ny in edges], axis=0)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    return np.clip(0.5 - sdf, 0.0, 1.0)


def render_clip(a: Attributes, rng: np.random.Generator, frames: int = 16,
                size: int = 32) -> np.ndarray:
    """One clip of `a`: the shape crosses most of the frame in its direction of motion."""
    r = rng.uniform(4.5, 6.0)
    margin = 1.2 * r + 1
    along_start = rng.uniform(margin, margin + 3)           # distance from the side it leaves
    travel = min(rng.uniform(0.9, 1.25) * (frames - 1), size - 2 * margin - (along_start - margin))
    across = rng.uniform(margin, size - margin)
    steps = np.arange(frames, dtype=np.float64)[:, None, None] / (frames - 1)
    start = {"left": size - along_start, "right": along_start,
             "up": size - along_start, "down": along_start}[a.direction]
    sign = -1.0 if a.direction in ("left", "up") else 1.0
    along = start + sign * travel * steps
    across_t = np.full_like(along, across)
    cx, cy = (along, across_t) if a.direction in ("left", "right") else (across_t, along)
    grid = np.arange(size, dtype=np.float64) + 0.5
    x, y = np.meshgrid(grid, grid)
    cover = _coverage(a.shape, x, y, cx, cy, r)              # (T, H, W)
    color = np.clip(np.array(COLORS[a.color]) + rng.uniform(-0.04, 0.04, 3), 0, 1)
    return (cover[..., None] * color).astype(np.float32)


def sample_batch(n: int, rng: np.random.Generator, combos=TRAIN_COMBINATIONS,
                 frames: int = 16, size: int = 32, templates=TRAIN_TEMPLATES):
    """n random clips: (videos (n,T,H,W,3), captions, attributes)."""
    attrs = [combos[i] for i in rng.integers(len(combos), size=n)]
    videos = np.stack([render_clip(a, rng, frames, size) for a in attrs])
    captions = [caption(a, rng, templates) for a in attrs]
    return videos, captions, attrs
