"""Memory budgets: sizes as users write them, and the policy both the export planner and the
runtimes apply (the largest block must fit; which blocks stay resident). Below both: it
imports neither a runtime nor a model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

# far above any machine's memory: a budget past it is a typo, not a plan
MAX_SIZE = 1 << 60
# One convention for sizes, in what edge reads and what it writes: binary units. A size given
# as 64MB, 64MiB or 64M is 64 x 2^20 bytes; sizes are written in KiB, MiB and GiB.
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MIB, GIB = _UNITS["M"], _UNITS["G"]


def physical_memory_bytes() -> int:
    """This machine's memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class BudgetError(ValueError):
    """A memory budget that cannot work (too small for the largest block)."""


def parse_size(value: str | int | None, name: str = "memory size") -> int | None:
    """'64MB', '1.5GiB', '512k', 1000 -> bytes (powers of 1024 for every unit); None stays
    None. Anything else (not finite, not positive, under one byte, another type) is refused
    with a ValueError naming `name`: the option (--memory-budget) or argument (memory_budget)
    the value came from."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{name}: {value!r} is a {type(value).__name__}; give a whole number "
                         "of bytes (int) or a size such as '64MB'")
    if isinstance(value, int):
        number, factor = value, 1
    else:
        s = value.strip().upper().removesuffix("B").removesuffix("I")
        factor = _UNITS.get(s[-1:], 1)
        try:
            number = float(s[:-1] if s[-1:] in _UNITS else s)
        except ValueError:
            raise ValueError(f"{name} {value!r}: not understood; use e.g. 64MB or 1.5GB"
                             ) from None
        if not math.isfinite(number):
            raise ValueError(f"{name} {value!r}: must be a finite size, e.g. 64MB or 1.5GB")
    if number <= 0:
        raise ValueError(f"{name} {value!r}: must be positive")
    if number * factor > MAX_SIZE:
        raise ValueError(f"{name} {value!r}: more than {format_size(MAX_SIZE)}, beyond any "
                         "machine's memory")
    size = int(number * factor)
    if size < 1:
        raise ValueError(f"{name} {value!r}: less than one byte")
    return size


def format_size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n} B"


def format_sizes(*sizes: int) -> list[str]:
    """Each size as format_size writes it, or in bytes when two different sizes would read
    the same ("45.5 MiB is smaller than 45.5 MiB" says nothing)."""
    shown = [format_size(n) for n in sizes]
    if len(set(shown)) < len(set(sizes)):
        return [f"{n:,} bytes" for n in sizes]
    return shown


def check_budget(sizes: dict[str, int], budget: int | None) -> None:
    """Refuse, before anything runs, a budget that cannot hold the largest block."""
    key = max(sizes, key=sizes.get)
    if budget is not None and budget < sizes[key]:
        shown_budget, shown_block = format_sizes(budget, sizes[key])
        raise BudgetError(
            f"memory budget {shown_budget} is smaller than block {key} "
            f"({shown_block}); the smallest budget that works is "
            f"{format_size(sizes[key])} ({sizes[key]} bytes)")


def plan_pins(sizes: dict[str, int], budget: int | None, every_step: tuple[str, ...] = (),
              prefetch: int = 1) -> set[str]:
    """The blocks kept in memory once loaded. Pinning must leave room to stream the largest
    remaining block plus one prefetched block; blocks run every step are considered first,
    in execution order, then the rest."""
    check_budget(sizes, budget)
    if budget is None:
        return set(sizes)
    order = list(every_step) + [k for k in sizes if k not in every_step]
    return fill_budget(sizes, budget, order, prefetch)


def fill_budget(sizes: dict[str, int], budget: int, order: Iterable[str], prefetch: int,
                held: set[str] = frozenset()) -> set[str]:
    """The blocks of `order`, taken in turn, that can stay in memory beside those `held`
    while room remains to stream the largest other block of `sizes` plus one read ahead."""
    held_bytes = sum(sizes[k] for k in held)
    chosen: set[str] = set()
    for key in order:
        trial = chosen | {key}
        streamed = sorted((n for k, n in sizes.items() if k not in trial and k not in held),
                          reverse=True)
        reserve = sum(streamed[:1 + min(prefetch, 1)])
        if held_bytes + sum(sizes[k] for k in trial) + reserve <= budget:
            chosen = trial
    return chosen


