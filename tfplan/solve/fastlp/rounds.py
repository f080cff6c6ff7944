"""One phase of fastlp certified (Note [periodic compression] in tfplan.solve.fastlp): rounds of the tied primal
(an upper bound U) and the tied dual (a lower bound L) in two threads, their margins growing until U - L meets the
phase's tolerance.

certified() runs the rounds of one phase and returns an Outcome, which phases.solve chains into the next phase.

Note [warm margins]
  Phase 2's tied primal often needs several margins on heterogeneous profiles (random-0 1F1B 32 x 512 and
  32 x 16384: four, of 5.2k, 8.9k, 16.4k and 30-31k columns), and each used to start GLOP from scratch. The
  last margin's optimum, expanded to every action and tied again at the larger margin (tied.carried_point),
  is feasible there with the same objective; a basis of its values (tied.basis_of_point) starts GLOP's dual
  simplex without presolve (CARRIED_PARAMS, through math_opt as in Note [warm phase 3]; where GLOP fails from
  it, the solve from scratch runs). Measured (1F1B, random-0, cap 0.9; fresh processes): 32 x 512 alternated,
  phase 2 18.9 s from scratch against 11.8 s carried, the solve 29.3 against 22.8 s; 32 x 16384, the runs
  just before and after the change, phase 2 19.1 against 13.2 s, the solve 33.0 against 27.3 s; the same
  optima (phase 2 to 1e-13). Tried before the safe bound was summed exactly (Note [bound rounding] in
  tfplan.solve.fastlp.exact), the different vertex it ends phase 2 on made phase 3's float64 L come out 2.4e-7
  above U, and it was taken out.

Note [unneeded duals]
  A round's tied dual runs in a worker thread beside its tied primal (_lower_side). When the primal finishes
  first and its U already meets the best L of an earlier round (any tied dual's bound holds, Note [periodic
  compression]), the phase is certified there and the dual is stopped (glop.Race): on random-0 1F1B
  32 x 16384 phase 2's third tied dual already met the optimum and only its primal was short, so the fourth
  round's dual (53,664 columns, about 8 s of GLOP) ran 2-4 s past its primal, for nothing. Which side will
  be short cannot be told beforehand (on interleaved 16 x 512 the last dual was needed), so both still start;
  only the wait is cut. The dual margin handed on is then the earlier round's, the smallest that met.

Note [kept compression]
  A phase keeps the smallest U of its rounds, and phase 3 starts from phase 2's basis (Note [warm phase 3]) only
  at the compression of the point phase 2 kept. A later round's U can come out equal to the noise but not
  smaller, and the margins had by then moved on: on seed 25 of benchmarks/solver_scale.py's hard instances
  (spread 3, 1F1B 32 x 16384) phase 2 kept its U of the 38k-column round while its margin stood at 75k columns,
  and phase 3's race from scratch at 96k columns took 152 s. A certified phase therefore hands on the margin of
  the point it keeps (Margins.keep): the next phase starts there, from that point's basis.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

import numpy as np

from tfplan.errors import TfplanError
from tfplan.solve.fastlp.dual import phase2_dual_basis, phase3_dual_basis, tied_dual
from tfplan.solve.fastlp.glop import (
    CARRIED_PARAMS,
    HANDED_DUAL_PARAMS,
    WARM_PARAMS,
    LPResult,
    Race,
    race,
    solve_lp,
    solve_warm,
)
from tfplan.solve.fastlp.lower import dual_bound, lower_bound, relaxed_bound, tighter_bound
from tfplan.solve.fastlp.margins import Margins
from tfplan.solve.fastlp.tied import (
    INF,
    Compressed,
    Phase,
    SparseLP,
    basis_of_point,
    carried_point,
    phase3_basis,
    tied_primal,
)
from tfplan.solve.lp import FEASIBLE, OPTIMAL, PHASE_NAMES, Deadline, PhaseResult, gap_tol

log = logging.getLogger(__name__)

SANE_GAP = (1e-7, 1e-7, 1e-6)  # per phase: a gap U - L above the tolerance up to this (relative) is first re-tried
# with U polished and L tightened (Note [LP tolerance] in tfplan.solve.fastlp.phases)
NEG_GAP = 1e-7  # U < L by more than this (relative) means a solve went wrong (L <= U by weak duality): grow,
# unless the point's own rounding explains it (phase 3: Note [explained negative gaps] in tfplan.solve.fastlp.lower)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One phase solved: its result, and its best tied primal point (the plan if it is the last phase)."""

    result: PhaseResult
    upper: LPResult
    c: Compressed
    phase: Phase
    primal: SparseLP
    """The tied primal `upper` solves (its row blocks place phase 2's basis in phase 3's LP)."""
    dual: tuple[tuple[np.ndarray, np.ndarray], LPResult] | None = None
    """The margin handed on (Margins.dual) and the tied dual solved there, with its basis in phase 2 (Note [warm
    phase 3])."""


