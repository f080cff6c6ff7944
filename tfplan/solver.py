"""The TimelyFreeze linear program (METHOD.md section 4), solved exactly with OR-Tools GLOP.

Variables: a start time t_v >= 0 per action, a freeze ratio r_a in [0, 1] per freezable action (B, W) whose
frozen time is below its unfrozen time, and the makespan T. Duration d_a = d_max - r_a (d_max - d_min).
  precedence   t_v >= t_u + d_u + lag(u, v)          for every edge (u, v)
  finish       T   >= t_u + d_u                       for every action without successors
  cap          sum_{a in A_s} r_a <= c_s |A_s|        for every stage s (mean ratio <= cap)
A_s holds stage s's B and W actions whose frozen time is below the unfrozen one; an action freezing cannot
shorten (d_min == d_max) gets no variable and does not count towards |A_s| (METHOD.md counts every B/W;
the difference only matters for profiles that declare some backward unfreezable).

Note [three-phase LP]: a lexicographic objective without big-M.
  phase 1  min T                                           -> T1
  phase 2  min sum_a r_a     s.t. T <= T1 (1 + 1e-9)       -> R2 (no freezing that buys no time)
  phase 3  min sum_s z_s     s.t. also sum_a r_a <= R2 (1 + 1e-9) + 1e-9, z_s >= r_a for a in A_s
Phase 3 spreads freezing evenly inside each stage: among equally fast, equally light plans it minimises each
stage's largest ratio, so a stage that must freeze 5.2 actions' worth over 8 equivalent actions gets 8 x 0.65
rather than the simplex vertex 5 x 1.0 + 0.2, where the schedule allows it. Phases share one GLOP model
and change only bounds and the objective (phase 3 adds its rows). GLOP can warm-start a phase from the last
basis only with presolve off, and measured on 1F1B 16 x 256 that was slower overall (27 s against 13 s with
presolve on every phase, mostly phase 3), so presolve stays on.

Note [redundant rows]: the same-stage edges F -> B/I and I -> W join two actions of one rank that the rank's
own chain already orders (a validated schedule runs F before B/I and I before W), with lag 0, so their rows
are implied and dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from tfplan.dag import Dag
from tfplan.errors import TfplanError

REL_TOL = 1e-9  # phases 2-3 keep earlier optima within this relative tolerance
GLOP_PARAMS = "primal_feasibility_tolerance: 1e-10"


class UnreachableTarget(TfplanError):
    """The requested makespan is below the phase-1 optimum under the caps."""

    def __init__(self, target_ms: float, best_makespan_ms: float) -> None:
        super().__init__(
            f"target makespan {target_ms:.6g} ms is unreachable under the caps; the best is {best_makespan_ms:.6g} ms"
        )
        self.best_makespan_ms = best_makespan_ms


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseResult:
    """Outcome of one LP phase."""

    name: str
    """`makespan`, `total_freeze` or `even_spread`."""
    objective: float
    """Optimal objective value (ms for makespan; sum of ratios otherwise)."""
    status: str
    """Solver status (OPTIMAL unless something went wrong, which raises)."""
    iterations: int
    """Simplex iterations."""
    wall_s: float
    """Seconds spent solving this phase."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Solution:
    """A freeze plan for every node of a DAG."""

    ratios: list[float]
    """Freeze ratio per node in [0, 1]; 0 for fixed nodes (F, I) and actions freezing cannot speed up."""
    durations: list[float]
    """Duration per node at those ratios (ms)."""
    makespan_ms: float
    """Phase-1 optimum: the smallest makespan the caps allow (ms)."""
    phases: tuple[PhaseResult, ...]
    """Per-phase results, in order."""
    backend: str
    """Which solver produced it."""
    build_s: float
    """Seconds spent building the model."""
    wall_s: float
    """Seconds spent building and solving, in all."""


