"""The three phases of fastlp (Note [periodic compression] in tfplan.solve.fastlp), chained, and the plan.

solve() runs the phases in order, each certified by rounds.certified (U - L within the phase's tolerance);
_plan() expands the last phase's point to every action and re-simulates it.


Note [warm phase 3]
  Phase 3 adds to phase 2's tied primal only the deviation columns and rows and the total-freeze row, and
  phase 2's optimum is feasible for it. Solved from scratch it took 3-10x phase 2's time: 14,815 simplex
  iterations on uniform 1F1B 32 x 512 (4.4 s on a loaded 2-core machine) against 7,313 for phase 2, and both
  simplexes were raced against each other with the tied dual beside them, three threads on two cores. Started
  from phase 2's optimal basis, extended by one basic variable per new row (tied.phase3_basis), the primal
  simplex needs 1,291 iterations (0.8 s there). GLOP takes a starting basis only without presolve, and
  pywraplp cannot hand one over, so this one solve goes through math_opt (glop.solve_warm), with PLAN_PARAMS
  (the point is the plan's); where phase 3 starts at another margin than phase 2 ended on, or GLOP fails
  from that basis, the race runs as before. Phase 2's tied primal is solved with the dual simplex from
  scratch and returns its basis (a few ms).
  Phase 3's tied dual, at the margin phase 2 hands on, is phase 2's tied dual there with columns (rho, sigma,
  p) and rows (mu, e) appended (tfplan.solve.fastlp.dual); from phase 2's optimal basis with those columns nonbasic
  and those rows basic (dual.phase3_dual_basis), the primal simplex gained nothing (uniform 32 x 512: 2.1 s
  warm without presolve against 1.8 s cold with it), but the dual simplex needs a few percent of the cold
  iterations (DUAL_WARM_PARAMS; one solve each, 05:45 UTC): random-0 1F1B 32 x 512, 0.39 s and 1,164
  iterations against 10.3-10.8 s and 33,439-48,416 cold; random-3 interleaved 1F1B 16 x 512 (58,145
  columns), 1.4 s and 2,327 iterations against 30.9 s for the cold race. Not always: on uniform 1F1B
  64 x 8192 it took 28-30 s (34,363 iterations) where the dual simplex from scratch with presolve took 19 s
  beside it, and racing all three slowed the winner by the third thread (uniform 32 x 512: phase 3 0.7 s
  with the warm dual alone, 1.7-2.0 s in a race of three). So the warm dual runs first and alone, for what
  phase 2's tied dual took at that margin (at least 1 s); if it has not finished by then, it is interrupted
  (math_opt's interrupter, glop.Race) and the race of two runs as before: at worst phase 3 costs that head
  start more (64 x 8192: phase 3 15.1 s, the warm dual stopped at 1.7 s, with half phase 2's time as the head
  start; that half stopped it at 1.0-1.3 s on seeds 27 and 28 of benchmarks/solver_scale.py's hard instances,
  under load, where it needed 1.2-2.3 s, and the cold race then took 5-7 s). On random-0 32 x 16384 the dual
  it ends on gives a safe bound 6e-7 below U (the cold race's: 1.3e-7; a primal feasibility
  tolerance of 1e-10 for it did not change that), which took lower.tighter_bound (the path windows, then the
  primal simplex from scratch: 6 s); recomputed from its basis (Note [refined duals] in
  tfplan.solve.fastlp.refine) the same dual's bound is 8.6e-8 below U, and phase 3 took 4.1 s in all.

Note [phase 3 through phase 2]
  Where phase 3 needs a margin phase 2 was not solved at (its own growths), its LPs had no basis to start from,
  and from scratch they took minutes at a million actions: on seeds 27 and 28 of benchmarks/solver_scale.py's
  hard instances (p2p 1 ms, near-equal stages; 1F1B 32 x 16384) phase 3's second round, 13-15k primal and
  28-31k dual columns, took 48-76 s for the primal's race and 38-71 s for the dual's (four GLOP threads on two
  cores). Phase 2's LPs there are far cheaper, so phase 3 goes through them (rounds._through_phase2,
  rounds._lower_side). The primal: phase 2's kept point carried to the new compression (tied.carried_point,
  Note [warm margins]) is optimal there to phase 2's tolerance (a larger margin only frees, and phase 2's
  certificate bounds it below), so the primal simplex from its basis (tied.basis_of_point, WARM_PARAMS) has
  only to reach a vertex: 9.5-12.8 s on seeds 28 and 27 where the dual simplex from it (CARRIED_PARAMS, for a
  point that is not optimal yet in phase 2's own rounds) took 20-29 s and from scratch 16 s; phase 3 then
  starts from that basis (tied.phase3_basis) as in its first round, 7.8-13.4 s. (Phase 3's own point carried
  the same way took 48 s by the primal simplex, 26 s by the dual.) The dual: phase 2's tied dual solved there
  from scratch (5.9-8.3 s), then phase 3's from its basis as in the first round (dual.phase3_dual_basis), except
  that after its head start it is not stopped but raced against the primal simplex from scratch (glop.race's
  keep_warm): 6.6-13.1 s where the race from scratch had taken 36-71 s. fastlp.solve, one run each under load
  (2026-12-06, with the other changes of that day): seed 28 96 -> 31 s, seed 27 100 -> 45 s, the same optima
  to phase 3's tolerance.

Note [LP tolerance]
  The plan is re-simulated, and its makespan should stay within the phase bound T1 (1 + 1e-9). A tied row
  violated by GLOP's tolerance is violated in every copy it stands for, so the violation adds up along a
  run: with presolve on, re-simulated plans ended up to 1.6e-9 above T1 on 1F1B 16 x 256 and 24 x 256;
  without presolve and with primal feasibility 1e-10 (PLAN_PARAMS) they stayed within 1.00002e-9, but that
  solve is about twice as slow on the large tied LPs. So every LP is first solved fast: small ones with
  lp.GLOP_PARAMS (1e-10, as cheap as the default there), large ones with GLOP's default (ten times faster
  on some 8000-column tied LPs). The tied primal of phase 2 uses the dual simplex: 2-5x faster than the
  primal simplex on every instance tried (uniform and heterogeneous 1F1B, interleaved, ZB, ZBV). Phase 3
  (the deviation objective of Note [three-phase LP]) has no steady winner: its tied primal took (seconds,
  primal simplex / dual simplex) 2.2 / 9.9 on uniform 1F1B 32 x 512, 2.3 / 0.9 heterogeneous, 2.2 / 1.0 on
  ZBV 16 x 256 and 93 / 22 on heterogeneous interleaved 1F1B 16 x 256 (a shared 2-core machine), so both
  run in a race (glop.Race) and the first to finish interrupts the other. So does its tied dual: the dual
  simplex took 1.2 against 2.7 s on uniform 1F1B 32 x 512 and 1.3 against 6.2 s on 32 x 16384, but 12.6
  against 8.4 s on the random-0 profile's 32 x 16384, where only the primal simplex's dual also gave a safe
  bound within the gap tolerance (the whole solve: 46 s before the race, 31 s with it); the tied duals of
  phases 1-2 keep the primal simplex (the dual simplex was slower there on every instance). Precision is
  bought only where it is missing: every safe bound L uses the cheap start-time windows of each rank's
  chain; a tied dual whose bound falls short of its own value by more than the gap tolerance (lp.gap_tol)
  is recomputed from its basis (lower.dual_bound, Note [refined duals]: tens of ms), and the path windows are
  built while the primal still runs if it is still short; one that misses the gap tolerance while GLOP's
  own dual value comes within SANE_GAP of U is recomputed with the longest-path windows, then from a dual
  solved again, more precisely or by the other simplex (lower.tighter_bound, bound: at a million actions GLOP's
  own dual value is no better than 3e-8);
  a gap U - L that misses it by a little (up to SANE_GAP: 1e-7 relative in phases 1-2, 1e-6 in phase 3) is
  re-tried with the tied primal polished by PLAN_PARAMS (a presolved U once came out 1.4e-9 relative above the
  optimum) and L tightened as above (SANE_GAP was 1e-6 for all three phases until 2026-12-06; the traces of
  GLOP's tolerances measured are 1.4e-9 on U, as said, and 3e-8 on its own dual value in phase 3 at a million
  actions, and on seed 15 of benchmarks/solver_scale.py's hard instances phase 2's gap of 1.7e-7 at its first
  margin was the margin's: polishing and tightening took 3.6 s, the next margin certified); and a plan past T1
  (or the target) (1 + SIM_TOL) or past phase 3's total-freeze row (the dual simplex with presolve once returned
  a point 2x over R2's allowance) is re-solved more precisely (_plan); the first that fits is kept.
  (Before issue 9's phase 3: on 11 instances (1F1B, GPipe, interleaved, ZB, ZBV, DualPipeV; up to 32,768
  actions) these settings took 32 s in all against 71 s with PLAN_PARAMS for every phase-3 primal and the
  primal simplex throughout, with the same objectives to 10 digits.)
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

import numpy as np

from tfplan.solve.fastlp import rounds
from tfplan.solve.fastlp.glop import PLAN_PARAMS, RETRY_PARAMS, solve_glop
from tfplan.solve.fastlp.graph import FIRST_MARGIN, GraphArrays, Runs, Ties
from tfplan.solve.fastlp.margins import Margins
from tfplan.solve.fastlp.tied import Compressed, Phase, expand_ratios, tied_primal
from tfplan.solve.heap import release_freed_memory
from tfplan.solve.lp import (
    OPTIMAL,
    PHASE_NAMES,
    Deadline,
    PhaseResult,
    Solution,
    TimeLimitReached,
    check_caps,
    check_time_limit,
    keep_caps,
    makespan_bound,
    total_bound,
)
from tfplan.step.dag import Dag
from tfplan.step.simulate import simulate

log = logging.getLogger(__name__)

UNTIE_LIMIT = 20_000  # actions: up to here a plan past the bound is re-solved on the full LP
SIM_TOL = 1.05e-9  # a plan's simulated makespan above T1 (1 + SIM_TOL) is re-solved (Note [LP tolerance])


def solve(dag: Dag, caps: Sequence[float] | float, target_makespan_ms: float | None = None,
          time_limit_s: float | None = None, *, first_margin: int = FIRST_MARGIN, margin: int | None = None,
          makespan: PhaseResult | None = None, handover: rounds.Handover | None = None) -> Solution:
    """Solve the three-phase LP of tfplan.solve.lp exactly, compressing repeating micro-batches.

    Args:
        dag: the action graph with d_min/d_max per node.
        caps: the per-stage cap on the mean freeze ratio (one value for all stages, or one per stage).
        target_makespan_ms: instead of the fastest plan, the least-freezing plan whose makespan is at most
            this (phase 2 bounds T by it); must not be below the phase-1 optimum (lp.makespan_bound).
        time_limit_s: seconds for the whole solve, None for none; when reached, the best plan so far comes
            back FEASIBLE with its gap (Note [periodic compression], Time limit).
        first_margin, margin: the margin schedule (Note [periodic compression], Margins): phase 1 starts at
            first_margin periods, phases 2-3 at `margin` (None: the cheaper of the stage count and the
            time-aligned margins). Tests set them to force the margin to grow.
        makespan: phase 1's certified optimum at these caps, found by the caller (the goodput search, Note
            [goodput certificate] in tfplan.solve.fastlp.goodput): phase 1 is not solved again.
        handover: with `makespan`, the bases phase 2 starts from (the goodput search's, Note [goodput handover]).

    Returns:
        A Solution with the same phase objectives as solver.solve (to the LP tolerance), backend "fastlp";
        its status is OPTIMAL unless the time limit stopped it.

    Raises:
        TfplanError: bad caps, an unreachable target (lp.UnreachableTarget), the time limit reached before any
            feasible plan (lp.TimeLimitReached), or GLOP failing on the uncompressed LP.
    """
    check_time_limit(time_limit_s)
    deadline = Deadline(limit_s=time_limit_s)
    start = deadline.start
    num_stages = dag.schedule.num_stages
    cap_arr = np.asarray(check_caps(caps, num_stages), dtype=np.float64)
    g = GraphArrays.from_dag(dag)
    sim_start = time.perf_counter()
    unfrozen = simulate(dag)
    if time_limit_s is not None:
        # Keep back what turning the last point into a plan costs (expanding it, one simulation, the caps:
        # about two simulations' time), so that the solve as a whole keeps its limit.
        reserve = min(0.5 * time_limit_s, 2.0 * (time.perf_counter() - sim_start))
        deadline = Deadline(limit_s=time_limit_s - reserve, start=start)
    margins = Margins(dag, g, Runs.detect(g), first_margin, margin, unfrozen.start_ms)
    build_s = time.perf_counter() - start
    # Each phase bounds the next by the certified optimum (Note [three-phase LP] in tfplan.solve.lp).
    phase = Phase(number=1, caps=cap_arr, t_max=unfrozen.makespan_ms)
    known: tuple[PhaseResult, ...] = ()
    if makespan is not None:
        assert makespan.status == OPTIMAL and makespan.name == PHASE_NAMES[0], "only a certified phase 1 is reused"
        known = (makespan,)
        t_ub = makespan_bound(makespan.objective, target_makespan_ms)
        phase = Phase(number=2, caps=cap_arr, t_ub=t_ub, t_max=t_ub)
    outcomes: list[rounds.Outcome] = []
    while True:
        handed = handover if makespan is not None and phase.number == 2 else None
        outcome = rounds.certified(phase, margins, deadline, outcomes[-1] if outcomes else None, handed)
        if outcome is None:
            break
        outcomes.append(outcome)
        if outcome.result.status != OPTIMAL or phase.number == 3:
            break
        if phase.number == 1:
            t_ub = makespan_bound(outcome.result.objective, target_makespan_ms)
            phase = Phase(number=2, caps=cap_arr, t_ub=t_ub, t_max=t_ub)
        else:
            phase = Phase(number=3, caps=cap_arr, t_ub=phase.t_ub, r_ub=total_bound(outcome.result.objective),
                          t_max=phase.t_ub)
    if not outcomes:
        raise TimeLimitReached(f"--time-limit: no feasible plan within {time_limit_s:g} s (fastlp); raise the limit")
    phases = known + tuple(o.result for o in outcomes)
    last = outcomes[-1]
    best = phases[0].objective
    if len(phases) < 3 or last.result.status != OPTIMAL:
        gaps = ", ".join(f"{p.name} {p.status}" + ("" if p.gap is None else f" (gap {p.gap:.3g})") for p in phases)
        why = f"the time limit of {time_limit_s:g} s stopped the solve" if deadline.expired() else (
            "the full LP's duals miss the gap tolerance")
        log.warning("fastlp: %s; the plan is feasible but not certified optimal: %s", why, gaps)
    target = target_makespan_ms if last.phase.number > 1 else None
    ratios = _plan(dag, g, last, best, target, deadline, cap_arr.tolist())
    del g, margins, outcomes, last  # the compressions and LPs: hundreds of MB at a million actions
    release_freed_memory()
    return Solution(
        ratios=ratios,
        durations=dag.durations(ratios),
        makespan_ms=best,
        phases=phases,
        backend="fastlp",
        build_s=build_s,
        wall_s=time.perf_counter() - start,
        time_limit_s=time_limit_s,
    )


def _plan(dag: Dag, g: GraphArrays, last: rounds.Outcome, best: float, target: float | None, deadline: Deadline,
          caps: list[float]) -> list[float]:
    """The ratio of every action from the last phase's tied primal (Note [LP tolerance]), each stage's mean within
    its cap (lp.keep_caps, before the plan is simulated: the simulation is the plan's, which tfplan.plan.plan's
    predictions then find in the Dag's memo).

    The plan must keep the rows its phase was solved under: its re-simulated makespan within T1 (1 + SIM_TOL)
    (or the target (1 + SIM_TOL)) and, in phase 3, its total freeze within R2's allowance r_ub (+ 1e-10
    relative, so that it stays within 2e-9 of R2). If it does not, the phase is solved again with tighter
    tolerances (PLAN_PARAMS, with the primal then the dual simplex, then RETRY_PARAMS) and, on instances up to
    UNTIE_LIMIT actions, untied (the full LP, as tfplan.solve.solver), while time is left; the first plan that fits
    is kept, else the one that misses least (with a warning).
    """
    c, upper, phase = last.c, last.upper, last.phase
    t_bound = (best if target is None else max(target, best)) * (1 + SIM_TOL)
    r_bound = phase.r_ub + 1e-10 * max(1.0, phase.r_ub)
    attempts = [(c, None), (c, PLAN_PARAMS), (c, PLAN_PARAMS + " use_dual_simplex: true"), (c, RETRY_PARAMS)]
    if g.n <= UNTIE_LIMIT and c.ties.num_tied:
        attempts.append((Compressed(g, Ties.none(g.n)), PLAN_PARAMS))
    best_plan = None
    for comp, params in attempts:
        if params is not None and deadline.expired():
            break
        limit = None if deadline.limit_s is None else deadline.remaining()
        result = upper if params is None else solve_glop(tied_primal(comp, phase), params, limit)
        if result is None or abs(result.objective - upper.objective) > 1e-7 * max(1.0, abs(upper.objective)):
            continue
        kept = keep_caps(dag, expand_ratios(comp, result.x).tolist(), caps, "fastlp")
        ratios = np.asarray(kept)
        durations = g.d_max - ratios * g.delta  # as dag.durations computes them, to the bit
        makespan, total = simulate(dag, durations.tolist()).makespan_ms, float(ratios.sum())
        miss = max(makespan / t_bound - 1, (total - r_bound) / max(1.0, r_bound), 0.0)  # relative, 0 = fits
        if best_plan is None or miss < best_plan[0]:
            best_plan = (miss, kept)
        if miss == 0.0:
            break
        log.debug("fastlp: plan misses its bounds by %.3g (makespan %.15g of %.15g, total freeze %.15g of %.15g); "
                  "re-solving the last phase", miss, makespan, t_bound, total, r_bound)
    miss, kept = best_plan
    if miss > 0.0:
        log.warning("fastlp: the plan misses its makespan or total-freeze bound by %.3g (relative)", miss)
    return kept