@dataclass(frozen=True, slots=True)
class Handover:
    """What the goodput search hands phase 2 of the plan's LP (Note [goodput handover] in
    tfplan.solve.fastlp.goodput): bases at the compression of `margin` (Margins.current)."""

    margin: tuple[np.ndarray, np.ndarray]
    primal: tuple[np.ndarray, np.ndarray] | None
    """A starting basis of phase 2's tied primal (LPResult.basis codes); None: from scratch."""
    dual: LPResult | None
    """Phase 1's tied dual there (the certificate's, with its basis); None: phase 2's tied dual from scratch."""

    def fits(self, margin: tuple[np.ndarray, np.ndarray] | None) -> bool:
        return margin is not None and all(np.array_equal(a, b) for a, b in zip(self.margin, margin))


def _submit_upper(pool: ThreadPoolExecutor, primal: SparseLP, exact: bool, number: int, deadline: Deadline,
                  warm: tuple[np.ndarray, np.ndarray] | None = None, handed: bool = False):
    """Start the tied primal's solve (Note [LP tolerance]): the dual simplex in phase 2 (keeping its basis for
    phase 3), from `warm` when it is given (the last margin's point, Note [warm margins]; or, `handed`, the goodput
    search's basis, by the primal simplex: Note [goodput handover]), the primal simplex in phase 1, and in
    phase 3 the primal simplex from `warm`, phase 2's basis (Note [warm phase 3]; a job that finds it, at a margin
    phase 2 was not solved at: Note [phase 3 through phase 2]), or without it both simplexes in a race (the first
    to finish interrupts the other). Returns the futures."""
    def cold() -> LPResult | None:
        if number == 3:
            return race(primal, exact, deadline)
        return solve_lp(primal, not exact, deadline, number == 2, duals=exact, basis=number == 2)

    if warm is not None:
        def warm_job() -> LPResult | None:
            basis, spent = warm() if callable(warm) else (warm, 0)  # (phase 3 through phase 2: found here)
            result = None
            limit = None if deadline.limit_s is None else deadline.remaining()
            if basis is not None and number == 2:
                result = solve_warm(primal, basis, WARM_PARAMS if handed else CARRIED_PARAMS, limit, final_basis=True)
            elif basis is not None:
                result = solve_warm(primal, basis, WARM_PARAMS, limit)
            if result is not None:
                return replace(result, iterations=result.iterations + spent)
            # A basis GLOP cannot use (or a failed solve): the solve from scratch, as without a basis.
            return None if deadline.expired() else cold()

        return [pool.submit(warm_job)]
    return [pool.submit(cold)]


