"""The goodput objective (`tfplan solve --objective goodput`) on fastlp's compressed LP: the stage means that
maximise predicted progress per second (tfplan.cost.goodput Note [goodput model]), as a sequence of LPs on GLOP.

Note [goodput LP]
  The problem is
      max  P(m) / (T + o)     P(m) = sum_s w_s e_s(m_s),  e_s(m) = (1 - m) B / ((1 - m) B + N_s)
  (or another learning model's concave term: tfplan.cost.goodput Note [learning models])
  over the makespan LP's variables (start times t, ratios r, finish T; tfplan.solve.lp) with m_s the mean ratio of
  stage s (|A_s| m_s = sum_{a in A_s} r_a), 0 <= m_s <= cap_s, and o the profile's step overhead. A ratio of a
  concave function to a positive linear one over a polyhedron: we solve it by Dinkelbach's method, each
  subproblem max P(m) - lam (T + o) by Kelley's cutting planes on the concave e_s:
    * lam starts at a feasible point's goodput (no freezing, or the last compression's optimum);
    * the subproblem's LP maximises sum_s w_s phi_s - lam (T + o) with phi_s below tangents of e_s; its value
      U is at least the subproblem's optimum, and the true value F = P(m) - lam (T + o) at its point at most;
      a tangent at each stage's m_s is added until U - F <= tol;
    * then U bounds the goodput gap: no plan of that LP exceeds lam + U / (T_min + o); once U <= tol (T_min +
      o) lam is optimal to that tolerance, otherwise lam = P(m) / (T + o), which only grows. GLOP satisfies
      rows to about 1e-9, so U cannot always fall below tol: when lam stops growing by more than tol, the
      search stops with the bound it has.
  Each LP is the makespan LP with 2 S more columns (m, phi) and a few rows per stage, re-solved by GLOP from
  its last basis after its objective or cuts change. The Charnes-Cooper transform would give one LP, but with
  a piecewise-linear numerator fixed in advance: exact only at its breakpoints. Dinkelbach with cuts places
  the breakpoints where the optimum is.
  The LP is fastlp's tied primal of phase 1 (Note [periodic compression] in tfplan.solve.fastlp): the actions of
  each repeating run tied beyond a margin, O(S^2) columns whatever M is. Tying restricts the LP, so its
  optimum m_t is a feasible plan whose goodput G_t is at most the true optimum; Note [goodput certificate]
  bounds the true optimum from above, and when the two miss each other the margin grows, up to the full LP
  (nothing tied), whose own U certifies it.
  The plan itself is then the three-phase LP (tfplan.solve.lp) at caps m*: the fastest plan within those means,
  and among the fastest the least freezing (whose progress is at least P(m*)), made by the usual backends.

Note [goodput certificate]
  The caps enter the makespan LP only in its right-hand side, so the makespan T*(m) at caps m is convex in
  m, and any dual vector y of the LP with cap prices lambda (per unit of a stage's summed ratios) bounds it
  everywhere: T*(m) >= L(m) = L0 - sum_s lambda_s |A_s| (m_s - m_t,s), with L0 the safe lower bound of
  tfplan.solve.fastlp.bound for y at m_t (its corrections do not depend on the caps). Hence for every m in the box
  [0, cap], P(m) / (T*(m) + o) <= P(m) / (L(m) + o), and the right side's maximum G_ub is separable: each
  Dinkelbach step maximises w_s e_s(m_s) + G lambda_s |A_s| m_s per stage in closed form.
  The prices: at the optimum, P - lam T* is stationary in m, and the tied LP's mean rows carry those
  prices (their duals sigma_s = lam lambda_s). y: the tied dual of phase 1 (tfplan.solve.fastlp.dual) with its
  cap prices fixed at lambda, so that L0 reaches T*(m_t) when the ties hold. G_ub <= G_t (1 + CERT_TOL)
  certifies m_t; the plan records G_ub as its bound.

Note [goodput handover]
  The plan's LP at the optimum's means (Note [goodput LP]) begins where the search ends: phase 1 there is the
  certificate's (its tied dual certifies the makespan of the search's point at those caps), and phases 2-3
  start at the compression the search used (both take Margins.start(2)). So the search hands over, besides
  phase 1 (fastlp.solve's `makespan`), two bases at its compression from which phase 2's first round starts
  instead of from scratch (`handover`, rounds.Handover):
    * the tied primal's: the last LP's basis cut down to tied_primal's columns and rows (GoodputLP.phase2_basis),
      a vertex of the makespan LP at those means, so primal feasible for phase 2 (T = T1, every stage at its
      cap): the primal simplex moves it to the least freezing in a few dozen pivots;
    * the tied dual's: the certificate's (phase 1 at those caps, prices fixed), with phase 2's theta column
      nonbasic and the prices free again (dual.phase2_dual_basis), solved by the primal simplex.
  Phase 3 then starts from phase 2's bases (Note [warm phase 3] in tfplan.solve.fastlp.phases), which are
  now nearer phase 3's: its warm tied dual finishes within its head start. A basis only starts GLOP: where
  it fails, or the plan's margins differ from the search's, the round solves from scratch as before, and
  the bounds U and L certify phase 2 as in any round. Measured (uniform 1F1B 32 x 512, noise 20,000 tokens,
  one run each on a shared machine): phase 2's tied primal 61 pivots (0.09 s) against 10,076 (1.7 s) from
  scratch, its tied dual 0.34 s against 0.77 s, phase 3's warm tied dual 2,632 pivots against 6,249.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tfplan.cost.goodput import NoiseModel, progress, stage_value
from tfplan.errors import TfplanError
from tfplan.solve.fastlp.bound import from_tied_dual, safe_lower_bound
from tfplan.solve.fastlp.dual import dual_layout, tied_dual
from tfplan.solve.fastlp.glop import solve_lp
from tfplan.solve.fastlp.goodput_lp import GoodputLP
from tfplan.solve.fastlp.graph import GraphArrays, Runs
from tfplan.solve.fastlp.margins import Margins
from tfplan.solve.fastlp.rounds import Handover
from tfplan.solve.fastlp.tied import Compressed, Phase
from tfplan.solve.lp import GAP_TOL, OPTIMAL, PHASE_NAMES, Deadline, PhaseResult, TimeLimitReached
from tfplan.step.dag import Dag
from tfplan.step.simulate import simulate

log = logging.getLogger(__name__)

TOL = 1e-8
"""Relative tolerance of the Dinkelbach search (Note [goodput LP]); GLOP's own tolerances leave the tangents
satisfied to about 1e-9, below which no cut moves the optimum."""
CERT_TOL = 1e-7
"""A tied optimum whose goodput is within this (relative) of the certificate's bound is accepted (Note
[goodput certificate]): the bound is a dual value, off by GLOP's tolerances on the prices."""
TANGENTS = 16
"""The search starts with tangents at 17 evenly spaced means per stage: fewer cuts, and a cheaper first
solve, than 3 (compressed 1F1B 32 x 512: 2.4 s against 4.0 s; 32 or 64 no faster, docs/cost-model.md)."""
MAX_ROUNDS = 1000
"""LP solves allowed in all (cuts and Dinkelbach steps); far more than measured (docs/cost-model.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GoodputSolution:
    """The goodput optimum's stage means and how it was found."""

    means: list[float]
    """m*: the mean freeze ratio per stage."""
    goodput: float
    """P(m*) / (T + o) at the optimum found, progress per ms (absolute; tfplan.cost.goodput reports it relative)."""
    unfrozen_goodput: float
    """P(0) / (T0 + o), the same for no freezing."""
    bound: float
    """No plan's goodput exceeds this (Notes [goodput LP], [goodput certificate])."""
    lp_solves: int
    dinkelbach_steps: int
    wall_s: float
    certified: bool = True
    """False when the time limit stopped the search: `means` is the best plan found, `bound` is infinite."""
    lp_columns: int = 0
    """Columns of the last LP searched (the compressed LP's size)."""
    compressions: int = 0
    """Compressed LPs searched: 1 unless the certificate asked for a longer margin."""
    makespan: PhaseResult | None = None
    """Phase 1 of the plan's LP at caps `means`, certified by the tied path (Note [goodput certificate]), so
    that the plan need not solve it again (fastlp.solve's `makespan`); None otherwise."""
    handover: Handover | None = None
    """Bases at the search's compression to start phase 2 of the plan's LP from (Note [goodput handover];
    fastlp.solve's `handover`), with `makespan`; None otherwise."""

    @property
    def pays(self) -> bool:
        """Whether freezing raises goodput (beyond the tolerance)."""
        return self.goodput > self.unfrozen_goodput * (1 + 1e-9)


