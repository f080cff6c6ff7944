"""The lower bound L of one phase of fastlp: a tied dual's safe bound, refined and tightened where it falls short.

Part of tfplan.solve.fastlp. lower_bound turns a tied dual's solution (or an untied primal's row duals) into the safe
bound of tfplan.solve.fastlp.bound; dual_bound is the first try for a freshly solved tied dual (the chains' windows,
then the point refined on its basis, Note [refined duals] in tfplan.solve.fastlp.refine); tighter_bound the last
resort when GLOP's own dual value is close to U but the safe bound is not (the longest-path windows, then a
dual solved again). Note [LP tolerance] in tfplan.solve.fastlp.phases says when each is used.
"""

from __future__ import annotations

import logging

from tfplan.solve.fastlp.bound import Windows, from_primal_duals, from_tied_dual, safe_lower_bound
from tfplan.solve.fastlp.dual import tied_dual
from tfplan.solve.fastlp.glop import DUAL_PARAMS, LPResult, solve_lp
from tfplan.solve.fastlp.margins import Margins
from tfplan.solve.fastlp.refine import refined
from tfplan.solve.fastlp.tied import INF, Compressed, Phase, SparseLP
from tfplan.solve.lp import Deadline, gap_tol

log = logging.getLogger(__name__)


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
