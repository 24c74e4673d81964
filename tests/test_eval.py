import numpy as np
import pytest

from edge.eval.metrics import clip_coherence, frame_is_coherent
from edge.eval.run import default_prompts, parse_prompt, read_prompts
from edge.models.tiny_sora_data import HELD_OUT, Attributes, render_clip


def test_default_prompts_cover_held_out_and_paraphrases():
    prompts = default_prompts()
    assert len(prompts) >= 48
    assert {a for _, a in prompts} >= set(HELD_OUT)
    for text, a in prompts:
        assert parse_prompt(text) == a


def test_parse_prompt_reads_synonyms():
    expected = Attributes("purple", "circle", "left")
    assert parse_prompt("A violet ball drifting to the left") == expected


@pytest.mark.parametrize("bad,what", [("a red circle", "direction"),
                                      ("a red blue circle moving up", "colour"),
                                      ("a red thing moving up", "shape")])
def test_parse_prompt_names_what_is_missing(bad, what):
    with pytest.raises(ValueError, match=what):
        parse_prompt(bad)


def test_read_prompts_reports_file_and_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# comment\na red circle moving left\n\na green blob moving up\n")
    with pytest.raises(ValueError, match=r"p\.txt:4: .*shape"):
        read_prompts(f)
    f.write_text("a red circle moving left\n")
    assert read_prompts(f)[0][1] == Attributes("red", "circle", "left")


def test_coherence_accepts_solid_shapes_and_rejects_speckle_and_washes():
    rng = np.random.default_rng(0)
    clip = render_clip(Attributes("green", "triangle", "down"), rng)
    assert clip_coherence(clip[None])[0]
    speckle = (rng.random((32, 32, 3)) > 0.93).astype(np.float32)
    assert not frame_is_coherent(speckle)
    assert not frame_is_coherent(np.full((32, 32, 3), 0.8, np.float32))
    assert not frame_is_coherent(np.zeros((32, 32, 3), np.float32))
    split = np.zeros((32, 32, 3), np.float32)
    split[2:8, 2:8] = split[20:26, 20:26] = 1.0  # two objects, neither holds 90%
    assert not frame_is_coherent(split)
