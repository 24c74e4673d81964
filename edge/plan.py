"""`edge export --dry-run`: which blocks a memory budget keeps resident, before exporting.

Uses the runtime loader's own policy on the sizes the blocks will have in the package, so the
plan printed is the plan that runs.
"""

from __future__ import annotations

from edge.blocks import Block
from edge.package import weights_layout
from runtimes.python.loader import plan_pins


def plan_residency(components: dict[str, list[Block]], budget: int | None) -> dict:
    sizes = {b.key: weights_layout({n: p.numel() * 4 for n, p in b.parameters().items()})[1]
             for blocks in components.values() for b in blocks}
    every_step = tuple(b.key for b in components.get("transformer", []))
    pinned = plan_pins(sizes, budget, every_step)
    return {"blocks": [{"block": k, "bytes": n, "resident": k in pinned}
                       for k, n in sizes.items()],
            "total_bytes": sum(sizes.values()), "largest_bytes": max(sizes.values()),
            "resident_bytes": sum(sizes[k] for k in pinned)}
