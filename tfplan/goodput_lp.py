"""The goodput objective (`tfplan solve --objective goodput`): the stage means that maximise predicted progress
per second, as a sequence of LPs on GLOP (tfplan.goodput Note [goodput model]).

Note [goodput LP]: the problem is
    max  P(m) / (T + o)     P(m) = sum_s w_s e_s(m_s),  e_s(m) = (1 - m) B / ((1 - m) B + N_s)
over the makespan LP's variables (start times t, ratios r, finish T; tfplan.lp) with m_s the mean ratio of
stage s (|A_s| m_s = sum_{a in A_s} r_a), 0 <= m_s <= cap_s, and o the profile's step overhead. A ratio of a
concave function to a positive linear one over a polyhedron: we solve it exactly by Dinkelbach's method,
each subproblem max P(m) - lam (T + o) by Kelley's cutting planes on the concave e_s:
  * lam starts at the unfrozen plan's goodput P(0) / (T0 + o) (a feasible point);
  * the subproblem's LP maximises sum_s w_s phi_s - lam (T + o) with phi_s below tangents of e_s; its value
    U is at least the subproblem's optimum, and the true value F = P(m) - lam (T + o) at its point at most;
    a tangent at each stage's m_s is added until U - F <= tol;
  * then U bounds the goodput gap: no plan exceeds lam + U / (T_min + o), so once U <= tol (T_min + o) lam
    is optimal to that tolerance; otherwise lam = P(m) / (T + o), which only grows. GLOP satisfies rows to
    about 1e-9, so U cannot always fall below tol: when lam stops growing by more than tol, the solve stops
    and reports the bound it has (GoodputSolution.bound).
Each LP is the makespan LP with S more columns (m, phi) and a few rows per stage, re-solved by GLOP after
its objective or cuts change. The Charnes-Cooper transform would give one LP, but with a piecewise-linear
numerator fixed in advance: exact only at its breakpoints. Dinkelbach with cuts places the breakpoints where
the optimum is and certifies the result.

The plan itself is then the three-phase LP (tfplan.lp) at caps m*: the fastest plan within those means, and
among the fastest the least freezing (whose progress is at least P(m*)), made by the usual backends.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from tfplan.dag import Dag
from tfplan.errors import TfplanError
from tfplan.goodput import NoiseModel, progress
from tfplan.lp import Deadline, TimeLimitReached, precedence_rows
from tfplan.simulate import simulate

log = logging.getLogger(__name__)

TOL = 1e-8
"""Relative tolerance of the goodput optimum (Note [goodput LP]); GLOP's own tolerances leave the tangents
satisfied to about 1e-9, below which no cut moves the optimum."""
WARM_PARAMS = "use_preprocessing: false use_dual_simplex: true primal_feasibility_tolerance: 1e-10"
"""GLOP re-solves each LP from the last basis only without presolve; a cut is a new row, which the dual
simplex absorbs in a few pivots. Measured on 1F1B 16 x 128 (25 solves): 5.6 s, against 24 s with presolve
(each solve from scratch) and 18 s with the primal simplex (docs/cost-model.md, "The goodput LP")."""
MAX_ROUNDS = 1000
"""LP solves allowed in all (cuts and Dinkelbach steps); far more than measured (docs/cost-model.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GoodputSolution:
    """The goodput optimum's stage means and how it was found."""

    means: list[float]
    """m*: the mean freeze ratio per stage."""
    goodput: float
    """P(m*) / (T + o) at the optimum found, progress per ms (absolute; tfplan.goodput reports it relative)."""
    unfrozen_goodput: float
    """P(0) / (T0 + o), the same for no freezing."""
    bound: float
    """No plan's goodput exceeds this (Note [goodput LP])."""
    lp_solves: int
    dinkelbach_steps: int
    wall_s: float
    certified: bool = True
    """False when the time limit stopped the search: `means` is the best plan found, `bound` is infinite."""

    @property
    def pays(self) -> bool:
        """Whether freezing raises goodput (beyond the tolerance)."""
        return self.goodput > self.unfrozen_goodput * (1 + 1e-9)


def efficiency_slope(m: float, batch_tokens: float, noise: float) -> tuple[float, float]:
    """(e(m), de/dm) of a stage at mean ratio m (Note [goodput LP]); a noiseless stage: (1, 0)."""
    if noise <= 0:
        return 1.0, 0.0
    kept = (1.0 - m) * batch_tokens
    return kept / (kept + noise), -batch_tokens * noise / (kept + noise) ** 2


def solve_goodput(dag: Dag, caps: Sequence[float], noise: NoiseModel, batch_tokens: float,
                  time_limit_s: float | None = None) -> GoodputSolution:
    """Note [goodput LP] on GLOP. `noise` is per stage of the DAG; `caps` one per stage. When the time limit
    stops it, the best stage means found so far come back, not certified (a warning).

    Raises:
        TfplanError: a GLOP status other than OPTIMAL.
    """
    start = time.perf_counter()
    deadline = Deadline(limit_s=time_limit_s)
    overhead = dag.step_overhead_ms
    n = noise.noise_scale_tokens
    # Scaled so that the LP sees numbers near 1 whatever the noise (GLOP's tolerances are absolute): each
    # stage's efficiency relative to its unfrozen one, weighted by its share of the unfrozen progress, so
    # that P(m) / P(0) = sum_s w'_s phi_s and the unfrozen plan has progress 1.
    e0 = [efficiency_slope(0.0, batch_tokens, x)[0] for x in n]
    p0 = progress([0.0] * len(caps), batch_tokens, noise)
    w = [wt * e / p0 for wt, e in zip(noise.grad_sq_share, e0)]

    def rel(s: int, m: float) -> tuple[float, float]:
        e, slope = efficiency_slope(m, batch_tokens, n[s])
        return e / e0[s], slope / e0[s]

    def rel_progress(means: Sequence[float]) -> float:
        return progress(means, batch_tokens, noise) / p0

    d0 = simulate(dag).batch_time_ms
    model = _Model(dag, caps)
    for s, cap in enumerate(caps):
        for m in {0.0, cap / 2, cap}:
            model.add_cut(s, m, *rel(s, m))
    best = {"lam": 1.0 / d0, "means": [0.0] * len(caps), "goodput": 1.0 / d0, "upper": math.inf,
            "t_min": simulate(dag, dag.d_min).batch_time_ms, "solves": 0, "steps": 0}
    certified = True
    try:
        _dinkelbach(model, w, rel, rel_progress, overhead, best, deadline)
    except TimeLimitReached:
        certified = False
        log.warning("--objective goodput: the time limit stopped the goodput search after %d LP solves; the plan "
                    "is the best found, not certified optimal", best["solves"])
    bound = (best["lam"] + max(0.0, best["upper"]) / best["t_min"]) * p0 if certified else math.inf
    return GoodputSolution(means=best["means"], goodput=best["goodput"] * p0, unfrozen_goodput=p0 / d0,
                           bound=bound, lp_solves=best["solves"], dinkelbach_steps=best["steps"],
                           wall_s=time.perf_counter() - start, certified=certified)


def _dinkelbach(model, w, rel, rel_progress, overhead: float, best: dict, deadline: Deadline) -> None:
    """Note [goodput LP]: Dinkelbach steps, each solved by Kelley's cuts; `best` holds lam, the best plan's
    means and goodput, the last subproblem bound U, t_min and the counts, updated as it goes (so that a time
    limit leaves the best found)."""
    lam = best["lam"]
    while True:
        best["steps"] += 1
        while True:  # Kelley: cuts until the LP's value meets the true one at its point
            best["solves"] += 1
            if best["solves"] > MAX_ROUNDS:
                raise TfplanError(f"--objective goodput: no convergence in {MAX_ROUNDS} LP solves (a bug)")
            upper, means, phis, finish = model.solve(lam, w, deadline)
            upper -= lam * overhead  # the subproblem's value: max P - lam (T + o), o a constant
            true = rel_progress(means) - lam * (finish + overhead)
            if upper - true <= TOL * lam * (finish + overhead):
                break
            added = False
            for s, (m, phi) in enumerate(zip(means, phis)):
                e, slope = rel(s, m)
                if phi > e + 1e-12:
                    added |= model.add_cut(s, m, e, slope)
            if not added:  # the tangents at this point are in: what is left is GLOP's tolerance
                break
        goodput = rel_progress(means) / (finish + overhead)
        if goodput > best["goodput"]:
            best["goodput"], best["means"] = goodput, list(means)
        best["upper"], best["lam"] = upper, lam
        if upper <= TOL * lam * best["t_min"] or goodput <= lam * (1 + TOL):
            return  # certified; or lam no longer grows: the LP's own tolerance is the floor (see TOL)
        lam = goodput


class _Model:
    """The makespan LP with stage means m_s and progress variables phi_s (Note [goodput LP]) in GLOP."""

    def __init__(self, dag: Dag, caps: Sequence[float]) -> None:
        solver = self.solver = pywraplp.Solver.CreateSolver("GLOP")
        assert solver is not None, "OR-Tools was built without GLOP"
        inf = solver.infinity()
        t = [solver.NumVar(0.0, inf, "") for _ in range(dag.num_nodes)]
        groups = dag.freeze_groups()
        r = {v: solver.NumVar(0.0, 1.0, "") for g in groups for v in g}
        self.T = solver.NumVar(0.0, inf, "T")

        def row(lower: float, terms, upper: float = inf):
            c = solver.Constraint(lower, upper)
            for var, coef in terms:
                c.SetCoefficient(var, coef)
            return c

        def end(u: int):
            return [] if u not in r else [(r[u], dag.d_max[u] - dag.d_min[u])]

        rows, finish = precedence_rows(dag)
        for u, v, lag in rows:
            row(dag.d_max[u] + lag, [(t[v], 1.0), (t[u], -1.0), *end(u)])
        for u, tail in finish:
            row(dag.d_max[u] + tail, [(self.T, 1.0), (t[u], -1.0), *end(u)])
        self.m = [solver.NumVar(0.0, cap, "") for cap in caps]
        self.phi = [solver.NumVar(-inf, 1.0, "") for _ in caps]  # relative efficiency: 1 unfrozen
        for s, group in enumerate(groups):
            if group:
                row(0.0, [(self.m[s], float(len(group))), *((r[v], -1.0) for v in group)], 0.0)
            else:
                self.m[s].SetUb(0.0)
        self.row = row
        self.cuts: set[tuple[int, float]] = set()

    def add_cut(self, s: int, m: float, e: float, slope: float) -> bool:
        """phi_s <= e + slope (m_s - m): a tangent of the concave e_s at m; False if already there."""
        key = (s, round(m, 12))
        if key in self.cuts:
            return False
        self.cuts.add(key)
        self.row(-self.solver.infinity(), [(self.phi[s], 1.0), (self.m[s], -slope)], e - slope * m)
        return True

    def solve(self, lam: float, weights: Sequence[float], deadline: Deadline
              ) -> tuple[float, list[float], list[float], float]:
        """max sum_s w_s phi_s - lam T; returns (its value, the means, the phis, T). The overhead is the
        caller's (a constant: it changes no optimum)."""
        obj = self.solver.Objective()
        obj.Clear()
        obj.SetCoefficient(self.T, lam)
        for phi, weight in zip(self.phi, weights):
            obj.SetCoefficient(phi, -weight)
        obj.SetMinimization()
        self._run(deadline)
        return (-obj.Value(), [min(1.0, max(0.0, m.solution_value())) for m in self.m],
                [phi.solution_value() for phi in self.phi], self.T.solution_value())

    def _run(self, deadline: Deadline) -> None:
        self.solver.SetSolverSpecificParametersAsString(WARM_PARAMS)
        remaining = deadline.remaining()
        if remaining <= 0.0:
            raise TimeLimitReached(f"--time-limit: the goodput solve reached the limit of {deadline.limit_s:g} s")
        if math.isfinite(remaining):
            self.solver.SetTimeLimit(max(1, int(remaining * 1000)))
        status = self.solver.Solve()
        if status != pywraplp.Solver.OPTIMAL:
            if deadline.expired():
                raise TimeLimitReached(f"--time-limit: the goodput solve reached the limit of {deadline.limit_s:g} s")
            raise TfplanError(f"--objective goodput: GLOP returned status {status} instead of OPTIMAL")