class _Progress:
    """P relative to no freezing, the LP's objective scale: each stage's term of the learning model
    (tfplan.cost.goodput Note [learning models]) relative to its unfrozen value, weighted by its share of the
    unfrozen progress, so that the unfrozen plan has progress 1 and GLOP sees numbers near 1 whatever the noise
    (its tolerances are absolute)."""

    def __init__(self, noise: NoiseModel, batch_tokens: float, num_stages: int) -> None:
        self.noise, self.batch = noise, batch_tokens
        self.terms = noise.terms()
        self.e0 = [stage_value(t, 0.0, batch_tokens)[0] for t in self.terms]
        self.p0 = progress([0.0] * num_stages, batch_tokens, noise)
        self.w = [t[0] * e / self.p0 for t, e in zip(self.terms, self.e0)]

    def rel(self, s: int, m: float) -> tuple[float, float]:
        """(e_s(m) / e_s(0), its slope), e_s the stage's term."""
        e, slope = stage_value(self.terms[s], m, self.batch)
        return e / self.e0[s], slope / self.e0[s]

    def __call__(self, means: Sequence[float]) -> float:
        return progress(means, self.batch, self.noise) / self.p0

    def best_mean(self, s: int, price: float, cap: float) -> float:
        """argmax over m in [0, cap] of w_s e_s(m) / e_s(0) + price m (Note [goodput certificate]), where the
        slope w_s e_s'(m) / e_s(0) = -price: for McCandlish's term, ((1 - m) B + N)^2 = w_s B N / (e_s(0) price);
        for others, by bisection on the slope (the term is concave: its slope falls with m)."""
        _, n, power = self.terms[s]
        b, w = self.batch, self.w[s]
        if price <= 0.0:
            return 0.0  # efficiency never rises with m
        if n <= 0 or w <= 0:
            return cap  # efficiency flat (or weightless): the price alone
        if power == 1.0:
            kept = (math.sqrt(w * b * n / (self.e0[s] * price)) - n) / b  # 1 - m
            return min(cap, max(0.0, 1.0 - kept))
        def gain(m: float) -> float:  # d/dm of the maximised function
            return w * self.rel(s, m)[1] + price

        if gain(0.0) <= 0.0:
            return 0.0
        if gain(cap) >= 0.0:
            return cap
        low, high = 0.0, cap
        for _ in range(60):  # (to 1e-18 of the cap: as exact as the closed form)
            mid = 0.5 * (low + high)
            low, high = (mid, high) if gain(mid) > 0.0 else (low, mid)
        return 0.5 * (low + high)


