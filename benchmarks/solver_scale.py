"""How fast the TimelyFreeze LP (METHOD.md section 4, three phases) is solved exactly at scale.

Prints, measured in one run (1F1B, uniform profile F = 1, B = 2, frozen B = 1, cap 0.9, unless said):
  (issue 23) each figure next to its target: 32 x 512, fastlp.solve and the whole `tfplan solve` process
      (medians of --repeats fresh processes); 64 x 8192, fastlp.solve and the same with --time-limit 60;
      32 x 16384 (a million actions), the whole `tfplan solve -o plan.json` command with its peak RSS and plan
      file size, on the uniform profile and on a random one (lp_instances.random_profile: per-stage costs as tests/
      test_fastlp.py draws them, with rank tails and a dispatch cost, seed 0).
  (issue 48, --figures hard) the million's whole command on each of lp_instances.HARD (seeds, spreads, p2p lags):
      wall, CPU (user + sys), peak RSS, status, phase times and optima; then the worst and the median. With
      --hard-rounds N, N rounds over the set: each instance's median wall and CPU, largest peak, its last run's phases.
  (a) 1F1B 16 x 256 (8,192 actions): a straightforward GLOP model written here (pywraplp; one start
      variable per action, one row per DAG edge, the phases of Note [three-phase LP]), phase 1 only and
      all three phases; tfplan.solve.solver.solve (GLOP, redundant rows dropped); tfplan.solve.fastlp.solve (periodic
      compression, Note [periodic compression]); speed ratios and the phase objectives side by side.
  (b) 1F1B 32 x 512 (32,768 actions): fastlp, all three phases, wall time and peak memory (ru_maxrss of a
      fresh process); with --glop-32, also tfplan.solve.solver.solve (several minutes).
  (c) a ladder up to about a million actions, each in a fresh process with a 60 s budget for fastlp.solve
      (building the DAG is timed apart): the largest instance solved within it.
Every fastlp plan is checked: caps kept and its re-simulated makespan equal to the phase-1 optimum.
Times are medians of --repeats runs for the fast cases (the machine may be shared: see the load averages).

    python benchmarks/solver_scale.py                      # everything, about 15 minutes on 2 cores
    python benchmarks/solver_scale.py --parts issue        # the issue's figures only, about 5 minutes
    python benchmarks/solver_scale.py --parts issue --figures 32x512   # one figure (32x512, 64x8192, 1m, hard)
    python benchmarks/solver_scale.py --parts issue --figures hard --hard-rounds 3   # medians of three rounds
    python benchmarks/solver_scale.py --quick              # small sizes of every part, about a minute
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import tfplan  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lp_instances import CAP, HARD, random_profile, spread_profile, whole_command  # (benchmarks/, this script's folder)
from ortools.linear_solver import pywraplp

from tfplan.cost import profile
from tfplan.schedule import schedules
from tfplan.solve import fastlp, heap, lp, solver
from tfplan.step import dag as dag_mod
from tfplan.step.simulate import simulate

LADDER = [(16, 4096), (32, 4096), (16, 32768), (32, 16384), (64, 8192)]  # (ranks, micro-batches)
QUICK_LADDER = [(8, 1024), (16, 4096)]
BUDGET_S = 60.0


def build(p: int, m: int) -> dag_mod.Dag:
    return dag_mod.build(schedules.generate("1f1b", p, m), profile.uniform(p))


def naive_glop(dag: dag_mod.Dag, phases: int) -> list[float]:
    """The straightforward model: t_v per action, r_a per freezable action, one row per edge (all kinds, even
    the same-stage edges the rank chain implies), one row per sink, one cap row per stage; phases as in
    tfplan.solve.lp (phase 2: T <= T1 (1 + 1e-9); phase 3: total <= R2 (1 + 1e-9) + 1e-9 and min sum_a |r_a - mu_s|
    with both rows e_a >= +-(r_a - mu_s) per action, as METHOD.md writes it)."""
    s = pywraplp.Solver.CreateSolver("GLOP")
    inf = s.infinity()
    n = dag.num_nodes
    t = [s.NumVar(0.0, inf, "") for _ in range(n)]
    groups = dag.freeze_groups()
    r = {v: s.NumVar(0.0, 1.0, "") for g in groups for v in g}
    big_t = s.NumVar(0.0, inf, "")

    def row(lo: float, terms, hi: float = inf):
        c = s.Constraint(lo, hi)
        for var, coef in terms:
            c.SetCoefficient(var, coef)
        return c

    def end(u: int):
        return [(r[u], dag.d_max[u] - dag.d_min[u])] if u in r else []

    has_succ = [False] * n
    for u, v, lag, _ in dag.edges():
        has_succ[u] = True
        row(dag.d_max[u] + lag, [(t[v], 1.0), (t[u], -1.0), *end(u)])
    for u in range(n):
        if not has_succ[u]:
            row(dag.d_max[u], [(big_t, 1.0), (t[u], -1.0), *end(u)])
    for g, cap in zip(groups, [CAP] * len(groups)):
        if g:
            row(-inf, [(r[v], 1.0) for v in g], cap * len(g))
    total = row(-inf, [(x, 1.0) for x in r.values()])

    def minimise(terms) -> float:
        obj = s.Objective()
        obj.Clear()
        for var, coef in terms:
            obj.SetCoefficient(var, coef)
        obj.SetMinimization()
        s.SetSolverSpecificParametersAsString(lp.GLOP_PARAMS)
        assert s.Solve() == pywraplp.Solver.OPTIMAL
        return obj.Value()

    out = [minimise([(big_t, 1.0)])]
    if phases > 1:
        big_t.SetUb(lp.makespan_bound(out[0], None))
        out.append(minimise([(x, 1.0) for x in r.values()]))
        total.SetUb(lp.total_bound(out[1]))
        e = {}
        for g in groups:
            if g:
                mu = s.NumVar(0.0, inf, "")
                row(0.0, [(mu, float(len(g))), *((r[v], -1.0) for v in g)], 0.0)
                for v in g:
                    e[v] = s.NumVar(0.0, inf, "")
                    row(0.0, [(e[v], 1.0), (r[v], -1.0), (mu, 1.0)])
                    row(0.0, [(e[v], 1.0), (r[v], 1.0), (mu, -1.0)])
        out.append(minimise([(x, 1.0) for x in e.values()]))
    return out


def timed(fn, repeats: int):
    """(median seconds, last result) over `repeats` calls."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def check_plan(dag: dag_mod.Dag, sol: lp.Solution) -> float:
    """Certified and caps kept; returns the re-simulated makespan's relative excess over the phase-1 optimum."""
    assert sol.status == "OPTIMAL", [(p.name, p.status, p.gap) for p in sol.phases]
    for g in dag.freeze_groups():
        if g:
            assert sum(sol.ratios[v] for v in g) / len(g) <= CAP + lp.CAP_TOL
    return simulate(dag, sol.durations).makespan_ms / sol.makespan_ms - 1


