"""The Swift runtime (runtimes/swift) compiled and tested on this machine: `swift build`, then
`swift test` with the replay fixtures this test writes (tests/swift_replay.py), so the Swift
pipeline is held to the Python runtime's block calls and frames. The iOS demo app cannot be
type-checked without Apple's SDK; each of its files is at least parsed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import swift_replay

pytestmark = pytest.mark.slow  # swift build and swift test: half a minute

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO   # Package.swift is at the root (SwiftPM's place); the sources in runtimes/swift


def swift_tool() -> str:
    """The `swift` driver: on PATH, else where the Linux toolchain installs it."""
    found = shutil.which("swift") or next(
        (p for p in ("/opt/swift/usr/bin/swift", "/usr/share/swift/usr/bin/swift")
         if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("no Swift toolchain: `swift` is neither on PATH nor in /opt/swift/usr/bin "
                    "(install Swift 6.3 for Linux from swift.org to run the Swift runtime's tests)")
    return found


def run(cmd: list[str], timeout: int, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def test_swift_package_builds_and_its_tests_pass(request, tmp_path, exported_package,
                                                 coreml_package, wan_iphone_package,
                                                 wan_folder, cog_iphone_package, cog_folders,
                                                 ltx_iphone_package, ltx_folders,
                                                 coreai_package, wan_tiled_coreai_package):
    from conftest import OPENSORA_FIXTURE

    swift = swift_tool()
    families = {"cogvideox": (cog_iphone_package[0], cog_folders["5b"]),
                "ltx": (ltx_iphone_package[0], ltx_folders["timestep"])}
    # Open-Sora's bundles where its fixture is here (BundleTests skips them, saying so, if not)
    if OPENSORA_FIXTURE.is_dir():
        families["opensora"] = (request.getfixturevalue("opensora_iphone_package")[0],
                                OPENSORA_FIXTURE)
    fixtures = swift_replay.write(tmp_path / "replay", exported_package[0], coreml_package[0],
                                  wan=(wan_iphone_package[0], wan_folder), families=families,
                                  coreai=coreai_package[0],
                                  tiled=wan_tiled_coreai_package[0])
    build = run([swift, "build", "--build-tests"], timeout=900, cwd=PACKAGE)
    assert build.returncode == 0, (
        f"swift build failed:\n{build.stdout[-6000:]}\n{build.stderr[-3000:]}")
    warnings = sorted({line for line in (build.stdout + build.stderr).splitlines()
                       if "warning:" in line and str(PACKAGE) in line})
    assert not warnings, "the Swift package compiles with warnings:\n" + "\n".join(warnings)
    env = os.environ | {"EDGE_SWIFT_REPLAY": str(fixtures)}
    test = run([swift, "test", "--skip-build"], timeout=900, cwd=PACKAGE, env=env)
    output = test.stdout + test.stderr
    failures = [line for line in output.splitlines() if ": error: " in line]
    assert test.returncode == 0 and not failures, "swift test failed:\n" + "\n".join(
        failures[:40] or [output[-6000:]])
    executed = [int(n) for n in re.findall(r"Executed (\d+) tests?, with 0 failures", output)]
    assert executed and max(executed) >= 30, f"fewer XCTests ran than expected:\n{output[-3000:]}"
    assert " skipped " not in output, "an XCTest skipped:\n" + "\n".join(
        line for line in output.splitlines() if "skipped" in line)
    assert "worst relative input difference from Python's" in output
    replayed = re.findall(r"bundle (\w+): \d+ calls, worst relative input difference", output)
    assert sorted(replayed) == sorted([*swift_replay.WAN_BUNDLES] + [
        f"{family}_{name}" for family, names in swift_replay.FAMILY_BUNDLES.items()
        for name in names] + [f"coreai_{name}" for name in swift_replay.COREAI_BUNDLES]
        + [f"tiled_{name}" for name in swift_replay.TILED_BUNDLES]), replayed
    check_edge_sample(fixtures / "wan", tmp_path)


def check_edge_sample(wan: Path, tmp_path: Path) -> None:
    """The command-line sample replays a Wan bundle on Linux and writes its frames as the
    bundle has them; another package's bundle and a GIF (no ImageIO here) are refused."""
    from edge.core.bundle import Bundle

    sample = PACKAGE / ".build" / "debug" / "edge-sample"
    out = tmp_path / "frames.npy"
    replayed = run([str(sample), str(wan / "package"), "--bundle",
                    str(wan / "bundles" / "negative_merge_leap"), "-o", str(out)], timeout=300)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "equal to the bundle's" in replayed.stdout
    # the bundle was recorded from a seed: Swift drew that seed's noise (TorchNoise)
    drift = re.search(r"latents: drawn for the bundle's seed 0, worst difference from the "
                      r"recorded ones (\S+)", replayed.stdout)
    assert drift and float(drift.group(1)) <= 1e-5, replayed.stdout
    worst = float(re.search(r"worst relative difference (\S+)", replayed.stdout).group(1))
    assert worst <= 1e-5
    frames = np.load(out)
    assert frames.dtype == np.uint8 and frames.shape == (9, 32, 48, 3)
    assert np.array_equal(frames, Bundle(wan / "bundles" / "negative_merge_leap").frames)
    other = run([str(sample), str(wan / "package"), "--bundle", str(wan / "tiny_sora_bundle")],
                timeout=300)
    assert other.returncode == 2 and "manifest digest" in other.stderr, other.stderr
    gif = run([str(sample), str(wan / "package"), "a cat", "-o", str(tmp_path / "x.gif")],
              timeout=300)
    assert gif.returncode == 2 and "ImageIO" in gif.stderr, gif.stderr
    assert not (tmp_path / "x.gif").exists()
    blocks = run([str(sample), str(wan / "package"), "a cat", "-o", str(tmp_path / "x.npy")],
                 timeout=300)
    assert blocks.returncode == 2 and "needs CoreML" in blocks.stderr, blocks.stderr
    check_output_refusals(sample, wan, tmp_path)
    check_seed_refusals(sample, wan, tmp_path)


