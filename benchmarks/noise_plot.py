"""The gradient noise scale of unfrozen runs over their steps, per stage, against the step's batch (docs/results.md).

Reads each run folder's metrics.jsonl (the steps that carry `noise_scale_tokens`, tfrun/freeze/noise.py) and its
run_config.json (tokens per step), and draws one panel per folder: the noise scale per stage in tokens, log
scale, with the step batch as a horizontal line (above it, freezing costs almost linearly; well below it,
almost nothing: docs/cost-model.md, "Goodput").

    python benchmarks/noise_plot.py runs/study/finetune/seed0/none runs/study/scratch/seed0/none -o noise.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def trajectory(folder: Path) -> tuple[list[int], list[list[float]], int]:
    """(steps, noise scale per stage per measured step in tokens, tokens per step) of one run folder."""
    steps, scales, tokens = [], [], 0
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        tokens = row.get("tokens", tokens)
        if "noise_scale_tokens" in row:
            steps.append(row["step"])
            scales.append(row["noise_scale_tokens"])
    if not steps:
        raise SystemExit(f"{folder}: no step measured the noise scale (tfrun train --noise-every)")
    return steps, scales, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(args.folders))
    rows = -(-len(args.folders) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.8 * rows), squeeze=False)
    for ax, folder in zip(axes.flat, args.folders):
        steps, scales, tokens = trajectory(folder)
        for s, style in zip(range(len(scales[0])), ("-", "--", ":", "-.")):
            ax.plot(steps, [row[s] for row in scales], style, label=f"stage {s}")
        ax.axhline(tokens, color="black", lw=0.8, label=f"step batch ({tokens:,} tokens)")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("noise scale (tokens)")
        ax.set_title(str(folder.parent.parent.name + "/" + folder.parent.name), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        print(f"{folder}: " + "; ".join(f"step {st}: " + ", ".join(f"{x:,.0f}" for x in row)
                                        for st, row in list(zip(steps, scales))[:: max(1, len(steps) // 6)]))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
