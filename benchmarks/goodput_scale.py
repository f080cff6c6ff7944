"""How long the goodput objective takes against the makespan objective (issue 36: at most 1.5x at 1F1B 32 x 512
and 64 x 2048; issue 21 asked for 2x at 32 x 512).

For each size: the makespan plan (tfplan.plan.job.solve_plan, three phases, backend auto) and the goodput plan
(the goodput search, tfplan/solve/fastlp/goodput.py, then the plan's LP at its stage means), on the uniform profile
(F = 1, B = 2, frozen B = 1 ms) with a given noise section (every stage N tokens, equal |G|^2 shares, 2,048
tokens a micro-batch), cap 0.9; medians of --repeats alternating runs in this process, and the goodput LP's
solves, Dinkelbach steps and the predicted goodput.

    python benchmarks/goodput_scale.py --sizes 8x64,16x128,32x512 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from tfplan.cost import profile
from tfplan.cost.goodput import NoiseModel
from tfplan.plan import job
from tfplan.schedule import schedules
from tfplan.step import dag as dag_mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8x64,16x128,32x512")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--noise", type=float, default=20000.0)
    args = ap.parse_args()
    print(f"goodput against makespan objective, 1F1B, cap 0.9, noise {args.noise:g} tokens; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for size in args.sizes.split(","):
        ranks, m = (int(x) for x in size.split("x"))
        prof = profile.uniform(ranks, forward_ms=1.0, backward_ms=2.0, backward_frozen_ms=1.0)
        d = dag_mod.build(schedules.generate("1f1b", ranks, m), prof)
        noise = NoiseModel(noise_scale_tokens=(args.noise,) * ranks, grad_sq_share=(1 / ranks,) * ranks,
                           microbatch_tokens=2048, source="given")
        times: dict[str, list[float]] = {"makespan": [], "goodput": []}
        plan = None
        for _ in range(args.repeats):
            for objective in ("makespan", "goodput"):
                start = time.perf_counter()
                got = job.solve_plan(d, prof, 0.9, objective=objective, noise=noise, time_limit_s=None)
                times[objective].append(time.perf_counter() - start)
                if objective == "goodput":
                    plan = got
        a, b = statistics.median(times["makespan"]), statistics.median(times["goodput"])
        solve = plan.goodput.solve or {}
        print(f"1F1B {ranks} x {m} ({d.num_nodes:,} actions): makespan {a:.2f} s, goodput {b:.2f} s, "
              f"{b / a:.2f}x (target <= 1.5x); goodput LP {solve.get('lp_solves')} solves, "
              f"{solve.get('dinkelbach_steps')} Dinkelbach steps, {solve.get('wall_s', 0):.2f} s; predicted "
              f"goodput {plan.goodput.value.goodput:.3f}x at mean ratio {plan.predicted.mean_freeze_ratio:.3f}; "
              f"runs {_list(times['makespan'])} / {_list(times['goodput'])}", flush=True)


def _list(values: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


if __name__ == "__main__":
    main()
