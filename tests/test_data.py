import numpy as np
import pytest

from edge.models.tiny_sora_data import (
    COLORS,
    DIRECTIONS,
    HELD_OUT,
    SHAPES,
    TRAIN_COMBINATIONS,
    Attributes,
    all_combinations,
    caption,
    render_clip,
    sample_batch,
)


def centroid(frame):
    lit = frame.max(-1) > 0.25
    ys, xs = np.nonzero(lit)
    return xs.mean(), ys.mean()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_object_moves_in_its_direction(direction):
    clip = render_clip(Attributes("red", "circle", direction), np.random.default_rng(0))
    (x0, y0), (x1, y1) = centroid(clip[0]), centroid(clip[-1])
    dx, dy = x1 - x0, y1 - y0
    expected = {"left": (dx < -8 and abs(dy) < 1), "right": (dx > 8 and abs(dy) < 1),
                "up": (dy < -8 and abs(dx) < 1), "down": (dy > 8 and abs(dx) < 1)}
    assert expected[direction], (dx, dy)


@pytest.mark.parametrize("color", list(COLORS))
def test_object_has_its_colour_and_stays_inside(color):
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        clip = render_clip(Attributes(color, shape, "up"), rng)
        assert clip.shape == (16, 32, 32, 3) and clip.dtype == np.float32
        lit = clip.max(-1) > 0.9 * clip.max()
        mean_rgb = clip[lit].mean(0) / clip[lit].mean(0).max()
        target = np.array(COLORS[color]) / max(COLORS[color])
        assert np.abs(mean_rgb - target).max() < 0.1
        # nothing touches the border: the whole object is visible in every frame
        border = np.concatenate([clip[:, 0], clip[:, -1], clip[:, :, 0], clip[:, :, -1]], 1)
        assert border.max() < 0.05


def test_shapes_differ_in_area():
    rng = np.random.default_rng(2)
    areas = {s: (render_clip(Attributes("white", s, "left"), rng)[0].max(-1) > 0.5).sum()
             for s in SHAPES}
    assert areas["triangle"] < areas["circle"] < areas["square"] * 1.2


def test_held_out_split_keeps_every_value_and_pair_in_training():
    assert len(HELD_OUT) == 12 and len(TRAIN_COMBINATIONS) + len(HELD_OUT) == 72
    assert not set(HELD_OUT) & set(TRAIN_COMBINATIONS)
    for a in all_combinations():
        pairs = [(a.color, a.shape), (a.color, a.direction), (a.shape, a.direction)]
        for pair in pairs:
            assert any(set(pair) <= {t.color, t.shape, t.direction} for t in TRAIN_COMBINATIONS)


def test_captions_name_the_attributes():
    rng = np.random.default_rng(3)
    for _ in range(50):
        a = TRAIN_COMBINATIONS[rng.integers(len(TRAIN_COMBINATIONS))]
        text = caption(a, rng)
        assert (a.shape in text or {"circle": "ball", "square": "box"}.get(a.shape, "?") in text
                or "disc" in text or "block" in text)


def test_sample_batch_is_seeded():
    a = sample_batch(4, np.random.default_rng(7))
    b = sample_batch(4, np.random.default_rng(7))
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
