"""What several commands share: the sampler options (step leaping, token merging, the step
cache, guidance), sizes and destinations checked before any work, the loaders of the PyTorch
reference and of a package, progress bars and table cells. Heavy imports happen inside the
functions so `edge --help` stays instant and the base install (no torch) runs the package
commands."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from edge.core.console import echo, fail
from edge.core.files import printable
from edge.core.manifest_schema import MANIFEST

WeightsOption = Annotated[Path | None, typer.Option(
    "--weights", help="tiny-sora weights folder [default: the one shipped in the package]",
    exists=True, file_okay=False)]

# Step leaping, token merging and the step cache (edge/core/sampler.py); None: the model's default
LeapOption = Annotated[bool | None, typer.Option(
    "--leap/--no-leap", help="Linear Proportional Leap: after --leap-after steps (or, with "
    "the dynamic options, once consecutive velocities stop aligning better) finish in "
    "--leap-steps steps [default: off].")]
LeapAfterOption = Annotated[int | None, typer.Option(
    min=1, help="Fixed leap: leap after this many steps (implies --leap) [default: the "
    "model's; tiny-sora: 6].")]
LeapMinStepsOption = Annotated[int | None, typer.Option(
    min=1, help="Dynamic leap (this or --leap-patience/--leap-tol asks for the cosine rule; "
    "implies --leap): never before this many steps [default: 15].")]
LeapPatienceOption = Annotated[int | None, typer.Option(
    min=1, help="Dynamic leap: after this many steps without a better cosine [default: 3].")]
LeapTolOption = Annotated[float | None, typer.Option(
    min=0, help="Dynamic leap: a better cosine must gain more than this [default: 1e-3].")]
LeapStepsOption = Annotated[int | None, typer.Option(
    min=1, help="Leap (implies --leap): steps from the leap to the end, spaced as the "
    "schedule spaces its own; 1 is one step straight to the end [default: the model's; "
    "tiny-sora: 10].")]
MergeStepsOption = Annotated[int | None, typer.Option(
    min=0, help="Temporal token merging (TDTM) for the first N steps, e.g. 15 = the first "
    "half of 30 [default: 0, off].")]
CacheOption = Annotated[float | None, typer.Option(
    min=0, help="Step cache: skip the transformer while the first block's input changed "
    "less than this in total, e.g. 0.1 [default: 0, off].")]
GuidanceStepsOption = Annotated[int | None, typer.Option(
    min=0, help="Guidance cutoff: classifier-free guidance for the first K steps, then the "
    "conditional prediction alone (a batch of one: half the transformer work a step) "
    "[default: every step; none at --guidance 1 or below].")]
GuidanceRescaleOption = Annotated[float | None, typer.Option(
    min=0.0, max=1.0, help="LTXPipeline's guidance_rescale: mix each step's guided velocity "
    "with itself rescaled to the conditional velocity's spread (0: off) [default: the "
    "package's].")]
DynamicGuidanceOption = Annotated[bool | None, typer.Option(
    "--dynamic-guidance/--no-dynamic-guidance", help="CogVideoX's dynamic classifier-free "
    "guidance (CogVideoXPipeline's use_dynamic_cfg): each step's scale from its timestep; "
    "cogvideox_ddim packages only [default: the package's].")]


def parse_sigmas(text: str | None) -> tuple[float, ...] | None:
    """--sigmas as a tuple of numbers (commas between them)."""
    from edge.core.sampler import levels_from_text

    if text is None:
        return None
    try:
        return levels_from_text(text)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


SigmasOption = Annotated[str | None, typer.Option(
    callback=parse_sigmas, help="Given noise levels, one a step (sets --steps), falling in "
    "(0, 1], e.g. a distilled model's 1,0.94,0.75,0.4: the schedule's own spacing replaced as "
    "diffusers' set_timesteps(sigmas=...) replaces it (shifted as the schedule shifts its "
    "own); flow schedulers only (not CogVideoX's DDIM) [default: the model's spacing].")]


# the sampler options `generate` and `record` both take, declared once; each command takes
# them after its own (edge/commands/declared.py with_options) and hands them on as **sampler
SAMPLER_OPTIONS = {
    "leap": LeapOption, "leap_after": LeapAfterOption, "leap_min_steps": LeapMinStepsOption,
    "leap_patience": LeapPatienceOption, "leap_tol": LeapTolOption,
    "leap_steps": LeapStepsOption, "merge_steps": MergeStepsOption,
    "cache_threshold": CacheOption, "guidance_steps": GuidanceStepsOption,
    "sigmas": SigmasOption, "dynamic_guidance": DynamicGuidanceOption,
    "guidance_rescale": GuidanceRescaleOption,
}


def sampler_overrides(**values) -> dict:
    """The sampler settings given on the command line (None: not given)."""
    out = {k: v for k, v in values.items() if v is not None}
    if {"leap_min_steps", "leap_patience", "leap_tol"} & set(out) and "leap_after" not in out:
        out["leap_after"] = None  # a dynamic option asks for the dynamic rule
    if {"leap_after", "leap_steps", "leap_min_steps", "leap_patience", "leap_tol"} & set(out):
        out.setdefault("leap", True)  # any leap option implies --leap (--no-leap still wins)
    return out


def preset_options(name: str, defaults, manifest: dict | None, given: dict) -> dict:
    """--preset NAME as sampler overrides for these package defaults with the step count the
    user gave (`given`: the command line's overrides; --steps or --sigmas set the steps the
    preset's rules scale to) (`manifest`: the package's, for whether it has merged variants;
    None: the PyTorch reference, which merges); an unknown name ends the command naming the
    known ones."""
    from edge.core.presets import preset_overrides

    merges = manifest is None or any(
        "tdtm" in b.get("variants", {}) for c in manifest["components"]
        if c["name"] == "transformer" for b in c["blocks"])
    steps = checked_settings(defaults, {k: v for k, v in given.items()
                                        if k in ("steps", "sigmas")})
    try:
        return preset_overrides(name, steps, merges)
    except ValueError as err:
        fail(str(err))


def load_reference_pipeline(weights: Path | None):
    """tiny-sora's PyTorch pipeline (the [export] extra), from `weights` or the shipped ones."""
    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora
    from edge.models.tiny_sora_folder import WeightsFolderError

    try:
        return TinySora.load(weights or DEFAULT_WEIGHTS)
    except WeightsFolderError as err:
        fail(str(err))