def freeze_groups(dag: Dag) -> list[list[int]]:
    """Per stage: the freezable nodes whose frozen duration is below the unfrozen one (the A_s of the cap).

    An action that freezing cannot shorten (d_min == d_max) is neither counted nor frozen.
    """
    groups: list[list[int]] = [[] for _ in range(dag.schedule.num_stages)]
    for v, a in enumerate(dag.actions):
        if dag.freezable[v] and dag.d_max[v] > dag.d_min[v]:
            groups[a.stage].append(v)
    return groups


def check_caps(caps: Sequence[float] | float, num_stages: int) -> list[float]:
    """One cap per stage, each in [0, 1].

    Raises:
        TfplanError: a cap outside [0, 1] or a per-stage list of the wrong length.
    """
    if isinstance(caps, (int, float)):
        caps = [float(caps)] * num_stages
    caps = [float(c) for c in caps]
    if len(caps) == 1:
        caps *= num_stages
    if len(caps) != num_stages:
        raise TfplanError(
            f"--max-freeze-ratio: got {len(caps)} per-stage caps but the schedule has {num_stages} stages"
        )
    for s, c in enumerate(caps):
        if not 0.0 <= c <= 1.0:
            raise TfplanError(f"--max-freeze-ratio: cap of stage {s} must be in [0, 1], got {c:g}")
    return caps


def precedence_rows(dag: Dag) -> tuple[list[tuple[int, int, float]], list[int]]:
    """Rows of the LP: (u, v, lag) per non-redundant edge (Note [redundant rows]) and the sink nodes."""
    pair_lag: dict[tuple[int, int], float] = {}
    has_succ = [False] * dag.num_nodes
    for k, (slot, lags) in enumerate(zip(dag.preds, dag.lags)):
        for v, u in enumerate(slot):
            if u < 0:
                continue
            has_succ[u] = True
            if k == 2 and lags[v] == 0.0 and dag.rank[u] == dag.rank[v]:
                continue  # implied by the rank chain
            key = (u, v)
            pair_lag[key] = max(lags[v], pair_lag.get(key, lags[v]))
    rows = [(u, v, lag) for (u, v), lag in pair_lag.items()]
    return rows, [v for v in range(dag.num_nodes) if not has_succ[v]]


