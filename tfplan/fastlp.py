"""An exact, fast solver for the three-phase TimelyFreeze LP (same LP and phases as tfplan.solver).

    from tfplan import schedules, profile, dag, fastlp
    d = dag.build(schedules.generate("1f1b", 32, 512), profile.uniform(32))
    sol = fastlp.solve(d, 0.9)          # a solver.Solution, like solver.solve(d, 0.9)

The LP grows with the micro-batch count M but its hard part does not: pipeline schedules repeat the same
per-rank pattern every micro-batch (or round), with the same per-stage costs. We solve two small LPs per
phase whose sizes depend on the pipeline depth, not on M, and that sandwich the true optimum.

Note [periodic compression]
  Runs. For a period q, action v = (stage, kind, m) and w = (stage, kind, m + q) are "shift-equal" when each
  predecessor slot of w holds the shifted predecessor of v with the same lag (and both sit the same number of
  list positions apart on their rank). Maximal chains of shift-equal actions are runs: the steady state of
  every stage and kind (fastlp_graph.Runs). All actions of a run have the same durations (costs are per stage).
  Ties. Leaving `margin` periods free at both ends of each run, the rest of a run is tied to its first tied
  action `rep`, `off` periods later: r_v = r_rep and t_v = t_rep + off * tau_run (fastlp_graph.Ties).
  Upper bound U (fastlp_lp.tied_primal). Substituting the ties into the LP restricts it, so U >= OPT. The
  substituted precedence rows collapse: two rows with the same (rep_u, rep_v, off_v - off_u, lag) differ only
  in off_u, on which they depend affinely, so the rows at the smallest and largest off_u imply all others.
  A tied ratio column weighs as many actions as it stands for in the caps and objectives. Size: the untied
  actions plus a few columns and rows per run.
  Lower bound L (fastlp_lp.tied_dual). Write the dual of the full LP (a flow per precedence row, a price per
  cap, ...) and tie its variables the same way: one flow for all rows of a group above, one price per tied
  ratio bound. A restriction of the (maximising) dual, so L <= OPT by weak duality. Dual constraints of tied
  actions that see the same tied flows are identical and kept once, so L is as small as U.
  Exactness. If U - L <= 1e-9 max(1, |U|), the tied primal solution is optimal for the full LP: we return it
  expanded to every action, and U as the phase objective. Otherwise the margin doubles and the phase is
  solved again; once nothing is tied the tied primal is the full LP (then U alone is exact). Both bounds are
  exact LP bounds for any choice of ties, so a wrong guess of the structure costs time, never correctness.
  Why it works: the fill and drain of a pipeline take about one period per stage, and the optimum (primal
  and dual) is periodic in between; margins of about the stage count make U = L in every schedule we tried
  (measured: tests/test_fastlp.py, benchmarks/solver_scale.py). Phase 1 usually needs far less.
  The phases are chained as in Note [three-phase LP] (tfplan.solver): phase 2 bounds T by T1 (1 + 1e-9),
  phase 3 the total freeze by R2 (1 + 1e-9) + 1e-9, with T1 and R2 the certified optima.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from tfplan.dag import Dag
from tfplan.errors import TfplanError
from tfplan.fastlp_graph import GraphArrays, Runs, Ties
from tfplan.fastlp_lp import INF, Compressed, Phase, expand_ratios, solve_glop, tied_dual, tied_primal
from tfplan.simulate import simulate
from tfplan.solver import REL_TOL, PhaseResult, Solution, check_caps

log = logging.getLogger(__name__)

GAP_TOL = 1e-9  # U - L <= GAP_TOL * max(1, |U|) certifies a phase (Note [periodic compression])
PHASE_NAMES = ("makespan", "total_freeze", "even_spread")


def solve(dag: Dag, caps: Sequence[float] | float, target_makespan_ms: float | None = None) -> Solution:
    """Solve the three-phase LP of tfplan.solver exactly, compressing repeating micro-batches.

    Args:
        dag: the action graph with d_min/d_max per node.
        caps: the per-stage cap on the mean freeze ratio (one value for all stages, or one per stage).
        target_makespan_ms: instead of the fastest plan, the least-freezing plan whose makespan is at most
            this (phase 2 bounds T by it); must not be below the phase-1 optimum.

    Returns:
        A Solution whose phase objectives equal solver.solve's (to the LP tolerance) and whose backend is
        "fastlp".

    Raises:
        TfplanError: bad caps or an unreachable target.
    """
    start = time.perf_counter()
    num_stages = dag.schedule.num_stages
    cap_arr = np.asarray(check_caps(caps, num_stages), dtype=np.float64)
    g = GraphArrays.from_dag(dag)
    runs = Runs.detect(g)
    build_s = time.perf_counter() - start
    margins = _Margins(g, runs, num_stages)
    phases: list[PhaseResult] = []
    t_ub = r_ub = INF
    best = INF
    final = None
    for number in (1, 2, 3):
        phase = Phase(number=number, caps=cap_arr, t_ub=t_ub, r_ub=r_ub)
        result, compressed, x, col = _certified(phase, margins)
        phases.append(result)
        if number == 1:
            best = result.objective
            t_ub = best * (1 + REL_TOL)
            if target_makespan_ms is not None:
                if target_makespan_ms < best * (1 - REL_TOL):
                    raise TfplanError(
                        f"target makespan {target_makespan_ms:.6g} ms is unreachable under the caps; "
                        f"the best is {best:.6g} ms"
                    )
                t_ub = target_makespan_ms
        elif number == 2:
            r_ub = result.objective * (1 + REL_TOL) + REL_TOL
        final = (compressed, x, col)
    assert final is not None
    ratios = expand_ratios(*final)
    durations = g.d_max - ratios * g.delta
    _check(dag, g, ratios, durations, cap_arr, t_ub)
    return Solution(
        ratios=ratios.tolist(),
        durations=durations.tolist(),
        makespan_ms=best,
        phases=tuple(phases),
        backend="fastlp",
        build_s=build_s,
        wall_s=time.perf_counter() - start,
    )


class _Margins:
    """The margin schedule: small for phase 1, about the stage count for phases 2-3, doubling on a gap."""

    def __init__(self, g: GraphArrays, runs: Runs, num_stages: int) -> None:
        self.g, self.runs = g, runs
        self.scale = max(2, num_stages)
        self.current = 2
        self._cache: dict[int, Compressed] = {}

    def start(self, phase: int) -> int:
        if phase > 1:
            self.current = max(self.current, self.scale)
        return self.current

    def compressed(self, margin: int) -> Compressed:
        if margin not in self._cache:
            self._cache.clear()  # keep memory flat: one compression at a time
            ties = self.runs.ties(self.g.n, (margin, margin)) if margin >= 0 else Ties.none(self.g.n)
            self._cache[margin] = Compressed(self.g, ties)
        return self._cache[margin]


def _certified(phase: Phase, margins: _Margins) -> tuple[PhaseResult, Compressed, np.ndarray, dict]:
    """Solve one phase: tied primal and dual until they meet (Note [periodic compression])."""
    wall = 0.0
    iterations = 0
    margin = margins.start(phase.number)
    while True:
        c = margins.compressed(margin)
        upper_lp, col = tied_primal(c, phase)
        upper = solve_glop(upper_lp, f"phase {phase.number} tied primal")
        wall += upper.wall_s
        iterations += upper.iterations
        if c.ties.num_tied == 0:
            break  # the full LP: exact
        lower = solve_glop(tied_dual(c, phase), f"phase {phase.number} tied dual")
        wall += lower.wall_s
        iterations += lower.iterations
        gap = upper.objective - lower.objective
        log.debug(
            "phase %d margin %d: U=%.12g L=%.12g gap=%.3g (%d of %d actions tied)",
            phase.number, margin, upper.objective, lower.objective, gap, c.ties.num_tied, c.g.n,
        )
        if gap <= GAP_TOL * max(1.0, abs(upper.objective)):
            break
        margin = 2 * margin + 1
        if margins.runs.ties(c.g.n, (margin, margin)).num_tied == 0:
            margin = -1  # untie everything
        margins.current = margin if margin >= 0 else margins.current
    result = PhaseResult(
        name=PHASE_NAMES[phase.number - 1], objective=upper.objective, status="OPTIMAL", iterations=iterations,
        wall_s=wall,
    )
    return result, c, upper.x, col


def _check(dag: Dag, g: GraphArrays, ratios, durations, caps, t_ub: float) -> None:
    """Invariants of the returned plan: caps hold and the simulated makespan is within the phase bound."""
    counts = np.bincount(g.stage[g.frz], minlength=len(caps))
    sums = np.bincount(g.stage[g.frz], weights=ratios[g.frz], minlength=len(caps))
    assert np.all(sums <= caps * counts + 1e-6 * np.maximum(1, counts)), "fastlp: a cap is violated"
    makespan = simulate(dag, durations.tolist()).makespan_ms
    assert makespan <= t_ub * (1 + 1e-7) + 1e-9, f"fastlp: simulated makespan {makespan} exceeds {t_ub}"