def reference_sampler(weights: Path | None):
    """The sampler defaults of a tiny-sora weights folder (or the shipped one's)."""
    from edge.models.tiny_sora import DEFAULT_WEIGHTS, load_sampler
    from edge.models.tiny_sora_folder import WeightsFolderError

    try:
        return load_sampler(weights or DEFAULT_WEIGHTS)
    except WeightsFolderError as err:
        fail(str(err))


def load_runtime(package: Path, budget: int | None, threads: int | None = None):
    """An exported package in the Python runtime (no torch); a bad one ends the command.
    `threads`: onnxruntime's threads a block call (default: its own choice, one a core)."""
    from edge.core.package import PackageError
    from edge.runtimes.python import BudgetError, Pipeline

    try:
        # one generation: no next one to keep the pinned blocks for, so the decoder's
        # activations may take their memory
        return Pipeline.load(package, memory_budget=budget, lean_decode=budget is not None,
                             threads=threads)
    except (PackageError, BudgetError, ValueError) as err:
        fail(str(err))


def read_package_manifest(package: Path) -> dict:
    """The package's manifest, checked in structure only (no file hashed yet): what options
    are checked against before the package is verified and loaded."""
    from edge.core.package import PackageError, read_manifest

    try:
        return read_manifest(package)
    except PackageError as err:
        fail(str(err))


def package_sampler(manifest: dict):
    """The sampler settings a package defaults to."""
    from edge.core.options import check_settings
    from edge.core.sampler import SamplerSettings

    try:
        return check_settings(SamplerSettings.from_dict(manifest["sampler"]))
    except (TypeError, ValueError) as err:
        fail(f"{MANIFEST}: sampler: {err}")


def frame_size(manifest: dict) -> tuple[int, int]:
    """(height, width) of the frames a package decodes: the last two axes of its last
    decoder block's output, or for a tiled decoder (whose graphs take any tile) the latent's
    scaled by its tiles' scale."""
    from edge.core.video import MAX_FRAME_SIDE

    decoder = next((c for c in manifest["components"] if c["name"] == "vae_decoder"), None)
    if decoder is None:
        fail(f"{MANIFEST}: no component 'vae_decoder'; a package decodes its video with one")
    last = decoder["blocks"][-1]["outputs"][0]["shape"]
    if "tiles" in decoder:
        scale = decoder["tiles"]["scale"]
        size = manifest["latent_shape"][-2] * scale, manifest["latent_shape"][-1] * scale
    else:
        size = last[-2], last[-1]
    if not all(isinstance(side, int) and 0 < side <= MAX_FRAME_SIDE for side in size):
        # the manifest's own figure, not an option: say so rather than blame --scale
        fail(f"{MANIFEST}: the decoder's frames are {size[0]}x{size[1]}; a frame side is a "
             f"size of at most {MAX_FRAME_SIDE} (the manifest is damaged or not edge's)")
    return size


def check_texts(prompt: str, negative_prompt: str | None) -> None:
    """The prompt and the negative prompt are valid Unicode text, before anything loads."""
    from edge.core.options import check_prompts

    try:
        check_prompts(prompt)
        if negative_prompt is not None:
            check_prompts(negative_prompt, "--negative-prompt")
    except ValueError as err:
        fail(str(err))


def manifest_before_loading(package: Path, output: Path) -> dict:
    """A package's manifest read for the options to be checked against (structure only, no
    file hashed), with `-o` refused inside the package."""
    manifest = read_package_manifest(package)
    check_outside_package(output, package, "-o")
    return manifest


def checked_settings(defaults, overrides: dict):
    """`defaults` with the command line's sampler options, each refused by name."""
    from edge.core.options import with_overrides

    try:
        return with_overrides(defaults, overrides)
    except ValueError as err:
        fail(str(err))


