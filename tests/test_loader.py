"""Block loader scheduling: budgets, pinning, streaming, prefetch and what it counts."""
import threading
import time

import numpy as np
import pytest

from runtimes.python.loader import BlockLoader, BlockWeights, BudgetError, parse_size, plan_pins

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
    import runtimes.python.loader as loader_module

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
    import runtimes.python.loader as loader_module

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
    assert loader._budget.held == sum(
        blocks[k].nbytes for k in loader._resident)
    list(loader.run(schedule()))  # and the next run is not starved
    loader.close()
