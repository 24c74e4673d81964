"""Scores for generated clips: attribute accuracy, consistency and coherence."""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

from edge.eval.classifier import AttributeClassifier

ATTRIBUTES = ("color", "shape", "direction")


def as_float(video: np.ndarray) -> np.ndarray:
    return video.astype(np.float32) / (255.0 if video.dtype == np.uint8 else 1.0)


@torch.no_grad()
def classify(model: AttributeClassifier, video: np.ndarray) -> dict[str, np.ndarray]:
    """uint8 or float video (B, T, H, W, 3) -> predicted label per attribute, and the
    per-clip consistency: the share of frames whose own colour and shape prediction (the
    clip heads applied to that frame alone) agree with the clip's. A subject that changes
    colour or form mid-clip, or dissolves, scores low."""
    appearance, layout = model.features(torch.from_numpy(as_float(video)))
    logits = model.logits(appearance, layout)
    same = torch.ones(appearance.shape[:2], dtype=torch.bool)
    for k in ("color", "shape"):
        per_frame = getattr(model, f"{k}_head")(appearance).argmax(-1)       # (B, T)
        same &= per_frame == logits[k].argmax(1)[:, None]
    return {k: logits[k].argmax(1).numpy() for k in ATTRIBUTES} | {
        "consistency": same.float().mean(1).numpy()}


def frame_is_coherent(frame: np.ndarray, threshold: float = 0.25, min_area: int = 8,
                      max_area_share: float = 0.3, share: float = 0.9) -> bool:
    """One solid object: an object-sized lit area (not empty, not a wash over the frame)
    whose largest 8-connected blob holds >= `share` of the lit pixels."""
    lit = frame.max(-1) > threshold
    area = int(lit.sum())
    if area < min_area or area > max_area_share * lit.size:
        return False
    labels, n = ndimage.label(lit, structure=np.ones((3, 3)))
    largest = np.bincount(labels.ravel())[1:].max()
    return largest >= share * area


def clip_coherence(video: np.ndarray, min_frames: float = 0.9) -> np.ndarray:
    """Per clip: True when >= `min_frames` of its frames are coherent."""
    return np.array([np.mean([frame_is_coherent(f) for f in clip]) >= min_frames
                     for clip in as_float(video)])


def score(model: AttributeClassifier, video: np.ndarray, labels: np.ndarray) -> dict:
    """labels (B, 3): colour, shape, direction indices. Returns per-clip correctness arrays."""
    pred = classify(model, video)
    out = {f"{k}_correct": pred[k] == labels[:, i] for i, k in enumerate(ATTRIBUTES)}
    return out | {"consistency": pred["consistency"], "coherent": clip_coherence(video)}


def summarize(per_clip: dict, mask: np.ndarray | None = None, prefix: str = "") -> dict:
    m = np.ones(len(per_clip["coherent"]), bool) if mask is None else mask
    if not m.any():
        return {}
    out = {f"{prefix}{k}_acc": float(per_clip[f"{k}_correct"][m].mean()) for k in ATTRIBUTES}
    return out | {f"{prefix}consistency": float(per_clip["consistency"][m].mean()),
                  f"{prefix}coherence": float(per_clip["coherent"][m].mean()),
                  f"{prefix}n_prompts": int(m.sum())}