def certified(phase: Phase, margins: Margins, deadline: Deadline, before: Outcome | None = None,
              handover: Handover | None = None) -> Outcome | None:
    """Solve one phase: tied primal and tied dual in two threads, growing their margins (Note [two margins] in
    tfplan.solve.fastlp.margins) until U - L <= lp.gap_tol(phase) max(1, |U|). `before`: the phase before (phase
    3 starts from its bases); `handover`: phase 2's first round starts from it (Note [goodput handover]).

    The phase value carried on is max(U, L): U may be off by GLOP's tolerance, and a value below the true
    optimum would make the next phase infeasible. Out of time (or untied and still short of the bound), the
    best U found so far comes back FEASIBLE with its gap; None when there is none.
    """
    start = time.perf_counter()
    iterations = 0
    margin = margins.start(phase.number)
    best: tuple[LPResult, Compressed, SparseLP] | None = None
    best_lower = -INF
    certified = False
    # Which side is solved this round, its last value, whether it moved at its last growth, and each round's dual
    # margin with its bound (the smallest that meets the optimum is handed on): Note [two margins].
    solve_p = solve_d = True
    prev_u = prev_l = None
    moved_u = moved_l = True
    lower: LPResult | None = None
    tightened_dual: LPResult | None = None
    polish_tried: LPResult | None = None
    rounds: list[tuple[tuple[np.ndarray, np.ndarray], float, LPResult | None]] = []
    handed = None
    bound = -INF
    carried: tuple[LPResult, Compressed] | None = None  # the last round's tied primal point (Note [warm margins])
    with ThreadPoolExecutor(max_workers=3) as pool:
        while not deadline.expired():
            if solve_p:
                c = margins.compressed(margin)
                exact = c.ties.num_tied == 0  # the tied primal is then the full LP
                primal = tied_primal(c, phase)
                warm = None  # Note [warm phase 3]; untied, the primal certifies itself with row duals, which it lacks
                handed = phase.number == 2 and not exact and handover is not None and carried is None \
                    and handover.primal is not None and handover.fits(margin)
                if handed:
                    warm = handover.primal  # Note [goodput handover]
                elif phase.number == 3 and not exact and before is not None and before.c is c:
                    if before.upper.basis is not None:
                        warm = phase3_basis(c, before.primal, primal, before.upper.x, before.upper.basis)
                elif phase.number == 3 and not exact and before is not None:
                    warm = _through_phase2(c, before, primal, deadline)  # Note [phase 3 through phase 2]
                elif phase.number == 2 and not exact and carried is not None and carried[1] is not c:
                    warm = basis_of_point(primal, carried_point(carried[1], carried[0].x, c))  # [warm margins]
                upper_jobs = _submit_upper(pool, primal, exact, phase.number, deadline, warm, handed)
            c_dual = c if exact else margins.compressed(margins.dual)
            cut = False  # Note [unneeded duals]
            fresh = -INF  # this round's own safe bound
            if exact:
                lower = None
            elif solve_d:
                dual_warm = None  # Note [warm phase 3]: phase 2's tied dual basis, at the same margin
                if phase.number == 3 and before is not None and before.dual is not None and not rounds \
                        and before.dual[1].basis is not None \
                        and all(np.array_equal(a, b) for a, b in zip(before.dual[0], margins.dual)):
                    dual_warm = before.dual[1]
                if phase.number == 2 and handover is not None and handover.dual is not None and not rounds \
                        and handover.dual.basis is not None and handover.fits(margins.dual):
                    dual_warm = handover.dual  # Note [goodput handover]
                stop = Race()
                dual_job = pool.submit(_lower_side, c_dual, phase, margins, deadline, dual_warm,
                                       upper_jobs if solve_p else [], stop, None if before is None else before.phase)
                if solve_p and best_lower > -INF:
                    wait([*upper_jobs, dual_job], return_when=FIRST_COMPLETED)
                    first = _best_upper(upper_jobs) if all(job.done() for job in upper_jobs) else None
                    if not dual_job.done() and first is not None and \
                            _certifies(first.objective - best_lower, max(1.0, abs(first.objective)), phase.number):
                        stop.finish()  # an earlier round's L already meets U
                        cut = True
                lower, fresh, spent = dual_job.result()
                iterations += spent
                bound = max(best_lower, fresh)
            if solve_p:
                upper = _best_upper(upper_jobs)
                iterations += upper.iterations if upper else 0
                carried = None if upper is None else (upper, c)
            if exact:  # the untied primal's own row duals
                bound = max(best_lower, lower_bound(c_dual, phase, primal, upper, lower, margins.chain_windows()))
            gap = upper.objective - bound if upper else INF
            scale = max(1.0, abs(upper.objective)) if upper else 1.0
            tol = gap_tol(phase.number) * scale
            claimed = upper.objective if exact and upper else lower.objective if lower else -INF  # GLOP's own L
            log.debug(
                "phase %d: U=%s L=%s (GLOP's %s) gap=%.3g (%d of %d actions tied, LP columns %d; dual's margin %d "
                "periods in all)", phase.number, upper and upper.objective, bound, claimed, gap, c.ties.num_tied,
                c.g.n, len(c.free_nodes) + len(c.r_nodes) + c.ties.num_runs,
                int(margins.dual[0].sum() + margins.dual[1].sum()),
            )
            tightened = not exact and lower is tightened_dual  # that dual's bound is as tight as it gets
            for polish in (False, True):
                sane = SANE_GAP[phase.number - 1] * scale
                if polish and upper is not polish_tried and tol < gap <= sane:  # GLOP's tolerance?
                    polish_tried = upper  # once per U, also in a round that grew only the dual
                    polished = solve_lp(primal, not exact, deadline, precise=True, duals=exact,
                                        basis=phase.number == 2)
                    if polished is not None:
                        polish_tried = polished
                        iterations += polished.iterations
                        log.debug("phase %d: U polished %s -> %s", phase.number, upper.objective, polished.objective)
                        upper, claimed = polished, polished.objective if exact else claimed
                        gap = upper.objective - bound
                if upper and not tightened and gap > tol and upper.objective - claimed <= sane:
                    tightened, tightened_dual = True, lower  # GLOP's own L is close, the safe one not
                    bound, spent = tighter_bound(c_dual, phase, primal, upper, lower, bound, margins, deadline)
                    iterations += spent
                    gap = upper.objective - bound
            if phase.number == 3 and upper is not None and lower is not None and not exact and fresh >= bound \
                    and gap < -NEG_GAP * scale:  # Note [explained negative gaps]
                point = relaxed_bound(margins, c, c_dual, phase, upper.x, lower)
                if point is not None and point[0] >= point[1] - NEG_GAP * scale:
                    gap = 0.0  # the value is L (max(U, L)), U's point within float64's reach of the bounds
            if upper is not None and (best is None or upper.objective < best[0].objective):
                best = (upper, c, primal, margin)
            best_lower = max(best_lower, bound)
            if not cut:  # (a cut dual's margin has no bound of its own to hand on)
                rounds.append((margins.dual, bound, lower))
            if _certifies(gap, scale, phase.number):
                certified = True
                break
            if exact:
                if upper is None and not deadline.expired():
                    raise TfplanError(f"LP phase {PHASE_NAMES[phase.number - 1]}: GLOP did not reach OPTIMAL on the "
                                      "full LP")
                break
            if solve_p:
                moved_u = upper is None or prev_u is None or abs(upper.objective - prev_u) > tol
                prev_u = None if upper is None else upper.objective
            if solve_d and not margins.caught_up:  # (a catch-up says nothing of growth: Note [catch-up rounds])
                moved_l = bound == -INF or prev_l is None or abs(bound - prev_l) > tol
            if solve_d:
                prev_l = bound
            solve_p, solve_d = margins.advance(moved_u, moved_l)
            margin = margins.current
    if best is None:
        return None
    upper, c, primal, kept = best
    if certified and kept is not margins.current:
        margins.keep(kept, c)  # the next phase starts where this one's point is (Note [kept compression])
    value = upper.objective
    gap = None if best_lower == -INF else max(0.0, value - best_lower)
    if certified:
        value = max(value, best_lower)
        tol = gap_tol(phase.number) * max(1.0, abs(value))
        margins.dual, handed = next(((m, low) for m, b, low in rounds if value - b <= tol), (margins.dual, None))
        handed = None if handed is None else (margins.dual, handed)
    result = PhaseResult(
        name=PHASE_NAMES[phase.number - 1], objective=value, status=OPTIMAL if certified else FEASIBLE,
        iterations=iterations, wall_s=time.perf_counter() - start, gap=gap,
    )
    return Outcome(result, upper, c, phase, primal, handed)


