"""Step leaping (LPL) and the step cache: the sampler's decisions on known trajectories."""
import json

import numpy as np
import pytest
from sampler_fixtures import (
    FIXTURES,
    build,
    curving_then_straight,
    replay_cache,
    replay_leap,
    straight,
)

from edge.sampler import (
    SamplerSettings,
    StepCache,
    Trace,
    cosine,
    modulated_input,
    run_pairs,
    sample,
    timesteps,
)

NOISE = np.array([[1.0, 2.0]], np.float32)


def test_straight_path_leaps_at_min_steps_and_lands_exactly():
    # a perfect velocity model on a straight path: the leap lands on x0 like 30 steps would
    x0 = np.random.default_rng(1).standard_normal((1, 4, 2, 4, 4), dtype=np.float32)
    noise = np.random.default_rng(2).standard_normal(x0.shape, dtype=np.float32)
    trace = Trace()
    settings = SamplerSettings(steps=30, guidance=3.0, leap=True, leap_min_steps=10,
                               leap_patience=3)
    out = sample(lambda x, t, step: (noise - x0, noise - x0), noise, settings, trace=trace)
    np.testing.assert_allclose(out, x0, atol=1e-5)
    assert trace.leap_at == 10 and trace.calls == 11
    assert all(c == pytest.approx(1.0) for c in trace.cosines)


def test_curved_path_does_not_leap_while_cosines_still_rise():
    settings = SamplerSettings(steps=12, guidance=1.0, leap=True, leap_min_steps=2,
                               leap_patience=2, leap_tol=1e-3)
    _, trace = replay_leap(settings, curving_then_straight(bend_until=8), NOISE)
    # cosines rise until call 8; two stale calls later it leaps, not at min_steps
    assert np.all(np.diff(trace.cosines[:8]) > settings.leap_tol)
    assert trace.leap_at == 10 and trace.calls == 11


def test_never_leaps_before_min_steps():
    settings = SamplerSettings(steps=12, guidance=1.0, leap=True, leap_min_steps=7,
                               leap_patience=1)
    _, trace = replay_leap(settings, straight(), NOISE)
    assert trace.leap_at == 7


def test_fixed_leap_takes_the_whole_remaining_time():
    settings = SamplerSettings(steps=12, guidance=1.0, leap=True, leap_after=5)
    v = curving_then_straight()
    x, trace = replay_leap(settings, v, NOISE)
    ts = timesteps(settings)
    want = NOISE[0].astype(np.float64)
    for i in range(5):
        want = want + (ts[i + 1] - ts[i]) * v[i, 0]
    want = want - ts[5] * v[5, 0]
    np.testing.assert_allclose(x[0], want, atol=1e-5)
    assert trace.calls == 6 and trace.leap_at == 5


def test_leap_off_runs_every_step():
    _, trace = replay_leap(SamplerSettings(steps=12, guidance=1.0), straight(), NOISE)
    assert trace.calls == 12 and trace.leap_at is None


def test_state_is_reset_between_generations():
    # a sampler that kept its best cosine across calls would leap at once on the second
    # (straight) generation; each sample() starts afresh
    settings = SamplerSettings(steps=12, guidance=1.0, leap=True, leap_min_steps=2,
                               leap_patience=2)
    _, first = replay_leap(settings, curving_then_straight(bend_until=8), NOISE)
    _, second = replay_leap(settings, curving_then_straight(bend_until=8), NOISE)
    assert first.to_dict() == second.to_dict()
    calls = []

    def predict(x, t, step):
        calls.append(step.cache)
        return x, x

    for _ in range(2):
        sample(predict, NOISE, SamplerSettings(steps=3, cache_threshold=0.5))
    assert calls[0] is calls[1] and calls[0] is not calls[3]


def test_cosine_is_over_the_whole_latent():
    a = np.zeros((2, 3), np.float32)
    b = a.copy()
    a[0, 0], b[0, 0] = 1.0, 1.0
    a[1, 2] = 1.0                      # differs only in the second sample
    assert cosine(a, b) == pytest.approx(1 / np.sqrt(2))


@pytest.mark.parametrize("settings,field", [
    ({"leap_after": 30}, "leap_after"), ({"leap_patience": 0}, "leap_patience"),
    ({"merge_steps": -1}, "merge_steps"), ({"cache_threshold": -0.1}, "cache_threshold")])
def test_bad_settings_are_named(settings, field):
    with pytest.raises(ValueError, match=field):
        SamplerSettings(**settings)


def test_manifest_settings_refuse_unknown_keys():
    assert SamplerSettings.from_dict({"steps": 4, "leap": True}).leap
    with pytest.raises(ValueError, match="leap_pateince"):
        SamplerSettings.from_dict({"leap_pateince": 3})


def test_cache_skips_while_accumulated_change_is_small():
    assert replay_cache(0.12, np.array([[1.0]] * 3 + [[2.0]] + [[2.0]])) == [
        True, False, False, True, True]


def test_run_pairs_reuses_the_residual():
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    t_mod = np.zeros((1, 6, 4), np.float32)
    cache = StepCache(threshold=10.0)
    calls = []

    def pairs(h):
        calls.append(1)
        return h * 2 + 1

    from edge.sampler import Step

    out0, ran0 = run_pairs(Step(0, False, cache, False), x, t_mod, pairs)
    out1, ran1 = run_pairs(Step(1, False, cache, False), x + 0.01, t_mod, pairs)
    assert ran0 and not ran1 and len(calls) == 1
    np.testing.assert_allclose(out1, x + 0.01 + (out0 - x), atol=1e-6)
    out2, ran2 = run_pairs(Step(2, False, cache, True), x, t_mod, pairs)  # last: computes
    assert ran2 and len(calls) == 2


def test_modulated_input_is_layernorm_then_modulation():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 8)).astype(np.float32)
    t_mod = np.random.default_rng(1).standard_normal((2, 6, 8)).astype(np.float32)
    ln = torch.nn.functional.layer_norm(torch.from_numpy(x), (8,), eps=1e-6).numpy()
    want = ln * (1 + t_mod[:, 1, None, None]) + t_mod[:, 0, None, None]
    np.testing.assert_allclose(modulated_input(x, t_mod), want, atol=1e-5)


def test_fixtures_for_other_runtimes_match_this_sampler():
    for name, data in build().items():
        stored = json.loads((FIXTURES / f"{name}.json").read_text())
        assert stored["expected"] == json.loads(json.dumps(data["expected"])), name
