"""GLOP for fastlp's sparse LPs (tied.SparseLP), with the settings of Note [LP tolerance] in tfplan.fastlp.phases.

Part of tfplan.fastlp. solve_glop fills a model through model_builder's helper (one call per entry, no scipy)
and hands it to pywraplp as a proto: pywraplp reports simplex iterations, honours a time limit and releases the
GIL while solving, so a tied primal and a tied dual can be solved in two threads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import linear_solver_pb2, pywraplp
from ortools.linear_solver.python import model_builder_helper as mbh

from tfplan.fastlp.tied import SparseLP
from tfplan.lp import GLOP_PARAMS, Deadline

PLAN_PARAMS = "use_preprocessing: false primal_feasibility_tolerance: 1e-10"  # Note [LP tolerance]
RETRY_PARAMS = "primal_feasibility_tolerance: 1e-12"
DUAL_PARAMS = " dual_feasibility_tolerance: 1e-10"  # an untied primal whose duals must certify it (fastlp)
TIGHT_COLUMNS = 4000  # bound LPs up to this size get lp.GLOP_PARAMS (cheap there; Note [LP tolerance])
LENIENT = " change_status_to_imprecise: false"  # a tied LP only needs a feasible point (_solve_lp)


@dataclass(frozen=True, slots=True)
class LPResult:
    """A GLOP solution."""

    objective: float
    x: np.ndarray
    """Column values."""
    iterations: int
    """Simplex iterations."""
    wall_s: float
    """Seconds to fill and solve the model."""
    duals: np.ndarray | None = None
    """Row duals (when asked for): >= 0 on a binding lower side of a minimisation, <= 0 on an upper side."""


class Race:
    """Solves of one LP by different methods in threads: the first result wins and the others are interrupted
    (pywraplp's InterruptSolve; Note [LP tolerance] in tfplan.fastlp.phases says why phase 3 races two simplexes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._solvers: list[pywraplp.Solver] = []
        self._over = False

    def enter(self, solver: pywraplp.Solver) -> bool:
        """Register a solver about to solve; False when the race is already over (then do not solve)."""
        with self._lock:
            if not self._over:
                self._solvers.append(solver)
            return not self._over

    @property
    def over(self) -> bool:
        return self._over

    def finish(self) -> None:
        """End the race: interrupt every registered solve still running."""
        with self._lock:
            self._over = True
            for solver in self._solvers:
                solver.InterruptSolve()


def solve_glop(lp: SparseLP, params: str = "", time_limit_s: float | None = None,
               duals: bool = False, race: Race | None = None) -> LPResult | None:
    """Solve with GLOP through pywraplp (as tfplan.solver); None unless OPTIMAL (or out of time, or lost a race).

    params: GLOP parameters in text format (Note [LP tolerance] in tfplan.fastlp.phases); time_limit_s: GLOP's own
    limit (None = none); duals: also return the row duals; race: the Race this solve runs in.
    """
    start = time.perf_counter()
    ri, ci, val = _coalesce(lp.ri, lp.ci, lp.val)
    h = mbh.ModelBuilderHelper()
    h.add_var_array_with_bounds(lp.lb, lp.ub, np.zeros(len(lp.lb), bool), "")
    add, set_lo, set_hi = h.add_linear_constraint, h.set_constraint_lower_bound, h.set_constraint_upper_bound
    for lo, hi in zip(lp.row_lo.tolist(), lp.row_hi.tolist()):
        k = add()
        set_lo(k, lo)
        set_hi(k, hi)
    set_coef = h.set_constraint_coefficient
    for r, c, v in zip(ri.tolist(), ci.tolist(), val.tolist()):
        set_coef(r, c, v)
    nz = np.flatnonzero(lp.obj)
    h.set_objective_coefficients(nz.tolist(), lp.obj[nz].tolist())
    h.set_maximize(lp.maximize)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    assert solver is not None, "OR-Tools was built without GLOP"
    error = solver.LoadModelFromProto(mbh.to_mpmodel_proto(h))
    assert not error, error
    if params:
        solver.SetSolverSpecificParametersAsString(params)
    if time_limit_s is not None:
        left = time_limit_s - (time.perf_counter() - start)
        if left <= 0:
            return None
        solver.SetTimeLimit(max(1, int(left * 1000)))
    if race is not None and not race.enter(solver):
        return None
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    response = linear_solver_pb2.MPSolutionResponse()
    solver.FillSolutionResponseProto(response)
    return LPResult(
        objective=solver.Objective().Value(), x=np.asarray(response.variable_value), iterations=solver.iterations(),
        wall_s=time.perf_counter() - start, duals=np.asarray(response.dual_value) if duals else None,
    )


def _coalesce(ri: np.ndarray, ci: np.ndarray, val: np.ndarray):
    """Sum duplicate (row, col) entries and drop zeros."""
    if len(ri) == 0:
        return ri, ci, val
    key = ri * (int(ci.max()) + 1) + ci
    order = np.argsort(key, kind="stable")
    key, ri, ci, val = key[order], ri[order], ci[order], val[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    idx = np.flatnonzero(first)
    sums = np.add.reduceat(val, idx)
    keep = sums != 0.0
    return ri[idx][keep], ci[idx][keep], sums[keep]


def solve_lp(lp: SparseLP, tied: bool, deadline: Deadline, dual_simplex: bool = False, precise: bool = False,
             duals: bool = False, extra: str = "", race: Race | None = None) -> LPResult | None:
    """GLOP with the settings of Note [LP tolerance]; GLOP's defaults if those fail; None once out of time.

    A tied LP only has to give a bound: a primal-feasible point is enough, so GLOP's IMPRECISE (dual
    tolerance missed, which weights of thousands of tied actions can cause) counts as a result there.
    dual_simplex: for the tied primal of phases 2-3; precise: PLAN_PARAMS, to polish a bound (Note [LP
    tolerance]); duals: return the row duals too (an untied primal certifies itself with them); extra: more
    GLOP parameters; race: the Race it runs in (no fallback once the race is over).
    """
    params = (PLAN_PARAMS if precise else GLOP_PARAMS if len(lp.obj) <= TIGHT_COLUMNS else "") + extra
    if dual_simplex:
        params += " use_dual_simplex: true"
    if tied:
        params += LENIENT
    for attempt in (params, LENIENT if tied else ""):
        if deadline.expired():
            return None
        limit = None if deadline.limit_s is None else deadline.remaining()
        result = solve_glop(lp, attempt, limit, duals, race)
        if result is not None or (race is not None and race.over):
            return result
    return None