def solve_goodput(dag: Dag, caps: Sequence[float], noise: NoiseModel, batch_tokens: float,
                  time_limit_s: float | None = None, *, margin: int | None = None) -> GoodputSolution:
    """Notes [goodput LP] and [goodput certificate] on GLOP. `noise` is per stage of the DAG; `caps` one per
    stage. When the time limit stops it, the best stage means found so far come back, not certified (a
    warning). `margin`: the first margin (Note [periodic compression], Margins; None: that of phases 2-3),
    for tests that force it to grow or untie everything.

    Raises:
        TfplanError: a GLOP status other than OPTIMAL.
    """
    start = time.perf_counter()
    deadline = Deadline(limit_s=time_limit_s)
    cap_arr = np.asarray(caps, dtype=np.float64)
    prog = _Progress(noise, batch_tokens, len(caps))
    unfrozen = simulate(dag)
    g = GraphArrays.from_dag(dag)
    # Phase 1's own first margin plays no part: start(2) takes the larger of it and the margins of phases 2-3.
    margins = Margins(dag, g, Runs.detect(g), 0, margin, unfrozen.start_ms)
    best = {"lam": 1.0 / unfrozen.batch_time_ms, "means": [0.0] * len(caps), "goodput": 1.0 / unfrozen.batch_time_ms,
            "upper": math.inf, "t_min": simulate(dag, dag.d_min).batch_time_ms, "solves": 0, "steps": 0,
            "finish": unfrozen.makespan_ms}
    margin = margins.start(2)  # uneven caps: the longer margins of phases 2-3 (docs/cost-model.md)
    bound, columns, compressions = math.inf, 0, 0
    try:
        while True:
            c = margins.compressed(margin)
            best.pop("makespan", None)  # certified for an earlier compression's means
            best.pop("dual", None)
            model = GoodputLP(c, Phase(number=1, caps=cap_arr, t_max=unfrozen.makespan_ms))
            columns, compressions = model.columns, compressions + 1
            for s, cap in enumerate(caps):
                for m in {cap * k / TANGENTS for k in range(TANGENTS + 1)}:
                    model.add_cut(s, m, *prog.rel(s, m))
            best["upper"] = math.inf
            _dinkelbach(model, prog, dag.step_overhead_ms, best, deadline)
            if c.ties.num_tied == 0:  # the full LP: its own U certifies (Note [goodput LP])
                bound = best["lam"] + max(0.0, best["upper"]) / best["t_min"]
                break
            bound = _certificate(c, model, prog, cap_arr, best, unfrozen.makespan_ms, dag.step_overhead_ms, deadline)
            log.debug("goodput: %d of %d actions tied, %d LP columns: found %.12g, bound %.12g", c.ties.num_tied,
                      g.n, columns, best["goodput"], bound)
            if bound <= best["goodput"] * (1 + CERT_TOL):
                break
            margin = margins.grow(margin)
        certified = True
    except TimeLimitReached:
        certified, bound = False, math.inf
        log.warning("--objective goodput: the time limit stopped the goodput search after %d LP solves; the plan "
                    "is the best found, not certified optimal", best["solves"])
    p0 = prog.p0
    handover = None
    if certified and "makespan" in best:  # Note [goodput handover]
        handover = Handover(margin=margin, primal=model.phase2_basis(), dual=best["dual"])
    return GoodputSolution(means=best["means"], goodput=best["goodput"] * p0,
                           unfrozen_goodput=p0 / unfrozen.batch_time_ms,
                           bound=bound * p0, lp_solves=best["solves"], dinkelbach_steps=best["steps"],
                           wall_s=time.perf_counter() - start, certified=certified, lp_columns=columns,
                           makespan=best.get("makespan") if certified else None, compressions=compressions,
                           handover=handover)


