"""`edge eval`: generate a prompt set and score it with the shipped attribute classifier."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from edge.eval.classifier import AttributeClassifier
from edge.eval.metrics import score, summarize
from edge.models.tiny_sora_data import (
    COLOR_WORDS,
    DIRECTION_WORDS,
    EVAL_TEMPLATES,
    HELD_OUT,
    SHAPE_WORDS,
    TRAIN_COMBINATIONS,
    TRAIN_TEMPLATES,
    Attributes,
    is_held_out,
    render_clip,
)

# (prompt, attributes) pairs
PromptSet = list[tuple[str, Attributes]]


def default_prompts() -> PromptSet:
    """48 prompts: each held-out combination twice (a training template and an unseen
    paraphrase), and 24 training combinations under unseen paraphrases."""
    rng = np.random.default_rng(1234)
    prompts = []
    for i, a in enumerate(HELD_OUT):
        prompts.append((TRAIN_TEMPLATES[i % len(TRAIN_TEMPLATES)].format(
            color=a.color, shape=a.shape, direction=a.direction), a))
        prompts.append((EVAL_TEMPLATES[i % len(EVAL_TEMPLATES)].format(
            color=a.color, shape=a.shape, direction=a.direction), a))
    for j, k in enumerate(rng.choice(len(TRAIN_COMBINATIONS), 24, replace=False)):
        a = TRAIN_COMBINATIONS[k]
        prompts.append((EVAL_TEMPLATES[j % len(EVAL_TEMPLATES)].format(
            color=a.color, shape=a.shape, direction=a.direction), a))
    return prompts


def _find(prompt: str, words: dict[str, list[str]], what: str) -> str:
    hits = {value for value, synonyms in words.items() for w in synonyms
            if re.search(rf"\b{re.escape(w)}\b", prompt)}
    if len(hits) != 1:
        found = ", ".join(sorted(hits)) or "none"
        raise ValueError(f"prompt {prompt!r} must name exactly one {what} (found: {found})")
    return hits.pop()


def parse_prompt(prompt: str) -> Attributes:
    """The colour, shape and direction a prompt asks for, from the vocabulary of the data."""
    p = prompt.lower()
    return Attributes(_find(p, COLOR_WORDS, "colour"), _find(p, SHAPE_WORDS, "shape"),
                      _find(p, DIRECTION_WORDS, "direction"))


def read_prompts(path: Path) -> PromptSet:
    """One prompt per line; blank lines and lines starting with # are skipped."""
    lines = [ln.strip() for ln in Path(path).read_text().splitlines()]
    prompts = []
    for n, line in enumerate(lines, 1):
        if line and not line.startswith("#"):
            try:
                prompts.append((line, parse_prompt(line)))
            except ValueError as err:
                raise ValueError(f"{path}:{n}: {err}") from None
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def load_classifier(weights_dir: Path) -> AttributeClassifier:
    path = Path(weights_dir) / "classifier.safetensors"
    if not path.is_file():
        raise FileNotFoundError(
            f"attribute classifier {path} not found; run `edge train tiny-sora`")
    model = AttributeClassifier()
    model.load_state_dict(load_file(path))
    return model.eval()


def evaluate(generate: Callable[[list[str], list[int]], np.ndarray],
             classifier: AttributeClassifier, prompts: PromptSet, seed: int = 0,
             batch: int = 8, on_batch: Callable[[int], None] | None = None) -> dict:
    """`generate(prompts, seeds)` -> uint8 videos. Returns the summary over all prompts and
    over the held-out combinations (`held_out_*`)."""
    per_clip: dict[str, list] = {}
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        video = generate([p for p, _ in chunk], [seed + start + i for i in range(len(chunk))])
        labels = np.array([a.labels for _, a in chunk])
        for k, v in score(classifier, video, labels).items():
            per_clip.setdefault(k, []).append(v)
        if on_batch:
            on_batch(len(chunk))
    merged = {k: np.concatenate(v) for k, v in per_clip.items()}
    held = np.array([is_held_out(a) for _, a in prompts])
    return summarize(merged) | summarize(merged, held, prefix="held_out_")


@torch.no_grad()
def reference_scores(classifier: AttributeClassifier, prompts: PromptSet, seed: int = 0) -> dict:
    """The same scores on rendered (real) clips of the prompts' attributes: the ceiling."""
    rng = np.random.default_rng(seed)
    video = np.stack([render_clip(a, rng) for _, a in prompts])
    labels = np.array([a.labels for _, a in prompts])
    return summarize(score(classifier, video, labels))
