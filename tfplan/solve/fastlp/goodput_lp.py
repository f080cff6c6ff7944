"""The goodput search's LP in GLOP (Note [goodput LP] in tfplan.solve.fastlp.goodput): fastlp's tied primal of
phase 1 with stage means m_s and progress variables phi_s, Kelley's cuts, re-solved warm as cuts and lam change,
and the basis it ends on, carried over to phase 2 of the plan's LP (Note [goodput handover] there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from ortools.linear_solver import pywraplp

from tfplan.errors import TfplanError
from tfplan.solve.fastlp.glop import load
from tfplan.solve.fastlp.tied import AT_UPPER, BASIC, INF, Compressed, Phase, SparseLP, tied_primal
from tfplan.solve.lp import Deadline, TimeLimitReached

WARM_PARAMS = "use_preprocessing: false use_dual_simplex: true primal_feasibility_tolerance: 1e-10"
PRIMAL_PARAMS = "use_preprocessing: false primal_feasibility_tolerance: 1e-10"
"""Note [warm goodput LP]: GLOP re-solves each LP from the last basis only without presolve. A cut is a new
row, which keeps the basis dual feasible: the dual simplex absorbs it in a few pivots. A new lam changes the
objective only, which keeps it primal feasible: the primal simplex. Measured on the full LP of 1F1B 16 x 128
(25 solves): 5.6 s with the dual simplex throughout, against 24 s with presolve (each solve from scratch)
and 18 s with the primal simplex throughout; the primal simplex after a new lam then took the compressed
1F1B 32 x 512 from 2.4 s to 2.1 s (docs/cost-model.md)."""


class GoodputLP:
    """fastlp's tied primal of phase 1 (Note [periodic compression]) with stage means m_s and progress
    variables phi_s (Note [goodput LP]) in GLOP, re-solved warm as cuts and lam change."""

    def __init__(self, c: Compressed, phase: Phase) -> None:
        lp = tied_primal(c, phase)
        num = len(phase.caps)
        stages = c.stage_idx[c.r_stage]  # capped-stage index of each ratio column
        first_r = len(c.free_nodes) + c.ties.num_runs  # tied_primal's columns: t, tau, r, T
        m0, nrow = len(lp.obj), len(lp.row_lo)
        cap_ub = np.zeros(num)
        cap_ub[c.stages] = phase.caps[c.stages]  # a stage without a freeze group keeps m = 0
        rows = nrow + np.arange(len(c.stages))  # |A_s| m_s - sum_{a in A_s} r_a = 0
        extended = SparseLP(
            obj=np.zeros(m0 + 2 * num), lb=np.concatenate([lp.lb, np.zeros(num), np.full(num, -INF)]),
            ub=np.concatenate([lp.ub, cap_ub, np.ones(num)]),
            ri=np.concatenate([lp.ri, rows, rows[stages]]),
            ci=np.concatenate([lp.ci, m0 + c.stages, first_r + np.arange(len(c.r_nodes))]),
            val=np.concatenate([lp.val, c.stage_size[c.stages].astype(np.float64), -c.weight]),
            row_lo=np.concatenate([lp.row_lo, np.zeros(len(c.stages))]),
            row_hi=np.concatenate([lp.row_hi, np.zeros(len(c.stages))]),
        )
        self.solver = load(extended)
        self.columns = len(extended.obj)
        self.core = (m0, nrow, lp.blocks["cap"])  # tied_primal's columns and rows come first, in its order
        variables = self.solver.variables()
        self.T = variables[first_r + len(c.r_nodes)]
        self.m = variables[m0: m0 + num]
        self.phi = variables[m0 + num:]
        constraints = self.solver.constraints()
        caps = range(lp.blocks["cap"].start, lp.blocks["cap"].stop)
        self.stages = c.stages
        self.price_rows = {int(s): (constraints[int(r)], constraints[k]) for s, r, k in zip(c.stages, rows, caps)}
        self.cuts: set[tuple[int, float]] = set()
        self.cut_stage: list[int] = []  # the stage of each cut row, in the order of the rows
        self._lam: float | None = None

    def add_cut(self, s: int, m: float, e: float, slope: float) -> bool:
        """phi_s <= e + slope (m_s - m): a tangent of the concave e_s at m; False if already there."""
        key = (s, round(m, 12))
        if key in self.cuts:
            return False
        self.cuts.add(key)
        self.cut_stage.append(s)
        row = self.solver.Constraint(-self.solver.infinity(), e - slope * m)
        row.SetCoefficient(self.phi[s], 1.0)
        row.SetCoefficient(self.m[s], -slope)
        return True

    def cap_prices(self, lam: float) -> np.ndarray:
        """lambda_s, the makespan's price of stage s's summed ratios at the last solve (Note [goodput
        certificate]): over lam, the dual of its mean row plus minus that of its cap row (the hard cap binds
        on both, and GLOP may price either), >= 0."""
        prices = np.zeros(len(self.m))
        for s, (mean, cap) in self.price_rows.items():
            prices[s] = max(0.0, (mean.dual_value() - cap.dual_value()) / lam)
        return prices

    def solve(self, lam: float, weights: Sequence[float], deadline: Deadline
              ) -> tuple[float, list[float], list[float], float]:
        """max sum_s w_s phi_s - lam T; returns (its value, the means, the phis, T). The overhead is the
        caller's (a constant: it changes no optimum)."""
        obj = self.solver.Objective()
        obj.Clear()
        obj.SetCoefficient(self.T, lam)
        for phi, weight in zip(self.phi, weights):
            obj.SetCoefficient(phi, -weight)
        obj.SetMinimization()
        # A new lam keeps the basis primal feasible, a new cut dual feasible (Note [warm goodput LP]).
        new_lam = self._lam is not None and lam != self._lam
        self._lam = lam
        self.solver.SetSolverSpecificParametersAsString(PRIMAL_PARAMS if new_lam else WARM_PARAMS)
        remaining = deadline.remaining()
        if remaining <= 0.0:
            raise TimeLimitReached(f"--time-limit: the goodput solve reached the limit of {deadline.limit_s:g} s")
        if math.isfinite(remaining):
            self.solver.SetTimeLimit(max(1, int(remaining * 1000)))
        status = self.solver.Solve()
        if status != pywraplp.Solver.OPTIMAL:
            if deadline.expired():
                raise TimeLimitReached(f"--time-limit: the goodput solve reached the limit of {deadline.limit_s:g} s")
            raise TfplanError(f"--objective goodput: GLOP returned status {status} instead of OPTIMAL")
        return (-obj.Value(), [min(1.0, max(0.0, m.solution_value())) for m in self.m],
                [phi.solution_value() for phi in self.phi], self.T.solution_value())

    def phase2_basis(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The last solve's basis as a starting basis of phase 2's tied primal at the same compression and caps
        at the found means (Note [goodput handover]); None when it does not come out square. Codes: LPResult.basis.

        tied_primal's columns and rows keep their statuses, except that each stage's cap row takes over the
        role of its mean row, which is dropped with m, phi and the cuts: per stage, those take away 1 + (its
        cuts) rows and (its basic m, phi, cut rows) basics. Where that takes one basic less than rows, the
        stage's mean is fixed by its cuts (two tangents meet there), and its cap row, which binds at those
        means, is made nonbasic; otherwise it stays basic (the mean is fixed by the makespan rows)."""
        m0, nrow, cap = self.core
        num, ns = len(self.m), len(self.stages)
        cols = np.fromiter((v.basis_status() for v in self.solver.variables()), np.int64) + 1  # glop.py's codes
        rows = np.fromiter((k.basis_status() for k in self.solver.constraints()), np.int64) + 1
        cuts = np.asarray(self.cut_stage, dtype=np.int64)
        dropped_rows = np.bincount(cuts, minlength=num)
        dropped_rows[self.stages] += 1  # the mean rows
        dropped_basics = (cols[m0: m0 + num] == BASIC).astype(np.int64) + (cols[m0 + num:] == BASIC)
        dropped_basics += np.bincount(cuts, weights=rows[nrow + ns:] == BASIC, minlength=num).astype(np.int64)
        dropped_basics[self.stages] += rows[nrow: nrow + ns] == BASIC
        cols, rows = cols[:m0], rows[:nrow]
        for i, s in enumerate(self.stages):
            if dropped_rows[s] > dropped_basics[s] and rows[cap.start + i] == BASIC:
                rows[cap.start + i] = AT_UPPER
        if np.count_nonzero(cols == BASIC) + np.count_nonzero(rows == BASIC) != nrow:
            return None
        return cols, rows