def _dinkelbach(model: GoodputLP, prog: _Progress, overhead: float, best: dict, deadline: Deadline) -> None:
    """Dinkelbach steps, each solved by Kelley's cuts (Note [goodput LP]); `best` holds lam, the best plan's
    means and goodput, the last subproblem bound U, t_min and the counts, updated as it goes (so that a time
    limit leaves the best found)."""
    lam = best["goodput"]  # a feasible plan's goodput: no freezing, or the last compression's optimum
    while True:
        best["steps"] += 1
        while True:  # Kelley: cuts until the LP's value meets the true one at its point
            best["solves"] += 1
            if best["solves"] > MAX_ROUNDS:
                raise TfplanError(f"--objective goodput: no convergence in {MAX_ROUNDS} LP solves (a bug)")
            upper, means, phis, finish = model.solve(lam, prog.w, deadline)
            upper -= lam * overhead  # the subproblem's value: max P - lam (T + o), o a constant
            true = prog(means) - lam * (finish + overhead)
            if upper - true <= TOL * lam * (finish + overhead):
                break
            added = False
            for s, (m, phi) in enumerate(zip(means, phis)):
                e, slope = prog.rel(s, m)
                if phi > e + 1e-12:
                    added |= model.add_cut(s, m, e, slope)
            if not added:  # the tangents at this point are in: what is left is GLOP's tolerance
                break
        goodput = prog(means) / (finish + overhead)
        if goodput > best["goodput"]:
            best["goodput"], best["means"], best["finish"] = goodput, list(means), finish
        best["upper"], best["lam"] = upper, lam
        if upper <= TOL * lam * best["t_min"] or goodput <= lam * (1 + TOL):
            return  # certified; or lam no longer grows: the LP's own tolerance is the floor (see TOL)
        lam = goodput


