"""Block loader scheduling: budgets, pinning, streaming, prefetch and what it counts."""
import platform
import threading
import time

import numpy as np
import pytest

from edge.core.budget import BudgetError, parse_size, plan_pins
from edge.runtimes.python.loader import BlockLoader, BlockWeights

PAGE = 4096


def make_blocks(tmp_path, sizes):
    """Blocks whose single tensor is filled with the block's index."""
    blocks = {}
    for i, (key, pages) in enumerate(sizes.items()):
        path = tmp_path / f"{key.replace('/', '_')}.bin"
        n = pages * PAGE
        np.full(n // 4, i, np.float32).tofile(path)
        blocks[key] = BlockWeights(key, path, n, ({"name": "w", "dtype": "float32",
                                                   "shape": [n // 4], "offset": 0, "bytes": n},))
    return blocks


SIZES = {"text/a": 4, "tr/p0": 2, "tr/p1": 2, "tr/p2": 2, "vae/d": 3}
EVERY_STEP = ("tr/p0", "tr/p1", "tr/p2")


def schedule(steps=3):
    return ["text/a"] + list(EVERY_STEP) * steps + ["vae/d"]


def test_parse_size():
    assert parse_size("64MB") == 64 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("512k") == 512 << 10 and parse_size(1000) == 1000
    with pytest.raises(ValueError, match="'lots'"):
        parse_size("lots")


def test_budget_below_largest_block_is_refused_with_the_way_out(tmp_path):
    blocks = make_blocks(tmp_path, SIZES)
    with pytest.raises(BudgetError, match=r"block text/a .*smallest budget that works is "
                                          r"16\.0 KiB \(16384 bytes\)"):
        BlockLoader(blocks, budget=4 * PAGE - 1)


def test_every_step_blocks_are_pinned_first():
    sizes = {k: n * PAGE for k, n in SIZES.items()}
    # room for p0 + p1 and two streamed blocks (4 + 3 pages): 2+2+4+3 = 11 pages
    assert plan_pins(sizes, 11 * PAGE, EVERY_STEP) == {"tr/p0", "tr/p1"}
    assert plan_pins(sizes, None, EVERY_STEP) == set(sizes)
    assert plan_pins(sizes, 7 * PAGE, EVERY_STEP) == set()


@pytest.mark.parametrize("budget_pages,prefetch", [(None, 1), (13, 1), (8, 1), (4, 1),
                                                   (4, 0), (20, 2)])
def test_yields_the_right_weights_in_order_within_budget(tmp_path, budget_pages, prefetch):
    blocks = make_blocks(tmp_path, SIZES)
    budget = budget_pages and budget_pages * PAGE
    loader = BlockLoader(blocks, budget, EVERY_STEP, prefetch=prefetch)
    index = {k: i for i, k in enumerate(SIZES)}
    seen = []
    for key, weights in loader.run(schedule()):
        assert weights["w"][0] == index[key] and weights["w"].size == blocks[key].nbytes // 4
        seen.append(key)
    assert seen == schedule()
    if budget is not None:
        assert loader.stats.peak_held_bytes <= budget
    # pinned blocks are read once; streamed ones at every use
    expected = sum(blocks[k].nbytes for k in set(schedule()) & loader.pinned) + sum(
        blocks[k].nbytes for k in schedule() if k not in loader.pinned)
    assert loader.stats.bytes_read == expected
    loader.close()


def test_pinned_blocks_survive_between_runs(tmp_path):
    blocks = make_blocks(tmp_path, SIZES)
    loader = BlockLoader(blocks, None, EVERY_STEP)
    list(loader.run(schedule()))
    first = loader.stats.bytes_read
    list(loader.run(schedule()))
    assert loader.stats.bytes_read == first  # nothing read again
    loader.close()


def test_prefetch_overlaps_reads_with_compute(tmp_path, monkeypatch):
    import edge.runtimes.python.loader as loader_module

    real_read = loader_module.read_file

    def slow_read(*args, **kwargs):
        time.sleep(0.05)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(loader_module, "read_file", slow_read)
    blocks = make_blocks(tmp_path, {f"tr/p{i}": 1 for i in range(6)})
    waits = {}
    for prefetch in (0, 1):
        loader = BlockLoader(blocks, 2 * PAGE, prefetch=prefetch)
        for _ in loader.run(list(blocks)):
            time.sleep(0.05)  # "compute"
        waits[prefetch] = loader.stats.wait_s
        assert loader.stats.peak_held_bytes <= 2 * PAGE
        loader.close()
    assert waits[0] > 0.25 and waits[1] < 0.6 * waits[0]


def test_reads_run_on_a_background_thread(tmp_path, monkeypatch):
    import edge.runtimes.python.loader as loader_module

    threads = set()
    real_read = loader_module.read_file
    monkeypatch.setattr(loader_module, "read_file", lambda *a, **k: (
        threads.add(threading.current_thread().name), real_read(*a, **k))[1])
    loader = BlockLoader(make_blocks(tmp_path, SIZES), 8 * PAGE, EVERY_STEP)
    list(loader.run(schedule()))
    assert threads and all(t.startswith("edge-prefetch") for t in threads)
    loader.close()


def test_cold_reads_return_the_same_bytes(tmp_path):
    blocks = make_blocks(tmp_path, SIZES)
    loader = BlockLoader(blocks, 8 * PAGE, EVERY_STEP, cold_reads=True)
    for key, weights in loader.run(schedule(1)):
        assert weights["w"][0] == list(SIZES).index(key)
    loader.close()


def test_a_consumer_that_stops_early_gives_its_bytes_back(tmp_path):
    blocks = make_blocks(tmp_path, SIZES)
    loader = BlockLoader(blocks, 8 * PAGE, EVERY_STEP)
    runs = loader.run(schedule())
    next(runs), next(runs)
    runs.close()
    assert loader.buffers.in_use == sum(
        blocks[k].nbytes for k in loader._resident)
    list(loader.run(schedule()))  # and the next run is not starved
    loader.close()


# --- the buffer pool: recycled, pre-faulted buffers under the budget ---------------------

def test_streamed_blocks_of_one_size_cycle_through_recycled_buffers(tmp_path):
    blocks = make_blocks(tmp_path, {f"tr/p{i}": 2 for i in range(4)})
    loader = BlockLoader(blocks, 4 * PAGE, prefetch=1)  # room for two pairs: nothing pinned
    steps = 5
    for key, weights in loader.run(list(blocks) * steps):
        assert weights["w"][0] == int(key[-1]) and weights["w"][-1] == int(key[-1])
    assert loader.stats.reads == 4 * steps
    # one buffer computing, one being read ahead: two made, every later read reuses one
    assert loader.buffers.made == 2 and loader.stats.buffers_reused == 4 * steps - 2
    assert loader.buffers.peak == 4 * PAGE and loader.buffers.in_use == 2 * PAGE
    del weights  # the last block's buffer comes back once its views are gone
    assert loader.buffers.in_use == 0
    loader.close()
    assert loader.buffers.kept == 0


def test_pool_never_keeps_more_than_its_limit_under_concurrent_use():
    from edge.runtimes.python.loader import BufferPool

    pool = BufferPool(10 * PAGE)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 5, size=(4, 60)) * PAGE - rng.integers(0, 100, size=(4, 60))
    errors = []

    def worker(row):
        try:
            for n in row:
                buf = pool.acquire(int(n))
                assert len(buf) % PAGE == 0 and len(buf) >= n
                assert pool.kept <= pool.limit
                time.sleep(0.0005)
                pool.give_back(buf)
        except Exception as err:  # surfaced below: a thread's assert would be lost otherwise
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(row,)) for row in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert pool.peak <= 10 * PAGE and pool.in_use == 0
    assert pool.reused > 0 and pool.unmapped > 0  # sizes vary: some buffers made way for others


def test_a_new_size_waits_for_a_buffer_in_use_rather_than_exceed_the_limit():
    from edge.runtimes.python.loader import BufferPool

    pool = BufferPool(3 * PAGE)
    first = pool.acquire(2 * PAGE)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(2 * PAGE - 10)))
    waiter.start()
    time.sleep(0.1)
    assert not got and pool.kept == 2 * PAGE  # 2 + 2 pages would exceed 3
    pool.give_back(first)  # (a buffer never lent: returned by hand)
    waiter.join(5)
    assert got and got[0] is first and pool.reused == 1  # same page-rounded size: recycled


def test_buffers_come_back_when_a_consumer_stops_early(tmp_path):
    blocks = make_blocks(tmp_path, {f"tr/p{i}": 2 for i in range(4)})
    loader = BlockLoader(blocks, 6 * PAGE, prefetch=2, pin=False)
    runs = loader.run(list(blocks) * 3)
    next(runs), next(runs)
    assert loader.buffers.in_use >= 2 * PAGE  # one held, up to two read ahead
    runs.close()  # the held block and the ones read ahead go back to the pool
    assert loader.buffers.in_use == 0 and 0 < loader.buffers.kept <= 6 * PAGE
    made = loader.buffers.made
    assert [k for k, _ in loader.run(list(blocks))] == list(blocks)
    assert loader.buffers.made == made  # the next run reads into the same buffers
    loader.close()


def test_a_view_kept_past_its_block_is_never_overwritten(tmp_path):
    blocks = make_blocks(tmp_path, {f"tr/p{i}": 2 for i in range(4)})
    loader = BlockLoader(blocks, 4 * PAGE, prefetch=1)
    kept = None
    for key, weights in loader.run(list(blocks) * 2):
        if key == "tr/p0" and kept is None:
            kept = weights["w"]  # held beyond the next block: the contract is broken
    assert (kept == 0).all()  # its buffer was abandoned, not recycled under it
    assert loader.buffers.abandoned >= 1 and loader.buffers.peak <= 4 * PAGE
    loader.close()


def test_concurrent_prefetch_reads_ahead_within_budget(tmp_path, monkeypatch):
    import edge.runtimes.python.loader as loader_module

    real_read = loader_module.read_file
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def counting_read(*args, **kwargs):
        with lock:
            in_flight[0] += 1
        time.sleep(0.01)
        try:
            return real_read(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(loader_module, "read_file", counting_read)
    blocks = make_blocks(tmp_path, {f"tr/p{i}": 2 for i in range(5)})
    loader = BlockLoader(blocks, 6 * PAGE, prefetch=2, pin=False)
    for key, weights in loader.run(list(blocks) * 3):
        with lock:
            most[0] = max(most[0], in_flight[0])
        assert weights["w"][0] == int(key[-1])
        assert loader.buffers.kept <= 6 * PAGE
        time.sleep(0.01)
    assert loader.stats.peak_held_bytes <= 6 * PAGE and loader.buffers.made == 3
    assert loader.stats.reads == 15 and loader.buffers.reused == 12
    loader.close()


def test_read_ahead_starts_behind_resident_blocks(tmp_path):
    """The next streamed block is read while resident blocks before it compute: with p1
    pinned, the read of p2 starts while the consumer still holds p0, not once it reaches p1."""
    blocks = make_blocks(tmp_path, {"tr/p0": 2, "tr/p1": 1, "tr/p2": 2, "tr/p3": 2})
    started = {k: threading.Event() for k in blocks}

    class Recording(BlockLoader):
        def _load(self, key):
            started[key].set()
            return super()._load(key)

    loader = Recording(blocks, budget=5 * PAGE, prefetch=1,
                       every_step=("tr/p1", "tr/p0", "tr/p2", "tr/p3"))
    assert loader.pinned == {"tr/p1"}
    runs = loader.run(["tr/p1", "tr/p0", "tr/p1", "tr/p2", "tr/p3"])
    try:
        assert next(runs)[0] == "tr/p1"
        key, weights = next(runs)
        assert key == "tr/p0"
        assert started["tr/p2"].wait(5), "p2 was not read while p0 and resident p1 computed"
        del weights
        assert [k for k, _ in runs] == ["tr/p1", "tr/p2", "tr/p3"]
    finally:
        runs.close()
        loader.close()


def test_blocks_recurring_in_one_run_are_read_once_where_the_budget_has_room(tmp_path):
    """A chunked component runs its blocks once per piece: with p0 pinned for the denoising
    loop, the budget (6 pages) cannot pin the decoder's blocks too (room to stream two
    transformer blocks must stay), but during the decode nothing else streams, so they are
    kept from their first use to their last and read once, not once per piece."""
    sizes = {"tr/p0": 2, "tr/p1": 2, "tr/p2": 2, "vae/h": 1, "vae/u": 1}
    blocks = make_blocks(tmp_path, sizes)
    loader = BlockLoader(blocks, 6 * PAGE, ("tr/p0", "tr/p1", "tr/p2"))
    assert loader.pinned == {"tr/p0"}
    decode = ["vae/h", "vae/u"] * 4
    assert loader.kept_for_run(decode) == {"vae/h", "vae/u"}
    index = {k: i for i, k in enumerate(sizes)}
    list(loader.run(["tr/p0"]))  # the pinned block is resident, as after a denoising loop
    before = loader.stats.bytes_read
    for key, weights in loader.run(decode, keep_recurring=True):
        assert weights["w"][0] == index[key]
    assert loader.stats.bytes_read - before == 2 * PAGE
    assert loader.stats.peak_held_bytes <= 6 * PAGE
    # after the run the kept blocks are let go: the next decode reads them again
    list(loader.run(decode, keep_recurring=True))
    assert loader.stats.bytes_read - before == 4 * PAGE
    # a run that does not ask streams them at every use, as the plan says
    list(loader.run(decode))
    assert loader.stats.bytes_read - before == 4 * PAGE + 8 * PAGE
    # no room: three decoder blocks of 2 pages beside p0, and keeping any one would leave
    # too little to stream the other two one after the other (2 + 2 + 2 + 2 > 6)
    wide = {"tr/p0": 2, "tr/p1": 2, "vae/h": 2, "vae/u": 2, "vae/o": 2}
    (tmp_path / "wide").mkdir()
    tight = BlockLoader(make_blocks(tmp_path / "wide", wide), 6 * PAGE, ("tr/p0", "tr/p1"))
    assert tight.pinned == {"tr/p0"}
    assert tight.kept_for_run(["vae/h", "vae/u", "vae/o"] * 2) == set()
    naive = BlockLoader(blocks, 6 * PAGE, ("tr/p0",), pin=False)
    assert naive.kept_for_run(decode) == set()  # naive loading keeps nothing
    for each in (loader, tight, naive):
        each.close()


# a fresh interpreter's heap: malloc, touch, free 16 MiB three times; prints the bytes of
# RSS each round kept (argv[1] == "fix": with the runtime's mmap threshold first)
KEPT_AFTER_FREE = """
import ctypes, ctypes.util, sys
if sys.argv[1] == "fix":
    from edge.runtimes.python.process_memory import return_freed_activations_to_the_system
    assert return_freed_activations_to_the_system()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
for _ in range(3):
    before = rss()
    buf = libc.malloc(16 << 20)
    ctypes.memset(buf, 1, 16 << 20)
    libc.free(buf)
    print(rss() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="mallopt's mmap threshold is glibc's; other C libraries differ")
def test_freed_activations_go_back_to_the_system_on_glibc():
    """The runtime fixes glibc's mmap threshold so that large freed activation buffers are
    unmapped, not kept in the heap (docs/benchmarks.md: 0.84 GB of RSS between generations
    at Wan 17x128x128, 0.19 GB with it fixed). Left alone, glibc raises the threshold to the
    first 16 MiB buffer freed and keeps the next one's memory."""
    import subprocess
    import sys
    from pathlib import Path

    def kept(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", KEPT_AFTER_FREE, mode], check=True,
                             capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1]).stdout
        return [int(n) for n in out.split()]

    assert max(kept("fix")) < 4 << 20
    assert max(kept("default")) > 8 << 20  # what the fix is for


def test_pinned_blocks_let_go_are_read_again_at_their_next_use(tmp_path):
    blocks = make_blocks(tmp_path, SIZES)
    loader = BlockLoader(blocks, 13 * PAGE, EVERY_STEP)
    list(loader.run(schedule()))
    held, first = loader.buffers.kept, loader.stats.bytes_read
    assert loader.pinned >= set(EVERY_STEP)
    gone = loader.release_pinned(keep=["vae/d"])
    assert gone == sum(blocks[k].nbytes for k in loader.pinned - {"vae/d"})
    assert loader.buffers.kept == held - gone  # unmapped, not kept as free buffers
    index = {k: i for i, k in enumerate(SIZES)}
    for key, weights in loader.run(schedule()):
        assert weights["w"][0] == index[key]
    assert loader.stats.bytes_read - first == gone  # each let-go block read once more
    loader.close()


@pytest.mark.parametrize("cold", [False, True])
def test_a_block_split_in_shards_is_read_back_to_back(tmp_path, cold):
    """A web package's weights file in pieces (`weights.shards`): one buffer holding the
    pieces in order, tensors at their offsets in the joined file, every byte counted."""
    values = np.arange(5 * PAGE, dtype=np.float32)  # 20 KiB: shards of 8, 8 and 4 KiB
    raw = values.tobytes()
    cut = [raw[i:i + 2 * PAGE] for i in range(0, len(raw), 2 * PAGE)]
    paths = []
    for i, piece in enumerate(cut):
        paths.append(tmp_path / f"w.{i}.bin")
        paths[-1].write_bytes(piece)
    tensor = {"name": "w", "dtype": "float32", "shape": [values.size], "offset": 0,
              "bytes": len(raw)}
    block = {"weights": {"path": "w.0.bin", "tensors": [tensor]}}
    spec = BlockWeights.of_block("tr/p0", paths[0], block,
                                 shards=tuple((p, p.stat().st_size, None) for p in paths))
    assert spec.nbytes == len(raw)
    loader = BlockLoader({"tr/p0": spec}, None, cold_reads=cold)
    (key, weights), = list(loader.run(["tr/p0"]))
    assert np.array_equal(weights["w"], values)
    assert loader.stats.bytes_read == len(raw)
    loader.close()
