import torch

from edge.models.stdit import STDiT, STDiTConfig

SMALL = STDiTConfig(hidden=32, heads=2, pairs=2, frames=4)


def inputs(batch=2, cfg=SMALL, seed=0):
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(batch, cfg.in_channels, cfg.frames, cfg.latent_size, cfg.latent_size,
                         generator=g)
    caption = torch.randn(batch, cfg.caption_len, cfg.caption_dim, generator=g)
    mask = torch.ones(batch, cfg.caption_len, dtype=torch.int64)
    mask[:, 6:] = 0
    return latent, torch.rand(batch, generator=g), caption, mask


def randomized(model):
    # the adaLN-zero init makes a fresh model output zeros; perturb so tests see real paths
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def test_output_shape_is_latent_shape():
    model = STDiT(SMALL)
    latent, t, caption, mask = inputs()
    assert model(latent, t, caption, mask).shape == latent.shape


def test_fresh_model_predicts_zero_velocity():
    model = STDiT(SMALL)
    assert torch.count_nonzero(model(*inputs())) == 0


def test_block_by_block_equals_whole_model():
    model = randomized(STDiT(SMALL))
    latent, t, caption, mask = inputs()
    x, t_mod, c, y, y_bias = model.prologue(latent, t, caption, mask)
    assert x.shape == (2, SMALL.frames, SMALL.tokens_per_frame, SMALL.hidden)
    assert t_mod.shape == (2, 6, SMALL.hidden) and y.shape == (2, SMALL.caption_len, SMALL.hidden)
    for pair in model.pairs:
        x = pair(x, t_mod, y, y_bias)
    torch.testing.assert_close(model.epilogue(x, c), model(latent, t, caption, mask))


def test_deterministic_and_batch_independent():
    model = randomized(STDiT(SMALL))
    latent, t, caption, mask = inputs(batch=3)
    full = model(latent, t, caption, mask)
    torch.testing.assert_close(full, model(latent, t, caption, mask), rtol=0, atol=0)
    single = model(latent[1:2], t[1:2], caption[1:2], mask[1:2])
    torch.testing.assert_close(single, full[1:2], atol=1e-5, rtol=1e-5)


def test_padding_tokens_are_ignored():
    model = randomized(STDiT(SMALL))
    latent, t, caption, mask = inputs()
    changed = caption.clone()
    changed[:, 6:] += 10.0  # masked positions
    torch.testing.assert_close(model(latent, t, caption, mask), model(latent, t, changed, mask),
                               atol=1e-5, rtol=1e-5)
    changed[:, 2] += 10.0   # a real token
    assert not torch.allclose(model(latent, t, caption, mask), model(latent, t, changed, mask))


def test_temporal_blocks_mix_frames_and_spatial_blocks_do_not():
    model = randomized(STDiT(SMALL))
    latent, t, caption, mask = inputs(batch=1)
    x, t_mod, c, y, y_bias = model.prologue(latent, t, caption, mask)
    bumped = x.clone()
    # change frame 0 only, and not by a constant (LayerNorm would remove it)
    bumped[:, 0] += torch.randn_like(bumped[:, 0])
    spatial = model.pairs[0].spatial
    torch.testing.assert_close(spatial(x, t_mod, y, y_bias)[:, 1:],
                               spatial(bumped, t_mod, y, y_bias)[:, 1:])
    temporal = model.pairs[0].temporal
    assert not torch.allclose(temporal(x, t_mod, y, y_bias)[:, 1:],
                              temporal(bumped, t_mod, y, y_bias)[:, 1:])


def test_null_condition_is_learned_and_full_length():
    model = STDiT(SMALL)
    tokens, mask = model.null_condition(3)
    assert tokens.shape == (3, SMALL.caption_len, SMALL.caption_dim) and bool(mask.all())
    assert any(p is model.null_caption for p in model.parameters())