def _through_phase2(c: Compressed, before: Outcome, primal: SparseLP, deadline: Deadline):
    """A job that finds phase 3's starting basis at compression `c`, where phase 2 (`before`) was not solved:
    phase 2's point carried to `c` and solved warm there (Note [warm margins]), then extended as phase3_basis does
    (Note [phase 3 through phase 2]). The job returns (the basis or None, the simplex iterations it took)."""
    def job() -> tuple[tuple[np.ndarray, np.ndarray] | None, int]:
        primal2 = tied_primal(c, before.phase)
        start = basis_of_point(primal2, carried_point(before.c, before.upper.x, c))
        if start is None:
            return None, 0
        limit = None if deadline.limit_s is None else deadline.remaining()
        two = solve_warm(primal2, start, WARM_PARAMS, limit, final_basis=True)  # (the primal simplex: see the Note)
        if two is None or two.basis is None:
            return None, 0
        return phase3_basis(c, primal2, primal, two.x, two.basis), two.iterations

    return job


def _best_upper(jobs: list[Future]) -> LPResult | None:
    """The smallest U the tied primal's finished `jobs` found (None when none found one)."""
    return min((r for r in (job.result() for job in jobs) if r is not None), default=None, key=lambda r: r.objective)


def _certifies(gap: float, scale: float, number: int) -> bool:
    """Whether U - L = gap certifies phase `number`, scale = max(1, |U|): within lp.gap_tol, and not far below 0
    (L <= U by weak duality, so that would be numerical trouble: NEG_GAP)."""
    return -NEG_GAP * scale <= gap <= gap_tol(number) * scale


