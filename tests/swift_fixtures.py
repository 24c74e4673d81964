"""JSON fixtures for the Swift runtime's XCTests (runtimes/swift/Tests), written from the
Python implementation so both runtimes are held to the same numbers.

    python tests/swift_fixtures.py                       # sampler + tokenizer fixtures
    python tests/swift_fixtures.py --manifest dist/tiny-sora-iphone   # + manifest examples

Besides tests/fixtures/sampler/*.json (tests/sampler_fixtures.py: leap and step cache),
tests/fixtures/swift/ holds:

- timesteps.json: `timesteps(settings)` for several settings;
- guided_merge.json: whole `sample()` runs with guidance (cond != uncond), TDTM
  `merge_steps` and a fixed leap: per call t, merged, last; final latent and trace;
- modulated_input.json: the step cache indicator of a small (x, t_mod);
- tokenizer.json + tokens.json: the package's tokenizer file and the ids and masks that
  `edge.tokenizer` makes of a few prompts (punctuation, capitals, accents, unknown words,
  truncation);
- manifest_iphone.json, manifest_bad_version.json: an `edge export --target iphone`
  manifest, and one a runtime must refuse.

tests/test_coreml_export.py checks that the files on disk are what this script writes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import warnings
from pathlib import Path

import numpy as np

from edge.sampler import SamplerSettings, Trace, modulated_input, sample, timesteps
from edge.tokenizer import load_tokenizer, tokenize

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


def build() -> dict[str, object]:
    """File name -> JSON content of every generated fixture (the manifests excepted)."""
    return {"timesteps.json": timestep_cases(), "guided_merge.json": guided_runs(),
            "modulated_input.json": modulated_case(),
            "tokens.json": token_cases(default_tokenizer())}


def manifest_fixtures(manifest: dict) -> dict[str, dict]:
    bad = json.loads(json.dumps(manifest))
    bad["format_version"] = 2
    return {"manifest_iphone.json": manifest, "manifest_bad_version.json": bad}


def write(files: dict[str, object]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (FIXTURES / name).write_text(json.dumps(data, indent=1) + "\n")
        print(FIXTURES / name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="an iphone package folder")
    args = parser.parse_args()
    files = build()
    if args.manifest:
        files |= manifest_fixtures(json.loads((args.manifest / "manifest.json").read_text()))
    write(files)
    shutil.copy(default_tokenizer(), FIXTURES / "tokenizer.json")
