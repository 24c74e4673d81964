"""JSON fixtures for the Swift runtime's XCTests (runtimes/swift/Tests), written from the
Python implementation so both runtimes are held to the same numbers.

    python tests/swift_fixtures.py                       # sampler + tokenizer fixtures
    python tests/swift_fixtures.py --manifest dist/tiny-sora-iphone   # + manifest examples
    python tests/swift_fixtures.py --train-unigram   # remake unigram/umt5_like_tokenizer.json
    python tests/swift_fixtures.py --check-tokenizer T.json --out /tmp/check.json
                                          # ids of many captions, for EDGE_TOKENIZER_CHECK

Besides tests/fixtures/sampler/*.json (tests/sampler_fixtures.py: leap and step cache),
tests/fixtures/swift/ holds:

- timesteps.json: `timesteps(settings)` for several settings;
- guided_merge.json: whole `sample()` runs with guidance (cond != uncond), TDTM
  `merge_steps` and a fixed leap: per call t, merged, last; final latent and trace;
- modulated_input.json: the step cache indicator of a small (x, t_mod);
- unipc.json: the `flow_unipc` scheduler (Wan 2.1): `timesteps` and `model_times` for several
  settings; whole `sample()` runs with guidance, merge_steps, fixed and dynamic leaps (one
  step and a re-planned tail): per call t (the model time), merged, last; final latent and
  trace; and 2x2 systems with what `np.linalg.solve` gives (UniPC's corrector solves one);
- dynamic_guidance.json: CogVideoX's dynamic guidance (`dynamic_guidance` on
  `cogvideox_ddim`): the scale `dynamic_guidance(guidance, timestep, steps)` gives (float64)
  for every timestep of several step counts, and whole `sample()` runs with it (fixed
  velocities, cond != uncond; merge_steps, a fixed and a dynamic leap, a guidance of 1, and
  the fixed scale for contrast): per call t, merged, last; final latent and trace;
- guidance_rescale.json: whole `sample()` runs with `guidance_rescale` (LTX's schedule with
  a re-planned leap and merge_steps, flow_euler fully rescaled, CogVideoX's dynamic guidance
  with a rescale, UniPC): per call t, merged, last; final latent and trace;
- schedulers.json: each scheduler of `edge.core.schedulers.SCHEDULERS` as an object, by name (the
  JS and Swift runtimes look theirs up the same way): for several (steps, shift, training
  steps, shift_terminal: 0.1 for a scheduler that takes one, else null; ltx_flow_euler also
  at LTX-Video's shifts exp(mu) and without a terminal; the flows also through `given`
  noise levels, SamplerSettings.sigmas), its `schedule` (noise levels, model times), a
  leap's `tail`, a `solver` stepped through the schedule with given velocities
  (the sample after each step) and its `jump`;
- tiles.json: a decoder's tiles (edge/core/tiles.py): for a few tilings, random decoded
  tiles in starts order, the tiles' sizes, each size's variant names and the blend;
- tokenizer.json + tokens.json: the package's tokenizer file and the ids and masks that
  `edge.core.tokenizer` makes of a few prompts (punctuation, capitals, accents, unknown words,
  truncation);
- unigram/: the Unigram (T5 / UMT5, Wan 2.1) tokenizers, captions, their ids and masks,
  and prompt-cleaner cases (tests/swift_unigram_fixtures.py says which and how);
- manifest_iphone.json, manifest_bad_version.json: an `edge export --target iphone`
  manifest, and one a runtime must refuse.

tests/test_coreml_export.py checks that the files on disk are what this script writes.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
from swift_unigram_fixtures import build_unigram, check_cases, train_umt5_like

from edge.core.sampler import (
    SamplerSettings,
    Trace,
    dynamic_guidance,
    max_calls,
    model_times,
    modulated_input,
    sample,
    timesteps,
)
from edge.core.schedulers import SCHEDULERS, UniPCFlow, ltx_mu, scheduler_for, unipc_sigmas
from edge.core.tokenizer import load_tokenizer, tokenize

FIXTURES = Path(__file__).parent / "fixtures" / "swift"
MAX_TOKENS = 16
PROMPTS = ["a red circle moving left", "A Violet BALL, drifting to the left!",
           "the café's crème square slides up", "zyxwvut qqqq moving",
           "a very small green triangle moving slowly up and then down across the whole "
           "frame twice"]


def timestep_cases() -> list[dict]:
    cases = [SamplerSettings(), SamplerSettings(steps=1), SamplerSettings(steps=7, shift=1.0),
             SamplerSettings(steps=12, shift=2.5, num_train_timesteps=500)]
    return [{"settings": s.to_dict(), "timesteps": timesteps(s).tolist()} for s in cases]


def guided_runs() -> list[dict]:
    """Velocity sequences with cond != uncond, replayed through `sample()`."""
    rng = np.random.default_rng(7)
    steps = 8
    cond = rng.standard_normal((steps, 1, 2, 3)).astype(np.float32)
    uncond = rng.standard_normal((steps, 1, 2, 3)).astype(np.float32)
    noise = rng.standard_normal((1, 2, 3)).astype(np.float32)
    runs = []
    for settings in (SamplerSettings(steps=steps, guidance=4.5, merge_steps=3),
                     SamplerSettings(steps=steps, guidance=2.0, leap=True, leap_after=5,
                                     merge_steps=2)):
        calls: list[dict] = []

        def predict(x, t, step, calls=calls):
            calls.append({"index": step.index, "t": t, "merged": step.merged,
                          "last": step.last})
            return cond[step.index][None], uncond[step.index][None]

        trace = Trace()
        x = sample(predict, noise[None], settings, trace=trace)
        runs.append({"settings": settings.to_dict(), "noise": noise.tolist(),
                     "cond": cond.tolist(), "uncond": uncond.tolist(),
                     "expected": {"calls": calls, "latent": x[0].tolist(),
                                  "trace": trace.to_dict()}})
    return runs


def modulated_case() -> dict:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    t_mod = rng.standard_normal((2, 6, 4)).astype(np.float32)
    return {"x": x.tolist(), "t_mod": t_mod.tolist(),
            "expected": modulated_input(x, t_mod).tolist()}


def unipc_timestep_cases() -> list[dict]:
    cases = [SamplerSettings(scheduler="flow_unipc", steps=steps, shift=shift)
             for steps in (1, 2, 3, 8, 30) for shift in (3.0, 5.0)]
    cases += [SamplerSettings(scheduler="flow_unipc", steps=50, shift=1.0),
              SamplerSettings(scheduler="flow_unipc", steps=12, shift=2.5,
                              num_train_timesteps=500)]
    return [{"settings": s.to_dict(), "timesteps": timesteps(s).tolist(),
             "model_times": model_times(s).tolist()} for s in cases]


def unipc_settings() -> dict[str, SamplerSettings]:
    def unipc(**kw) -> SamplerSettings:
        return SamplerSettings(scheduler="flow_unipc", **kw)

    dynamic = {"leap": True, "leap_min_steps": 8, "leap_patience": 2, "leap_tol": 1e-3}
    return {
        "steps1": unipc(steps=1, guidance=5.0),
        "steps2_shift5": unipc(steps=2, shift=5.0, guidance=3.0),
        "steps3_merge": unipc(steps=3, guidance=4.5, merge_steps=1),
        "steps8_shift5_merge": unipc(steps=8, shift=5.0, guidance=5.0, merge_steps=3),
        "steps30": unipc(steps=30, guidance=5.0),
        "steps30_shift5_merge": unipc(steps=30, shift=5.0, guidance=6.0, merge_steps=10),
        "steps12_n500": unipc(steps=12, shift=2.5, guidance=4.0, num_train_timesteps=500),
        "fixed_leap_one_step": unipc(steps=8, guidance=4.0, leap=True, leap_after=4,
                                     merge_steps=2),
        "fixed_leap_tail2": unipc(steps=8, shift=5.0, guidance=5.0, leap=True, leap_after=2,
                                  leap_steps=2),
        "fixed_leap_tail6": unipc(steps=30, shift=5.0, guidance=5.0, leap=True,
                                  leap_after=10, leap_steps=6, merge_steps=4),
        # a tail longer than the steps it replaces
        "fixed_leap_long_tail": unipc(steps=3, guidance=3.5, leap=True, leap_after=1,
                                      leap_steps=5),
        # a leap after steps - 1 steps never happens
        "fixed_leap_too_late": unipc(steps=8, guidance=5.0, leap=True, leap_after=7,
                                     leap_steps=3),
        "dynamic_leap_one_step": unipc(steps=30, guidance=5.0, **dynamic),
        "dynamic_leap_tail4": unipc(steps=30, shift=5.0, guidance=5.0, leap_steps=4,
                                    merge_steps=3, **dynamic),
    }


def unipc_velocities(settings: SamplerSettings, shape: tuple[int, ...], seed: int):
    """Noise and (cond, uncond) for every call the settings can make: guided velocities that
    point from a fixed x0 to the noise, plus a perturbation that fades call by call (so
    consecutive cosines level off and a dynamic leap comes), cond != uncond."""
    rng = np.random.default_rng(seed)
    calls = max_calls(settings)
    noise = rng.standard_normal(shape).astype(np.float32)
    x0 = 0.5 * rng.standard_normal(shape)
    fade = 0.4 * 0.6 ** np.arange(calls)
    wobble = rng.standard_normal((calls, *shape)) * fade.reshape(-1, *(1,) * len(shape))
    v = (noise - x0)[None] + wobble
    uncond = v + 0.3 * rng.standard_normal((calls, *shape))
    cond = uncond + (v - uncond) / settings.guidance
    return noise, cond.astype(np.float32), uncond.astype(np.float32)


def replay_runs(named: dict[str, SamplerSettings], seed: int) -> list[dict]:
    """Velocity sequences (unipc_velocities, run k seeded seed + k) replayed through
    `sample()`: per call index, model time, merged, last; final latent and trace."""
    runs = []
    for k, (name, settings) in enumerate(named.items()):
        noise, cond, uncond = unipc_velocities(settings, (2, 2, 3), seed + k)
        calls: list[dict] = []

        def predict(x, t, step, calls=calls, cond=cond, uncond=uncond):
            calls.append({"index": step.index, "t": t, "merged": step.merged,
                          "last": step.last})
            return cond[step.index][None], uncond[step.index][None]

        trace = Trace()
        x = sample(predict, noise[None], settings, trace=trace)
        if name.startswith("dynamic"):
            assert trace.leap_at is not None, name
        runs.append({"name": name, "settings": settings.to_dict(), "noise": noise.tolist(),
                     "cond": cond.tolist(), "uncond": uncond.tolist(),
                     "expected": {"calls": calls, "latent": x[0].tolist(),
                                  "trace": trace.to_dict()}})
    return runs


def unipc_runs() -> list[dict]:
    """Velocity sequences replayed through `sample()` with flow_unipc."""
    return replay_runs(unipc_settings(), 100)


def dynamic_guidance_settings() -> dict[str, SamplerSettings]:
    def cog(**kw) -> SamplerSettings:
        return SamplerSettings(scheduler="cogvideox_ddim", dynamic_guidance=True, **kw)

    return {
        "steps8": cog(steps=8, guidance=6.0),
        # CogVideoXPipeline's defaults: 50 steps, guidance 6
        "steps50": cog(steps=50, guidance=6.0),
        # a stride (1000 // 7) that does not land on the next timestep; SNR shift 1
        "steps7_shift1_merge": cog(steps=7, shift=1.0, guidance=7.5, merge_steps=2),
        "steps12_n500": cog(steps=12, guidance=5.0, num_train_timesteps=500),
        # the jump is guided as the step it replaces
        "fixed_leap": cog(steps=12, guidance=6.0, leap=True, leap_after=5),
        "dynamic_leap": cog(steps=30, guidance=6.0, leap=True, leap_min_steps=8,
                            leap_patience=2, leap_tol=1e-3),
        # at or below 1 the plain scale (diffusers runs no guidance there)
        "guidance1": cog(steps=8, guidance=1.0),
        "fixed_scale": SamplerSettings(scheduler="cogvideox_ddim", steps=8, guidance=6.0),
    }


# (steps, training steps, guidance) of the scale table: every timestep of each schedule,
# 1000 steps covering 999 down to 0
DYNAMIC_SCALES = [(1, 1000, 6.0), (2, 1000, 6.0), (3, 1000, 7.5), (7, 1000, 6.0),
                  (8, 1000, 1.5), (13, 1000, 6.0), (20, 1000, 6.0), (50, 1000, 6.0),
                  (50, 1000, 7.5), (12, 500, 5.0), (1000, 1000, 6.0)]


def dynamic_guidance_cases() -> dict:
    scales = []
    for steps, n, guidance in DYNAMIC_SCALES:
        ts = scheduler_for("cogvideox_ddim", 3.0, n).timesteps(steps).tolist()
        scales.append({"steps": steps, "num_train_timesteps": n, "guidance": guidance,
                       "timesteps": ts,
                       "scales": [dynamic_guidance(guidance, t, steps) for t in ts]})
    return {"scales": scales, "runs": replay_runs(dynamic_guidance_settings(), 300)}


def guidance_rescale_settings() -> dict[str, SamplerSettings]:
    return {
        "ltx_leap_tail_merge": SamplerSettings(
            scheduler="ltx_flow_euler", steps=8, shift=2.05, shift_terminal=0.1, guidance=3.0,
            guidance_rescale=0.7, leap=True, leap_after=3, leap_steps=2, merge_steps=2),
        "euler_whole": SamplerSettings(steps=6, guidance=5.0, guidance_rescale=1.0),
        "ddim_dynamic": SamplerSettings(scheduler="cogvideox_ddim", steps=8, guidance=6.0,
                                        dynamic_guidance=True, guidance_rescale=0.5),
        "unipc_dynamic_leap": SamplerSettings(
            scheduler="flow_unipc", steps=30, guidance=5.0, guidance_rescale=0.3, leap=True,
            leap_min_steps=8, leap_patience=2, leap_tol=1e-3),
    }


def solve_cases() -> list[dict]:
    """2x2 float32 systems and np.linalg.solve's answers: UniPC's [[1, 1], [rk, 1]] with the
    rk and b of a 30-step run's corrector steps, random ones of that shape on both sides of
    |rk| = 1 (partial pivoting swaps the rows above it), and general ones."""
    rng = np.random.default_rng(11)
    systems = []
    solver = UniPCFlow(unipc_sigmas(30, 5.0, 1000))
    for i in range(2, 30):
        h = solver._coefficients(i - 1, i)[3]
        systems.append(([[1.0, 1.0], [solver._rk(i - 2, i - 1, h), 1.0]], solver._b_terms(h, 2)))
    for rk in [-1.0, 1.5, -0.5, -2.0, 0.25,
               *-np.exp(rng.normal(0.0, 1.5, 40)), *rng.uniform(-3.0, 3.0, 20)]:
        systems.append(([[1.0, 1.0], [rk, 1.0]], rng.standard_normal(2)))
    for _ in range(20):
        systems.append((rng.standard_normal((2, 2)), rng.standard_normal(2)))
    out = []
    for a, b in systems:
        a32, b32 = np.array(a, np.float32), np.array(b, np.float32)
        out.append({"a": a32.tolist(), "b": b32.tolist(),
                    "x": np.linalg.solve(a32, b32).tolist()})
    return out


def ltx_shift(tokens: int) -> float:
    """The manifest shift exp(mu) of LTX-Video 0.9.x's scheduler config at `tokens` tokens."""
    return math.exp(ltx_mu(tokens, 1024, 4096, 0.95, 2.05))


