"""An exact, fast solver for the three-phase TimelyFreeze LP (same LP and phases as tfplan.solver).

    from tfplan import schedules, profile, dag, fastlp
    d = dag.build(schedules.generate("1f1b", 32, 512), profile.uniform(32))
    sol = fastlp.solve(d, 0.9)          # a solver.Solution, like solver.solve(d, 0.9)

The LP grows with the micro-batch count M but its hard part does not: pipeline schedules repeat the same
per-rank pattern every micro-batch (or round), with the same per-stage costs. We solve two small LPs per
phase whose sizes depend on the pipeline depth, not on M, and that sandwich the true optimum.

Note [periodic compression]
  Runs. For a period q, actions v = (stage, kind, m) and w = (stage, kind, m + q) are "shift-equal" when each
  predecessor slot of w holds the shifted predecessor of v with the same lag (and w sits as many list
  positions after v as is usual for that stage and kind). Maximal chains of shift-equal actions are runs:
  the steady state of every stage and kind (fastlp_graph.Runs). All actions of a run have the same
  durations, since costs are per stage.
  Ties. Leaving `margin` periods free at both ends of each run, the rest of a run is tied to its first tied
  action rep, off periods later: r_v = r_rep and t_v = t_rep + off * tau_run (fastlp_graph.Ties).
  Upper bound U (fastlp_lp.tied_primal). Substituting the ties restricts the LP, so U >= OPT. The
  substituted precedence rows collapse: rows with the same (run_u, run_v, off_v - off_u, lag) differ only in
  off_u, on which they depend affinely, so the rows at the smallest and largest off_u imply all others. A
  tied ratio column weighs as many actions as it stands for in the caps and objectives. Size: the untied
  actions plus a few columns and rows per run.
  Lower bound L (fastlp_lp.tied_dual). Write the dual of the full LP (a flow per precedence row, a price per
  cap, ...) and tie its variables the same way: one flow for all rows of a group above, one price per tied
  ratio bound. That restricts the (maximising) dual, so L <= OPT by weak duality. Dual constraints of tied
  actions that see the same tied flows are identical and kept once, so L is about as small as U.
  Exactness. If U - L <= 1e-9 max(1, |U|), both equal OPT to that tolerance: the phase reports max(U, L)
  and the last phase's tied primal solution, expanded to every action, is the plan. Otherwise the margin
  grows (2 margin + 1) and the phase is solved again; once nothing is tied, the tied primal is the full LP
  and is exact alone. Both bounds hold for any choice of ties, so a wrong guess of the structure costs time,
  never correctness. The two LPs of a margin are solved in two threads (GLOP releases the GIL).
  Margins. Phase 1 starts at 2 periods and usually needs no more. Phases 2-3 need more: their optima are
  periodic only after the pipeline's fill and before its drain, and in between a stage with slack unfreezes
  a block of about S (stages) of its last steady-state actions (measured: uniform 1F1B 8 x 96 needs 8,
  heterogeneous 32 x 512 needs 32; too small a margin shows as U > L and costs a round). They start at the
  cheaper of S for every run and margins aligned on the unfrozen schedule's timing (_aligned_margins:
  1F1B 32 x 512 then needs 5.2k LP columns instead of 7.8k). The LPs have O(S^2) columns whatever M is:
  1F1B 32 x 512 and 32 x 16384 solve LPs of the same size, and 64 stages (~30k columns) take GLOP minutes.
  The phases are chained as in Note [three-phase LP] (tfplan.solver): phase 2 bounds T by T1 (1 + 1e-9),
  phase 3 the total freeze by R2 (1 + 1e-9) + 1e-9, with T1 and R2 the certified optima.

Note [LP tolerance]
  The plan is re-simulated, and its makespan should stay within the phase bound T1 (1 + 1e-9). A tied row
  violated by GLOP's tolerance is violated in every copy it stands for, so the violation adds up along a
  run: with presolve on, re-simulated plans ended up to 1.6e-9 above T1 on 1F1B 16 x 256 and 24 x 256;
  without presolve and with primal feasibility 1e-10 (PLAN_PARAMS) they stayed within 1.00002e-9, but that
  solve is about twice as slow on the large tied LPs. So every LP is first solved fast: small ones with
  solver.GLOP_PARAMS (1e-10, as cheap as the default there), large ones with GLOP's default (ten times faster
  on some 8000-column tied LPs). The tied primal of phases 2 and 3 uses the dual simplex. Measured (seconds,
  primal simplex -> dual simplex): phase 2, 2-5x faster on every instance tried (uniform and heterogeneous
  1F1B, interleaved, ZB, ZBV); phase 3 on uniform 1F1B 32 x M, erratic with the primal simplex and steady
  with the dual (M = 512: 0.77 -> 0.90, 1024: 0.82 -> 0.93, 2048: 5.0 -> 1.05, 4096: 0.96 -> 1.05, 16384:
  12.7 -> 1.1), heterogeneous 1F1B 32 x 512 1.6 -> 0.66, but interleaved 1F1B 16 x 256 (heterogeneous)
  6.7 -> 13.4. We take the steady one. The tied dual keeps the primal simplex (the dual simplex was slower
  there on every instance). Precision is bought only where it is missing: a gap U - L that misses GAP_TOL
  by a little (up to SANE_GAP) is first re-tried with the tied primal polished by PLAN_PARAMS (a presolved
  U once came out 1.4e-9 relative above the optimum), and a plan past T1 (or the target) (1 + SIM_TOL) or
  past phase 3's total-freeze row (the dual simplex with presolve once returned a point 2x over R2's
  allowance) is re-solved more precisely (_plan); the first that fits is kept.
  Side by side on 11 instances (1F1B, GPipe, interleaved, ZB, ZBV, DualPipeV; up to 32,768 actions) this
  took 32 s in all against 71 s with the earlier settings (PLAN_PARAMS for every phase-3 primal, primal
  simplex throughout), with the same objectives to 10 digits.
  GLOP may call a tied LP IMPRECISE (dual tolerance missed; weights of thousands of tied actions in the
  objective do that): any primal-feasible point is a valid bound, so we take it and let U - L judge. A
  small tied primal once came out 6e-9 (relative) below the true phase-2 optimum, so each phase carries
  max(U, L) on: a value below the optimum would make the next phase infeasible. (In 10,000 random instances
  the plan retries were needed once; the full LP fixed it.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import linear_solver_pb2, pywraplp
from ortools.linear_solver.python import model_builder_helper as mbh

from tfplan.dag import Dag
from tfplan.errors import TfplanError
from tfplan.fastlp_graph import GraphArrays, Runs, Ties
from tfplan.fastlp_lp import INF, Compressed, Phase, SparseLP, expand_ratios, tied_dual, tied_primal
from tfplan.simulate import simulate
from tfplan.solver import GLOP_PARAMS, REL_TOL, PhaseResult, Solution, UnreachableTarget, check_caps

log = logging.getLogger(__name__)

GAP_TOL = 1e-9  # U - L <= GAP_TOL * max(1, |U|) certifies a phase (Note [periodic compression])
SANE_GAP = 1e-6  # a gap U - L above GAP_TOL up to this (relative) is first re-tried with U polished
NEG_GAP = 1e-7  # U < L by more than this (relative) means a solve went wrong (L <= U by weak duality): grow
PLAN_PARAMS = "use_preprocessing: false primal_feasibility_tolerance: 1e-10"  # Note [LP tolerance]
RETRY_PARAMS = "primal_feasibility_tolerance: 1e-12"
UNTIE_LIMIT = 20_000  # actions: up to here a plan past the bound is re-solved on the full LP
TIGHT_COLUMNS = 4000  # bound LPs up to this size get solver.GLOP_PARAMS (cheap there; Note [LP tolerance])
SIM_TOL = 1.05e-9  # a plan's simulated makespan above T1 (1 + SIM_TOL) is re-solved (Note [LP tolerance])
PHASE_NAMES = ("makespan", "total_freeze", "even_spread")


def solve(dag: Dag, caps: Sequence[float] | float, target_makespan_ms: float | None = None) -> Solution:
    """Solve the three-phase LP of tfplan.solver exactly, compressing repeating micro-batches.

    Args:
        dag: the action graph with d_min/d_max per node.
        caps: the per-stage cap on the mean freeze ratio (one value for all stages, or one per stage).
        target_makespan_ms: instead of the fastest plan, the least-freezing plan whose makespan is at most
            this (phase 2 bounds T by it); must not be below the phase-1 optimum.

    Returns:
        A Solution with the same phase objectives as solver.solve (to the LP tolerance), backend "fastlp".

    Raises:
        TfplanError: bad caps, an unreachable target (solver.UnreachableTarget), or GLOP failing on the
            uncompressed LP.
    """
    return _solve(dag, caps, target_makespan_ms)


def _solve(
    dag: Dag, caps: Sequence[float] | float, target_makespan_ms: float | None, first_margin: int = 2,
    margin: int | None = None,
) -> Solution:
    """solve() with the margin schedule exposed for tests: phase 1 starts at first_margin, phases 2-3 at
    `margin` (default: the cheaper of the stage count and time-aligned margins, _Margins)."""
    start = time.perf_counter()
    num_stages = dag.schedule.num_stages
    cap_arr = np.asarray(check_caps(caps, num_stages), dtype=np.float64)
    g = GraphArrays.from_dag(dag)
    margins = _Margins(dag, g, Runs.detect(g), first_margin, margin)
    build_s = time.perf_counter() - start
    # Note [three-phase LP] (tfplan.solver): each phase bounds the next by the certified optimum.
    first, upper, c = _certified(Phase(number=1, caps=cap_arr), margins)
    best = first.objective
    t_ub = best * (1 + REL_TOL)
    if target_makespan_ms is not None:
        if target_makespan_ms < best * (1 - REL_TOL):
            raise UnreachableTarget(target_makespan_ms, best)
        t_ub = target_makespan_ms
    second, upper, c = _certified(Phase(number=2, caps=cap_arr, t_ub=t_ub), margins)
    phase = Phase(number=3, caps=cap_arr, t_ub=t_ub, r_ub=second.objective * (1 + REL_TOL) + REL_TOL)
    third, upper, c = _certified(phase, margins)
    phases = [first, second, third]
    ratios, durations = _plan(dag, g, c, upper, phase, best, target_makespan_ms)
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
    """The margin schedule and the current compression (Note [periodic compression], Margins).

    A margin is a pair of (num_runs,) arrays: periods left untied at the head and at the tail of each run.
    Phase 1 starts at `first` everywhere. Phases 2-3 start at the cheaper (fewer untied actions) of `later`
    everywhere and the time-aligned margins of _aligned_margins. A gap grows a margin to 2 m + 1; None
    stands for "nothing tied" (the full LP).
    """

    def __init__(self, dag: Dag, g: GraphArrays, runs: Runs, first: int, later: int | None) -> None:
        self.g, self.runs = g, runs
        k = runs.num_runs
        self.candidates = [(np.full(k, max(2, dag.schedule.num_stages) if later is None else later),) * 2]
        if later is None:
            aligned = _aligned_margins(dag, runs)
            if aligned is not None:
                self.candidates.append(aligned)
        self.current: tuple[np.ndarray, np.ndarray] | None = (np.full(k, first), np.full(k, first))
        self._compressed: tuple[object, Compressed] | None = None

    def start(self, phase: int) -> tuple[np.ndarray, np.ndarray] | None:
        if phase > 1 and self.current is not None:
            best = min(self.candidates, key=lambda m: self._untied(m))
            self.current = (np.maximum(self.current[0], best[0]), np.maximum(self.current[1], best[1]))
        return self.current

    def grow(self, margin: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
        grown = (2 * margin[0] + 1, 2 * margin[1] + 1)
        self.current = grown if self.runs.ties(self.g.n, grown).num_tied else None
        return self.current

    def compressed(self, margin: tuple[np.ndarray, np.ndarray] | None) -> Compressed:
        key = None if margin is None else (margin[0].tobytes(), margin[1].tobytes())
        if self._compressed is None or self._compressed[0] != key:
            ties = Ties.none(self.g.n) if margin is None else self.runs.ties(self.g.n, margin)
            self._compressed = (key, Compressed(self.g, ties))
        return self._compressed[1]

    def _untied(self, margin: tuple[np.ndarray, np.ndarray]) -> int:
        return self.g.n - self.runs.ties(self.g.n, margin).num_tied


def _aligned_margins(dag: Dag, runs: Runs, slack: int = 2, limit: int = 2000):
    """Margins from the timing of the unfrozen schedule: a run that enters its steady state before the runs
    running beside it (overlapping in time) are all in theirs keeps the periods in between untied, twice over,
    plus `slack`; the same at its end. This follows the pipeline's fill and drain rank by rank (1F1B: a stage
    late in the pipeline starts its steady state early), where one margin for all runs must fit the worst.
    None when there are no runs or more than `limit` (the overlap test is quadratic)."""
    k = runs.num_runs
    if k == 0 or k > limit:
        return None
    start = np.asarray(simulate(dag).start_ms)
    first, last = runs.nodes[runs.start[:-1]], runs.nodes[runs.start[1:] - 1]
    t0, t1 = start[first], start[last]
    period = start[runs.nodes[runs.start[:-1] + 1]] - t0
    overlap = (t0[:, None] <= t1[None, :]) & (t0[None, :] <= t1[:, None])
    all_in = np.where(overlap, t0[None, :], -np.inf).max(axis=1)  # when every overlapping run is steady
    all_out = np.where(overlap, t1[None, :], np.inf).min(axis=1)
    ok = period > 0
    per = np.where(ok, period, 1.0)
    head = np.where(ok, np.ceil(2 * (all_in - t0) / per), np.inf) + slack
    tail = np.where(ok, np.ceil(2 * (t1 - all_out) / per), np.inf) + slack
    cap = np.diff(runs.start)  # a margin past the run's length unties it all
    return np.minimum(head, cap).astype(np.int64), np.minimum(tail, cap).astype(np.int64)


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


def solve_glop(lp: SparseLP, params: str = "") -> LPResult | None:
    """Solve with GLOP through pywraplp (as tfplan.solver); None unless OPTIMAL.

    The model is filled through model_builder's helper (one call per entry, no scipy) and handed to
    pywraplp as a proto. pywraplp reports simplex iterations and releases the GIL while solving, so a
    tied primal and a tied dual can be solved in two threads. params: GLOP parameters in text format
    (Note [LP tolerance] in tfplan.fastlp).
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
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    response = linear_solver_pb2.MPSolutionResponse()
    solver.FillSolutionResponseProto(response)
    return LPResult(
        objective=solver.Objective().Value(), x=np.asarray(response.variable_value), iterations=solver.iterations(),
        wall_s=time.perf_counter() - start,
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


def _solve_lp(lp: SparseLP, tied: bool, dual_simplex: bool = False, precise: bool = False) -> LPResult | None:
    """GLOP with the settings of Note [LP tolerance]; GLOP's defaults if those fail.

    A tied LP only has to give a bound: a primal-feasible point is enough, so GLOP's IMPRECISE (dual
    tolerance missed, which weights of thousands of tied actions can cause) counts as a result there.
    dual_simplex: for the tied primal of phases 2-3; precise: PLAN_PARAMS, to polish a bound (Note [LP tolerance]).
    """
    params = PLAN_PARAMS if precise else GLOP_PARAMS if len(lp.obj) <= TIGHT_COLUMNS else ""
    if dual_simplex:
        params += " use_dual_simplex: true"
    if tied:
        params += " change_status_to_imprecise: false"
    return solve_glop(lp, params) or solve_glop(lp, " change_status_to_imprecise: false" if tied else "")


def _certified(phase: Phase, margins: _Margins) -> tuple[PhaseResult, LPResult, Compressed]:
    """Solve one phase: tied primal and tied dual in two threads, growing the margin until they meet.

    The phase value carried on is max(U, L): either may be off by GLOP's tolerance, and a value below the
    true optimum would make the next phase infeasible.
    """
    start = time.perf_counter()
    iterations = 0
    margin = margins.start(phase.number)
    with ThreadPoolExecutor(max_workers=2) as pool:
        while True:
            c = margins.compressed(margin)
            exact = c.ties.num_tied == 0  # the tied primal is then the full LP
            upper_job = pool.submit(_solve_lp, tied_primal(c, phase), not exact, phase.number >= 2)
            lower = None if exact else _solve_lp(tied_dual(c, phase), True)
            upper = upper_job.result()
            iterations += (upper.iterations if upper else 0) + (lower.iterations if lower else 0)
            if exact:
                if upper is None:
                    raise TfplanError(f"LP phase {PHASE_NAMES[phase.number - 1]}: GLOP did not reach OPTIMAL")
                value = upper.objective
                break
            gap = upper.objective - lower.objective if upper and lower else INF
            log.debug(
                "phase %d: U=%s L=%s gap=%.3g (%d of %d actions tied, LP columns %d)", phase.number,
                upper and upper.objective, lower and lower.objective, gap, c.ties.num_tied, c.g.n,
                len(c.free_nodes) + len(c.r_nodes) + c.ties.num_runs,
            )
            scale = max(1.0, abs(upper.objective)) if upper else 1.0
            if GAP_TOL * scale < gap <= SANE_GAP * scale:  # maybe only GLOP's tolerance: polish U first
                polished = _solve_lp(tied_primal(c, phase), True, precise=True)
                if polished is not None:
                    iterations += polished.iterations
                    log.debug("phase %d: U polished %s -> %s", phase.number, upper.objective, polished.objective)
                    upper, gap = polished, polished.objective - lower.objective
            if -NEG_GAP * scale <= gap <= GAP_TOL * scale:  # far below 0 would be numerical trouble
                value = max(upper.objective, lower.objective)
                break
            margin = margins.grow(margin)
    result = PhaseResult(
        name=PHASE_NAMES[phase.number - 1], objective=value, status="OPTIMAL", iterations=iterations,
        wall_s=time.perf_counter() - start,
    )
    return result, upper, c


def _plan(dag: Dag, g: GraphArrays, c: Compressed, upper: LPResult, phase: Phase, best: float,
          target: float | None):
    """Ratios and durations of every action from the last phase's tied primal (Note [LP tolerance]).

    The plan must keep the rows phase 3 was solved under: its re-simulated makespan within T1 (1 + SIM_TOL)
    (or the target (1 + SIM_TOL)) and its total freeze within R2's allowance r_ub (+ 1e-10 relative, so that
    it stays within 2e-9 of R2). If it does not, the last phase is solved again with tighter tolerances
    (PLAN_PARAMS, with the primal then the dual simplex, then RETRY_PARAMS) and, on instances up to
    UNTIE_LIMIT actions, untied (the full LP, as tfplan.solver); the first plan that fits is kept, else the
    one that misses least (with a warning).
    """
    t_bound = (best if target is None else max(target, best)) * (1 + SIM_TOL)
    r_bound = phase.r_ub + 1e-10 * max(1.0, phase.r_ub)
    attempts = [(c, None), (c, PLAN_PARAMS), (c, PLAN_PARAMS + " use_dual_simplex: true"), (c, RETRY_PARAMS)]
    if g.n <= UNTIE_LIMIT and c.ties.num_tied:
        attempts.append((Compressed(g, Ties.none(g.n)), PLAN_PARAMS))
    best_plan = None
    for comp, params in attempts:
        result = upper if params is None else solve_glop(tied_primal(comp, phase), params)
        if result is None or abs(result.objective - upper.objective) > 1e-7 * max(1.0, abs(upper.objective)):
            continue
        ratios = expand_ratios(comp, result.x)
        durations = g.d_max - ratios * g.delta
        makespan, total = simulate(dag, durations.tolist()).makespan_ms, float(ratios.sum())
        miss = max(makespan / t_bound - 1, (total - r_bound) / max(1.0, r_bound), 0.0)  # relative, 0 = fits
        if best_plan is None or miss < best_plan[0]:
            best_plan = (miss, ratios, durations)
        if miss == 0.0:
            break
        log.debug("fastlp: plan misses its bounds by %.3g (makespan %.15g of %.15g, total freeze %.15g of %.15g); "
                  "re-solving the last phase", miss, makespan, t_bound, total, r_bound)
    miss, ratios, durations = best_plan
    if miss > 0.0:
        log.warning("fastlp: the plan misses its makespan or total-freeze bound by %.3g (relative)", miss)
    counts = np.bincount(g.stage[g.frz], minlength=len(phase.caps))
    sums = np.bincount(g.stage[g.frz], weights=ratios[g.frz], minlength=len(phase.caps))
    assert np.all(sums <= phase.caps * counts + 1e-6 * np.maximum(1, counts)), "fastlp: a cap is violated"
    return ratios, durations
