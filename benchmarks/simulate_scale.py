"""How fast tfplan builds and simulates large pipeline schedules (issue: >= 1 million actions/s of simulation).

Times, per schedule size, three steps separately:
  generate   tfplan.schedule.schedules.generate (including the validator every schedule passes);
  build      tfplan.step.dag.build (predecessor slots, lags, topological order);
  simulate   tfplan.step.simulate.simulate (start/end of every action, bubbles, critical path): median of 5 runs,
and prints the simulation rate in actions per second. The headline case is 1F1B on 64 ranks x 1024
micro-batches (131,072 actions). Before timing, it checks the closed form (M + P - 1)(F + B) on a uniform 1F1B
so that a fast but wrong simulator cannot pass.

Run:
    python benchmarks/simulate_scale.py            # full sizes (about 20 s on a 2-core laptop)
    python benchmarks/simulate_scale.py --quick    # small sizes, a few seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

try:
    import tfplan  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tfplan.cost import profile
from tfplan.schedule import schedules
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

REQUIRED_ACTIONS_PER_S = 1_000_000

# (schedule, ranks, micro-batches, stages per rank or None for the default)
FULL = [
    ("1f1b", 64, 1024, None),
    ("gpipe", 64, 1024, None),
    ("interleaved-1f1b", 32, 512, 2),
    ("interleaved-zb", 16, 512, 2),
    ("zbv", 32, 512, None),
    ("dualpipev", 16, 256, None),
]
QUICK = [
    ("1f1b", 16, 128, None),
    ("interleaved-1f1b", 8, 64, 2),
    ("zbv", 8, 64, None),
]


def check_closed_form() -> None:
    """Uniform 1F1B: makespan (M + P - 1)(F + B) and bubble fraction (P - 1)/(M + P - 1)."""
    p, m = 8, 37
    dag = dag_mod.build(schedules.generate("1f1b", p, m), profile.uniform(p))  # F = 1, B = 2
    sim = simulate(dag)
    assert sim.makespan_ms == (m + p - 1) * 3.0, sim.makespan_ms
    assert abs(sim.bubble_fraction - (p - 1) / (m + p - 1)) < 1e-12, sim.bubble_fraction


def bench(name: str, p: int, m: int, v: int | None, repeats: int) -> dict:
    t0 = time.perf_counter()
    sched = schedules.generate(name, p, m, v)
    t1 = time.perf_counter()
    # Uniform toy costs with a p2p lag, so every cross-rank edge carries a lag.
    dag = dag_mod.build(sched, profile.uniform(sched.num_stages, p2p_ms=0.05))
    t2 = time.perf_counter()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        sim = simulate(dag)
        runs.append(time.perf_counter() - start)
    median = statistics.median(runs)
    return {
        "case": f"{name} P={p} V={sched.stages_per_rank} M={m}",
        "actions": sched.num_actions,
        "generate_s": t1 - t0,
        "build_s": t2 - t1,
        "simulate_s": median,
        "rate": sched.num_actions / median,
        "best_rate": sched.num_actions / min(runs),
        "makespan_ms": sim.makespan_ms,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few seconds)")
    parser.add_argument("--repeats", type=int, default=5, help="simulation runs per case (median reported)")
    args = parser.parse_args()

    check_closed_form()
    cases = QUICK if args.quick else FULL
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"tfplan simulator scale benchmark ({'quick' if args.quick else 'full'}; simulate s and actions/s: median "
        f"of {args.repeats} runs, best: fastest run; {os.cpu_count()} CPUs, load average {load:.2f})"
    )
    header = (
        f"{'case':<34}{'actions':>10}{'generate s':>12}{'build s':>10}{'simulate s':>12}{'actions/s':>14}{'best':>14}"
    )
    print(header)
    print("-" * len(header))
    results = []
    for name, p, m, v in cases:
        r = bench(name, p, m, v, args.repeats)
        results.append(r)
        print(
            f"{r['case']:<34}{r['actions']:>10,}{r['generate_s']:>12.3f}{r['build_s']:>10.3f}"
            f"{r['simulate_s']:>12.4f}{r['rate']:>14,.0f}{r['best_rate']:>14,.0f}",
            flush=True,
        )
    head = results[0]
    verdict = "met" if head["rate"] >= REQUIRED_ACTIONS_PER_S else "NOT met"
    print("-" * len(header))
    print(
        f"headline {head['case']}: {head['rate'] / 1e6:.2f} million actions/s of simulation "
        f"(requirement >= {REQUIRED_ACTIONS_PER_S / 1e6:.0f} million: {verdict})"
    )
    if load > 1:
        print("note: the machine is busy (load average above 1); the median is pessimistic, see the best column")
    return 0


if __name__ == "__main__":
    sys.exit(main())
