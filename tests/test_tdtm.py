"""Temporal token merging: the merge/unmerge ops and the merged transformer variant."""
import pytest
import torch

from edge.models.stdit import MergedPair, STDiT, STDiTConfig
from edge.models.tdtm import merge_frames, merged_frames, unmerge_frames


@pytest.mark.parametrize("frames", [1, 2, 5, 16])
def test_merge_then_unmerge_round_trips(frames):
    x = torch.randn(2, frames, 3, 4)
    m = merge_frames(x)
    assert m.shape == (2, merged_frames(frames), 3, 4)
    torch.testing.assert_close(merge_frames(unmerge_frames(m, frames)), m)
    # frames already equal in pairs survive merge + unmerge unchanged
    paired = unmerge_frames(m, frames)
    torch.testing.assert_close(unmerge_frames(merge_frames(paired), frames), paired)


def test_merge_averages_consecutive_frames_and_keeps_an_odd_last_frame():
    x = torch.arange(5.0).view(1, 5, 1, 1)
    assert merge_frames(x).flatten().tolist() == [0.5, 2.5, 4.0]
    assert unmerge_frames(merge_frames(x), 5).flatten().tolist() == [0.5, 0.5, 2.5, 2.5, 4.0]


@pytest.mark.parametrize("frames", [4, 6])
def test_merged_model_equals_base_on_frame_paired_input(frames):
    # when frames come in equal pairs, merging loses nothing: the outputs must match (an odd
    # last frame would weigh differently in temporal attention, so T is even here)
    torch.manual_seed(0)
    model = STDiT(STDiTConfig(frames=frames, hidden=32, heads=2, pairs=2)).eval()
    cfg = model.cfg
    half = torch.randn(2, merged_frames(frames), cfg.in_channels, 64)
    latent = unmerge_frames(half, frames).view(2, frames, cfg.in_channels, 8, 8).transpose(1, 2)
    # the temporal position encoding differs per frame: zero it for this property
    model.prologue.pos_temporal.zero_()
    caption, mask = torch.randn(2, 16, 384), torch.ones(2, 16, dtype=torch.int64)
    t = torch.rand(2)
    with torch.no_grad():
        base = model(latent, t, caption, mask)
        merged = model(latent, t, caption, mask, merged=True)
    torch.testing.assert_close(merged, base, atol=1e-5, rtol=1e-5)


def test_merged_variant_differs_on_real_input_and_shares_parameters():
    torch.manual_seed(0)
    model = STDiT(STDiTConfig(frames=4, hidden=32, heads=2, pairs=1)).eval()
    pair = model.pairs[0]
    variant = MergedPair(pair)
    base_params = dict(pair.named_parameters())
    var_params = dict(variant.named_parameters())
    assert base_params.keys() == var_params.keys()
    assert all(var_params[k] is base_params[k] for k in base_params)
    x, t_mod = torch.randn(1, 4, 16, 32), torch.randn(1, 6, 32)
    y, y_bias = torch.randn(1, 16, 32), torch.zeros(1, 1, 1, 16)
    with torch.no_grad():
        a = pair(x, t_mod, y, y_bias)
        b = variant(x, t_mod, y, y_bias)
        torch.testing.assert_close(b, pair(x, t_mod, y, y_bias, merged=True))
    assert not torch.allclose(a, b, atol=1e-3)
