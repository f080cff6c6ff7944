"""Is backward time linear in the freeze ratio, inside the pipeline? (The LP assumes d(r) = d0 - r (d0 - d1).)

One run of a 2-stage 1F1B pipeline (tiny model, 2 gloo ranks, M = 12) in which micro-batch m's backward
freezes share r = RATIOS[m % 6] of its stage's weight-gradient cost, frozen sets re-drawn every step, so
every ratio is measured in the same run under the same conditions (this machine's timings drift between
runs). Per stage and ratio we take the median backward time over the timed steps, fit a line and print it
with its worst residual and the worst gap to the straight line between the r = 0 and r = 1 medians (what a
profile gives the LP). One run per freeze method (detach, grad: tfrun.distributed.runtime Note [freeze methods]) and
one with rotating random subsets on stage 0 instead of the prefix (tfrun.freeze.freezing Note [freeze policy]).

    python benchmarks/freeze_linearity.py            # about 2 minutes on 2 CPU cores
    python benchmarks/freeze_linearity.py --quick    # fewer steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tfplan.schedule import schedules
from tfrun.config.train_config import TrainConfig
from tfrun.distributed.launch import launch

RATIOS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def run(root: Path, method: str, policy: str, steps: int) -> dict[float, dict[int, float]]:
    """Median backward time (ms) per ratio and stage, all ratios in one run."""
    m = 2 * len(RATIOS)
    sched = schedules.generate("1f1b", 2, m)
    order = [[str(a) for a in row] for row in sched.order]
    ratio_of = {str(a): RATIOS[a.mb % len(RATIOS)] for row in sched.order for a in row if a.kind in "BW"}
    out = root / f"{method}-{policy}"
    config = TrainConfig(order=order, num_stages=2, num_microbatches=m, stage_to_rank=[0, 1],
                         schedule_name="1f1b", ratios=ratio_of, freeze="plan", freeze_method=method,
                         freeze_policy=policy, steps=steps, out_dir=str(out), quiet=True, eval_batches=1,
                         timing_warmup_steps=2, redraw_every=1)
    launch(config)
    actions = json.loads((out / "timings.json").read_text())["actions"]
    by_action = {a: row["duration_ms"] for a, row in actions.items()}
    result: dict[float, dict[int, float]] = {}
    for r in RATIOS:
        for stage in (0, 1):
            times = [t for a, t in by_action.items() if a in ratio_of and a.startswith(f"{stage}B")
                     and ratio_of[a] == r]
            result.setdefault(r, {})[stage] = statistics.median(times)
    return result


def fit(xs, ys) -> tuple[float, float, float]:
    """Least-squares line y = a + b x and its worst absolute residual."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return a, b, max(abs(y - (a + b * x)) for x, y in zip(xs, ys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out", default=None, help="keep runs here (default: temp folder)")
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 16)
    root = Path(args.out or tempfile.mkdtemp(prefix="linearity-"))
    variants = [("detach", "auto"), ("grad", "auto"), ("detach", "random")]
    results = {v: run(root, *v, steps) for v in variants}
    print(f"median backward time (ms) per stage and freeze ratio, same run for all ratios; tiny model, 1F1B, "
          f"2 gloo ranks, M = {2 * len(RATIOS)}, {steps} steps ({steps - 2} timed)")
    print(f"{'method':7s} {'policy':7s} {'stage':>5s} " + " ".join(f"r={r:<5}" for r in RATIOS)
          + "  fit a + b r         worst residual    worst gap to 0-1 line")
    for (method, policy), res in results.items():
        for stage in (0, 1):
            ys = [res[r][stage] for r in RATIOS]
            a, b, worst = fit(RATIOS, ys)
            chord = max(abs(y - (ys[0] + r * (ys[-1] - ys[0]))) for r, y in zip(RATIOS, ys))
            span = max(ys[0] - ys[-1], 1e-9)
            print(f"{method:7s} {policy:7s} {stage:5d} " + " ".join(f"{y:7.2f}" for y in ys)
                  + f"  {a:6.2f} {b:+7.2f} r  {worst:6.2f} ({worst / span:5.1%})   {chord:6.2f} ({chord / span:5.1%})")
    print("(policy auto = prefix on stage 0 here (some micro-batches freeze nothing), rotating random subsets on "
          "stage 1; percentages are of the r=0 to r=1 span)")


if __name__ == "__main__":
    main()
