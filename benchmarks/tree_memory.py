"""A command's wall and the peak of its whole process tree's resident memory.

    python benchmarks/tree_memory.py [--every 0.5] -- COMMAND ARGS...

`/usr/bin/time -v` reports the largest single process's peak; a command whose work runs in
child processes side by side (`edge export --target iphone --min-ios 27`: Core AI workers)
holds their sum. This samples the resident memory of the command and all its descendants
(psutil, every `--every` seconds) and prints, when the command ends, its wall, the peak of
the sum and the largest single process's beside it. Sampling can miss a peak shorter than
the interval.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psutil  # with edge[export] (accelerate's)


def resident(root: psutil.Process) -> list[int]:
    """The resident bytes of `root` and each descendant alive now."""
    found = []
    for process in [root, *root.children(recursive=True)]:
        try:
            found.append(process.memory_info().rss)
        except psutil.Error:   # ended meanwhile
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    started = time.perf_counter()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peak_sum = peak_one = 0
    while child.poll() is None:
        sizes = resident(root)
        peak_sum, peak_one = max(peak_sum, sum(sizes)), max([peak_one, *sizes])
        time.sleep(args.every)
    wall = time.perf_counter() - started
    print(f"tree_memory: wall {wall:.0f} s, peak RSS of the process tree {peak_sum / 2**30:.2f} "
          f"GiB, of its largest process {peak_one / 2**30:.2f} GiB (sampled every "
          f"{args.every:g} s); exit status {child.returncode}", file=sys.stderr)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
