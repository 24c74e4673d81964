"""`edge eval --sweep --ray`: the sweep's generations as Ray tasks on a local two-worker Ray
instance, compared with the serial sweep; a worker killed mid-sweep; bad addresses and a
package a node cannot read."""
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge.commands import app
from edge.eval.on_ray import run_regimes as ray_regimes
from edge.eval.run import load_classifier, parse_prompt
from edge.eval.sweep import package_settings, run_sweep
from edge.models.tiny_sora import DEFAULT_WEIGHTS

pytestmark = pytest.mark.slow  # starts a Ray instance

ray = pytest.importorskip("ray", reason="Ray is in the test extras (pip install -e '.[test]')")

runner = CliRunner()
PROMPTS = ["a red circle moving left", "a blue square moving up", "a green triangle moving right"]
# what may differ between two runs of the same sweep: the timings and what follows from them
TIMED = {"wall_s", "speedup", "transformer_s", "transformer_speedup", "io_wait_s"}


@pytest.fixture(scope="module")
def prompt_set():
    return [(p, parse_prompt(p)) for p in PROMPTS]


@pytest.fixture(scope="module")
def classifier():
    return load_classifier(DEFAULT_WEIGHTS)


# the rows the Ray sweeps run: the baseline, one technique that keeps state between steps
# (the step cache) and every technique at once; the serial sweep's full list is
# tests/test_sweep.py's (Ray runs each row as the same task, so more rows test nothing more)
RAY_ROWS = ("baseline", "step cache", "all combined + cutoff")


@pytest.fixture(scope="module")
def rows(exported_package):
    settings = package_settings(exported_package[0], 4)
    chosen = [s for s in settings if s.name in RAY_ROWS]
    assert [s.name for s in chosen] == list(RAY_ROWS), [s.name for s in settings]
    return chosen


@pytest.fixture(scope="module")
def serial(exported_package, classifier, prompt_set, rows):
    root, _ = exported_package
    return run_sweep(root, classifier, prompt_set, steps=4, batch=1, threads=1, settings=rows)


@pytest.fixture()
def local_ray():
    """A local Ray instance with two workers' worth of CPUs, shut down after the test."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def assert_same_rows(got: dict, want: dict) -> None:
    for regime, rows in want["regimes"].items():
        assert [r["setting"] for r in got["regimes"][regime]] == [r["setting"] for r in rows]
        for g, w in zip(got["regimes"][regime], rows, strict=True):
            for key in w.keys() - TIMED:
                assert g[key] == w[key], (regime, w["setting"], key)


def test_ray_sweep_gives_the_serial_rows(exported_package, classifier, prompt_set, serial,
                                         rows, local_ray):
    root, _ = exported_package
    on_ray = run_sweep(root, classifier, prompt_set, steps=4, batch=1, threads=1,
                       run_regimes=ray_regimes, settings=rows)
    assert on_ray["ray"] is True and serial["ray"] is False
    assert_same_rows(on_ray, serial)


def _generate_workers() -> list[int]:
    """Ray worker processes running a sweep task now (Ray titles them ray::_generate)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::_generate"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_a_worker_killed_mid_sweep_has_its_task_retried(exported_package, classifier,
                                                        prompt_set, serial, rows, local_ray):
    root, _ = exported_package
    out: dict = {}
    done = []

    def sweep():
        try:
            out["result"] = run_sweep(root, classifier, prompt_set, steps=4, batch=1,
                                      threads=1, run_regimes=ray_regimes,
                                      on_generation=done.append, settings=rows)
        except Exception as err:  # noqa: BLE001 - reported below
            out["error"] = err

    thread = threading.Thread(target=sweep)
    thread.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and thread.is_alive() and time.monotonic() < deadline:
        workers = _generate_workers()
        if workers and len(done) >= 4:  # mid-sweep: some tasks done, this one running
            os.kill(workers[0], signal.SIGKILL)
            killed = workers[0]
        time.sleep(0.05)
    thread.join(timeout=600)
    assert killed is not None, "no running sweep task was seen to kill"
    assert "error" not in out, out.get("error")
    assert_same_rows(out["result"], serial)


def test_ray_address_nothing_answers_on_is_refused_at_once(exported_package, tmp_path):
    root, _ = exported_package
    started = time.monotonic()
    res = runner.invoke(app, ["eval", "--sweep", "--package", str(root), "--ray-address",
                              "127.0.0.1:1", "--steps", "2"])
    assert res.exit_code == 2
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in res.output
    assert time.monotonic() - started < 30
    res = runner.invoke(app, ["eval", "--sweep", "--package", str(root), "--ray-address",
                              "headnode"])
    assert res.exit_code == 2 and "'headnode'" in res.output and "HOST:PORT" in res.output


def test_a_node_that_reads_another_package_stops_the_sweep(exported_package, local_ray,
                                                           monkeypatch):
    import edge.eval.on_ray as ray_eval

    root, _ = exported_package
    ray_eval.check_package_on_every_node(root)  # every node reads the same manifest
    # the driver's manifest differs from what the nodes read at that path
    monkeypatch.setattr(ray_eval, "manifest_digest", lambda package: "0" * 64)
    with pytest.raises(ray_eval.RayError, match=f"cannot read the package at {root.resolve()}"):
        ray_eval.check_package_on_every_node(root)


def test_probe_names_why_a_node_cannot_read_the_package(tmp_path, local_ray):
    from edge.eval.on_ray import _probe

    node, digest, why = _probe(str(tmp_path / "missing"))
    assert digest is None and "manifest.json" in why and node


def test_plain_eval_on_ray_scores_what_the_serial_eval_scores(tmp_path):
    """`edge eval --ray` with no address: a local instance started and stopped by the CLI."""
    import json

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    args = ["eval", "--prompts", str(prompts), "--steps", "3", "--batch", "2", "--json"]
    serial = runner.invoke(app, args)
    on_ray = runner.invoke(app, [*args, "--ray"])
    assert serial.exit_code == 0 and on_ray.exit_code == 0, on_ray.output
    a = json.loads(serial.stdout.strip().splitlines()[-1])
    b = json.loads(on_ray.stdout.strip().splitlines()[-1])
    assert b["ray"] is True and a["ray"] is False and b["n_prompts"] == 3
    for key in ("color_acc", "shape_acc", "direction_acc", "coherence"):
        assert b[key] == a[key], key
    assert b["consistency"] == pytest.approx(a["consistency"], abs=1e-4)
    assert not ray.is_initialized()
