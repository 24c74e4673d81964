"""The Core AI exporter's workers side by side (exporters/pool.py `run_worker`): each job
done once, by whichever worker claims it first; a failed or crashed job named; the number of
workers by CPUs, jobs and memory. A stand-in worker keeps the worker's contract (claim, then
write the results whole) without Core AI, so these run anywhere in a second."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import edge.exporters.iphone.coreai.pool as pool
from edge.core.files import EdgeNotice
from edge.exporters import ExportValidationError

# the stand-in: claims jobs through the worker's own `claimed`; a job may ask it to fail
# (ok false) or to crash (SIGABRT) once claimed, every time or the first time only
STAND_IN = """
import json, os, signal, sys, time
sys.path.insert(0, {folder!r})
from worker import claimed  # exporters/iphone/coreai/worker.py
for path in sys.argv[3:]:   # after -P and the worker's path, as run_worker calls it
    if not claimed(path):
        continue
    job = json.load(open(path))
    time.sleep(job.get("sleep", 0.2))
    if job.get("crash") or job.get("crash_once") and not os.path.exists(path + ".crashed"):
        open(path + ".crashed", "w").close()
        os.kill(os.getpid(), signal.SIGABRT)
    found = {{"ok": not job.get("fail"), "functions": {{}}, "pid": os.getpid()}}
    if job.get("fail"):
        found |= {{"stage": "convert", "error": "ValueError: no lowering for aten.sort"}}
    with open(job["results"] + ".partial", "w") as out:
        json.dump(found, out)
    os.rename(job["results"] + ".partial", job["results"])
    if job.get("fail"):
        sys.exit(1)
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(folder=str(pool.WORKER.parent)))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(pool, "WORKER_PYTHON", str(python))
    monkeypatch.setattr(pool, "WORKERS", 2)


def _jobs(tmp_path: Path, count: int, **special) -> tuple[list[Path], list[str]]:
    """`count` jobs; `special`: {index: extra job fields} by name, e.g. fail=2."""
    jobs = []
    for i in range(count):
        folder = tmp_path / "jobs" / str(i)
        folder.mkdir(parents=True)
        job = {"results": str(folder / "results.json"), "functions": []}
        job |= {field: True for field, index in special.items() if index == i}
        (folder / "job.json").write_text(json.dumps(job))
        jobs.append(folder / "job.json")
    return jobs, [f"c/block_{i}" for i in range(len(jobs))]


def test_two_workers_share_the_jobs_each_done_once(tmp_path, stand_in):
    jobs, keys = _jobs(tmp_path, 6)
    done = []
    found = pool.run_worker(jobs, keys, on_done=done.append)
    assert sorted(done) == list(range(6))
    assert all(f["ok"] for f in found)
    # both worked: the jobs went to two processes, each job claimed by the one that did it
    assert len({f["pid"] for f in found}) == 2
    for job, f in zip(jobs, found, strict=True):
        assert pool._claimant(job) == f["pid"]


def test_a_failed_job_is_named_and_ends_the_other_worker(tmp_path, stand_in):
    jobs, keys = _jobs(tmp_path, 6, fail=2)
    with pytest.raises(ExportValidationError, match=r"block c/block_2: Core AI cannot convert "
                       r"it: ValueError: no lowering for aten\.sort"):
        pool.run_worker(jobs, keys)
    # the other worker was stopped: the last jobs were never done
    assert not (jobs[-1].with_name("results.json")).exists()


def test_a_crash_names_the_job_the_crashed_worker_held(tmp_path, stand_in):
    jobs, keys = _jobs(tmp_path, 4, crash=1)
    with pytest.warns(EdgeNotice, match="block c/block_1: .*SIGABRT.*running the blocks not "
                      "done again"), \
            pytest.raises(ExportValidationError, match="block c/block_1: Core AI's converter or "
                          "runtime ended by SIGABRT"):
        pool.run_worker(jobs, keys)


def test_a_job_a_crash_left_undone_is_run_once_more(tmp_path, stand_in):
    """Core AI's beta interpreter aborted once on a block it then ran (SIGABRT): the jobs a
    crashed worker left, its own and those the stopped workers had not done, run again, and
    each is done once; the jobs done before the crash are not run again."""
    jobs, keys = _jobs(tmp_path, 6, crash_once=1)
    done = []
    with pytest.warns(EdgeNotice, match="block c/block_1: .*ended by SIGABRT"):
        found = pool.run_worker(jobs, keys, on_done=done.append)
    assert all(f["ok"] for f in found)
    assert sorted(done) == list(range(6))
    for job, f in zip(jobs, found, strict=True):
        assert pool._claimant(job) == f["pid"]


def test_the_workers_are_bounded_by_cpus_jobs_and_memory(tmp_path, monkeypatch):
    jobs = []
    for i in range(8):
        program = tmp_path / f"{i}.pt2"
        program.write_bytes(b"\0" * (1000 if i else 100_000))   # the largest: 100 kB
        job = tmp_path / f"{i}.json"
        job.write_text(json.dumps({"functions": [{"program": str(program)}]}))
        jobs.append(job)
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(pool, "WORKER_BASE_BYTES", 0)
    available = SimpleNamespace(value=10**9)
    monkeypatch.setattr(pool.psutil, "virtual_memory",
                        lambda: SimpleNamespace(available=available.value))
    assert pool.worker_count(jobs) == 4            # the CPUs
    assert pool.worker_count(jobs[:3]) == 3        # the jobs
    # memory for two workers at 5x the largest job's graphs
    available.value = 2 * 5 * 100_000 + 1
    assert pool.worker_count(jobs) == 2
    available.value = 0
    assert pool.worker_count(jobs) == 1            # never fewer than one


EXPORTER = """
import json, sys
import edge.exporters.iphone.coreai.pool as pool
from pathlib import Path
pool.WORKER_PYTHON, pool.WORKERS = sys.argv[1], 2
jobs = [Path(p) for p in sys.argv[2:]]
pool.run_worker(jobs, [str(j) for j in jobs])
"""


def test_workers_end_with_an_exporter_killed_outright(tmp_path, stand_in):
    """SIGKILL of the exporter runs none of its cleanup: its workers converted on for an
    hour (item 17). The system ends them with it (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    jobs, _ = _jobs(tmp_path, 2)
    for job in jobs:  # each worker busy for a minute
        job.write_text(json.dumps(json.loads(job.read_text()) | {"sleep": 60}))
    exporter = subprocess.Popen([sys.executable, "-c", EXPORTER, pool.WORKER_PYTHON,
                                 *map(str, jobs)])
    try:
        deadline = time.monotonic() + 60
        while len(workers := psutil.Process(exporter.pid).children(recursive=True)) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        os.kill(exporter.pid, signal.SIGKILL)
        exporter.wait()
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers outlived the exporter: {alive}"
    finally:
        exporter.kill()


HOLDER = """
import sys, time
from edge.core.files import held_temporary_folder
with held_temporary_folder(sys.argv[1]) as folder:
    (folder / "graph.pt2").write_bytes(b"x" * 1000)
    print(folder, flush=True)
    time.sleep(120)
"""


def test_a_temporary_folder_of_an_export_killed_outright_goes_at_the_next(tmp_path):
    import signal
    import subprocess
    from pathlib import Path

    from edge.core.files import held_temporary_folder

    prefix = f"edge-test-{tmp_path.name}-"
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, prefix], stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        killed, alive = procs
        left, held = (Path(p.stdout.readline().strip()) for p in procs)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert left.is_dir() and held.is_dir()
        with held_temporary_folder(prefix) as mine:
            assert not left.exists() and held.is_dir()
        assert not mine.exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()
