"""GLOP for fastlp's sparse LPs (tied.SparseLP), with the settings of Note [LP tolerance] in tfplan.solve.fastlp.phases.

Part of tfplan.solve.fastlp. solve_glop fills a model through model_builder's helper (one call per entry, no scipy)
and hands it to pywraplp as a proto: pywraplp reports simplex iterations, honours a time limit and releases the
GIL while solving, so a tied primal and a tied dual can be solved in two threads. solve_warm starts GLOP from a
given basis (Note [warm phase 3] in tfplan.solve.fastlp.phases), which pywraplp cannot: it goes through math_opt's
GLOP with a ModelProto filled column by column.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
from google.protobuf import text_format
from ortools.linear_solver import linear_solver_pb2, pywraplp
from ortools.linear_solver.python import model_builder_helper as mbh
from ortools.math_opt import callback_pb2, model_parameters_pb2, model_pb2, parameters_pb2, result_pb2
from ortools.math_opt.core.python import solver as math_opt_solver
from ortools.util.python.pybind_solve_interrupter import PySolveInterrupter
from pybind11_abseil.status import StatusNotOk

from tfplan.solve.fastlp.tied import SparseLP
from tfplan.solve.heap import release_between_solves
from tfplan.solve.lp import GLOP_PARAMS, Deadline

PLAN_PARAMS = "use_preprocessing: false primal_feasibility_tolerance: 1e-10"  # Note [LP tolerance]
RETRY_PARAMS = "primal_feasibility_tolerance: 1e-12"
DUAL_PARAMS = " dual_feasibility_tolerance: 1e-10"  # an untied primal whose duals must certify it (fastlp)
TIGHT_COLUMNS = 4000  # bound LPs up to this size get lp.GLOP_PARAMS (cheap there; Note [LP tolerance])
LENIENT = " change_status_to_imprecise: false"  # a tied LP only needs a feasible point (_solve_lp)
WARM_PARAMS = PLAN_PARAMS + LENIENT  # phase 3 from phase 2's basis: no presolve (GLOP needs that to use a basis)
CARRIED_PARAMS = "use_preprocessing: false use_dual_simplex: true" + LENIENT  # Note [warm margins] (phases)
DUAL_WARM_PARAMS = CARRIED_PARAMS  # phase 3's tied dual from phase 2's (Note [warm phase 3] in phases)
HANDED_DUAL_PARAMS = "use_preprocessing: false" + LENIENT  # phase 2's from the goodput certificate's (goodput.py)


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
    basis: tuple[np.ndarray, np.ndarray] | None = None
    """(column statuses, row statuses) of the optimal basis (when asked for), in math_opt's BasisStatusProto
    codes (tied.FREE 1 ... tied.BASIC 5; a row's status is its activity's)."""
    dual_simplex: bool | None = None
    """Which simplex won the race that gave this result (None outside a race)."""


class Race:
    """Solves of one LP by different methods in threads: the first result wins and the others are interrupted
    (pywraplp's InterruptSolve; Note [LP tolerance] in tfplan.solve.fastlp.phases says why phase 3 races two simplexes).
    A Race can also enter another: finishing the outer one finishes it (a tied dual that phases no longer needs,
    Note [unneeded duals] there, stops whatever race it is in)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._solvers: list[pywraplp.Solver | PySolveInterrupter | Race] = []  # math_opt's by their interrupter
        self._over = False

    def enter(self, solver: pywraplp.Solver | PySolveInterrupter | Race) -> bool:
        """Register a solver about to solve (or a math_opt solve's interrupter, or an inner race); False when the
        race is already over (then do not solve)."""
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
                if isinstance(solver, Race):
                    solver.finish()
                elif isinstance(solver, PySolveInterrupter):
                    solver.interrupt()
                else:
                    solver.InterruptSolve()


def solve_glop(lp: SparseLP, params: str = "", time_limit_s: float | None = None,
               duals: bool = False, race: Race | None = None, basis: bool = False) -> LPResult | None:
    """Solve with GLOP through pywraplp (as tfplan.solve.solver); None unless OPTIMAL (or out of time, or lost a race).

    params: GLOP parameters in text format (Note [LP tolerance] in tfplan.solve.fastlp.phases); time_limit_s: GLOP's own
    limit (None = none); duals: also return the row duals; race: the Race this solve runs in; basis: also return
    the optimal basis (LPResult.basis).
    """
    result = _solve_glop(lp, params, time_limit_s, duals, race, basis)
    release_between_solves()  # the model is gone by now
    return result


def _solve_glop(lp: SparseLP, params: str, time_limit_s: float | None, duals: bool, race: Race | None,
                basis: bool) -> LPResult | None:
    start = time.perf_counter()
    solver = load(lp)
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
    statuses = None
    if basis:  # pywraplp's codes (FREE 0 ... BASIC 4) are math_opt's minus one
        statuses = (np.fromiter((v.basis_status() for v in solver.variables()), np.int64, len(lp.lb)) + 1,
                    np.fromiter((k.basis_status() for k in solver.constraints()), np.int64, len(lp.row_lo)) + 1)
    return LPResult(
        objective=solver.Objective().Value(), x=np.asarray(response.variable_value), iterations=solver.iterations(),
        wall_s=time.perf_counter() - start, duals=np.asarray(response.dual_value) if duals else None, basis=statuses,
    )


def load(lp: SparseLP) -> pywraplp.Solver:
    """A pywraplp GLOP model of `lp` (duplicate entries summed), its columns and rows in `lp`'s order."""
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
    return solver


def solve_warm(lp: SparseLP, basis: tuple[np.ndarray, np.ndarray], params: str, time_limit_s: float | None = None,
               final_basis: bool = False, race: Race | None = None) -> LPResult | None:
    """GLOP started from `basis` (LPResult.basis's codes), through math_opt; None unless OPTIMAL (or out of time,
    or lost a race).

    GLOP uses a starting basis only without presolve, so `params` should say use_preprocessing: false.
    final_basis: also return the optimal basis (LPResult.basis); race: the Race this solve runs in.
    """
    result = _solve_warm(lp, basis, params, time_limit_s, final_basis, race)
    release_between_solves()
    return result


def _solve_warm(lp: SparseLP, basis: tuple[np.ndarray, np.ndarray], params: str,
                time_limit_s: float | None, final_basis: bool, race: Race | None) -> LPResult | None:
    start = time.perf_counter()
    ri, ci, val = _coalesce(lp.ri, lp.ci, lp.val)
    order = np.lexsort((ci, ri))  # math_opt wants the matrix in row-major order
    model = model_pb2.ModelProto()
    cols, rows = np.arange(len(lp.lb)).tolist(), np.arange(len(lp.row_lo)).tolist()
    model.variables.ids.extend(cols)
    model.variables.lower_bounds.extend(lp.lb.tolist())
    model.variables.upper_bounds.extend(lp.ub.tolist())
    model.variables.integers.extend([False] * len(cols))
    nz = np.flatnonzero(lp.obj)
    model.objective.maximize = lp.maximize
    model.objective.linear_coefficients.ids.extend(nz.tolist())
    model.objective.linear_coefficients.values.extend(lp.obj[nz].tolist())
    model.linear_constraints.ids.extend(rows)
    model.linear_constraints.lower_bounds.extend(lp.row_lo.tolist())
    model.linear_constraints.upper_bounds.extend(lp.row_hi.tolist())
    matrix = model.linear_constraint_matrix
    matrix.row_ids.extend(ri[order].tolist())
    matrix.column_ids.extend(ci[order].tolist())
    matrix.coefficients.extend(val[order].tolist())
    solve_params = parameters_pb2.SolveParametersProto()
    text_format.Parse(params, solve_params.glop)
    if time_limit_s is not None:
        left = time_limit_s - (time.perf_counter() - start)
        if left <= 0:
            return None
        solve_params.time_limit.FromNanoseconds(int(left * 1e9))
    model_params = model_parameters_pb2.ModelSolveParametersProto()
    model_params.initial_basis.variable_status.ids.extend(cols)
    model_params.initial_basis.variable_status.values.extend(basis[0].tolist())
    model_params.initial_basis.constraint_status.ids.extend(rows)
    model_params.initial_basis.constraint_status.values.extend(basis[1].tolist())
    interrupter = None
    if race is not None:
        interrupter = PySolveInterrupter()
        if not race.enter(interrupter):
            return None
    try:
        result = math_opt_solver.solve(model, parameters_pb2.SOLVER_TYPE_GLOP,
                                       parameters_pb2.SolverInitializerProto(), solve_params, model_params, None,
                                       callback_pb2.CallbackRegistrationProto(), None, interrupter)
    except StatusNotOk:  # a basis math_opt rejects (not square): the caller solves without one
        return None
    if result.termination.reason != result_pb2.TERMINATION_REASON_OPTIMAL or not result.solutions:
        return None
    solution = result.solutions[0]
    primal = solution.primal_solution
    x = _dense(primal.variable_values, len(cols))
    statuses = None
    if final_basis and solution.HasField("basis"):
        statuses = (_dense(solution.basis.variable_status, len(cols)).astype(np.int64),
                    _dense(solution.basis.constraint_status, len(rows)).astype(np.int64))
    return LPResult(objective=primal.objective_value, x=x, iterations=result.solve_stats.simplex_iterations,
                    wall_s=time.perf_counter() - start, basis=statuses)


def _dense(vector, size: int) -> np.ndarray:
    """A math_opt sparse vector (ids, values) as a dense array of `size` (0 where absent)."""
    out = np.zeros(size)
    out[np.asarray(vector.ids, dtype=np.int64)] = vector.values
    return out


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
             duals: bool = False, extra: str = "", race: Race | None = None, basis: bool = False) -> LPResult | None:
    """GLOP with the settings of Note [LP tolerance]; GLOP's defaults if those fail; None once out of time.

    A tied LP only has to give a bound: a primal-feasible point is enough, so GLOP's IMPRECISE (dual
    tolerance missed, which weights of thousands of tied actions can cause) counts as a result there.
    dual_simplex: for the tied primal of phases 2-3; precise: PLAN_PARAMS, to polish a bound (Note [LP
    tolerance]); duals: return the row duals too (an untied primal certifies itself with them); extra: more
    GLOP parameters; race: the Race it runs in (no fallback once the race is over); basis: return the optimal
    basis too (LPResult.basis).
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
        result = solve_glop(lp, attempt, limit, duals, race, basis)
        if result is not None or (race is not None and race.over):
            return result
    return None


def race(lp: SparseLP, exact: bool, deadline: Deadline, warm: tuple[np.ndarray, np.ndarray] | None = None,
         head_start_s: float = 0.0, basis: bool = False, within: Race | None = None,
         keep_warm: bool = False) -> LPResult | None:
    """Phase 3's tied primal (or tied dual) by the primal and the dual simplex at once: the first result
    interrupts the other (Note [LP tolerance] in tfplan.solve.fastlp.phases). With `warm` (phase 3's tied dual:
    dual.phase3_dual_basis, Note [warm phase 3] there) the dual simplex from that basis first, alone; if it has
    no result within head_start_s seconds, it is interrupted and the race runs as without it, or, keep_warm,
    it goes on against the primal simplex from scratch (Note [phase 3 through phase 2] in
    tfplan.solve.fastlp.rounds). basis: return the optimal basis too (LPResult.basis); within: a Race whose end
    stops this one (None once it has)."""
    if warm is not None:
        alone = Race()
        if within is not None and not within.enter(alone):
            return None

        def first(dual_simplex: bool, job):  # a result ends the contest
            def run() -> LPResult | None:
                result = job()
                if result is not None:
                    alone.finish()
                    result = replace(result, dual_simplex=dual_simplex)
                return result
            return run

        with ThreadPoolExecutor(max_workers=2) as pool:
            limit = None if deadline.limit_s is None else deadline.remaining()
            jobs = [pool.submit(first(True, lambda: solve_warm(lp, warm, DUAL_WARM_PARAMS, limit, final_basis=basis,
                                                               race=alone)))]
            try:
                jobs[0].result(timeout=head_start_s)
            except TimeoutError:
                if keep_warm:
                    jobs.append(pool.submit(first(False, lambda: solve_lp(lp, not exact, deadline, duals=exact,
                                                                          race=alone, basis=basis))))
                else:
                    alone.finish()
            results = [r for r in (job.result() for job in jobs) if r is not None]
        if results:  # (an interrupted solve has none)
            return _better(lp, results)
    contest = Race()
    if within is not None and not within.enter(contest):
        return None
    with ThreadPoolExecutor(max_workers=1) as other:
        def job(dual_simplex: bool) -> LPResult | None:
            result = solve_lp(lp, not exact, deadline, dual_simplex, duals=exact, race=contest, basis=basis)
            if result is not None:
                contest.finish()
                result = replace(result, dual_simplex=dual_simplex)
            return result

        dual = other.submit(job, True)
        results = [r for r in (job(False), dual.result()) if r is not None]
    return _better(lp, results)


def _better(lp: SparseLP, results: list[LPResult]) -> LPResult | None:
    """Both of a race may finish: the better optimum (a tied primal's smaller U, a tied dual's larger value)."""
    return max(results, default=None, key=lambda r: r.objective if lp.maximize else -r.objective)
