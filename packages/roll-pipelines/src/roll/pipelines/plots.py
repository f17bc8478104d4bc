"""End-of-run plots of the main curves, from metrics.jsonl (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from roll.pipelines.tracking import read_metrics

__all__ = ["PLOT_GROUPS", "write_plots"]

# File name -> substrings selecting metric keys for that figure. "skill" holds the held-out correctness and format
# curves (roll.pipelines.evaluation), apart from the reward the verifier gives.
PLOT_GROUPS: dict[str, tuple[str, ...]] = {
    "skill": ("val/correct", "val/format", "pass@", "exact_match"),
    "loss": ("loss",),
    "reward": ("reward", "accuracy", "score", "pass@"),
    "kl": ("kl",),
    "lengths": ("length",),
    "optim": ("grad_norm", "lr"),
    "throughput": ("time/", "tokens_per_s", "samples_per_s"),
}


def write_plots(metrics_path: str | Path, out_dir: str | Path, max_curves: int = 12) -> list[Path]:
    """One PNG per group that has data; returns the written files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    out_dir = Path(out_dir)
    written = []
    for group, patterns in PLOT_GROUPS.items():
        keys = sorted(
            {
                k
                for row in rows
                for k, v in row.items()
                if k != "step" and isinstance(v, int | float) and any(p in k for p in patterns)
            }
        )
        keys = keys[:max_curves]
        if not keys:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        cols = min(3, len(keys))
        nrows = (len(keys) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
        for ax, key in zip(axes.flat, keys):
            points = [(row["step"], row[key]) for row in rows if isinstance(row.get(key), int | float)]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None)
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(keys) :]:
            ax.axis("off")
        fig.tight_layout()
        path = out_dir / f"{group}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
