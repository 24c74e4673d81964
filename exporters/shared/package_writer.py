"""The one package writer every target hands its blocks to: the folder written atomically,
the manifest's head and the target's own fields, each component's blocks exported in order
(their example inputs chained from the block before), the component records, the manifest,
and the end-to-end check run on the package as written.

A target says what differs (`PackageParts`): how it exports a block (or a component's
blocks at once), the fields it adds to the manifest before and after the components, and its
check; the order of the manifest's fields is the writer's, so every target's packages read
alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from edge.core.package import atomic_directory, write_manifest
from edge.core.tiles import Tiling
from edge.exporters.shared.package_head import manifest_head
from edge.graph.blocks import Block, chained
from edge.graph.family_model import FamilyModel

OnBlock = Callable[[str], None]


def each_block(name: str, blocks: list[Block]) -> Iterable[Block]:
    """A component's blocks as most targets export them: in order, each one's example inputs
    made from the outputs of the one before."""
    return chained(blocks)


@dataclass
class PackageParts:
    """What a target gives the writer.

    `export_block(component, block, root)`: the block's manifest record (its files written
    under `root`); or `export_component(component, blocks, root, on_block)`: every record of a
    component at once (Core AI converts a component's blocks in workers side by side).
    `blocks(component, blocks)`: the blocks as they are exported (default: chained; a target
    may add variants). `head(root)`: the target's fields after the manifest's head (its
    section, a plan), files it writes first included. `component_fields(component, blocks)`:
    a component record's fields after its blocks (beside the family's chunking). `tail(root,
    manifest)`: fields after the components (the page's site files; a structure check that
    raises). `check(root, manifest)`: the end-to-end check of the package as written, its
    result the manifest's `validation` (None: no check recorded)."""

    target: str
    export_block: Callable[[str, Block, Path], dict] | None = None
    export_component: Callable[[str, list[Block], Path, OnBlock | None], list[dict]] | None = None
    blocks: Callable[[str, list[Block]], Iterable[Block]] = each_block
    head: Callable[[Path], dict] = lambda root: {}
    component_fields: Callable[[str, list[Block]], dict] = lambda name, blocks: {}
    tail: Callable[[Path, dict], dict] = lambda root, manifest: {}
    check: Callable[[Path, dict], dict | None] | None = None
    raw_null_caption: bool = False  # a raw float32 null caption too (Swift reads no .npy)
    # the components decoded in tiles, as the blocks were cut (FamilyModel applied_tiles):
    # the manifest's `tiles`
    tiles: dict[str, Tiling] = field(default_factory=dict)


def write_package(model: FamilyModel, dest: Path, components: dict[str, list[Block]],
                  parts: PackageParts, model_name: str | None = None,
                  on_block: OnBlock | None = None) -> dict:
    """Write the package of `components` to `dest` atomically (nothing there changes unless
    the whole package, its check included, succeeds); returns the manifest."""
    if (parts.export_block is None) == (parts.export_component is None):
        raise ValueError("a target gives export_block or export_component, one of them")
    with atomic_directory(dest) as root:
        manifest = manifest_head(model, root, parts.target, model_name or model.name,
                                 raw_null_caption=parts.raw_null_caption)
        manifest |= parts.head(root)
        manifest["components"] = []
        for name, blocks in components.items():
            component = {"name": name,
                         "blocks": _records(name, blocks, root, parts, on_block)}
            if name in model.chunked:   # run piece by piece, the state carried
                component["chunked"] = model.chunked[name].to_dict(blocks)
            if name in parts.tiles:
                component["tiles"] = parts.tiles[name].to_dict()
            component |= parts.component_fields(name, blocks)
            manifest["components"].append(component)
        manifest |= parts.tail(root, manifest)
        write_manifest(root, manifest)   # the check reads the package as written
        if parts.check is not None and (validation := parts.check(root, manifest)) is not None:
            manifest["validation"] = validation
            write_manifest(root, manifest)
    return manifest


def _records(name: str, blocks: list[Block], root: Path, parts: PackageParts,
             on_block: OnBlock | None) -> list[dict]:
    if parts.export_component is not None:
        return parts.export_component(name, blocks, root, on_block)
    records = []
    for block in parts.blocks(name, blocks):
        records.append(parts.export_block(name, block, root))
        if on_block:
            on_block(block.key)
    return records
