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

from edge.core.sampler import (
    SamplerSettings,
    StepCache,
    Trace,
    cosine,
    max_calls,
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


def test_leap_tail_replans_the_remaining_time_with_the_schedules_spacing():
    settings = SamplerSettings(steps=30, guidance=1.0, leap=True, leap_after=8, leap_steps=9)
    v = np.tile(curving_then_straight(steps=30)[-1:], (30, 1, 1))  # any 30 velocities
    x, trace = replay_leap(settings, v, NOISE)
    times = trace.times
    ts = timesteps(settings)
    # 8 steps of the schedule, the leap's call, then 8 more: 17 calls
    assert trace.leap_at == 8 and trace.calls == 17 == len(times)
    assert times[:9] == [float(t) for t in ts[:9]]
    tail = np.array(times[8:], np.float64)
    assert tail[-1] == pytest.approx(ts[-2], rel=1e-6)  # ends where the schedule ends
    # evenly spaced before the shift, as the schedule's own steps are
    even = tail / (settings.shift - (settings.shift - 1) * tail)
    np.testing.assert_allclose(np.diff(even), np.diff(even)[0], rtol=1e-5)
    assert np.diff(even)[0] < 0


def test_leap_tail_lands_exactly_on_a_straight_path_with_either_scheduler():
    x0 = np.random.default_rng(1).standard_normal((1, 4, 2, 4, 4), dtype=np.float32)
    noise = np.random.default_rng(2).standard_normal(x0.shape, dtype=np.float32)
    for scheduler in ("flow_euler", "flow_unipc"):
        trace = Trace()
        settings = SamplerSettings(steps=30, guidance=3.0, leap=True, leap_after=5,
                                   leap_steps=4, scheduler=scheduler)
        out = sample(lambda x, t, step: (noise - x0, noise - x0), noise, settings,
                     trace=trace)
        np.testing.assert_allclose(out, x0, atol=1e-5, err_msg=scheduler)
        assert trace.calls == 9 and trace.leap_at == 5


def last_call_flags(settings: SamplerSettings) -> list[bool]:
    """What each call was told of being the generation's last (the step cache's `last`)."""
    lasts = []

    def predict(x, t, step):
        lasts.append(step.last)
        return np.ones_like(x), np.ones_like(x)

    sample(predict, NOISE[None], settings)
    return lasts


def test_leap_tail_tells_the_step_cache_its_last_call():
    # a fixed leap's tail is known in advance: the cache must compute the tail's last call
    settings = SamplerSettings(steps=12, guidance=1.0, leap=True, leap_after=3, leap_steps=4,
                               cache_threshold=1e9)
    assert last_call_flags(settings) == [False] * 6 + [True]


def test_leap_settings_out_of_range_are_refused_by_name():
    with pytest.raises(ValueError, match="leap_steps=0.*at least 1"):
        SamplerSettings(steps=12, leap_steps=0)
    with pytest.raises(ValueError, match="leap_after=0.*at least 1"):
        SamplerSettings(steps=12, leap_after=0)


def test_a_leap_after_the_last_step_never_happens():
    # a package's fixed leap stays valid when a caller asks for fewer steps than it names
    settings = SamplerSettings(steps=6, guidance=1.0, leap=True, leap_after=8, leap_steps=9)
    _, trace = replay_leap(settings, curving_then_straight(), NOISE)
    assert trace.calls == 6 and trace.leap_at is None


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
    ({"leap_after": 0}, "leap_after"), ({"leap_patience": 0}, "leap_patience"),
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

    from edge.core.sampler import Step

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


def test_max_calls_bounds_every_leap():
    for steps in (2, 5, 12):
        for leap_steps in (1, 2, 7, 20):
            for after in [None, *range(1, steps + 2)]:
                settings = SamplerSettings(steps=steps, guidance=1.0, leap=True, leap_after=after,
                                           leap_min_steps=1, leap_patience=1,
                                           leap_steps=leap_steps)
                _, trace = replay_leap(settings, straight(40), NOISE)
                assert trace.calls <= max_calls(settings), (steps, leap_steps, after)
    assert max_calls(SamplerSettings(steps=30, leap=False, leap_steps=50)) == 30


def test_a_leap_that_never_happens_leaves_the_last_call_to_the_schedule():
    settings = SamplerSettings(steps=6, guidance=1.0, leap=True, leap_after=8, leap_steps=9,
                               cache_threshold=1e9)
    assert last_call_flags(settings) == [False] * 5 + [True]


def test_any_leap_option_implies_leap_and_no_leap_still_wins():
    from edge.commands.common import sampler_overrides as _sampler_overrides

    assert _sampler_overrides(leap_steps=4) == {"leap_steps": 4, "leap": True}
    assert _sampler_overrides(leap_after=3) == {"leap_after": 3, "leap": True}
    # a dynamic option asks for the cosine rule over a package's fixed leap
    assert _sampler_overrides(leap_patience=2) == {"leap_patience": 2, "leap_after": None,
                                                   "leap": True}
    assert _sampler_overrides(leap=False, leap_after=3)["leap"] is False
    assert _sampler_overrides(steps=12) == {"steps": 12}