def _certificate(c: Compressed, model: GoodputLP, prog: _Progress, caps: np.ndarray, best: dict, t_max: float,
                 overhead: float, deadline: Deadline) -> float:
    """G_ub of Note [goodput certificate] (relative progress per ms); inf when the tied dual fails."""
    prices = model.cap_prices(best["lam"])
    means = np.minimum(np.asarray(best["means"]), caps)
    sizes = c.stage_size  # |A_s|
    for s in np.flatnonzero((means <= 1e-9) & (sizes > 0)):  # the highest price that keeps m_s = 0 optimal
        prices[s] = max(prices[s], -prog.w[s] * prog.rel(s, 0.0)[1] / (best["goodput"] * sizes[s]))
    phase = Phase(number=1, caps=means, t_max=t_max)
    dual = tied_dual(c, phase)
    cols = dual_layout(c, phase)["lambda"]
    dual.lb[cols] = dual.ub[cols] = prices[c.stages]
    got = solve_lp(dual, True, deadline, basis=True)  # (its basis starts phase 2's tied dual: [goodput handover])
    if got is None:
        if deadline.expired():
            raise TimeLimitReached("--time-limit: the goodput certificate ran out of time")
        return math.inf
    low = safe_lower_bound(c.g, phase, from_tied_dual(c, phase, got.x))
    if best["finish"] - low <= GAP_TOL * max(1.0, best["finish"]):  # phase 1 of the plan at caps m_t, certified
        best["makespan"] = PhaseResult(name=PHASE_NAMES[0], objective=max(best["finish"], low), status=OPTIMAL,
                                       iterations=got.iterations, wall_s=got.wall_s, gap=max(0.0, best["finish"] - low))
        best["dual"] = got
    slope = prices * sizes  # lambda_s |A_s|
    base = low + float(slope @ means) + overhead  # L(m) + o = base - slope . m

    def best_means(goodput: float) -> list[float]:
        return [prog.best_mean(s, goodput * k, cap) for s, (k, cap) in enumerate(zip(slope, caps))]

    goodput = best["goodput"]
    for _ in range(100):  # Dinkelbach on the separable bound: superlinear, a few steps
        m = best_means(goodput)
        denom = base - float(slope @ np.asarray(m))
        if denom <= 0.0:
            return math.inf
        value = prog(m) / denom
        if value <= goodput * (1 + 1e-12):
            return max(goodput, value)
        goodput = value
    return math.inf  # not converged: no bound (the last value is only a lower one)
