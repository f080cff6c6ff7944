"""The gradient noise scale of unfrozen runs over their steps, per stage, against the step's batch (docs/results.md).

Reads each run folder's metrics.jsonl (the steps that carry `noise_scale_tokens`, tfrun/freeze/noise.py) and its
run_config.json (tokens per step), and draws one panel per folder: the noise scale per stage in tokens, log
scale, with the step batch as a horizontal line (above it, freezing costs almost linearly; well below it,
almost nothing: docs/cost-model.md, "Goodput").

With --freeze (a run that froze, e.g. the online goodput mode), each panel also draws the run's realised freeze
ratio per stage (right axis, the mean over each --window steps) and, from its plan events, the planned ratio per
stage as a step line, each re-plan as a vertical line (blue: the learning model's inputs moved; grey: an action time
drifted; green: a bounded move continued; black: the first or seed plan) and each check that kept its plan as a
tick at the top; the noise scales each plan was solved with are drawn as points with their +-1 standard error bars
(tfrun.freeze.controller Note [learning gate]); a second panel beside it draws each window's realised ratio per
stage against its median noise scale over the step batch (log scale, a line where they are equal), the windows
with a re-plan ringed in its colour. A table gives, per window, the mean ratio and the median noise scale
per stage, with their rank correlation (Spearman) per stage: issue 38 asks whether the online goodput mode freezes
less as the measured noise scale rises. It also explains every re-plan (issue 46): which input moved, by how many
standard errors, and the predicted goodput before and after; counts the re-plans by cause and the learning re-plans
whose move was not beyond two standard errors (the gate's default: there should be none); and says how often a
25% rule (tfrun.freeze.controller.NOISE_REPLAN) would fire on the estimator's own scatter: the share of pairs of
measured steps `--horizon` steps apart (a check's spacing) whose estimates differ by more than that on some stage,
and the median change between consecutive estimates.

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
    """The run's plan and check events, each explained (Note [goodput controller]), counted by cause, and per stage
    how far its noise estimates (`steps`, `scales`: trajectory's) move on their own: the median |log ratio| of
    consecutive estimates, and the share of pairs `horizon` steps apart (from step `horizon` on, past the early
    fall) that differ by more than NOISE_REPLAN."""
    from tfrun.config.train_config import GATE_Z
    from tfrun.freeze.controller import NOISE_REPLAN

    plans = [r for r in rows if r.get("event") == "plan"]
    checks = [r for r in rows if r.get("event") == "check"]
    kinds = [replan_kind(r) for r in plans]
    learning = [m for r in plans + checks for m in r.get("moves", []) if m.get("input") != "time"]
    ungated = sum(1 for m in learning if m.get("z") is None or m["z"] <= GATE_Z)
    lines = [f"  {len(plans)} plans: " + ", ".join(f"{kinds.count(k)} {k}" for k in KINDS if kinds.count(k))
             + f"; {len(checks)} checks kept their plan (hysteresis); {len(learning)} input moves behind them, "
             f"{ungated} of them within {GATE_Z:g} standard errors or unresolved"]
    for r in plans + checks:
        moved = "; ".join(_move_text(m) for m in r.get("moves", []))
        value = ""
        if "goodput_before" in r:
            value = (f"; goodput {r['goodput_before']:.4f} -> {r['goodput_after']:.4f} (optimum "
                     f"{r['goodput_target']:.4f}{', bounded' if r.get('bounded') else ''})")
        ratio = " ".join(f"{x:.2f}" for x in r.get("mean_freeze_ratio", []))
        lines.append(f"  step {r['step']:4d} {r['event']:5s} {r['reason']}" + (f" [{moved}]" if moved else "")
                     + value + (f"; ratios {ratio}" if ratio else f"; {r.get('decision', '')}"))
    noise = dict(zip(steps, scales))
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
                     f"{sum(apart)}/{len(apart)} pairs {horizon} steps apart differ by more than "
                     f"{NOISE_REPLAN:.0%}")
    return "\n".join(lines)


KINDS = ("first", "learning", "drift", "continuing")
"""Plan events by cause (replan_kind), in the order the report counts them."""


def replan_kind(event: dict) -> str:
    """first (the first or seed plan), learning (an input of the learning model moved: a noise or share reason),
    drift (an action time only) or continuing (a bounded move's next step)."""
    reason = event.get("reason") or ""
    if reason in ("first plan", "seed plan"):
        return "first"
    if reason.startswith("continuing"):
        return "continuing"
    return "learning" if "noise:" in reason or "share:" in reason else "drift"


def _move_text(move: dict) -> str:
    if move.get("input") == "time":
        return f"time {move['key']} x{move['ratio']:.2f}"
    z = f", {move['z']:.1f} SE" if move.get("z") is not None else ""
    return f"stage {move['stage']} {move['input']} {move['from']:,.4g} -> {move['to']:,.4g}{z}"


def draw_plans(ax, right, rows: list[dict]) -> None:
    """The planned ratio per stage (step lines, right axis), each plan event as a vertical line by cause, each
    kept check as a tick at the top, and the noise scales each plan was solved with, +-1 standard error (left)."""
    plans = [r for r in rows if r.get("event") == "plan"]
    if not plans:
        return
    last = max(r["step"] for r in rows if "event" not in r)
    colors = {"first": "black", "learning": "tab:blue", "drift": "grey", "continuing": "tab:green"}
    for r in plans:
        ax.axvline(r["step"], color=colors[replan_kind(r)], lw=0.8, alpha=0.6)
        for s, (n, se) in enumerate(zip(r.get("noise_scale_tokens", []), r.get("noise_log_se", []))):
            if n and se is not None:
                ax.errorbar([r["step"]], [n], yerr=[[n - n * math.exp(-se)], [n * math.exp(se) - n]], fmt="o",
                            ms=3, color=f"C{s}", capsize=2)
    for r in (r for r in rows if r.get("event") == "check"):
        ax.plot([r["step"]], [1.0], marker="|", ms=10, color="tab:blue", transform=ax.get_xaxis_transform())
    for s, style in zip(range(len(plans[0]["mean_freeze_ratio"])), ("-", "--", ":", "-.")):
        right.step([r["step"] for r in plans] + [last], [r["mean_freeze_ratio"][s] for r in plans]
                   + [plans[-1]["mean_freeze_ratio"][s]], style, where="post", color="tab:purple", alpha=0.8,
                   label=f"planned ratio, stage {s}")


def draw_ratio_against_noise(ax, windows: list[tuple[int, list[float], list[float | None]]], tokens: int,
                             rows: list[dict]) -> None:
    """Per stage, each window's realised ratio against its median noise scale over the step batch (log x; issue 46
    asks the ratio to fall as the noise scale rises past the batch), in window order; a window in which a plan was
    put in force after the first is ringed in its cause's colour (draw_plans')."""
    colors = {"first": "black", "learning": "tab:blue", "drift": "grey", "continuing": "tab:green"}
    replans = [(r["step"], replan_kind(r)) for r in rows if r.get("event") == "plan"][1:]
    width = windows[1][0] - windows[0][0] if len(windows) > 1 else 1
    for s, style in zip(range(len(windows[0][1])), ("-", "--", ":", "-.")):
        points = [(w[2][s] / tokens, w[1][s], w[0]) for w in windows if w[2][s]]
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", ms=3, color=f"C{s}",
                label=f"stage {s}")
        for x, y, start in points:
            for kind in {k for step, k in replans if start <= step < start + width}:
                ax.plot([x], [y], "o", ms=9, mfc="none", color=colors[kind])
    ax.axvline(1.0, color="black", lw=0.8, label="noise scale = step batch")
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("median noise scale / step batch (per window)")
    ax.set_ylabel("realised freeze ratio")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")


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

    # --freeze: a row per folder, over the steps and the ratio against the noise scale; else two folders a row
    cols = 2 if args.freeze else min(2, len(args.folders))
    grid = len(args.folders) if args.freeze else -(-len(args.folders) // cols)
    fig, axes = plt.subplots(grid, cols, figsize=(6 * cols, 3.8 * grid), squeeze=False)
    panels = [(row[0], row[1]) for row in axes] if args.freeze else [(ax, None) for ax in axes.flat]
    for (ax, against), folder in zip(panels, args.folders):
        rows = metrics(folder)
        steps, scales, tokens = trajectory(folder, rows)
        for s, style in zip(range(len(scales[0])), ("-", "--", ":", "-.")):  # (a stage left out: a gap)
            ax.plot(steps, [math.nan if row[s] is None else row[s] for row in scales], style, label=f"stage {s}")
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
            draw_plans(ax, right, rows)
            draw_ratio_against_noise(against, windows, tokens, rows)
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
        print(f"{folder}: " + "; ".join(f"step {st}: " + ", ".join("-" if x is None else f"{x:,.0f}" for x in row)
                                        for st, row in list(zip(steps, scales))[:: max(1, len(steps) // 6)]))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