def rel_gap(sol: lp.Solution) -> float:
    """The largest certified gap of a fastlp solution, relative (Note [LP certificate])."""
    return max((p.gap or 0.0) / max(1.0, abs(p.objective)) for p in sol.phases)


def _child(conn, p: int, m: int, with_glop: bool, time_limit_s: float | None = None) -> None:
    """One instance in a fresh process: (build s, fastlp s, phases, sim excess, peak MiB[, glop s, phases])."""
    heap.configure()  # memory as tfplan's CLI sets it up (tfplan.solve.heap)
    start = time.perf_counter()
    dag = build(p, m)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    sol = fastlp.solve(dag, CAP, time_limit_s=time_limit_s)
    wall = time.perf_counter() - start
    excess = check_plan(dag, sol) if sol.status == "OPTIMAL" else float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"build_s": build_s, "fast_s": wall, "phases": [x.objective for x in sol.phases], "excess": excess,
           "peak_mib": peak, "actions": dag.num_nodes, "gap": rel_gap(sol), "status": sol.status,
           "phase_s": [x.wall_s for x in sol.phases]}
    if with_glop:
        start = time.perf_counter()
        ref = solver.solve(dag, CAP)
        out["glop_s"] = time.perf_counter() - start
        out["glop_phases"] = [x.objective for x in ref.phases]
        out["glop_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conn.send(out)


def fresh(p: int, m: int, with_glop: bool = False, timeout: float | None = None,
          time_limit_s: float | None = None) -> dict | None:
    """Run _child in a new process; None if it did not finish within `timeout` seconds."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, p, m, with_glop, time_limit_s))
    proc.start()
    result = parent.recv() if parent.poll(timeout) else None
    if result is None:
        proc.terminate()
    proc.join()
    return result


def part_a(p: int, m: int, repeats: int) -> None:
    dag = build(p, m)
    print(f"(a) 1F1B {p} x {m}: {dag.num_nodes:,} actions, cap {CAP}")
    naive1_s, naive1 = timed(lambda: naive_glop(dag, 1), 1)
    naive3_s, naive3 = timed(lambda: naive_glop(dag, 3), 1)
    glop_s, glop = timed(lambda: solver.solve(dag, CAP), 1)
    fast_s, fast = timed(lambda: fastlp.solve(dag, CAP), repeats)
    rows = [("straightforward GLOP, phase 1", naive1_s, naive1), ("straightforward GLOP, 3 phases", naive3_s, naive3),
            ("tfplan.solve.solver.solve (GLOP)", glop_s, [x.objective for x in glop.phases]),
            (f"tfplan.solve.fastlp.solve (median of {repeats})", fast_s, [x.objective for x in fast.phases])]
    print(f"    {'solver':<36}{'wall s':>9}{'x faster':>10}   phase objectives (T1, R2, E3)")
    for name, wall, objs in rows:
        print(f"    {name:<36}{wall:>9.3f}{naive3_s / wall:>10.1f}   " + ", ".join(f"{x:.10g}" for x in objs))
    agree = max(abs(a.objective - b.objective) / max(1.0, abs(b.objective)) for a, b in zip(fast.phases, glop.phases))
    print(f"    fastlp vs tfplan.solve.solver: {glop_s / fast_s:.1f}x faster; fastlp phase 1 alone vs straightforward "
          f"phase 1: {naive1_s / fast.phases[0].wall_s:.1f}x; plan re-simulated: makespan "
          f"{check_plan(dag, fast):+.2e} relative to T1")
    print(f"    phase values fastlp vs GLOP: largest relative difference {agree:.1e}; fastlp's certified gaps <= "
          f"{rel_gap(fast):.1e} (relative)")


def part_b(p: int, m: int, repeats: int, with_glop: bool) -> None:
    runs = [fresh(p, m, with_glop=with_glop and i == 0) for i in range(repeats)]
    fast = statistics.median(r["fast_s"] for r in runs)
    first = runs[0]
    print(f"(b) 1F1B {p} x {m}: {first['actions']:,} actions; DAG build {first['build_s']:.2f} s")
    each = ", ".join(f"{r['fast_s']:.2f}" for r in runs)
    peak = max(r["peak_mib"] for r in runs)
    objs = ", ".join(f"{x:.10g}" for x in first["phases"])
    print(f"    fastlp.solve: {fast:.2f} s (median of {repeats} fresh processes: {each}), peak memory {peak:.0f} MiB")
    print(f"    phases {objs}; certified gap <= {max(r['gap'] for r in runs):.1e} (relative); plan makespan "
          f"{first['excess']:+.2e} relative to T1")
    if "glop_s" in first:
        agree = max(abs(a - b) / max(1, abs(b)) for a, b in zip(first["phases"], first["glop_phases"]))
        print(f"    tfplan.solve.solver.solve: {first['glop_s']:.1f} s, peak {first['glop_peak_mib']:.0f} MiB (same "
              f"process), {first['glop_s'] / first['fast_s']:.0f}x slower; largest relative phase difference "
              f"{agree:.1e}")


def part_c(ladder: list[tuple[int, int]]) -> None:
    print(f"(c) ladder, fresh process each, fastlp.solve budget {BUDGET_S:.0f} s (DAG build not counted)")
    print(f"    {'instance':<16}{'actions':>11}{'build s':>9}{'fastlp s':>10}{'peak MiB':>10}   result")
    largest = None
    for p, m in ladder:
        r = fresh(p, m, timeout=BUDGET_S + 60.0)
        if r is None or r["fast_s"] > BUDGET_S:
            wall = "> budget" if r is None else f"{r['fast_s']:.1f}"
            print(f"    {f'{p} x {m}':<16}{p * m * 2:>11,}{'':>9}{wall:>10}{'':>10}   over {BUDGET_S:.0f} s")
            continue
        largest = (p, m, r)
        print(f"    {f'{p} x {m}':<16}{r['actions']:>11,}{r['build_s']:>9.2f}{r['fast_s']:>10.2f}{r['peak_mib']:>10.0f}"
              f"   T1 {r['phases'][0]:.10g}, gap <= {r['gap']:.0e}, plan makespan {r['excess']:+.1e} vs T1")
    if largest:
        p, m, r = largest
        print(f"    largest within {BUDGET_S:.0f} s: 1F1B {p} x {m} ({r['actions']:,} actions) in {r['fast_s']:.1f} s")


# ---------------------------------------------------------------------------------------------------------
# Issue 23's figures, each next to its target


def hard_figures(p: int, m: int, folder: Path, rounds: int = 1) -> None:
    """Issue 48: the whole command on each HARD instance (CPU: user + sys of its threads, from wait4), `rounds`
    times over the set (each round runs every instance once, so that a slow spell of the machine falls on all of
    them): per instance the median wall and CPU and the largest peak over its runs."""
    print(f"    hard instances, 1F1B {p} x {m} cap {CAP}, whole tfplan solve -o plan.json each"
          + ("" if rounds == 1 else f", {rounds} rounds (median wall and CPU, largest peak)") + ":")
    runs: dict[int, list[dict]] = {seed: [] for seed, _, _ in HARD}
    for _ in range(rounds):
        for seed, spread, p2p in HARD:
            runs[seed].append(whole_command(spread_profile(p, seed, spread, p2p), p, m, folder))
    rows = []
    for seed, spread, p2p in HARD:
        rs = runs[seed]
        r = rs[-1] | {"wall_s": statistics.median(x["wall_s"] for x in rs),
                      "cpu_s": statistics.median(x["cpu_s"] for x in rs), "peak_mib": max(x["peak_mib"] for x in rs)}
        rows.append(r)
        walls = "" if rounds == 1 else " (runs " + ", ".join(f"{x['wall_s']:.1f}" for x in rs) + ")"
        print(f"      seed {seed} spread {spread:g} p2p {p2p:g}: wall {r['wall_s']:.1f} s{walls}, "
              f"CPU {r['cpu_s']:.1f} s, peak {r['peak_mib']:.0f} MiB, {r['status']}, phases "
              + " / ".join(f"{x['wall_s']:.1f}" for x in r["phases"])
              + " s, optima " + ", ".join(f"{x['objective']:.12g}" for x in r["phases"]), flush=True)
    for key, target in (("cpu_s", 20.0), ("wall_s", 20.0), ("peak_mib", 1536.0)):
        worst, median = max(r[key] for r in rows), statistics.median(r[key] for r in rows)
        print(f"    {key}: worst {worst:.1f}, median {median:.1f} ({_verdict(worst, target)})")


def _verdict(value: float, target: float) -> str:
    return f"target <= {target:g}: {'met' if value <= target else 'MISSED'}"


def issue_figures(figures: set[str], repeats: int, quick: bool, hard_rounds: int = 1) -> None:
    print("(issue 23) figures and targets (the targets are for a quiet machine; see the load averages)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "32x512" in figures:
            p, m = (16, 256) if quick else (32, 512)
            solves, commands = [], []
            for _ in range(repeats):  # alternating: the solver alone, then the whole command
                solves.append(fresh(p, m))
                commands.append(whole_command(profile.uniform(p), p, m, folder))
            fast = statistics.median(r["fast_s"] for r in solves)
            whole = statistics.median(r["wall_s"] for r in commands)
            p3 = statistics.median(r["phase_s"][2] / r["phase_s"][1] for r in solves)
            print(f"    1F1B {p} x {m} cap {CAP}: fastlp.solve {fast:.2f} s (runs "
                  + ", ".join(f"{r['fast_s']:.2f}" for r in solves) + f"; {_verdict(fast, 2.5)}); phase 3 took "
                  f"{p3:.2f}x phase 2's time")
            print(f"    1F1B {p} x {m} cap {CAP}: whole tfplan solve process {whole:.2f} s (runs "
                  + ", ".join(f"{r['wall_s']:.2f}" for r in commands) + f"; {_verdict(whole, 4.0)})")
        if "64x8192" in figures:
            p, m = (32, 2048) if quick else (64, 8192)
            for limit in (None, 60.0):
                r = fresh(p, m, timeout=600.0, time_limit_s=limit)
                what = "fastlp.solve" if limit is None else f"fastlp.solve --time-limit {limit:g}"
                if r is None:
                    print(f"    1F1B {p} x {m}: {what} did not finish within 600 s")
                    continue
                phases = ", ".join(f"{x:.1f}" for x in r["phase_s"])
                target = 60.0 if limit is None else limit * 1.05
                print(f"    1F1B {p} x {m}: {what} {r['fast_s']:.1f} s ({r['status']}, phases {phases} s, peak "
                      f"{r['peak_mib']:.0f} MiB; {_verdict(r['fast_s'], target)})")
        if "hard" in figures:
            hard_figures(*((32, 2048) if quick else (32, 16384)), folder, hard_rounds)
        if "1m" in figures:
            p, m = (32, 2048) if quick else (32, 16384)
            for prof in (profile.uniform(p), random_profile(p)):
                r = whole_command(prof, p, m, folder)
                print(f"    1F1B {p} x {m} ({prof.name} profile): whole tfplan solve -o plan.json {r['wall_s']:.1f} s "
                      f"({_verdict(r['wall_s'], 20.0)}), peak RSS {r['peak_mib']:.0f} MiB "
                      f"({_verdict(r['peak_mib'], 1536.0)}), solver {r['solver_s']:.1f} s {r['status']}, plan "
                      f"{r['plan_mb']:.1f} MB + schedule CSV {r['csv_mb']:.1f} MB")
                if r["warnings"]:
                    print("      warnings: " + " ".join(r["warnings"].split()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 x 128, 16 x 256, a short ladder (under a minute)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the fast solvers (median reported)")
    parser.add_argument("--glop-32", action="store_true", help="also tfplan.solve.solver.solve on 32 x 512 (minutes)")
    parser.add_argument("--parts", default="issue,a,b,c", help="comma-separated parts to run: issue, a, b, c")
    parser.add_argument("--figures", default="32x512,64x8192,1m",
                        help="the issue's figures to measure: 32x512, 64x8192, 1m, hard (comma-separated)")
    parser.add_argument("--hard-rounds", type=int, default=1,
                        help="runs of every hard instance, one round over the set at a time (median reported)")
    args = parser.parse_args()
    if args.hard_rounds < 1:
        parser.error("--hard-rounds must be at least 1")
    parts, figures = set(args.parts.split(",")), set(args.figures.split(","))
    print(f"TimelyFreeze LP at scale ({'quick' if args.quick else 'full'}; {os.cpu_count()} CPUs, load averages "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at start)")
    if "issue" in parts:
        issue_figures(figures, args.repeats, args.quick, args.hard_rounds)
    if "a" in parts:
        part_a(*((8, 128) if args.quick else (16, 256)), args.repeats)
    if "b" in parts:
        part_b(*((16, 256) if args.quick else (32, 512)), args.repeats, args.glop_32)
    if "c" in parts:
        part_c(QUICK_LADDER if args.quick else LADDER)
    print(f"load averages at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
