"""Train the attribute classifier on rendered clips (every combination: it is a measuring
instrument, not the generator). Light noise and blur make it tolerant of the softness of
generated frames; `measure_classifier` reports its accuracy on fresh clips.

Colour and shape are also trained per frame (the heads on each frame's own features): 16x
the signal per clip, and the consistency score relies on per-frame predictions."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from edge.eval.classifier import AttributeClassifier
from edge.models.tiny_sora_data import HELD_OUT, all_combinations, sample_batch

ATTRIBUTES = ("color", "shape", "direction")


def _degrade(video: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    b, t, h, w, c = video.shape
    x = video.permute(0, 1, 4, 2, 3).reshape(b * t, c, h, w)
    if torch.rand(1, generator=gen).item() < 0.5:
        x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    x = x + 0.05 * torch.rand(1, generator=gen) * torch.randn(x.shape, generator=gen)
    return x.clamp(0, 1).view(b, t, c, h, w).permute(0, 1, 3, 4, 2)


def labels_of(attrs) -> torch.Tensor:
    return torch.tensor([a.labels for a in attrs])


def train_classifier(steps: int, batch: int, seed: int, lr: float = 2e-3):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AttributeClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    combos = all_combinations()
    bar = tqdm(range(steps), desc="classifier", unit="step")
    for _ in bar:
        video, _, attrs = sample_batch(batch, rng, combos)
        x = _degrade(torch.from_numpy(video), gen)
        appearance, layout = model.features(x)
        logits = model.logits(appearance, layout)
        y = labels_of(attrs)
        loss = sum(F.cross_entropy(logits[k], y[:, i]) for i, k in enumerate(ATTRIBUTES))
        frames = x.shape[1]
        for i, k in enumerate(("color", "shape")):
            per_frame = getattr(model, f"{k}_head")(appearance).flatten(0, 1)
            loss = loss + F.cross_entropy(per_frame, y[:, i].repeat_interleave(frames))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    model.eval().requires_grad_(False)
    return model, measure_classifier(model, np.random.default_rng(seed + 1))


@torch.no_grad()
def measure_classifier(model: AttributeClassifier, rng: np.random.Generator,
                       clips: int = 240) -> dict:
    """Accuracy on fresh rendered clips of the held-out combinations."""
    video, _, attrs = sample_batch(clips, rng, HELD_OUT)
    logits = model(torch.from_numpy(video))
    y = labels_of(attrs)
    return {f"classifier_{k}_acc_real": float((logits[k].argmax(1) == y[:, i]).float().mean())
            for i, k in enumerate(ATTRIBUTES)}
