"""The TimelyFreeze LP (tfplan.solve.lp, METHOD.md section 4) on the full LP with OR-Tools GLOP: the reference backend.

    from tfplan.schedule import schedules
    from tfplan.cost import profile
    from tfplan.step import dag
    from tfplan.solve import solver
    d = dag.build(schedules.generate("1f1b", 4, 8), profile.uniform(4))
    sol = solver.solve(d, 0.9)          # an lp.Solution; sol.phases: makespan, total_freeze, even_spread

The phases are those of Note [three-phase LP] (tfplan.solve.lp); each phase is OPTIMAL by GLOP's own status (Note
[LP certificate]). Phases share one GLOP model and change only bounds and the objective (phase 3 adds its
variables and rows). GLOP can warm-start a phase from the last basis only with presolve off, and measured on
1F1B 16 x 256 that was slower overall (27 s against 13 s with presolve on every phase, with the earlier
phase 3), so presolve stays on; on 1F1B 4 x 700 neither the dual simplex nor presolve off made the new phase 3
faster (9-13 s against 9.3 s).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ortools.linear_solver import pywraplp

from tfplan.errors import TfplanError
from tfplan.solve.lp import (
    GLOP_PARAMS,
    OPTIMAL,
    Deadline,
    PhaseResult,
    Solution,
    check_caps,
    check_time_limit,
    keep_caps,
    makespan_bound,
    precedence_rows,
    total_bound,
)
from tfplan.step.dag import Dag

_STATUS_NAMES = {
    pywraplp.Solver.OPTIMAL: "OPTIMAL",
    pywraplp.Solver.INFEASIBLE: "INFEASIBLE",
    pywraplp.Solver.UNBOUNDED: "UNBOUNDED",
    pywraplp.Solver.ABNORMAL: "ABNORMAL",
    pywraplp.Solver.NOT_SOLVED: "NOT_SOLVED",
    pywraplp.Solver.FEASIBLE: "FEASIBLE",
}


class _GlopModel:
    """The full three-phase model in one pywraplp GLOP solver (kept between phases)."""

    def __init__(self, dag: Dag, caps: Sequence[float]) -> None:
        self.dag = dag
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        assert self.solver is not None, "OR-Tools was built without GLOP"
        inf = self.solver.infinity()
        solver = self.solver
        self.t = [solver.NumVar(0.0, inf, "") for _ in range(dag.num_nodes)]
        self.groups = dag.freeze_groups()
        self.r: dict[int, pywraplp.Variable] = {v: solver.NumVar(0.0, 1.0, "") for g in self.groups for v in g}
        self.T = solver.NumVar(0.0, inf, "T")

        def add_row(lower: float, terms: list[tuple[pywraplp.Variable, float]], upper: float = inf):
            row = solver.Constraint(lower, upper)
            for var, coef in terms:
                row.SetCoefficient(var, coef)
            return row

        def end_terms(u: int) -> list[tuple[pywraplp.Variable, float]]:
            # t_u + d_u = t_u + d_max - delta r_u, so (t_v - t_u + delta r_u) >= d_max + lag
            r = self.r.get(u)
            return [] if r is None else [(r, dag.d_max[u] - dag.d_min[u])]

        rows, finish = precedence_rows(dag)
        for u, v, lag in rows:
            add_row(dag.d_max[u] + lag, [(self.t[v], 1.0), (self.t[u], -1.0), *end_terms(u)])
        for u, tail in finish:
            add_row(dag.d_max[u] + tail, [(self.T, 1.0), (self.t[u], -1.0), *end_terms(u)])
        for group, cap in zip(self.groups, caps):
            if group:
                add_row(-inf, [(self.r[v], 1.0) for v in group], cap * len(group))
        self.total_row = add_row(-inf, [(r, 1.0) for r in self.r.values()])
        self.add_row = add_row
        self.e: list[pywraplp.Variable] = []

    def add_spread(self) -> None:
        """Phase 3's mean mu_s per stage and deviation e_a per action (Note [three-phase LP]); added late, they
        do not slow phases 1-2."""
        inf = self.solver.infinity()
        for group in self.groups:
            if not group:
                continue
            mu = self.solver.NumVar(0.0, inf, "")
            self.add_row(0.0, [(mu, float(len(group))), *((self.r[v], -1.0) for v in group)], 0.0)
            for v in group:  # e >= r - mu (Note [one-sided deviation] in tfplan.solve.lp)
                e = self.solver.NumVar(0.0, inf, "")
                self.add_row(0.0, [(e, 1.0), (self.r[v], -1.0), (mu, 1.0)])
                self.e.append(e)

    def solve(self, name: str, objective: list[tuple[pywraplp.Variable, float]], deadline: Deadline) -> PhaseResult:
        """One phase: OPTIMAL or an error (Note [LP certificate]).

        Raises:
            TfplanError: GLOP ran out of time (--time-limit) or returned another status than OPTIMAL.
        """
        obj = self.solver.Objective()
        obj.Clear()
        for var, coef in objective:
            obj.SetCoefficient(var, coef)
        obj.SetMinimization()
        self.solver.SetSolverSpecificParametersAsString(GLOP_PARAMS)
        remaining = deadline.remaining()
        if remaining <= 0.0:
            raise TfplanError(f"--time-limit: GLOP reached the limit of {deadline.limit_s:g} s before LP phase "
                              f"{name}; raise --time-limit or use --solver fastlp")
        if remaining < float("inf"):
            self.solver.SetTimeLimit(max(1, int(remaining * 1000)))
        start = time.perf_counter()
        status = self.solver.Solve()
        wall = time.perf_counter() - start
        status_name = _STATUS_NAMES.get(status, str(status))
        if status != pywraplp.Solver.OPTIMAL:
            if deadline.expired():
                raise TfplanError(f"--time-limit: GLOP reached the limit of {deadline.limit_s:g} s in LP phase "
                                  f"{name}; raise --time-limit or use --solver fastlp")
            raise TfplanError(f"LP phase {name}: GLOP returned {status_name} instead of OPTIMAL (after {wall:.2f} s)")
        return PhaseResult(
            name=name, objective=obj.Value(), status=OPTIMAL, iterations=self.solver.iterations(), wall_s=wall
        )


def solve(dag: Dag, caps: Sequence[float] | float, target_makespan_ms: float | None = None,
          time_limit_s: float | None = None) -> Solution:
    """Solve the three-phase LP with GLOP.

    Args:
        dag: the action graph with d_min/d_max per node.
        caps: the per-stage cap on the mean freeze ratio (one value for all stages, or one per stage).
        target_makespan_ms: instead of the fastest plan, the least-freezing plan whose makespan is at most
            this (phase 2 bounds T by it); must not be below the phase-1 optimum (lp.makespan_bound).
        time_limit_s: seconds for the whole solve (GLOP's time limit per phase is what is left); None = none.

    Raises:
        TfplanError: bad caps, an unreachable target (lp.UnreachableTarget), the time limit reached, or a
            solver status other than OPTIMAL.
    """
    caps = check_caps(caps, dag.schedule.num_stages)
    check_time_limit(time_limit_s)
    deadline = Deadline(limit_s=time_limit_s)
    start = time.perf_counter()
    model = _GlopModel(dag, caps)
    build_s = time.perf_counter() - start
    phases = [model.solve("makespan", [(model.T, 1.0)], deadline)]
    best = phases[0].objective
    model.T.SetUb(makespan_bound(best, target_makespan_ms))
    phases.append(model.solve("total_freeze", [(r, 1.0) for r in model.r.values()], deadline))
    model.total_row.SetUb(total_bound(phases[1].objective))
    model.add_spread()
    phases.append(model.solve("even_spread", [(e, 2.0) for e in model.e], deadline))
    ratios = [0.0] * dag.num_nodes
    for v, var in model.r.items():
        ratios[v] = min(1.0, max(0.0, var.solution_value()))
    ratios = keep_caps(dag, ratios, caps, "glop")
    return Solution(
        ratios=ratios,
        durations=dag.durations(ratios),
        makespan_ms=best,
        phases=tuple(phases),
        backend="glop",
        build_s=build_s,
        wall_s=time.perf_counter() - start,
        time_limit_s=time_limit_s,
    )
