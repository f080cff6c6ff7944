"""The lower bound L of one phase of fastlp: a tied dual's safe bound, refined and tightened where it falls short.

Part of tfplan.solve.fastlp. lower_bound turns a tied dual's solution (or an untied primal's row duals) into the safe
bound of tfplan.solve.fastlp.bound; dual_bound is the first try for a freshly solved tied dual (the chains' windows,
then the point refined on its basis, Note [refined duals] in tfplan.solve.fastlp.refine); tighter_bound the last
resort when GLOP's own dual value is close to U but the safe bound is not (the longest-path windows, then a
dual solved again); relaxed_bound judges a phase-3 U that came out below L. Note [LP tolerance] in
tfplan.solve.fastlp.phases says when each is used.

Note [explained negative gaps]
  By weak duality L <= OPT <= U for a feasible U, so rounds.certified reads U below L by more than NEG_GAP (1e-7
  relative) as a solve gone wrong and grows the margins. In phase 3 that can be rounding instead. Its value can
  be far more sensitive to the bound on T than its size suggests: on seed 23 of benchmarks/solver_scale.py's hard
  instances (1F1B 32 x 16384, spread 1) the tied dual prices T at 52,540 deviation units per ms, against a value
  of 407.6 at T = 79,032 ms, so a plan past T by 1e-13 of T moves the value by 1e-6 of itself. Phase 3's first
  tied primal point there was past T by 1.95e-8 ms (2.5e-13; start times near 8e4 ms summed along paths of
  ~1e4-1e5 actions round that much, GLOP's 1e-10 tolerance aside) and past its total-freeze bound by 5e-9
  (1.3e-13), and its U came out 6.4e-5 (1.6e-7 relative) below L: two more rounds and 104 s of phase 3 (the CLI's
  120 s limit stopped it FEASIBLE), and the round that certified had U 5.8e-8 below L, by luck. So in phase 3
  such a gap is first explained (relaxed_bound): the point's plan is simulated; past its bounds (T, the total
  freeze, the caps) by no more than POINT_TOL (1e-12 relative) it is as feasible as float64 makes it, and the
  same dual's safe bound on the LP relaxed to what the plan reaches (weak duality again: a safe bound of that LP)
  falls to 407.5715, below U. A U at or above that relaxed bound less NEG_GAP is what its rounding explains, and
  the phase is certified at max(U, L) = L, the safe bound, as any U within NEG_GAP below L is; otherwise the
  margins grow as before. Seed 23: phase 3 1.8 s, the same value (407.57254347240655) as the 104 s run certified.
  The gap tolerances themselves are unchanged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np

from tfplan.solve.fastlp.bound import Windows, from_primal_duals, from_tied_dual, safe_lower_bound
from tfplan.solve.fastlp.dual import tied_dual
from tfplan.solve.fastlp.glop import DUAL_PARAMS, LPResult, solve_lp
from tfplan.solve.fastlp.margins import Margins
from tfplan.solve.fastlp.refine import refined
from tfplan.solve.fastlp.tied import INF, Compressed, Phase, SparseLP, expand_ratios
from tfplan.solve.lp import Deadline, gap_tol
from tfplan.step.simulate import simulate

log = logging.getLogger(__name__)

POINT_TOL = 1e-12
"""Relative: how far past its bounds (T <= t_ub, the total freeze, the caps) a phase-3 point may reach and still count
as kept to float64's rounding (Note [explained negative gaps]): a start time summed along a path of ~1e4-1e5
actions is off by up to that many roundings of 1.1e-16."""


def lower_bound(c: Compressed, phase: Phase, primal: SparseLP | None, upper: LPResult | None, lower: LPResult | None,
                windows: Windows | None = None) -> float:
    """The safe lower bound L of tfplan.solve.fastlp.bound from the tied dual's solution or, untied, the primal's own
    duals (`primal` and `upper` are read only then); -inf without a solution."""
    if c.ties.num_tied == 0:
        if upper is None or upper.duals is None:
            return -INF
        dual = from_primal_duals(c, phase, primal, upper.duals)
    elif lower is None:
        return -INF
    else:
        dual = from_tied_dual(c, phase, lower.x)
    return safe_lower_bound(c.g, phase, dual, windows)


def dual_bound(c: Compressed, phase: Phase, lp: SparseLP, lower: LPResult | None, margins: Margins,
               primal_running: bool) -> tuple[LPResult | None, float]:
    """The safe bound of a tied dual's solution with the chains' windows (it needs no U, so it is computed while
    the primal may still run). Where it falls short of GLOP's own value by more than the gap tolerance: the
    same from the point recomputed on its basis (Note [refined duals]), the better kept; and if still short
    while the primal runs, the path windows that tighter_bound will want are built now (seconds at a million
    actions, otherwise spent after the primal). Returns the dual kept and its bound."""
    if lower is None:
        return None, -INF
    assert c.ties.num_tied, "an untied primal certifies itself"
    tol = gap_tol(phase.number) * max(1.0, abs(lower.objective))
    bound = lower_bound(c, phase, None, None, lower, margins.chain_windows())
    if lower.objective - bound > tol:
        again = refined(lp, lower)
        if again is not lower:
            fresh = lower_bound(c, phase, None, None, again, margins.chain_windows())
            log.debug("phase %d: safe bound %s, from the refined dual %s", phase.number, bound, fresh)
            lower, bound = (again, fresh) if fresh > bound else (lower, bound)
        if lower.objective - bound > tol and primal_running:
            margins.path_windows()
    return lower, bound


def tighter_bound(c: Compressed, phase: Phase, primal: SparseLP, upper: LPResult, lower: LPResult | None,
                  bound: float, margins: Margins, deadline: Deadline) -> tuple[float, int]:
    """When GLOP's own dual value comes within phases.SANE_GAP of U but the safe bound misses the gap tolerance: the
    same dual vector with the longest-path windows (bound.Windows; the chains' are already in `bound`), then, if
    that is not enough, a dual solved again: in phases 1-2 more precisely, in phase 3 (whose tied dual two simplexes
    race for) by the one that lost the race. Measured on 1F1B 32 x 16384 (random-0 profile) phase 3, where a tied
    row stands for up to 16,000 actions (exact sums, Note [bound rounding]): GLOP's own dual value came 3.3e-8
    (relative) below U, the safe bound from the same dual 1.3e-7 below with the chains' windows and 3.6e-8 with the
    longest paths' (certified at lp.EVEN_GAP_TOL); the other simplex's dual gave 3.4e-8. (The float64 sums of before
    had put the first within 4e-9 of U.) Returns the best safe bound and the simplex iterations spent."""
    target = upper.objective - gap_tol(phase.number) * max(1.0, abs(upper.objective))
    # `bound` already holds this dual's bound with the chains' windows.
    bound = max(bound, lower_bound(c, phase, primal, upper, lower, margins.path_windows()))
    if bound >= target or deadline.expired():
        return bound, 0
    if c.ties.num_tied == 0:
        again = solve_lp(primal, False, deadline, precise=True, duals=True, extra=DUAL_PARAMS)
        fresh = None if again is None else lower_bound(c, phase, primal, again, None, margins.path_windows())
    else:
        # Phase 3's dual came from a race: now the simplex that lost it (the same LP by the same method would
        # give the same point).
        other = None if lower is None or lower.dual_simplex is None else not lower.dual_simplex
        dual_lp = tied_dual(c, phase)
        again = solve_lp(dual_lp, True, deadline, bool(other), precise=other is None, basis=True)
        # The cheap windows first (and the point refined where they fall short, as for any tied dual): the
        # tight ones cost seconds at a million actions.
        again, fresh = dual_bound(c, phase, dual_lp, again, margins, False)
        if again is not None and fresh < target:
            fresh = max(fresh, lower_bound(c, phase, primal, upper, again, margins.path_windows()))
    log.debug("phase %d: safe bound with windows %s, from a dual solved again %s", phase.number, bound, fresh)
    return max(bound, -INF if fresh is None else fresh), 0 if again is None else again.iterations


def relaxed_bound(margins: Margins, c: Compressed, c_dual: Compressed, phase: Phase, x: np.ndarray,
                  lower: LPResult) -> tuple[float, float] | None:
    """The exact value of phase 3's tied primal point x (at compression c) expanded to every action, its deviations
    recomputed from its ratios, and the safe bound of the tied dual `lower` (at c_dual) on the LP whose bounds are
    relaxed to what that plan reaches (its simulated makespan, its total freeze, its stages' means): Note [explained
    negative gaps]. None when the plan is past a bound by more than POINT_TOL (relative)."""
    g = c.g
    r = expand_ratios(c, x)
    frz, stage = g.frz, g.stage[g.frz]
    size = np.maximum(np.bincount(stage, minlength=len(phase.caps)), 1)
    mean = np.bincount(stage, weights=r[frz], minlength=len(phase.caps)) / size
    value = 2.0 * math.fsum(np.maximum(0.0, r[frz] - mean[stage]))  # 2 sum_a e_a (Note [one-sided deviation])
    makespan = simulate(margins.dag, (g.d_max - r * g.delta).tolist()).makespan_ms
    total = math.fsum(r)
    past = (max(0.0, makespan - phase.t_ub), max(0.0, total - phase.r_ub), np.maximum(0.0, mean - phase.caps))
    if past[0] > POINT_TOL * phase.t_ub or past[1] > POINT_TOL * max(1.0, phase.r_ub) or np.any(past[2] > POINT_TOL):
        return None
    relaxed = replace(phase, t_ub=phase.t_ub + past[0], t_max=phase.t_max + past[0], r_ub=phase.r_ub + past[1],
                      caps=phase.caps + past[2])
    bound = lower_bound(c_dual, relaxed, None, None, lower, margins.chain_windows())
    log.debug("phase 3: the point's value %s, past T by %.3g ms and the total by %.3g; the bound there %s", value,
              past[0], past[1], bound)
    return value, bound
