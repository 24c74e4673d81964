"""`edge export --memory-budget`: cut the blocks for a budget, and say what stays resident.

The planned working set while streaming is the pinned blocks plus two streamed blocks: the one
computing and the one being read ahead. So, for a budget B:

1. Split: a block larger than B/2 leaves no room to read the next block while it computes; a
   block that large is split where its family says how (`Block.splitter`; tiny-sora: a
   transformer pair into its spatial and temporal halves). A block still
   larger than B cannot run at all: refused, naming it and the smallest budget that works.
   Pairs are also split where the halves let the loader pin more of the transformer (a finer
   grain fills the budget better), so fewer bytes are read every denoising step.
2. Pin: the runtime loader's own policy (`edge.core.budget.plan_pins`) on the sizes the
   blocks will have in the package, so the plan printed is the plan that runs.
3. Merge: adjacent streamed blocks of one kind (`layer_0`, `layer_1`, ...) are merged into one
   block while the merged weights stay within READ_UNIT and within the second largest
   streamed block, so streaming them is one large read instead of several small ones, and
   the two largest streamed blocks, hence the working set and what is pinned, stay as they
   were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from edge.core.budget import check_budget, format_size, plan_pins
from edge.core.package import weights_layout
from edge.graph.blocks import Block
from edge.planning.partition import kind, merge, split, splittable

# Reads of this size reach the disk's sequential bandwidth (docs/benchmarks.md); merging
# blocks beyond it gains nothing and coarsens what the loader can pin.
READ_UNIT = 16 << 20


def block_bytes(block: Block) -> int:
    """The size of the block's weights file in the package (flash layout, page padded)."""
    return weights_layout({n: p.numel() * p.element_size()
                           for n, p in block.parameters().items()})[1]


# What a block will occupy once loaded on the target: its weights file as the onnx and web
# packages store it (block_bytes), or the stored form a target compresses it to (iphone).
SizeOf = Callable[[Block], int]


@dataclass
class Partition:
    components: dict[str, list[Block]]
    members: dict[str, list[str]] = field(default_factory=dict)  # new block key -> cut from
    notes: list[str] = field(default_factory=list)

    def to_manifest(self, budget: int, read_unit: int) -> dict:
        return {"memory_budget_bytes": budget, "read_unit_bytes": read_unit,
                "blocks": {k: v for k, v in self.members.items()}}


def _split_large(blocks: list[Block], limit: int, why: str, out: Partition,
                 size_of: SizeOf) -> list[Block]:
    """Split every splittable block larger than `limit` bytes."""
    result = []
    for b in blocks:
        size = size_of(b)
        if size > limit and splittable(b):
            halves = split(b)
            for h in halves:
                out.members[h.key] = [b.name]
            result += halves
            out.notes.append(f"{b.key} ({format_size(size)}) split into {halves[0].name} and "
                             f"{halves[1].name}: {why}")
        else:
            result.append(b)
    return result


def _streamed_per_step(components: dict[str, list[Block]], budget: int,
                       size_of: SizeOf) -> int:
    """Bytes read every denoising step: the transformer blocks left unpinned."""
    sizes = {b.key: size_of(b) for blocks in components.values() for b in blocks}
    pinned = _pins(components, sizes, budget)
    return sum(sizes[b.key] for b in components.get("transformer", []) if b.key not in pinned)


def _split(components: dict[str, list[Block]], budget: int, out: Partition,
           size_of: SizeOf) -> dict:
    """Pairs larger than half the budget must split (two must fit: one computing, one read
    ahead). The others split too where halves pin more, so fewer bytes stream every step."""
    must = Partition({})
    kept = {c: _split_large(blocks, budget // 2, f"two of it do not fit {format_size(budget)}, "
                            "so the next block could not be read while it computes", must,
                            size_of)
            for c, blocks in components.items()}
    check_budget({b.key: size_of(b) for blocks in kept.values() for b in blocks}, budget)
    every = Partition({})
    halves = {c: _split_large(blocks, 0, "", every, size_of) for c, blocks in components.items()}
    if every.members.keys() != must.members.keys():
        before = _streamed_per_step(kept, budget, size_of)
        after = _streamed_per_step(halves, budget, size_of)
        if after < before:
            out.members |= every.members
            out.notes.append(f"transformer pairs split into spatial and temporal halves: "
                             f"halves pin more, {format_size(after)} instead of "
                             f"{format_size(before)} streamed every step")
            return halves
    out.members |= must.members
    out.notes += must.notes
    return kept


