"""`edge eval --ray` and `edge eval --sweep --ray`: generations as Ray tasks.

Plain `edge eval --ray`: each prompt chunk is one task generating with the PyTorch pipeline
(the shipped weights as each node's edge install has them, or a weights folder every node
sees at the same path); the driver scores the videos as `edge eval` does.

The sweep: each (regime, setting, prompt chunk) is one Ray task; the driver scores the
videos the tasks return chunk by chunk, exactly as the serial sweep does (edge/eval/sweep.py
`summarize_rows`), so the rows are the same apart from the timings.

Without an address a local Ray instance is started (and stopped after); with one, the
command joins that cluster.

The package is read from its path on every node, not shipped through Ray's object store: the
streamed regime measures reads from storage, which a copy in shared memory would not be. So
every node must see the package at the same path (a shared filesystem, or the same copy on
each). Before any task, one probe per node compares the manifest's sha256 there with the
driver's; a node that cannot read it stops the sweep with its address and the path.

A worker process that dies mid-task has the task retried (up to MAX_RETRIES times, on any
node): the sweep completes as long as some worker lives. Timings under Ray come from several
tasks sharing each node's cores and storage; compare rows within one run only.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge.eval.classifier import AttributeClassifier
from edge.eval.run import PromptSet
from edge.eval.sweep import REGIMES, Chunk, Setting, chunks, generate_chunk, summarize_rows, warm_up

MAX_RETRIES = 3
CONNECT_TIMEOUT_S = 5.0


class RayError(ValueError):
    """A cluster the sweep cannot use: unreachable, or a node that cannot read the package."""


def parse_address(address: str) -> tuple[str, int]:
    """host:port of a Ray address (`10.0.0.5:6379`, or `ray://host:10001` for Ray Client)."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RayError(f"--ray-address {address!r}: expected HOST:PORT (e.g. 10.0.0.5:6379, "
                       "as `ray start --head` prints)")
    return host, int(port)


def check_reachable(address: str) -> None:
    """Refuse at once an address nothing answers on (ray.init would retry for minutes)."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        raise RayError(f"cannot reach a Ray cluster at {address}: {err.strerror or err} "
                       f"(is `ray start --head` running there, and port {port} open?)") from err


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address`, or start a local instance. Returns whether a connection
    was made here (and so is to be shut down by the caller)."""
    import ray

    if ray.is_initialized():
        return False
    if address is not None:
        check_reachable(address)
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
    return True


def manifest_digest(package: Path) -> str:
    return hashlib.sha256((Path(package) / "manifest.json").read_bytes()).hexdigest()


def _probe(package: str) -> tuple[str, str | None, str | None]:
    """On one node: its address, the manifest's sha256 there (None if unreadable), why not."""
    import ray

    node = ray.util.get_node_ip_address()
    try:
        return node, manifest_digest(Path(package)), None
    except OSError as err:
        return node, None, str(err)


def check_package_on_every_node(package: Path) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    want = manifest_digest(package)
    probe = ray.remote(num_cpus=0)(_probe)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(str(Path(package).resolve())) for n in nodes]
    for node, digest, why in ray.get(refs):
        if digest != want:
            what = why or "a different manifest.json (another export?)"
            raise RayError(f"the Ray node at {node} cannot read the package at "
                           f"{Path(package).resolve()}: {what}. Every node reads the package "
                           "from the same path: put it on a filesystem they share, or copy it "
                           "to that path on each node")


# per worker process: pipelines already loaded and warmed up, reused by later tasks
_PIPELINES: dict = {}


def _generate(package: str, regime: str, budget: int, threads: int | None,
              warm_overrides: dict, setting: Setting, chunk: Chunk) -> tuple[np.ndarray, dict]:
    """One task: `setting` on `chunk` with the regime's pipeline of this worker."""
    from edge.runtimes.python import Pipeline

    key = (package, regime, budget, threads)
    if key not in _PIPELINES:
        streamed = regime == "streamed"
        pipe = Pipeline.load(package, memory_budget=budget if streamed else None,
                             cold_reads=streamed, threads=threads)
        warm_up(pipe, [Setting("warm-up", warm_overrides)], chunk.prompts, chunk.seeds[0])
        _PIPELINES[key] = pipe
    return generate_chunk(_PIPELINES[key], setting, chunk)


_REFERENCE: dict = {}  # per worker process: PyTorch pipelines by weights folder


def _generate_reference(weights: str | None, overrides: dict, prompts: list[str],
                        seeds: list[int]) -> np.ndarray:
    """One task of plain `edge eval`: a chunk with the PyTorch pipeline, one torch thread
    (Ray runs a task per CPU)."""
    import torch

    from edge.models.tiny_sora import DEFAULT_WEIGHTS, TinySora

    torch.set_num_threads(1)
    key = weights or str(DEFAULT_WEIGHTS)
    if key not in _REFERENCE:
        _REFERENCE[key] = TinySora.load(Path(key))
    return _REFERENCE[key].generate(prompts, seeds, **overrides)


def generate_on_ray(weights: Path | None, overrides: dict, prompts: PromptSet, seed: int,
                    batch: int, on_batch: Callable[[int], None] | None = None
                    ) -> Callable[[list[str], list[int]], np.ndarray]:
    """Every chunk of plain `edge eval` as a Ray task; returns the `generate(prompts, seeds)`
    that `edge.eval.run.evaluate` calls, answering from the finished videos."""
    import ray

    task = ray.remote(max_retries=MAX_RETRIES)(_generate_reference)
    folder = None if weights is None else str(Path(weights).resolve())
    pending = {}
    for chunk in chunks(prompts, batch, seed):
        names = [p for p, _ in chunk.prompts]
        pending[task.remote(folder, overrides, names, chunk.seeds)] = (tuple(names),
                                                                       tuple(chunk.seeds))
    videos = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        key = pending.pop(done[0])
        videos[key] = ray.get(done[0])
        if on_batch:
            on_batch(len(key[0]))
    return lambda names, seeds: videos[(tuple(names), tuple(seeds))]


def run_regimes(package: Path, settings: list[Setting], classifier: AttributeClassifier,
                prompts: PromptSet, seed: int, batch: int, budget: int,
                regimes: tuple[str, ...] = REGIMES, threads: int | None = None,
                on_generation: Callable[[str], None] | None = None) -> dict[str, list[dict]]:
    """Every (regime, setting, chunk) as a Ray task on the connected cluster; the rows of
    each regime, as `run_regime` gives them."""
    import ray

    check_package_on_every_node(package)
    task = ray.remote(max_retries=MAX_RETRIES)(_generate)
    chunk_list = chunks(prompts, batch, seed)
    path = str(Path(package).resolve())
    pending = {}
    for regime in regimes:
        for i, chunk in enumerate(chunk_list):
            for s in settings:
                ref = task.remote(path, regime, budget, threads, settings[0].overrides, s, chunk)
                pending[ref] = (regime, s.name, i)
    results = {r: {s.name: [None] * len(chunk_list) for s in settings} for r in regimes}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        regime, name, i = pending.pop(done[0])
        results[regime][name][i] = ray.get(done[0])
        if on_generation:
            on_generation(name)
    return {r: summarize_rows(settings, classifier, chunk_list, results[r]) for r in regimes}
