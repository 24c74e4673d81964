"""The shipped attribute classifier is the evaluation's measuring instrument: check it."""
import numpy as np

from edge.eval.metrics import score, summarize
from edge.models.tiny_sora_data import HELD_OUT, sample_batch


def test_classifier_reads_real_clips_of_held_out_combinations(classifier):
    video, _, attrs = sample_batch(96, np.random.default_rng(99), HELD_OUT)
    result = summarize(score(classifier, video, np.array([a.labels for a in attrs])))
    assert result["color_acc"] >= 0.97
    # known weakness: circles and squares are often confused (measured 0.71-0.75), which
    # caps what the eval can say about shape; docs/tiny-sora.md reports it
    assert result["shape_acc"] >= 0.65
    assert result["direction_acc"] >= 0.97
    assert result["consistency"] >= 0.9 and result["coherence"] >= 0.97


def test_classifier_is_not_fooled_by_static_or_empty_clips(classifier):
    video, _, attrs = sample_batch(8, np.random.default_rng(5), HELD_OUT)
    labels = np.array([a.labels for a in attrs])
    static = np.repeat(video[:, :1], 16, axis=1)          # no motion at all
    empty = np.zeros_like(video)
    for fake in (static, empty):
        result = summarize(score(classifier, fake, labels))
        assert result["direction_acc"] < 0.9 or result["coherence"] < 0.5
