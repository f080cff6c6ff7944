"""Is backward time linear in the freeze ratio, inside the pipeline? (The LP assumes d(r) = d0 - r (d0 - d1).)

For r in 0, 0.25, 0.5, 0.75, 1 every freezable action of a 2-stage 1F1B pipeline (tiny model, 2 gloo ranks)
freezes share r of its stage's weight-gradient cost; we take each stage's median backward time over every
micro-batch of the timed steps, fit a line and print it with its worst residual and the worst gap to the
straight line between the r = 0 and r = 1 measurements (what a profile gives the LP). Rows per freeze
method (detach, grad: tfrun.runtime Note [freeze methods]) and per stage-0 policy (prefix, random).

    python benchmarks/freeze_linearity.py            # about 6 minutes on 2 CPU cores
    python benchmarks/freeze_linearity.py --quick    # fewer steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tfplan import schedules
from tfrun.config import TrainConfig
from tfrun.launch import launch

RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0)


def run(root: Path, ratio: float, method: str, policy: str, steps: int, m: int) -> dict[str, float]:
    sched = schedules.generate("1f1b", 2, m)
    order = [[str(a) for a in row] for row in sched.order]
    ratios = {a: ratio for row in order for a in row if "B" in a or "W" in a}
    out = root / f"{method}-{policy}-{ratio}"
    config = TrainConfig(order=order, num_stages=2, num_microbatches=m, stage_to_rank=[0, 1],
                         schedule_name="1f1b", ratios=ratios, freeze="plan", freeze_method=method,
                         freeze_policy=policy, steps=steps, out_dir=str(out), quiet=True, eval_batches=1,
                         timing_warmup_steps=2)
    launch(config)
    timings = json.loads((out / "timings.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return timings["by_stage_kind_ms"] | {"step": summary["step_time_ms"]}


def fit(xs, ys) -> tuple[float, float, float]:
    """Least-squares line y = a + b x and its worst absolute residual."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return a, b, max(abs(y - (a + b * x)) for x, y in zip(xs, ys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help="keep runs here (default: temp folder)")
    args = parser.parse_args()
    steps, m = (5, 4) if args.quick else (10, 8)
    root = Path(args.out or tempfile.mkdtemp(prefix="linearity-"))
    variants = [("detach", "auto"), ("grad", "auto"), ("detach", "random")]
    results = {}
    for method, policy in variants:
        for r in RATIOS:
            results[(method, policy, r)] = run(root, r, method, policy, steps, m)
            print(f"  ran {method:6s} {policy:6s} r={r:.2f}: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(results[(method, policy, r)].items())), flush=True)
    print("\nmedian backward time (ms) per stage vs freeze ratio; tiny model, 1F1B, 2 gloo ranks, M =", m)
    print(f"{'method':7s} {'stage0':7s} {'stage':>5s} " + " ".join(f"r={r:<5}" for r in RATIOS)
          + "  fit a + b r          worst residual   worst gap to 0-1 line")
    for method, policy in variants:
        for stage in (0, 1):
            ys = [results[(method, policy, r)][f"{stage}B"] for r in RATIOS]
            a, b, worst = fit(RATIOS, ys)
            chord = max(abs(y - (ys[0] + r * (ys[-1] - ys[0]))) for r, y in zip(RATIOS, ys))
            span = ys[0] - ys[-1]
            print(f"{method:7s} {policy:7s} {stage:5d} " + " ".join(f"{y:7.2f}" for y in ys)
                  + f"  {a:6.2f} {b:+7.2f} r   {worst:6.2f} ({worst / span:5.1%})   {chord:6.2f} ({chord / span:5.1%})")
    print("\nstep time (ms) per ratio:")
    for method, policy in variants:
        print(f"{method:7s} {policy:7s} " + " ".join(f"{results[(method, policy, r)]['step']:8.1f}" for r in RATIOS))


if __name__ == "__main__":
    main()
