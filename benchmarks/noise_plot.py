"""The gradient noise scale of unfrozen runs over their steps, per stage, against the step's batch (docs/results.md).

Reads each run folder's metrics.jsonl (the steps that carry `noise_scale_tokens`, tfrun/freeze/noise.py) and its
run_config.json (tokens per step), and draws one panel per folder: the noise scale per stage in tokens, log
scale, with the step batch as a horizontal line (above it, freezing costs almost linearly; well below it,
almost nothing: docs/cost-model.md, "Goodput").

With --freeze (a run that froze, e.g. the online goodput mode), each panel also draws the run's realised freeze
ratio per stage (right axis, the mean over each --window steps), and a table gives, per window, the mean ratio
and the median noise scale per stage, with their rank correlation (Spearman) per stage: issue 38 asks whether the
online goodput mode freezes less as the measured noise scale rises. It also says how often the run re-planned,
and how often its noise reason could fire on the estimator's own scatter: the share of pairs of measured steps
`--horizon` steps apart (a re-plan check's spacing) whose estimates differ by more than the re-plan threshold
(tfrun.freeze.online.NOISE_REPLAN) on some stage, and the median change between consecutive estimates.

    python benchmarks/noise_plot.py runs/study/finetune/seed0/none runs/study/scratch/seed0/none -o noise.png
    python benchmarks/noise_plot.py runs/study/crossing/seed0/timely-goodput --freeze -o crossing.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def metrics(folder: Path) -> list[dict]:
    """The records of a run's metrics.jsonl (steps and events), in order."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def trajectory(folder: Path, rows: list[dict]) -> tuple[list[int], list[list[float | None]], int]:
    """(steps, noise scale per stage per measured step in tokens, tokens per step) of one run's `rows`."""
    steps, scales, tokens = [], [], 0
    for row in rows:
        tokens = row.get("tokens", tokens)
        if "noise_scale_tokens" in row:
            steps.append(row["step"])
            scales.append(row["noise_scale_tokens"])
    if not steps:
        raise SystemExit(f"{folder}: no step measured the noise scale (tfrun train --noise-every)")
    return steps, scales, tokens


def freeze_windows(folder: Path, rows: list[dict], width: int) -> list[tuple[int, list[float], list[float | None]]]:
    """Per window of `width` steps: (first step, mean realised freeze ratio per stage, median noise scale per stage
    over the window's measured steps, None where none)."""
    rows = [r for r in rows if "event" not in r and "freeze_ratio" in r]
    if not rows:
        raise SystemExit(f"{folder}: no step recorded its freeze ratio")
    out = []
    for start in range(0, rows[-1]["step"] + 1, width):
        part = [r for r in rows if start <= r["step"] < start + width]
        if not part:
            continue
        stages = len(part[0]["freeze_ratio"])
        ratio = [sum(r["freeze_ratio"][s] for r in part) / len(part) for s in range(stages)]
        noise = []
        for s in range(stages):
            values = sorted(r["noise_scale_tokens"][s] for r in part
                            if r.get("noise_scale_tokens") and r["noise_scale_tokens"][s] is not None)
            noise.append(statistics.median(values) if values else None)
        out.append((start, ratio, noise))
    return out