def check_outside_package(path: Path, package: Path, option: str) -> None:
    """Refuse, before any work, a destination inside the package (a file there would be one
    its manifest does not list)."""
    if path.resolve().is_relative_to(package.resolve()):
        fail(f"{option} {path}: inside the package {package}; write it elsewhere (a package "
             "holds only what its manifest lists)")


def budget_option(memory_budget: str | None) -> int | None:
    """--memory-budget in bytes, refused by name before any work."""
    from edge.core.budget import parse_size

    try:
        return parse_size(memory_budget, "--memory-budget")
    except ValueError as err:
        fail(str(err))


def check_destination(dest: Path, force: bool, identify=None, option: str = "-o") -> None:
    """Before any work: the folder `dest` can be written, and replaces nothing but a folder
    edge wrote (a package, unless `identify` says what else), and that only with --force;
    says what it replaces."""
    from edge.core.files import OutputError, check_writable_parent
    from edge.core.package import PackageWriteError, check_replaceable, identify_package

    try:
        check_writable_parent(dest, option)
        replaced = check_replaceable(dest, force, identify or identify_package)
    except (OutputError, PackageWriteError) as err:
        fail(str(err))
    if replaced:
        echo(f"replacing {replaced} at {dest} (--force)")


def cell(value: float | int | None) -> str:
    """A table cell: '-' for nothing, three decimals for a float."""
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def advance(bar, done: int, total: int) -> None:
    """Move a tqdm bar to `done` of `total` steps; a leap shortens the total on the way."""
    if bar.total != total:
        bar.total = total
        bar.refresh()
    bar.update(done - bar.n)


def print_run_figures(run: dict) -> None:
    """A package run's figures: walls, bytes read, I/O wait, overlap, peaks."""
    from edge.core.budget import format_size

    walls = ", ".join(f"{k} {v:.2f} s" for k, v in run["wall_s"].items())
    bw = run["read_bandwidth_bytes_per_s"]
    overlap = run["overlap_efficiency"]  # None unless transformer blocks were streamed
    echo(
        f"wall: {walls}\n"
        f"transformer calls {run['transformer_calls']}, read {format_size(run['bytes_read'])}"
        f" in {run['reads']} reads ({format_size(int(bw)) + '/s' if bw else 'n/a'}), "
        f"compute waited {run['io_wait_s']:.2f} s for I/O, "
        + ("" if overlap is None else
           f"streamed denoising hid {overlap:.0%} of its read time behind compute, ")
        + f"peak held {format_size(run['peak_held_bytes'])}, "
        f"peak RSS {format_size(run['peak_rss_bytes'])}")


# Third-party warnings a command keeps from its user: each is about the library's own code,
# not about the model, the options or the result (other warnings are shown as they come)
SILENCED_WARNINGS = (
    # torch's pytree deprecating its own LeafSpec, raised as torch.export copies a program
    # (about 20 a web export)
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)


def notices_as_notes(function: Callable) -> Callable:
    """`function` (a command), printing each EdgeNotice raised while it runs as a `note:`
    line on stderr (a library user sees them as warnings), and none of SILENCED_WARNINGS."""

    @functools.wraps(function)
    def command_function(*args, **kwargs):
        from edge.core.files import EdgeNotice

        with warnings.catch_warnings():
            warnings.simplefilter("always", EdgeNotice)
            for category, message in SILENCED_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, EdgeNotice):
                    from tqdm import tqdm

                    # above a running progress bar, on a line of its own, not inside it
                    tqdm.write(printable(f"note: {message}"), file=sys.stderr)
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            return function(*args, **kwargs)

    return command_function


def interruptions_in_a_line(function: Callable) -> Callable:
    """`function` (a command) stopped by Ctrl-C or SIGTERM ends with one line saying so and
    the shell's status for the signal (130, 143), not a silent exit or a library's error:
    SIGTERM is taken as Ctrl-C is, so every write in progress is undone the same way
    (files.atomic_file, package.atomic_directory), and the signal is remembered, since a
    library can turn the KeyboardInterrupt into an error of its own (onnxruntime's import
    into "ImportError: initialization failed")."""

    @functools.wraps(function)
    def command_function(*args, **kwargs):
        import signal
        import threading

        received: list[int] = []

        def interrupt(signum: int, frame) -> None:
            received.append(signum)
            raise KeyboardInterrupt(f"signal {signum}")

        wanted = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
        owned = [sig for sig, default in wanted.items()
                 if threading.current_thread() is threading.main_thread()
                 and signal.getsignal(sig) is default]
        for sig in owned:
            signal.signal(sig, interrupt)
        try:
            return function(*args, **kwargs)
        except BaseException as err:
            if not received and not isinstance(err, KeyboardInterrupt):
                raise
            signum = received[0] if received else signal.SIGINT
            name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C (SIGINT)"
            print(f"\nstopped by {name} before it finished: what it was writing was removed, "
                  "and what was at its destination is as it was", file=sys.stderr)
            raise SystemExit(128 + signum) from None
        finally:
            for sig in owned:
                signal.signal(sig, wanted[sig])

    return command_function