class _GlopModel:
    """The full three-phase model in one pywraplp GLOP solver (kept between phases for warm starts)."""

    def __init__(self, dag: Dag, caps: Sequence[float]) -> None:
        self.dag = dag
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        assert self.solver is not None, "OR-Tools was built without GLOP"
        inf = self.solver.infinity()
        n = dag.num_nodes
        solver = self.solver
        self.t = [solver.NumVar(0.0, inf, "") for _ in range(n)]
        self.groups = freeze_groups(dag)
        self.r: dict[int, pywraplp.Variable] = {v: solver.NumVar(0.0, 1.0, "") for g in self.groups for v in g}
        self.T = solver.NumVar(0.0, inf, "T")
        self.z = [solver.NumVar(0.0, 1.0, "") for _ in self.groups]

        def add_row(lower: float, terms: list[tuple[pywraplp.Variable, float]], upper: float = inf):
            row = solver.Constraint(lower, upper)
            for var, coef in terms:
                row.SetCoefficient(var, coef)
            return row

        def end_terms(u: int) -> list[tuple[pywraplp.Variable, float]]:
            # t_u + d_u = t_u + d_max - delta r_u, so (t_v - t_u + delta r_u) >= d_max + lag
            r = self.r.get(u)
            return [] if r is None else [(r, dag.d_max[u] - dag.d_min[u])]

        rows, sinks = precedence_rows(dag)
        for u, v, lag in rows:
            add_row(dag.d_max[u] + lag, [(self.t[v], 1.0), (self.t[u], -1.0), *end_terms(u)])
        for u in sinks:
            add_row(dag.d_max[u], [(self.T, 1.0), (self.t[u], -1.0), *end_terms(u)])
        for group, cap in zip(self.groups, caps):
            if group:
                add_row(-inf, [(self.r[v], 1.0) for v in group], cap * len(group))
        self.total_row = add_row(-inf, [(r, 1.0) for r in self.r.values()])
        self.add_row = add_row

    def add_spread_rows(self) -> None:
        """z_s >= r_a for every a in A_s (phase 3 only: added late, they do not slow phases 1-2)."""
        for s, group in enumerate(self.groups):
            for v in group:
                self.add_row(0.0, [(self.z[s], 1.0), (self.r[v], -1.0)])

    def solve(self, name: str, objective: list[tuple[pywraplp.Variable, float]]) -> PhaseResult:
        obj = self.solver.Objective()
        obj.Clear()
        for var, coef in objective:
            obj.SetCoefficient(var, coef)
        obj.SetMinimization()
        # GLOP's default primal feasibility tolerance (1e-8, absolute) lets a re-simulated plan exceed the
        # phase-1 makespan by more than REL_TOL on small instances; 1e-10 keeps it within (tests/test_solver).
        self.solver.SetSolverSpecificParametersAsString(GLOP_PARAMS)
        start = time.perf_counter()
        status = self.solver.Solve()
        wall = time.perf_counter() - start
        names = {
            pywraplp.Solver.OPTIMAL: "OPTIMAL",
            pywraplp.Solver.INFEASIBLE: "INFEASIBLE",
            pywraplp.Solver.UNBOUNDED: "UNBOUNDED",
            pywraplp.Solver.ABNORMAL: "ABNORMAL",
            pywraplp.Solver.NOT_SOLVED: "NOT_SOLVED",
            pywraplp.Solver.FEASIBLE: "FEASIBLE",
        }
        status_name = names.get(status, str(status))
        if status != pywraplp.Solver.OPTIMAL:
            raise TfplanError(f"LP phase {name}: GLOP returned {status_name} instead of OPTIMAL (after {wall:.2f} s)")
        return PhaseResult(
            name=name, objective=obj.Value(), status=status_name, iterations=self.solver.iterations(), wall_s=wall
        )


def solve(dag: Dag, caps: Sequence[float] | float, target_makespan_ms: float | None = None) -> Solution:
    """Solve the three-phase LP with GLOP.

    Args:
        dag: the action graph with d_min/d_max per node.
        caps: the per-stage cap on the mean freeze ratio (one value for all stages, or one per stage).
        target_makespan_ms: instead of the fastest plan, the least-freezing plan whose makespan is at most
            this (phase 2 bounds T by it); must not be below the phase-1 optimum.

    Raises:
        TfplanError: bad caps, an unreachable target, or a solver status other than OPTIMAL.
    """
    caps = check_caps(caps, dag.schedule.num_stages)
    start = time.perf_counter()
    model = _GlopModel(dag, caps)
    build_s = time.perf_counter() - start
    phases = [model.solve("makespan", [(model.T, 1.0)])]
    best = phases[0].objective
    bound = best * (1 + REL_TOL)
    if target_makespan_ms is not None:
        if target_makespan_ms < best * (1 - REL_TOL):
            raise UnreachableTarget(target_makespan_ms, best)
        bound = target_makespan_ms
    model.T.SetUb(bound)
    phases.append(model.solve("total_freeze", [(r, 1.0) for r in model.r.values()]))
    total = phases[1].objective
    model.total_row.SetUb(total * (1 + REL_TOL) + REL_TOL)
    model.add_spread_rows()
    phases.append(model.solve("even_spread", [(z, 1.0) for z, g in zip(model.z, model.groups) if g]))
    ratios = [0.0] * dag.num_nodes
    for v, var in model.r.items():
        ratios[v] = min(1.0, max(0.0, var.solution_value()))
    return Solution(
        ratios=ratios,
        durations=dag.durations(ratios),
        makespan_ms=best,
        phases=tuple(phases),
        backend="glop",
        build_s=build_s,
        wall_s=time.perf_counter() - start,
    )
