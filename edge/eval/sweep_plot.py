"""`edge eval --sweep --plot PNG`: the sweep's speed-quality frontier as one picture.

One point per setting in each regime's panel: x is the wall-time speedup over the baseline, y the
largest loss of colour, shape or direction accuracy against the baseline (0 is no loss;
higher is better), so a setting worth having sits to the right and near the top. The
baseline is a star at (1, 0); the band marks the loss the sweep's quality target allows.
"""

from __future__ import annotations

from pathlib import Path

from edge.core.files import atomic_file

ACCURACIES = ("color_acc", "shape_acc", "direction_acc")
# the leap target of docs/benchmarks.md: every accuracy within 0.02 of the baseline
ALLOWED_LOSS = 0.02
MARKER_CYCLE = "osD^vP<>Xph"


def worst_accuracy_change(row: dict, baseline: dict) -> float:
    """The most negative change of any attribute accuracy against the baseline."""
    return min(row[k] - baseline[k] for k in ACCURACIES)


def plot_frontier(result: dict, path: Path) -> None:
    """Write the plot of a `run_sweep` result to `path` (PNG): one panel per regime, each
    setting in its own colour and marker in both, named once in a shared legend (names
    written beside the points overlap where settings land close together)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    regimes = list(result["regimes"].items())
    names = [r["setting"] for r in regimes[0][1][1:]]
    colours = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, len(regimes), figsize=(12, 6), dpi=90, sharey=True,
                             squeeze=False)
    for ax, (regime, rows) in zip(axes[0], regimes, strict=True):
        baseline = rows[0]
        ax.axhspan(-ALLOWED_LOSS, 0.0, color="tab:green", alpha=0.12,
                   label=f"within {ALLOWED_LOSS} of the baseline")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.axvline(1.0, color="grey", lw=0.8)
        for row in rows[1:]:
            i = names.index(row["setting"])
            ax.scatter(row["speedup"], worst_accuracy_change(row, baseline), s=60, zorder=3,
                       color=colours[i % len(colours)], marker=MARKER_CYCLE[i % len(MARKER_CYCLE)],
                       edgecolors="black", linewidths=0.5, label=row["setting"])
        ax.scatter([1.0], [0.0], marker="*", s=260, color="black", label="baseline", zorder=4)
        ax.set_title(regime)
        ax.set_xlabel("wall-time speedup over the baseline (×)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("worst change of colour / shape / direction accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(f"{Path(result['package']).name}: {result['n_prompts']} prompts, "
                 f"{result['steps']}-step baseline")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    try:
        with atomic_file(path, "--plot") as tmp:  # a reader never sees half a PNG
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