def _merge_runs(blocks: list[Block], cap: int, pinned: set[str], out: Partition,
                size_of: SizeOf) -> list[Block]:
    result, run = [], []

    def flush(upto: int) -> None:
        if len(run) > 1:
            later = {n for b in blocks[upto:] for n in b.inputs}
            merged = merge(run, later)
            out.members[merged.key] = [b.name for b in run]
            out.notes.append(f"{merged.key} = {', '.join(b.name for b in run)} "
                             f"({format_size(size_of(merged))}): one read instead of "
                             f"{len(run)}")
            result.append(merged)
        else:
            result.extend(run)
        run.clear()

    size = 0
    for i, b in enumerate(blocks):
        n = size_of(b)
        if run and (b.key in pinned or run[-1].key in pinned or kind(b.name) is None
                    or kind(b.name) != kind(run[-1].name) or size + n > cap):
            flush(i)
        if not run:
            size = 0
        run.append(b)
        size += n
    flush(len(blocks))
    return result


def partition(components: dict[str, list[Block]], budget: int | None,
              read_unit: int = READ_UNIT, size_of: SizeOf = block_bytes) -> Partition:
    """The blocks to export for `budget` (None: as cut, nothing changes), each block
    counted as `size_of` says it will occupy once loaded."""
    if budget is None:
        return Partition(dict(components))
    out = Partition({})
    split_components = _split(components, budget, out, size_of)
    sizes = {b.key: size_of(b) for blocks in split_components.values() for b in blocks}
    pinned = _pins(split_components, sizes, budget)  # refuses a budget below the largest block
    streamed = sorted((n for k, n in sizes.items() if k not in pinned), reverse=True)
    cap = min(read_unit, streamed[1]) if len(streamed) > 1 else 0
    out.components = {c: _merge_runs(blocks, cap, pinned, out, size_of)
                      for c, blocks in split_components.items()}
    return out


def _pins(components: dict[str, list[Block]], sizes: dict[str, int],
          budget: int | None) -> set[str]:
    every_step = tuple(b.key for b in components.get("transformer", []))
    return plan_pins(sizes, budget, every_step)


def plan_residency(components: dict[str, list[Block]], budget: int | None,
                   size_of: SizeOf = block_bytes) -> dict:
    sizes = {b.key: size_of(b) for blocks in components.values() for b in blocks}
    pinned = _pins(components, sizes, budget)
    streamed = sorted(((n, k) for k, n in sizes.items() if k not in pinned), reverse=True)
    resident = sum(sizes[k] for k in pinned)
    # pinned + the block computing + the one read ahead; the loader never holds more than the
    # budget, so where the two largest streamed blocks do not fit, the read waits instead
    working_set = resident + sum(n for n, _ in streamed[:2])
    notes = []
    if budget is not None and working_set > budget:
        notes.append(f"{format_size(budget)} cannot hold {streamed[0][1]} and the next block "
                     f"together: the next block cannot be read while {streamed[0][1]} "
                     f"computes (a budget of {format_size(working_set)} allows it)")
    return {"blocks": [{"block": k, "bytes": n, "resident": k in pinned}
                       for k, n in sizes.items()],
            "total_bytes": sum(sizes.values()), "largest_bytes": max(sizes.values()),
            "resident_bytes": resident, "working_set_bytes": working_set, "notes": notes}


def plan_lines(plan: dict, members: dict[str, list[str]], budget: int | None,
               unit: str = "weights") -> list[str]:
    """The --dry-run table of a residency plan: per block its bytes and whether it stays
    resident, what a re-cut block was made of, then the totals."""
    lines = [f"{'block':<28}{unit:>12}  at {format_size(budget) if budget else 'no budget'}"]
    for row in plan["blocks"]:
        made_of = members.get(row["block"])
        lines.append(f"{row['block']:<28}{format_size(row['bytes']):>12}  "
                     f"{'resident' if row['resident'] else 'streamed every use'}"
                     f"{'  <- ' + ', '.join(made_of) if made_of else ''}")
    lines.append(f"total {format_size(plan['total_bytes'])}, resident "
                 f"{format_size(plan['resident_bytes'])}, largest block "
                 f"{format_size(plan['largest_bytes'])}, working set "
                 f"{format_size(plan['working_set_bytes'])} (resident + the block computing"
                 " + the block read ahead)")
    return lines


def device_residency(cut: Partition, budget: int, held: dict[str, int], setting: str,
                     unit: str) -> tuple[list[str], list[str]]:
    """A device target's residency at `budget` for its dry run: the lines (each block counted
    at `held`, the bytes its program stores at `setting`; the table's column named `unit`)
    and the plan's notes."""
    plan = plan_residency(cut.components, budget, size_of=lambda block: held[block.key])
    lines = ["", f"residency on the device at {format_size(budget)} (stored {setting} bytes, "
             "estimated; the Swift loader's plan):"]
    return lines + plan_lines(plan, cut.members, budget, unit=unit), plan["notes"]