def replan_report(rows: list[dict], steps: list[int], scales: list[list[float | None]], horizon: int) -> str:
    """The run's plan events (all, and those with a noise reason), and per stage how far its noise estimates
    (`steps`, `scales`: trajectory's) move on their own: the median |log ratio| of consecutive estimates, and the
    share of pairs `horizon` steps apart (from step `horizon` on, past the early fall) that differ by more than
    NOISE_REPLAN."""
    from tfrun.freeze.online import NOISE_REPLAN

    plans = [r for r in rows if r.get("event") == "plan"]
    by_noise = sum("noise: stage" in (r.get("reason") or "") for r in plans)  # (not a seeded run's first estimates)
    noise = dict(zip(steps, scales))
    lines = [f"  {len(plans)} plans, {by_noise} of them for a noise reason (threshold x{1 + NOISE_REPLAN:.2f})"]
    gated = [(r["step"], r["noise_log_se"]) for r in plans if r.get("noise_log_se")]
    if gated:  # --noise-replan-z: the standard errors of the log noise scale each plan was solved with
        lines.append("  log noise scale's standard error at each plan (step: per stage): " + "; ".join(
            f"{t}: " + ", ".join("-" if v is None else f"{v:.2f}" for v in se) for t, se in gated))
    for s in range(len(scales[0])):
        series = [(t, v[s]) for t, v in sorted(noise.items()) if t >= horizon and v[s]]
        steps = dict(series)
        logs = [abs(math.log(b / a)) for (_, a), (_, b) in zip(series, series[1:])]
        apart = [abs(steps[t + horizon] / v - 1) > NOISE_REPLAN for t, v in series if t + horizon in steps]
        if not logs or not apart:
            lines.append(f"  stage {s}: too few estimates")
            continue
        typical = math.exp(statistics.median(logs))
        lines.append(f"  stage {s}: {len(series)} estimates; consecutive ones differ by x{typical:.2f} (median); "
                     f"{sum(apart)}/{len(apart)} pairs {horizon} steps apart differ by more than the threshold")
    return "\n".join(lines)


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation, tied values sharing their mean rank; NaN where either side is constant."""
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        out = [0.0] * len(x)
        k = 0
        while k < len(order):
            j = k
            while j + 1 < len(order) and x[order[j + 1]] == x[order[k]]:
                j += 1
            for i in order[k:j + 1]:
                out[i] = (k + j) / 2
            k = j + 1
        return out

    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--freeze", action="store_true", help="also the realised freeze ratio per stage, and the table")
    ap.add_argument("--window", type=int, default=25, help="steps per window of the freeze ratio (--freeze)")
    ap.add_argument("--horizon", type=int, default=20, help="steps between re-plan checks (--freeze; tfrun's default)")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(args.folders))
    rows = -(-len(args.folders) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.8 * rows), squeeze=False)
    for ax, folder in zip(axes.flat, args.folders):
        rows = metrics(folder)
        steps, scales, tokens = trajectory(folder, rows)
        for s, style in zip(range(len(scales[0])), ("-", "--", ":", "-.")):
            ax.plot(steps, [row[s] for row in scales], style, label=f"stage {s}")
        ax.axhline(tokens, color="black", lw=0.8, label=f"step batch ({tokens:,} tokens)")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("noise scale (tokens)")
        ax.set_title(f"{folder.parent.parent.name}/{folder.parent.name}/{folder.name}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        if args.freeze:
            windows = freeze_windows(folder, rows, args.window)
            right = ax.twinx()
            for s, style in zip(range(len(windows[0][1])), ("-", "--", ":", "-.")):
                right.step([w[0] for w in windows], [w[1][s] for w in windows], style, where="post", color="tab:red",
                           alpha=0.7, label=f"freeze ratio, stage {s}")
            right.set_ylim(0, 1)
            right.set_ylabel(f"realised freeze ratio (mean over {args.window} steps)")
            right.legend(fontsize=8, loc="lower right")
            print(f"{folder}: per window of {args.window} steps, mean freeze ratio and median noise scale per stage")
            for start, ratio, noise in windows:
                print(f"  steps {start:4d}-{start + args.window - 1:<4d} ratio "
                      + " ".join(f"{r:.2f}" for r in ratio) + "  noise "
                      + " ".join("-" if n is None else f"{n:,.0f}" for n in noise))
            for s in range(len(windows[0][1])):
                pairs = [(w[1][s], w[2][s]) for w in windows if w[2][s] is not None]
                rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
                print(f"  stage {s}: Spearman(freeze ratio, noise scale) = "
                      + ("- (the ratio never changes)" if math.isnan(rho) else f"{rho:+.2f}")
                      + f" over {len(pairs)} windows")
            print(replan_report(rows, steps, scales, args.horizon))
        print(f"{folder}: " + "; ".join(f"step {st}: " + ", ".join(f"{x:,.0f}" for x in row)
                                        for st, row in list(zip(steps, scales))[:: max(1, len(steps) // 6)]))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