def check_output_refusals(sample: Path, wan: Path, tmp_path: Path) -> None:
    """An -o that cannot be written (a folder, a missing parent folder) is refused in one line
    before the replay runs, not with Foundation's error after it."""
    (tmp_path / "taken.npy").mkdir()
    for out, why in [(tmp_path / "taken.npy", "is a folder"),
                     (tmp_path / "missing" / "x.npy", f"the folder {tmp_path / 'missing'} "
                                                       "does not exist")]:
        refused = run([str(sample), str(wan / "package"), "--bundle",
                       str(wan / "bundles" / "negative_merge_leap"), "-o", str(out)], timeout=300)
        assert refused.returncode == 2 and not refused.stdout, refused.stdout + refused.stderr
        assert refused.stderr.startswith(f"error: -o {out}: {why}"), refused.stderr


def check_seed_refusals(sample: Path, wan: Path, tmp_path: Path) -> None:
    """`--seed` is a whole number from 0 to 2^63 - 1 (torch's manual_seed range): a
    negative, fractional or larger one is refused with one line naming it, before anything
    runs; a seed with --latents is refused too."""
    out = tmp_path / "seeded.npy"
    out_of_range = "is out of range: a seed is from 0 to 2^63 - 1"
    for seed, why in [("-1", out_of_range), ("1.5", "must be a whole number from 0 to 2^63 - 1"),
                      ("9223372036854775808", out_of_range)]:
        refused = run([str(sample), str(wan / "package"), "a cat", "--seed", seed, "-o", str(out)],
                      timeout=300)
        assert refused.returncode == 2 and not refused.stdout, refused.stdout + refused.stderr
        assert refused.stderr.splitlines() == [f"error: --seed {seed} {why}"], refused.stderr
        assert not out.exists()
    # a whole number past Int: out of range, not "not a number" (item 30)
    huge = run([str(sample), str(wan / "package"), "a cat", "--steps", "9" * 20, "-o", str(out)],
               timeout=300)
    assert huge.returncode == 2 and not out.exists(), huge.stdout + huge.stderr
    assert huge.stderr.splitlines() == [f"error: --steps {'9' * 20}: out of range (at most "
                                        "9223372036854775807)"], huge.stderr
    np.save(tmp_path / "latents.npy", np.zeros((1, 16, 3, 4, 6), np.float32))
    both = run([str(sample), str(wan / "package"), "a cat", "--seed", "3", "--latents",
                str(tmp_path / "latents.npy"), "-o", str(out)], timeout=300)
    assert both.returncode == 2 and "--seed and --latents: give one" in both.stderr, both.stderr


def test_ios_demo_files_parse():
    """`swiftc -parse` on each file of the demo app (no SDK needed to parse)."""
    swiftc = str(Path(swift_tool()).with_name("swiftc"))
    files = sorted((REPO / "ios_demo").rglob("*.swift"))
    assert files
    for f in files:
        parsed = run([swiftc, "-parse", str(f)], timeout=120)
        assert parsed.returncode == 0, f"{f.relative_to(REPO)}:\n{parsed.stderr[-3000:]}"
