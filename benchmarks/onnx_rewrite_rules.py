"""Where an ONNX export's time goes in onnxscript's rewrite rules, and what leaving out the
quadratic ones saves (exporters/shared/onnx_rewrites.py): a model exported to ONNX twice in one run,
with onnxscript's default rules and with the exporter's, each rule's matching timed.

The model is the tests' tiny Open-Sora (the fixture's checkpoint at its size, attention in
the tests' query chunks of 16 rows), or any folder `edge export` takes.

    python benchmarks/onnx_rewrite_rules.py [--model FOLDER --height H --width W --frames F]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnxscript.rewriter import _rewrite_rule

from edge.exporters.onnx.package import export_onnx
from edge.exporters.shared.graph_reuse import forget_graphs
from edge.families import load_model
from edge.graph.attention import score_limit

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parents[1] / "shared" / "fixtures" / "opensora-1.2-tiny"


@contextlib.contextmanager
def timed_rules(spent: collections.Counter, fired: collections.Counter):
    """Each rule's matching time and rewrites while the block lasts."""
    try_rewrite = _rewrite_rule.RewriteRule.try_rewrite

    def timed(rule, *args, **kwargs):
        start = time.perf_counter()
        result = try_rewrite(rule, *args, **kwargs)
        name = rule.name or "(unnamed)"
        spent[name] += time.perf_counter() - start
        fired[name] += result is not None
        return result

    _rewrite_rule.RewriteRule.try_rewrite = timed
    try:
        yield
    finally:
        _rewrite_rule.RewriteRule.try_rewrite = try_rewrite


@contextlib.contextmanager
def onnxscripts_defaults():
    """The exporter's rule set swapped back for onnxscript's own."""
    from edge.exporters.shared import onnx_rewrites

    leave_out = onnx_rewrites.QUADRATIC_RULES
    onnx_rewrites.QUADRATIC_RULES = frozenset()
    try:
        yield
    finally:
        onnx_rewrites.QUADRATIC_RULES = leave_out


def export(model, dest: Path, defaults: bool) -> tuple[float, collections.Counter,
                                                       collections.Counter]:
    spent, fired = collections.Counter(), collections.Counter()
    forget_graphs()  # or the second export copies the first one's graphs
    rules = onnxscripts_defaults() if defaults else contextlib.nullcontext()
    start = time.perf_counter()
    with rules, timed_rules(spent, fired), score_limit(2048, min_rows=16):
        export_onnx(model, dest)
    return time.perf_counter() - start, spent, fired


def graphs(root: Path) -> dict[str, list[str]]:
    return {p.relative_to(root).as_posix(): [n.op_type for n in onnx.load(p).graph.node]
            for p in sorted(root.rglob("*.onnx"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=FIXTURE)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--frames", type=int, default=34)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if not args.model.is_dir():
        sys.exit(f"no model folder at {args.model} (--model)")
    model = load_model(args.model, height=args.height, width=args.width, frames=args.frames,
                       steps=args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, defaults in (("onnxscript's defaults", True), ("the exporter's", False)):
            dest = Path(tmp) / name.split()[-1].strip("'")
            runs[name] = (*export(model, dest, defaults), graphs(dest))
        for name, (seconds, spent, fired, _) in runs.items():
            print(f"{name}: export {seconds:.1f} s, rule matching {sum(spent.values()):.1f} s")
            for rule, s in spent.most_common(5):
                print(f"    {s:6.1f} s  {fired[rule]:4d} rewrites  {rule}")
        (a, *_, ga), (b, *_, gb) = runs.values()
        print(f"ratio: {a / b:.2f}x faster; the graphs' nodes are "
              f"{'the same' if ga == gb else 'different'} ({len(ga)} graphs)")


if __name__ == "__main__":
    main()