# given noise levels (SamplerSettings.sigmas) the schedulers that take them are held to
GIVEN_LEVELS = ((1.0, 0.9937, 0.9875, 0.975, 0.9094, 0.725, 0.4219), (0.95, 0.6, 0.3, 0.1),
                (0.7,))


def scheduler_cases() -> list[dict]:
    """Each scheduler through its interface alone, so a mirror is held to it before any
    sampler logic: schedule, tail, solver steps on fixed velocities, jump."""
    rng = np.random.default_rng(23)
    cases = []
    # (steps, shift, training steps, shift_terminal) beyond the common ones
    extra = {"ltx_flow_euler": [(20, ltx_shift(7392), 1000, 0.1, None),
                                (8, ltx_shift(1024), 1000, None, None)]}
    for name, cls in SCHEDULERS.items():
        terminal = 0.1 if cls.takes_shift_terminal else None
        common = [(steps, shift, n, terminal, None) for steps, shift, n in (
            (1, 3.0, 1000), (2, 5.0, 1000), (7, 1.0, 1000), (12, 2.5, 500), (30, 5.0, 1000))]
        if cls.takes_sigmas:  # given levels: from 1, below 1, one alone
            common += [(len(g), shift, 1000, terminal, g) for shift, g in (
                (3.0, GIVEN_LEVELS[0]), (5.0, GIVEN_LEVELS[1]), (1.0, GIVEN_LEVELS[2]))]
        for steps, shift, n, shift_terminal, given in common + extra.get(name, []):
            scheduler = scheduler_for(name, shift, n, shift_terminal)
            sigmas, times = scheduler.schedule(steps, given)
            x = rng.standard_normal((2, 3)).astype(np.float32)
            v = rng.standard_normal((steps, 2, 3)).astype(np.float32)
            solver, xs = scheduler.solver(sigmas), [x]
            for i in range(steps):
                xs.append(solver.step(v[i], i, xs[-1]))
            xs = [a.tolist() for a in xs[1:]]
            t_from = float(sigmas[steps // 2])
            tail = None  # a scheduler without a re-planned tail leaps in one jump
            if scheduler.leap_tail:
                tail_sigmas, tail_times = scheduler.tail(t_from, float(sigmas[-2]), 3)
                tail = {"t_from": t_from, "t_min": float(sigmas[-2]), "steps": 3,
                        "sigmas": tail_sigmas.tolist(), "model_times": tail_times.tolist()}
            cases.append({"scheduler": name, "shift": shift, "num_train_timesteps": n,
                          "shift_terminal": shift_terminal, "steps": steps,
                          "given": None if given is None else list(given),
                          "sigmas": sigmas.tolist(), "model_times": times.tolist(),
                          "x": x.tolist(), "v": v.tolist(), "solver_steps": xs, "tail": tail,
                          "jump": {"sigma": t_from,
                                   "x": scheduler.jump(x, v[0], t_from).tolist()}})
    return cases


def unipc_cases() -> dict:
    return {"timesteps": unipc_timestep_cases(), "runs": unipc_runs(), "solve": solve_cases()}


def token_cases(tokenizer_json: Path) -> dict:
    tok = load_tokenizer(tokenizer_json, MAX_TOKENS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the long prompt is truncated on purpose
        ids, mask = tokenize(tok, PROMPTS)
    return {"max_tokens": MAX_TOKENS, "prompts": PROMPTS, "input_ids": ids.tolist(),
            "attention_mask": mask.tolist()}


def default_tokenizer() -> Path:
    from edge.models.text_encoder import minilm_dir

    return minilm_dir() / "tokenizer.json"


def tile_cases() -> list[dict]:
    """Decoded tiles (random, lead x h x w) of a few tilings, in starts order, and what
    edge.core.tiles gives of them: the tiles' sizes and each size's variant names
    (manifest_schema.tile_variant), and the blended output."""
    from edge.core.manifest_schema import tile_variant
    from edge.core.tiles import BlendedTiles, Tiling

    rng = np.random.default_rng(11)
    cases = []
    for size, stride, scale, (h, w), lead in [((3, 3), (2, 2), 2, (4, 7), 2),
                                              ((2, 4), (2, 2), 3, (2, 6), 1),
                                              ((4, 2), (3, 2), 1, (10, 3), 3)]:
        tiling = Tiling(size, stride, scale)
        rows, cols = tiling.starts(h, w)
        tiles, blended = [], BlendedTiles(tiling, h, w)
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                th, tw = min(size[0], h - r) * scale, min(size[1], w - c) * scale
                tile = rng.standard_normal((lead, th, tw)).astype(np.float32)
                tiles.append({"i": i, "j": j, "h": th, "w": tw,
                              "values": tile.ravel().tolist()})
                blended.add(i, j, tile.copy())
        sizes = tiling.tile_sizes(h, w)
        cases.append({"tiling": tiling.to_dict(), "height": h, "width": w, "lead": lead,
                      "applies": tiling.applies(h, w), "sizes": [list(s) for s in sizes],
                      "variants": [[tile_variant(v, s, sizes[0]) for v in (None, "first")]
                                   for s in sizes],
                      "tiles": tiles, "output": blended.output.ravel().tolist()})
    return cases


def build() -> dict[str, object]:
    """File name -> JSON content of every generated fixture (the manifests excepted)."""
    return {"timesteps.json": timestep_cases(), "guided_merge.json": guided_runs(),
            "modulated_input.json": modulated_case(), "unipc.json": unipc_cases(),
            "dynamic_guidance.json": dynamic_guidance_cases(),
            "guidance_rescale.json": {"runs": replay_runs(guidance_rescale_settings(), 400)},
            "schedulers.json": scheduler_cases(), "tiles.json": tile_cases(),
            "tokens.json": token_cases(default_tokenizer()), **build_unigram()}


def manifest_fixtures(manifest: dict) -> dict[str, dict]:
    bad = json.loads(json.dumps(manifest))
    bad["format_version"] = 2
    return {"manifest_iphone.json": manifest, "manifest_bad_version.json": bad}


def write(files: dict[str, object]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (FIXTURES / name).parent.mkdir(parents=True, exist_ok=True)
        (FIXTURES / name).write_text(json.dumps(data, indent=1) + "\n")
        print(FIXTURES / name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="an iphone package folder")
    parser.add_argument("--train-unigram", action="store_true",
                        help="retrain unigram/umt5_like_tokenizer.json (needs sentencepiece)")
    parser.add_argument("--check-tokenizer", type=Path,
                        help="write the ids of many captions with this tokenizer.json to --out")
    parser.add_argument("--pad-token", default="<pad>", help="with --check-tokenizer")
    parser.add_argument("--out", type=Path, help="with --check-tokenizer")
    args = parser.parse_args()
    if args.check_tokenizer:
        args.out.write_text(json.dumps(check_cases(args.check_tokenizer, args.pad_token)))
        raise SystemExit(print(args.out))
    if args.train_unigram:
        train_umt5_like()
    files = build()
    if args.manifest:
        files |= manifest_fixtures(json.loads((args.manifest / "manifest.json").read_text()))
    write(files)
    shutil.copy(default_tokenizer(), FIXTURES / "tokenizer.json")
