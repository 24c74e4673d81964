"""Distilled recipes: how a step- and guidance-distilled checkpoint is sampled (its steps,
guidance, noise levels, shift and flow scheduler), written into a package as its defaults by
`edge export --recipe NAME|FILE`, so `edge generate PKG "prompt"` samples it as it was
distilled to be sampled, and nobody retypes the numbers on every run.

A recipe names the values its source gives: a named one here (each with where its numbers
come from), or a JSON file with the same fields. Light: no torch, so the command line reads
it at start. Explicit `--steps`/`--sigmas` still win over a recipe's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from edge.core.sampler import SamplerSettings

FLOW_SCHEDULERS = ("flow_euler", "flow_unipc")   # what a recipe may ask a flow model for


class RecipeError(ValueError):
    """A recipe edge cannot use; the message names the recipe, file or field."""


@dataclass(frozen=True)
class Recipe:
    name: str
    steps: int
    guidance: float                        # 1: no classifier-free guidance (distilled away)
    source: str                            # where the numbers come from
    sigmas: tuple[float, ...] | None = None   # noise levels before the shift, one a step
    shift: float | None = None             # None: the folder's own
    scheduler: str | None = None           # None: the folder's own; else a FLOW_SCHEDULERS

    def sampler(self, own: SamplerSettings) -> SamplerSettings:
        """`own` (the folder's sampler) as this recipe samples, checked as the runtimes check
        it; refused naming the recipe."""
        from edge.core.options import check_settings

        if self.scheduler is not None and not own.scheduler.startswith("flow_"):
            raise RecipeError(f"recipe {self.name}: asks for the {self.scheduler} scheduler, "
                              f"but the model samples with {own.scheduler} (not a flow model)")
        changed = {"steps": self.steps, "guidance": self.guidance, "sigmas": self.sigmas,
                   "leap_min_steps": max(1, self.steps // 2)}
        changed |= {k: getattr(self, k) for k in ("shift", "scheduler")
                    if getattr(self, k) is not None}
        try:
            return check_settings(replace(own, **changed))
        except ValueError as err:
            raise RecipeError(f"recipe {self.name}: {err}") from None

    def summary(self) -> str:
        given = {k: v for k, v in asdict(self).items()
                 if k not in ("name", "source") and v is not None}
        values = ", ".join(f"{k} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
                           for k, v in given.items())
        return f"recipe {self.name} ({self.source}): {values}"


# LightX2V's 4-step Wan 2.1 distillation (step and guidance distilled, Self-Forcing/DMD): its
# configs/distill/wan_t2v_distill_4step_cfg.json samples denoising_step_list [1000, 750,
# 500, 250] with sample_shift 5 and enable_cfg false, and its WanStepDistillScheduler steps
# x + (sigma_next - sigma) v from each shifted level to the next, then to 0: flow-match
# Euler through the levels t/1000, shifted as diffusers' FlowMatchEulerDiscreteScheduler
# shifts given sigmas.
NAMED = {
    "lightx2v-4step": Recipe(
        "lightx2v-4step", steps=4, guidance=1.0, sigmas=(1.0, 0.75, 0.5, 0.25), shift=5.0,
        scheduler="flow_euler",
        source="LightX2V's Wan2.1 T2V StepDistill-CfgDistill (and its LoRA): "
               "wan_t2v_distill_4step_cfg.json"),
}
FIELDS = {f.name for f in fields(Recipe)} - {"name"}


def recipe_from(value: str | Recipe) -> Recipe:
    """A named recipe, or one read from a JSON file of Recipe's fields (`source` optional);
    anything else refused naming the name, file or field."""
    if isinstance(value, Recipe):
        return value
    if value in NAMED:
        return NAMED[value]
    path = Path(value).expanduser()
    if not path.is_file():
        raise RecipeError(f"{value!r}: not a recipe name ({', '.join(NAMED)}) nor a JSON file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecipeError(f"{path}: not a JSON recipe ({err})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a JSON object of {', '.join(sorted(FIELDS))}")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise RecipeError(f"{path}: unknown field(s) {', '.join(unknown)}; a recipe has "
                          f"{', '.join(sorted(FIELDS))}")
    missing = sorted({"steps", "guidance"} - set(data))
    if missing:
        raise RecipeError(f"{path}: no {' or '.join(missing)}")
    return _checked_fields(path, {"source": str(path)} | data)


def _checked_fields(path: Path, data: dict) -> Recipe:
    kinds = {"steps": int, "guidance": float, "shift": float, "source": str, "scheduler": str}
    for key, kind in kinds.items():
        value = data.get(key)
        if value is None:
            continue
        ok = (isinstance(value, int) and not isinstance(value, bool) if kind is int else
              isinstance(value, int | float) and not isinstance(value, bool)
              if kind is float else isinstance(value, str))
        if not ok:
            raise RecipeError(f"{path}: {key}={value!r}; give a{'n' * (kind is int)} "
                              f"{kind.__name__}")
        if kind is float:
            data = data | {key: float(value)}
    if data.get("scheduler") not in (None, *FLOW_SCHEDULERS):
        raise RecipeError(f"{path}: scheduler={data['scheduler']!r}; one of "
                          f"{', '.join(FLOW_SCHEDULERS)}")
    sigmas = data.get("sigmas")
    if sigmas is not None:
        if not (isinstance(sigmas, list) and all(isinstance(s, int | float)
                                                 and not isinstance(s, bool) for s in sigmas)):
            raise RecipeError(f"{path}: sigmas={sigmas!r}; give a list of noise levels")
        if len(sigmas) != data["steps"]:
            raise RecipeError(f"{path}: {len(sigmas)} sigmas for steps={data['steps']}; one "
                              "level a step")
        data = data | {"sigmas": tuple(float(s) for s in sigmas)}
    return Recipe(name=path.name, **{k: v for k, v in data.items() if k != "name"})