def _lower_side(c: Compressed, phase: Phase, margins: Margins, deadline: Deadline, warm: LPResult | None,
                upper_jobs: list[Future], stop: Race,
                before: Phase | None = None) -> tuple[LPResult | None, float, int]:
    """A phase's tied dual at `c`, solved and turned into its safe bound (lower.dual_bound), in a worker thread
    beside the tied primal's `upper_jobs`; `stop` ends its solve (Note [unneeded duals]). Phase 3's is raced by
    both simplexes, as its primal (Note [LP tolerance]), after a head start from `warm`, phase 2's tied dual at
    the same margin (Note [warm phase 3]), or without it from `before` (phase 2's Phase) solved here first (Note
    [phase 3 through phase 2]); phase 2's starts from `warm`, the goodput certificate's, where given (Note
    [goodput handover]). Returns the dual (None when stopped), its bound and its iterations."""
    dual_lp = tied_dual(c, phase)
    spent, through = 0, False
    if phase.number == 3 and warm is None and before is not None:  # Note [phase 3 through phase 2]
        through = True
        warm = solve_lp(tied_dual(c, before), True, deadline, basis=True, race=stop)
        spent = 0 if warm is None else warm.iterations
        warm = None if warm is None or warm.basis is None else warm
    if phase.number == 3:
        basis = None if warm is None else phase3_dual_basis(warm.basis, dual_lp)
        head_start = 0.0 if basis is None else max(1.0, warm.wall_s)
        lower = race(dual_lp, False, deadline, basis, head_start, basis=True, within=stop, keep_warm=through)
    else:
        lower = None
        basis = None if warm is None else phase2_dual_basis(warm.basis, dual_lp)
        if basis is not None:
            limit = None if deadline.limit_s is None else deadline.remaining()
            lower = solve_warm(dual_lp, basis, HANDED_DUAL_PARAMS, limit, final_basis=True, race=stop)
        if lower is None and not stop.over:  # (a basis GLOP cannot use: from scratch)
            lower = solve_lp(dual_lp, True, deadline, basis=True, race=stop)
    if stop.over:
        return None, -INF, spent + (0 if lower is None else lower.iterations)
    running = not all(job.done() for job in upper_jobs)
    lower, bound = dual_bound(c, phase, dual_lp, lower, margins, running)
    return lower, bound, spent + (0 if lower is None else lower.iterations)
